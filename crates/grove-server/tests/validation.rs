//! One test per validation rule: the status, OpenAI's `error.type` and the named `param`. The
//! server (the embedded default model with a DDTree drafter, budget 6, a 512-token KV pool)
//! keeps serving after every refusal.

mod common;

use std::sync::OnceLock;

use common::*;
use serde_json::{json, Value};

fn server() -> &'static TestServer {
    static SERVER: OnceLock<TestServer> = OnceLock::new();
    SERVER.get_or_init(|| TestServer::start(default_served(), config("tiny", 6, 512, 4, 16)))
}

/// Posts raw `body` to `path` and checks the error shape.
async fn refused(path: &str, body: Vec<u8>, status: u16, kind: &str, param: Option<&str>) -> Value {
    let server = server();
    let response = server
        .client
        .post(format!("{}{path}", server.base))
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), status);
    let body: Value = response.json().await.unwrap();
    let error = &body["error"];
    assert_eq!(error["type"], kind, "{body}");
    assert_eq!(error["param"].as_str(), param, "{body}");
    assert!(
        error["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{body}"
    );
    if let Some(param) = param {
        let message = error["message"].as_str().unwrap();
        let leaf = param.rsplit('.').next().unwrap();
        let leaf = leaf.split('[').next().unwrap();
        assert!(
            message.contains(leaf) || param == "body",
            "message names {param}: {message}"
        );
    }
    // Still serving.
    let (ok, answer) = server
        .post(
            "/v1/completions",
            &json!({"model": "tiny", "prompt": "ok", "max_tokens": 2, "temperature": 0}),
        )
        .await;
    assert_eq!(ok, 200, "{answer}");
    body
}

fn completion(extra: Value) -> Vec<u8> {
    let mut body = json!({"model": "tiny", "prompt": "def f(x):", "max_tokens": 4});
    for (key, value) in extra.as_object().unwrap() {
        body[key] = value.clone();
    }
    serde_json::to_vec(&body).unwrap()
}

fn chat(extra: Value) -> Vec<u8> {
    let mut body = json!({"model": "tiny", "messages": [{"role": "user", "content": "hi"}]});
    for (key, value) in extra.as_object().unwrap() {
        body[key] = value.clone();
    }
    serde_json::to_vec(&body).unwrap()
}

macro_rules! rule {
    ($name:ident, $path:expr, $body:expr, $status:expr, $kind:expr, $param:expr) => {
        #[tokio::test]
        async fn $name() {
            refused($path, $body, $status, $kind, $param).await;
        }
    };
}

const C: &str = "/v1/completions";
const CHAT: &str = "/v1/chat/completions";
const BAD: &str = "invalid_request_error";

