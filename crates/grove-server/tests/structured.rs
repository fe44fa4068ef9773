//! `response_format` through the server: `json_schema` and `json_object` hold the text to JSON
//! on both endpoints (a whole value where the model stopped, a beginning of one where it ran
//! out of tokens), streams carry the same text, DDTree answers what plain decoding answers, and
//! what grove cannot enforce is refused by name.

mod common;

use common::*;
use grove_engine::structured::{Matcher, Schema};
use serde_json::{json, Value};

fn schema() -> Value {
    json!({"type": "object", "properties": {
        "ok": {"type": "boolean"},
        "level": {"enum": ["low", "high"]}
    }, "required": ["ok", "level"]})
}

fn json_schema() -> Value {
    json!({"type": "json_schema", "json_schema": {"name": "status", "schema": schema()}})
}

fn server() -> TestServer {
    let mut settings = config("tiny", 6, 4096, 4, 16);
    settings.stop_token_ids = vec![256];
    TestServer::start(default_served(), settings)
}

/// `text` is a value of `schema`, or the beginning of one when the answer ran out of tokens.
fn keeps_to(schema: &Schema, text: &str, finish_reason: &Value) {
    let mut state = Matcher::new(schema);
    assert!(
        state.feed(schema, text.as_bytes()),
        "{text:?} leaves the schema"
    );
    if finish_reason == "stop" {
        assert!(state.can_end(schema), "{text:?}");
        serde_json::from_str::<Value>(text).expect("a whole value");
    } else {
        assert_eq!(finish_reason, "length");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn answers_keep_to_the_schema_and_speculation_changes_nothing() {
    let server = server();
    let compiled = Schema::compile(&schema()).unwrap();
    let mut stopped = 0;
    for seed in 0..4 {
        let mut answers = Vec::new();
        for algorithm in ["none", "ddtree"] {
            let body = json!({"model": "tiny", "max_tokens": 160, "temperature": 0.9,
                "seed": seed, "speculative": {"algorithm": algorithm},
                "messages": [{"role": "user", "content": "status?"}],
                "response_format": json_schema()});
            let (status, answer) = server.post("/v1/chat/completions", &body).await;
            assert_eq!(status, 200, "{answer}");
            let choice = &answer["choices"][0];
            let text = choice["message"]["content"].as_str().unwrap().to_owned();
            keeps_to(&compiled, &text, &choice["finish_reason"]);
            stopped += usize::from(choice["finish_reason"] == "stop");
            answers.push(text);
        }
        assert_eq!(answers[0], answers[1], "seed {seed}");
    }
    assert!(stopped > 0, "no answer ended in a whole value");

    // JSON mode on completions, streamed and not: the same text, an object's beginning.
    let body = json!({"model": "tiny", "prompt": "{", "max_tokens": 40, "temperature": 0,
        "response_format": {"type": "json_object"}});
    let (status, answer) = server.post("/v1/completions", &body).await;
    assert_eq!(status, 200, "{answer}");
    let choice = &answer["choices"][0];
    let text = choice["text"].as_str().unwrap();
    keeps_to(&Schema::any_object(), text, &choice["finish_reason"]);
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let (chunks, done) = read_stream(server.send("/v1/completions", &streamed).await).await;
    assert!(done);
    let joined: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["text"].as_str())
        .collect();
    assert_eq!(joined, text);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn what_cannot_be_enforced_is_refused_by_name() {
    let server = server();
    let chat = |format: Value, extra: Value| {
        let mut body = json!({"model": "tiny", "messages": [{"role": "user", "content": "x"}],
                              "response_format": format});
        for (key, value) in extra.as_object().unwrap() {
            body[key] = value.clone();
        }
        body
    };
    let cases = [
        (
            json!({"type": "json_schema", "json_schema": {"name": "s",
                   "schema": {"type": "integer", "multipleOf": 5}}}),
            json!({}),
            "response_format.json_schema.schema",
            "`multipleOf`",
        ),
        (
            json!({"type": "json_schema", "json_schema": {"name": "s"}}),
            json!({}),
            "response_format.json_schema.schema",
            "",
        ),
        (
            json!({"type": "yaml"}),
            json!({}),
            "response_format.type",
            "json_schema",
        ),
        (json!("json"), json!({}), "response_format", ""),
        (json_schema(), json!({"ignore_eos": true}), "ignore_eos", ""),
    ];
    for (format, extra, param, words) in cases {
        let (status, answer) = server
            .post("/v1/chat/completions", &chat(format, extra))
            .await;
        assert_eq!(status, 400, "{answer}");
        assert_eq!(answer["error"]["param"], param, "{answer}");
        let message = answer["error"]["message"].as_str().unwrap();
        assert!(message.contains(words), "{message}");
    }
    // Free text as before.
    let (status, _) = server
        .post(
            "/v1/chat/completions",
            &chat(json!({"type": "text"}), json!({"max_tokens": 4})),
        )
        .await;
    assert_eq!(status, 200);
}
