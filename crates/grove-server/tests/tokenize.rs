//! vLLM's `/tokenize` and `/detokenize`: a prompt's count is what completions bill for it, a
//! chat's is what chat bills, ids come back as the text, and bad input is named.

mod common;

use common::*;
use serde_json::{json, Value};

fn server() -> TestServer {
    TestServer::start(default_served(), config("tiny", 6, 4096, 4, 16))
}

fn count(answer: &Value) -> u64 {
    answer["count"].as_u64().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn counts_are_what_the_endpoints_bill_and_ids_read_back_as_text() {
    let server = server();
    let prompt = "def add(a, b):\n    return a + b";
    let (status, tokenized) = server
        .post("/tokenize", &json!({"model": "tiny", "prompt": prompt}))
        .await;
    assert_eq!(status, 200, "{tokenized}");
    assert_eq!(
        count(&tokenized),
        tokenized["tokens"].as_array().unwrap().len() as u64
    );
    let (_, model) = server.get("/v1/models").await;
    let model: Value = serde_json::from_str(&model).unwrap();
    assert_eq!(
        tokenized["max_model_len"],
        model["data"][0]["max_model_len"]
    );
    let (_, completion) = server
        .post(
            "/v1/completions",
            &json!({"model": "tiny", "prompt": prompt, "max_tokens": 1}),
        )
        .await;
    assert_eq!(completion["usage"]["prompt_tokens"], count(&tokenized));
    let (status, text) = server
        .post(
            "/detokenize",
            &json!({"model": "tiny", "tokens": tokenized["tokens"]}),
        )
        .await;
    assert_eq!(status, 200, "{text}");
    assert_eq!(text["prompt"], prompt);

    // A chat's messages, rendered by the template (no `model` needed, as vLLM allows).
    let messages = json!([{"role": "system", "content": "Be brief."},
                          {"role": "user", "content": "hi"}]);
    let (status, tokenized) = server
        .post("/tokenize", &json!({"messages": messages}))
        .await;
    assert_eq!(status, 200, "{tokenized}");
    let (_, chat) = server
        .post(
            "/v1/chat/completions",
            &json!({"model": "tiny", "messages": messages, "max_tokens": 1}),
        )
        .await;
    assert_eq!(chat["usage"]["prompt_tokens"], count(&tokenized));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bad_input_is_named() {
    let server = server();
    let cases = [
        (
            "/tokenize",
            json!({"prompt": "a", "messages": []}),
            400,
            "prompt` or `messages",
        ),
        ("/tokenize", json!({}), 400, "prompt` or `messages"),
        ("/tokenize", json!({"prompt": ""}), 400, "prompt"),
        ("/tokenize", json!({"messages": []}), 400, "messages"),
        ("/detokenize", json!({"tokens": [1, 320]}), 400, "tokens"),
        ("/detokenize", json!({"tokens": []}), 400, "tokens"),
        ("/detokenize", json!({"tokens": "abc"}), 400, "tokens"),
        (
            "/tokenize",
            json!({"model": "other", "prompt": "a"}),
            404,
            "",
        ),
    ];
    for (path, body, status, param) in cases {
        let (got, answer) = server.post(path, &body).await;
        assert_eq!(got, status, "{path} {body}: {answer}");
        if status == 400 {
            assert_eq!(answer["error"]["param"], param, "{path} {body}: {answer}");
        }
    }
}