rule!(
    malformed_json,
    C,
    b"{\"model\": \"tiny\", ".to_vec(),
    400,
    BAD,
    Some("body")
);
rule!(
    body_not_an_object,
    C,
    b"[1, 2]".to_vec(),
    400,
    BAD,
    Some("body")
);
rule!(empty_body, C, Vec::new(), 400, BAD, Some("body"));
rule!(
    invalid_utf8,
    C,
    b"{\"model\": \"tiny\", \"prompt\": \"\xff\xfe\"}".to_vec(),
    400,
    BAD,
    Some("body")
);
rule!(
    wrong_type,
    C,
    completion(json!({"max_tokens": "four"})),
    400,
    BAD,
    Some("max_tokens")
);
rule!(
    wrong_type_nested,
    C,
    completion(json!({"stream_options": {"include_usage": 3}})),
    400,
    BAD,
    Some("stream_options.include_usage")
);
rule!(
    missing_model,
    C,
    br#"{"prompt": "x"}"#.to_vec(),
    400,
    BAD,
    Some("model")
);
rule!(
    missing_prompt,
    C,
    br#"{"model": "tiny"}"#.to_vec(),
    400,
    BAD,
    Some("prompt")
);
rule!(
    empty_prompt,
    C,
    completion(json!({"prompt": ""})),
    400,
    BAD,
    Some("prompt")
);
rule!(
    empty_token_prompt,
    C,
    completion(json!({"prompt": []})),
    400,
    BAD,
    Some("prompt")
);
rule!(
    token_outside_vocab,
    C,
    completion(json!({"prompt": [1, 2, 320]})),
    400,
    BAD,
    Some("prompt")
);
rule!(
    more_sequences_than_a_request_may_start,
    C,
    completion(json!({"prompt": vec!["a"; 17], "n": 4})),
    400,
    BAD,
    Some("prompt")
);
rule!(
    max_tokens_zero,
    C,
    completion(json!({"max_tokens": 0})),
    400,
    BAD,
    Some("max_tokens")
);
rule!(
    over_the_context,
    C,
    completion(json!({"max_tokens": 5000})),
    400,
    BAD,
    Some("max_tokens")
);
rule!(
    over_the_kv_pool,
    C,
    completion(json!({"max_tokens": 600})),
    400,
    BAD,
    Some("max_tokens")
);
rule!(
    temperature_range,
    C,
    completion(json!({"temperature": 2.5})),
    400,
    BAD,
    Some("temperature")
);
rule!(
    top_p_range,
    C,
    completion(json!({"top_p": 0.0})),
    400,
    BAD,
    Some("top_p")
);
rule!(
    top_k_range,
    C,
    completion(json!({"top_k": -2})),
    400,
    BAD,
    Some("top_k")
);
rule!(
    seed_negative,
    C,
    completion(json!({"seed": -1})),
    400,
    BAD,
    Some("seed")
);
rule!(
    n_above_sixteen,
    C,
    completion(json!({"n": 17})),
    400,
    BAD,
    Some("n")
);
rule!(n_zero, C, completion(json!({"n": 0})), 400, BAD, Some("n"));
rule!(
    too_many_stops,
    C,
    completion(json!({"stop": ["a", "b", "c", "d", "e"]})),
    400,
    BAD,
    Some("stop")
);
rule!(
    empty_stop,
    C,
    completion(json!({"stop": [""]})),
    400,
    BAD,
    Some("stop")
);
rule!(
    stream_options_without_stream,
    C,
    completion(json!({"stream_options": {"include_usage": true}})),
    400,
    BAD,
    Some("stream_options")
);
rule!(
    logprobs_past_twenty,
    C,
    completion(json!({"logprobs": 21})),
    400,
    BAD,
    Some("logprobs")
);
rule!(
    logprobs_not_a_count,
    C,
    completion(json!({"logprobs": true})),
    400,
    BAD,
    Some("logprobs")
);
rule!(
    zero_max_tokens_without_echo,
    C,
    completion(json!({"max_tokens": 0})),
    400,
    BAD,
    Some("max_tokens")
);
rule!(
    suffix_without_fim_tokens,
    C,
    completion(json!({"suffix": ")\n"})),
    400,
    BAD,
    Some("suffix")
);
rule!(
    suffix_with_token_ids,
    C,
    completion(json!({"prompt": [1, 2], "suffix": ")"})),
    400,
    BAD,
    Some("suffix")
);
rule!(
    suffix_with_echo,
    C,
    completion(json!({"suffix": ")", "echo": true})),
    400,
    BAD,
    Some("echo")
);
rule!(
    echo_with_stream,
    C,
    completion(json!({"echo": true, "stream": true})),
    400,
    BAD,
    Some("echo")
);
rule!(
    presence_penalty_past_two,
    C,
    completion(json!({"presence_penalty": 2.5})),
    400,
    BAD,
    Some("presence_penalty")
);
rule!(
    frequency_penalty_below_minus_two,
    C,
    completion(json!({"frequency_penalty": -3})),
    400,
    BAD,
    Some("frequency_penalty")
);
rule!(
    logit_bias_key_not_an_id,
    C,
    completion(json!({"logit_bias": {"abc": 1}})),
    400,
    BAD,
    Some("logit_bias")
);
rule!(
    logit_bias_id_past_the_vocabulary,
    C,
    completion(json!({"logit_bias": {"99999999": 1}})),
    400,
    BAD,
    Some("logit_bias")
);
rule!(
    logit_bias_past_a_hundred,
    C,
    completion(json!({"logit_bias": {"5": 150}})),
    400,
    BAD,
    Some("logit_bias")
);
rule!(
    logit_bias_not_an_object,
    C,
    completion(json!({"logit_bias": [1, 2]})),
    400,
    BAD,
    Some("logit_bias")
);
rule!(
    speculative_budget_over_ceiling,
    C,
    completion(json!({"speculative": {"budget": 7}})),
    400,
    BAD,
    Some("speculative.budget")
);
rule!(
    speculative_budget_unknown_name,
    C,
    completion(json!({"speculative": {"budget": "fast"}})),
    400,
    BAD,
    Some("speculative.budget")
);
rule!(
    speculative_budget_zero,
    C,
    completion(json!({"speculative": {"budget": 0}})),
    400,
    BAD,
    Some("speculative.budget")
);
rule!(
    speculative_budget_without_drafting,
    C,
    completion(json!({"speculative": {"algorithm": "none", "budget": 3}})),
    400,
    BAD,
    Some("speculative.budget")
);
rule!(
    speculative_unknown_algorithm,
    C,
    completion(json!({"speculative": {"algorithm": "medusa"}})),
    400,
    BAD,
    Some("speculative.algorithm")
);
rule!(
    chat_missing_messages,
    CHAT,
    br#"{"model": "tiny"}"#.to_vec(),
    400,
    BAD,
    Some("messages")
);
rule!(
    chat_empty_messages,
    CHAT,
    chat(json!({"messages": []})),
    400,
    BAD,
    Some("messages")
);
rule!(
    chat_bad_role,
    CHAT,
    chat(json!({"messages": [{"role": "wizard", "content": "x"}]})),
    400,
    BAD,
    Some("messages[0].role")
);
rule!(
    chat_image_part,
    CHAT,
    chat(json!({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})),
    400,
    BAD,
    Some("messages[0].content[0]")
);
rule!(
    chat_tool_without_function,
    CHAT,
    chat(json!({"tools": [{"type": "function"}]})),
    400,
    BAD,
    Some("tools[0].function")
);
rule!(
    // This server's model has no end-of-sequence token for a value to end with.
    chat_json_without_an_eos_token,
    CHAT,
    chat(json!({"response_format": {"type": "json_object"}})),
    400,
    BAD,
    Some("response_format")
);
rule!(
    chat_max_completion_tokens_zero,
    CHAT,
    chat(json!({"max_completion_tokens": 0})),
    400,
    BAD,
    Some("max_completion_tokens")
);
rule!(
    chat_role_missing,
    CHAT,
    chat(json!({"messages": [{"role": "user", "content": "a"}, {"content": "hi"}]})),
    400,
    BAD,
    Some("messages[1].role")
);
rule!(
    chat_top_logprobs_without_logprobs,
    CHAT,
    chat(json!({"top_logprobs": 2})),
    400,
    BAD,
    Some("top_logprobs")
);
rule!(
    chat_top_logprobs_past_twenty,
    CHAT,
    chat(json!({"logprobs": true, "top_logprobs": 21})),
    400,
    BAD,
    Some("top_logprobs")
);
rule!(
    chat_top_logprobs_negative,
    CHAT,
    chat(json!({"logprobs": true, "top_logprobs": -1})),
    400,
    BAD,
    Some("top_logprobs")
);
rule!(
    chat_text_part_without_text,
    CHAT,
    chat(json!({"messages": [{"role": "user", "content": [{"type": "text"}]}]})),
    400,
    BAD,
    Some("messages[0].content[0].text")
);
rule!(
    chat_part_without_type,
    CHAT,
    chat(json!({"messages": [{"role": "user", "content": [{"text": "hi"}]}]})),
    400,
    BAD,
    Some("messages[0].content[0].type")
);
rule!(
    chat_template_kwargs_not_an_object,
    CHAT,
    chat(json!({"chat_template_kwargs": "enable_thinking"})),
    400,
    BAD,
    Some("chat_template_kwargs")
);
rule!(
    chat_template_kwargs_setting_groves_own_variable,
    CHAT,
    chat(json!({"chat_template_kwargs": {"tools": []}})),
    400,
    BAD,
    Some("chat_template_kwargs")
);

