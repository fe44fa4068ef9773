//! Function calling through the server: `tools` reach the chat template, a required or named
//! `tool_choice` always answers one well-formed call (its arguments held to the function's
//! `parameters`), streamed as one `tool_calls` delta, DDTree answering as plain decoding does;
//! a conversation that carries calls and the tools' answers renders; bad tools are refused by
//! name. (Reading calls from free text is `tools.rs`'s unit tests; Qwen2.5's own template is
//! `grove-model/tests/chat_tools.rs`.)

mod common;

use std::sync::Arc;

use common::*;
use grove_model::TextTokenizer;
use serde_json::{json, Value};

/// A Qwen-like template that writes the tools and the calls.
const TEMPLATE: &str = "{%- if tools %}<|im_start|>system\n{% for tool in tools %}{{ tool | tojson }}\n{% endfor %}<|im_end|>\n{% endif %}{% for message in messages %}<|im_start|>{{ message.role }}\n{% if message.tool_calls %}{% for call in message.tool_calls %}<tool_call>{{ call.function | tojson }}</tool_call>{% endfor %}{% else %}{{ message.content }}{% endif %}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

fn server() -> TestServer {
    let mut served = default_served();
    let dir = repo_dir().join("assets/tiny-qwen3");
    let tokenizer = TextTokenizer::load(&dir).unwrap();
    served.tokenizer = Some(Arc::new(
        tokenizer.with_chat_template(TEMPLATE.into()).unwrap(),
    ));
    let mut settings = config("tiny", 6, 8192, 4, 16);
    settings.stop_token_ids = vec![256];
    TestServer::start(served, settings)
}

fn tools() -> Value {
    json!([
        {"type": "function", "function": {"name": "get_weather", "description": "Weather now",
            "parameters": {"type": "object", "properties": {
                "city": {"enum": ["Paris", "Tokyo"]}, "days": {"type": "integer"}},
                "required": ["city"]}}},
        {"type": "function", "function": {"name": "now", "parameters": {"type": "object",
            "properties": {}, "additionalProperties": false}}}
    ])
}

fn body(tool_choice: Value, extra: Value) -> Value {
    let mut body = json!({"model": "tiny", "max_tokens": 600, "temperature": 0,
        "messages": [{"role": "user", "content": "weather?"}], "tools": tools(),
        "tool_choice": tool_choice});
    for (key, value) in extra.as_object().unwrap() {
        body[key] = value.clone();
    }
    body
}