/// Content that is neither a string nor a list of parts says what it must be, not serde's
/// untagged-enum message.
#[tokio::test]
async fn chat_content_of_the_wrong_shape_says_what_it_must_be() {
    let body = chat(json!({"messages": [{"role": "user", "content": 5}]}));
    let body = refused(CHAT, body, 400, BAD, Some("messages[0].content")).await;
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("a string or a list of content parts"),
        "{message}"
    );
    assert!(!message.contains("untagged"), "{message}");
}
rule!(
    body_too_large,
    C,
    completion(json!({"prompt": "x".repeat(5 << 20)})),
    413,
    BAD,
    Some("body")
);
rule!(
    unknown_model,
    C,
    completion(json!({"model": "gpt-4"})),
    404,
    BAD,
    Some("model")
);
rule!(
    unknown_route,
    "/v1/embeddings",
    completion(json!({})),
    404,
    BAD,
    None
);

#[tokio::test]
async fn api_key_is_required_when_configured() {
    let mut settings = config("tiny", 6, 512, 4, 16);
    settings.api_key = Some("sesame".into());
    let server = TestServer::start(default_served(), settings);
    let body = json!({"model": "tiny", "prompt": "x", "max_tokens": 2});
    for key in [None, Some("wrong")] {
        let mut request = server
            .client
            .post(format!("{}/v1/completions", server.base))
            .json(&body);
        if let Some(key) = key {
            request = request.bearer_auth(key);
        }
        let response = request.send().await.unwrap();
        assert_eq!(response.status().as_u16(), 401);
        let error: Value = response.json().await.unwrap();
        assert_eq!(error["error"]["type"], BAD);
        assert_eq!(error["error"]["code"], "invalid_api_key");
    }
    let response = server
        .client
        .post(format!("{}/v1/completions", server.base))
        .bearer_auth("sesame")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 200);
}