/// The answer's one call, checked against the tools: `(name, arguments)`.
fn one_call(answer: &Value) -> (String, Value) {
    let choice = &answer["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{answer}");
    assert!(choice["message"]["content"].is_null(), "{answer}");
    let calls = choice["message"]["tool_calls"].as_array().unwrap();
    assert_eq!(calls.len(), 1, "{answer}");
    assert_eq!(calls[0]["type"], "function");
    assert!(calls[0]["id"].as_str().unwrap().starts_with("call_"));
    let name = calls[0]["function"]["name"].as_str().unwrap().to_owned();
    let arguments: Value =
        serde_json::from_str(calls[0]["function"]["arguments"].as_str().unwrap()).unwrap();
    match name.as_str() {
        "get_weather" => assert!(["Paris", "Tokyo"].contains(&arguments["city"].as_str().unwrap())),
        "now" => assert_eq!(arguments, json!({})),
        other => panic!("{other} is not a tool"),
    }
    (name, arguments)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_required_call_is_well_formed_streamed_and_lossless() {
    let server = server();
    let named = json!({"type": "function", "function": {"name": "get_weather"}});
    let mut calls = Vec::new();
    for algorithm in ["none", "ddtree"] {
        let request = body(
            named.clone(),
            json!({"speculative": {"algorithm": algorithm}}),
        );
        let (status, answer) = server.post("/v1/chat/completions", &request).await;
        assert_eq!(status, 200, "{answer}");
        calls.push(one_call(&answer));
    }
    assert_eq!(calls[0].0, "get_weather");
    assert_eq!(
        calls[0], calls[1],
        "DDTree called otherwise than plain decoding"
    );
    for seed in 0..3 {
        let request = body(json!("required"), json!({"temperature": 1.0, "seed": seed}));
        let (status, answer) = server.post("/v1/chat/completions", &request).await;
        assert_eq!(status, 200, "{answer}");
        one_call(&answer);
    }
    // Streamed: no text, one delta with the call, the same call.
    let (chunks, done) = read_stream(
        server
            .send("/v1/chat/completions", body(named, json!({"stream": true})))
            .await,
    )
    .await;
    assert!(done);
    let deltas: Vec<&Value> = chunks.iter().map(|c| &c["choices"][0]).collect();
    assert!(deltas
        .iter()
        .all(|d| d["delta"]["content"].as_str().is_none_or(str::is_empty)));
    let streamed: Vec<&Value> = deltas
        .iter()
        .filter_map(|d| d["delta"]["tool_calls"].as_array())
        .flatten()
        .collect();
    assert_eq!(streamed.len(), 1, "{chunks:?}");
    assert_eq!(streamed[0]["function"]["name"], "get_weather");
    let arguments: Value =
        serde_json::from_str(streamed[0]["function"]["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(arguments, calls[0].1);
    assert_eq!(deltas.last().unwrap()["finish_reason"], "tool_calls");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tools_and_calls_reach_the_template_and_bad_ones_are_named() {
    let server = server();
    let prompt_tokens = |answer: &Value| answer["usage"]["prompt_tokens"].as_u64().unwrap();
    let short = |tool_choice: Value| body(tool_choice, json!({"max_tokens": 4}));
    let (_, with_tools) = server
        .post("/v1/chat/completions", &short(json!("auto")))
        .await;
    let (_, without) = server
        .post("/v1/chat/completions", &short(json!("none")))
        .await;
    // The tools' JSON is written into the prompt (one token a byte here).
    let written = tools()
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.to_string().len() + 1)
        .sum::<usize>();
    assert!(prompt_tokens(&with_tools) > prompt_tokens(&without) + written as u64 / 2);

    let history = |arguments: &str| {
        let mut request = short(json!("auto"));
        request["messages"] = json!([
            {"role": "user", "content": "weather?"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type":
                "function", "function": {"name": "get_weather", "arguments": arguments}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}
        ]);
        request
    };
    let (status, short_call) = server
        .post("/v1/chat/completions", &history(r#"{"city": "Paris"}"#))
        .await;
    assert_eq!(status, 200, "{short_call}");
    let (_, long_call) = server
        .post(
            "/v1/chat/completions",
            &history(r#"{"city": "Paris", "days": 10}"#),
        )
        .await;
    // The call's arguments are in the prompt, as `tojson` writes them.
    assert_eq!(
        prompt_tokens(&long_call) - prompt_tokens(&short_call),
        r#", "days": 10"#.len() as u64
    );

    let refused = [
        (
            short(json!({"type": "function", "function": {"name": "fly"}})),
            "tool_choice",
        ),
        (short(json!("sometimes")), "tool_choice"),
        (
            {
                let mut request = short(json!("auto"));
                request["tools"] = json!([{"type": "function", "function": {"name": "a b"}}]);
                request
            },
            "tools[0].function.name",
        ),
        (
            {
                let mut request = history("{}");
                request["messages"][1]["tool_calls"][0] = json!({"id": "x", "type": "function"});
                request
            },
            "messages[1].tool_calls[0].function",
        ),
        (
            {
                let mut request = short(json!("required"));
                request["response_format"] = json!({"type": "json_object"});
                request
            },
            "response_format",
        ),
    ];
    for (request, param) in refused {
        let (status, answer) = server.post("/v1/chat/completions", &request).await;
        assert_eq!(status, 400, "{answer}");
        assert_eq!(answer["error"]["param"], param, "{answer}");
    }
}