/// OpenAI's schema allows `null` for the boolean flags: it means the default.
#[tokio::test]
async fn null_flags_mean_their_defaults() {
    let server = server();
    for path in [C, CHAT] {
        let extra = json!({"stream": null, "ignore_eos": null, "return_token_ids": null,
                           "max_tokens": 2});
        let body = if path == C {
            completion(extra)
        } else {
            chat(extra)
        };
        let body: Value = serde_json::from_slice(&body).unwrap();
        let (status, answer) = server.post(path, &body).await;
        assert_eq!(status, 200, "{answer}");
        assert!(answer["choices"][0].get("token_ids").is_none(), "{answer}");
    }
}

/// An error quotes what the client sent only up to a bound: a 3 MB model name is not sent
/// back.
#[tokio::test]
async fn errors_do_not_echo_huge_input() {
    let body = refused(
        C,
        completion(json!({"model": "m".repeat(3 << 20)})),
        404,
        BAD,
        Some("model"),
    )
    .await;
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.len() < 1200, "{} bytes", message.len());
    assert!(message.contains("more bytes"), "{message}");
}

/// A body shorter than its `Content-Length` (the client stopped sending) is a bad request,
/// not a body too large.
#[test]
fn a_truncated_body_is_400() {
    use std::io::{Read, Write};
    let server = server();
    let address = server.base.trim_start_matches("http://");
    let mut socket = std::net::TcpStream::connect(address).unwrap();
    let head = "POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
                content-length: 100\r\nconnection: close\r\n\r\n{\"model\": \"ti";
    socket.write_all(head.as_bytes()).unwrap();
    socket.shutdown(std::net::Shutdown::Write).unwrap();
    let mut answer = String::new();
    socket.read_to_string(&mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    assert!(answer.contains("invalid_body"), "{answer}");
}

/// A prompt that cannot fit whatever `max_tokens` says is blamed on the prompt, with the code
/// clients trim history on; one that fits with fewer new tokens is blamed on `max_tokens`.
#[tokio::test]
async fn overflows_name_the_prompt_when_no_max_tokens_could_fit() {
    let long = "x".repeat(700);
    for (path, body, param) in [
        (
            CHAT,
            chat(json!({"messages": [{"role": "user", "content": long}]})),
            "prompt",
        ),
        (
            C,
            completion(json!({"prompt": long, "max_tokens": 4})),
            "prompt",
        ),
        (C, completion(json!({"max_tokens": 600})), "max_tokens"),
        (C, completion(json!({"max_tokens": 5000})), "max_tokens"),
    ] {
        let body = refused(path, body, 400, BAD, Some(param)).await;
        assert_eq!(body["error"]["code"], "context_length_exceeded", "{body}");
    }
}

/// A multi-megabyte prompt is refused after encoding only enough of it to know it cannot fit
/// (issue 26, item 2), as an overflow that names the prompt.
#[tokio::test]
async fn a_huge_prompt_is_refused_before_all_of_it_is_tokenized() {
    let huge = "for item in range(10): print(item)\n".repeat(90_000);
    assert!(huge.len() > 3_000_000);
    for (path, body, param) in [
        (C, completion(json!({"prompt": huge})), "prompt"),
        (
            CHAT,
            chat(json!({"messages": [{"role": "user", "content": huge}]})),
            "prompt",
        ),
    ] {
        let body = refused(path, body, 400, BAD, Some(param)).await;
        assert_eq!(body["error"]["code"], "context_length_exceeded", "{body}");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(message.contains("before reading the rest"), "{message}");
    }
}

#[tokio::test]
async fn context_length_caps_requests_and_models_reports_the_true_ceiling() {
    // The default server: its 512-token pool, less one verify (budget 6 + 1), is the ceiling.
    let (_, models) = server().get("/v1/models").await;
    let models: Value = serde_json::from_str(&models).unwrap();
    assert_eq!(models["data"][0]["max_model_len"], 512 - 7, "{models}");

    let mut settings = config("tiny", 6, 512, 4, 16);
    settings.context_length = Some(100);
    let server = TestServer::start(default_served(), settings);
    let (_, models) = server.get("/v1/models").await;
    let models: Value = serde_json::from_str(&models).unwrap();
    assert_eq!(models["data"][0]["max_model_len"], 100, "{models}");
    let (status, body) = server
        .post(
            "/v1/completions",
            &json!({"model": "tiny", "prompt": "def f(x):", "max_tokens": 95}),
        )
        .await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"]["param"], "max_tokens", "{body}");
    assert_eq!(body["error"]["code"], "context_length_exceeded", "{body}");
    assert!(
        body["error"]["message"].as_str().unwrap().contains("100"),
        "{body}"
    );
    // Chat without max_tokens gets the rest of the shorter context.
    let (status, body) = server
        .post(
            "/v1/chat/completions",
            &json!({"model": "tiny", "messages": [{"role": "user", "content": "hi"}],
                    "temperature": 0}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert!(
        body["usage"]["total_tokens"].as_u64().unwrap() <= 100,
        "{body}"
    );

    let mut settings = config("tiny", 6, 512, 4, 16);
    settings.context_length = Some(1 << 30);
    let error = grove_server::start(default_served(), settings)
        .err()
        .unwrap();
    assert!(error.contains("--context-length"), "{error}");
}

/// A known path asked with another method (OPTIONS included: grove sends no CORS headers) is
/// a 405 in OpenAI's error shape, with the methods it takes in `Allow`.
#[tokio::test]
async fn wrong_methods_get_an_openai_shaped_405_with_allow() {
    let server = server();
    for (method, path, allowed) in [
        (reqwest::Method::GET, C, "POST"),
        (reqwest::Method::OPTIONS, CHAT, "POST"),
        (reqwest::Method::DELETE, "/v1/models", "GET"),
    ] {
        let response = server
            .client
            .request(method.clone(), format!("{}{path}", server.base))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status().as_u16(), 405, "{method} {path}");
        let allow = response.headers()["allow"].to_str().unwrap().to_owned();
        assert!(allow.contains(allowed), "{method} {path}: Allow {allow}");
        assert!(response
            .headers()
            .get("access-control-allow-origin")
            .is_none());
        let body: Value = response.json().await.unwrap();
        assert_eq!(body["error"]["type"], BAD, "{body}");
        assert_eq!(body["error"]["code"], "method_not_allowed", "{body}");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(
            message.contains(method.as_str()) && message.contains(path),
            "{message}"
        );
    }
}
