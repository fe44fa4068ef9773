//! `--reasoning-parser` and `chat_template_kwargs` through the server, on the embedded default
//! model with `<think>` and `</think>` added to its tokenizer (logit biases make it write
//! them): answers carry `reasoning_content` apart from `content`, streams add up to the same
//! split, a schema holds only the text after the block (speculation changing nothing), and the
//! template reads the request's variables and the reasoning of earlier answers sent back.

mod common;

use std::sync::Arc;

use common::*;
use grove_engine::structured::{Matcher, Schema};
use grove_model::TextTokenizer;
use grove_server::{ReasoningParser, ServedModel};
use serde_json::{json, Value};

const OPEN: u32 = 259;
const CLOSE: u32 = 260;

/// Qwen3's switch at the generation prompt, and its rendering of an earlier turn's reasoning,
/// as its template has them.
const TEMPLATE: &str = concat!(
    "{% for m in messages %}<|im_start|>{{ m.role }}\n",
    "{% if m.reasoning_content is string %}<think>\n{{ m.reasoning_content }}\n</think>\n\n",
    "{% endif %}{{ m.content }}<|im_end|>\n{% endfor %}",
    "<|im_start|>assistant\n",
    "{% if enable_thinking is defined and enable_thinking is false %}",
    "<think>\n\n</think>\n\n{% endif %}"
);

/// The default model with `<think>` (259) and `</think>` (260) as tokens of its vocabulary.
fn thinking_served() -> ServedModel {
    let mut served = default_served();
    let path = repo_dir().join("assets/tiny-qwen3/tokenizer.json");
    let mut tokenizer = tokenizers::Tokenizer::from_file(path).unwrap();
    let added = ["<think>", "</think>"].map(|t| tokenizers::AddedToken::from(t, false));
    tokenizer.add_tokens(added).unwrap();
    let tokenizer = TextTokenizer::from_tokenizer(tokenizer, Some(TEMPLATE.into()));
    assert_eq!(tokenizer.token_to_id("<think>"), Some(OPEN));
    assert_eq!(tokenizer.token_to_id("</think>"), Some(CLOSE));
    served.tokenizer = Some(Arc::new(tokenizer));
    served
}

fn server(parser: ReasoningParser) -> TestServer {
    let mut settings = config("tiny", 6, 4096, 4, 16);
    settings.stop_token_ids = vec![256];
    settings.reasoning_parser = Some(parser);
    TestServer::start(thinking_served(), settings)
}

fn chat(extra: Value) -> Value {
    let mut body = json!({"model": "tiny", "max_tokens": 48,
                          "messages": [{"role": "user", "content": "think, then answer"}]});
    for (key, value) in extra.as_object().unwrap() {
        body[key] = value.clone();
    }
    body
}

/// A streamed chat answer's reasoning and content, each its deltas joined.
async fn streamed(server: &TestServer, body: &Value) -> (String, String) {
    let mut body = body.clone();
    body["stream"] = json!(true);
    let (chunks, done) = read_stream(server.send("/v1/chat/completions", &body).await).await;
    assert!(done);
    let joined = |field: &str| -> String {
        chunks
            .iter()
            .filter_map(|c| c["choices"][0]["delta"][field].as_str())
            .collect()
    };
    (joined("reasoning_content"), joined("content"))
}

fn text(value: &Value) -> String {
    value.as_str().unwrap_or_default().to_owned()
}

/// Biases that make the model open a block first and close it now and then (the model never
/// saw these ids in training, and its logits put the closing tag several units above the
/// opening one).
fn thinking_biases() -> Value {
    json!({OPEN.to_string(): 20, CLOSE.to_string(): 10})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reasoning_is_answered_apart_and_a_stream_adds_up_to_the_same() {
    for parser in [ReasoningParser::Qwen3, ReasoningParser::DeepSeekR1] {
        let server = server(parser);
        let (mut reasoned, mut answered) = (0, 0);
        for seed in 0..8 {
            let body = chat(json!({"temperature": 1.0, "seed": seed,
                                   "logit_bias": thinking_biases()}));
            let (status, answer) = server.post("/v1/chat/completions", &body).await;
            assert_eq!(status, 200, "{answer}");
            let message = &answer["choices"][0]["message"];
            let reasoning = text(&message["reasoning_content"]);
            let content = text(&message["content"]);
            let usage = &answer["usage"];
            let counted = usage["completion_tokens_details"]["reasoning_tokens"].as_u64();
            let counted = counted.expect("reasoning tokens counted");
            assert!(
                counted <= usage["completion_tokens"].as_u64().unwrap(),
                "{usage}"
            );
            assert!(reasoning.is_empty() || counted > 0, "{answer}");
            reasoned += usize::from(!reasoning.is_empty());
            answered += usize::from(!reasoning.is_empty() && !content.is_empty());
            let split = (reasoning, content);
            assert_eq!(
                streamed(&server, &body).await,
                split,
                "{parser:?} seed {seed}"
            );
        }
        assert!(
            answered > 0,
            "{parser:?}: {reasoned} reasoned, {answered} also answered"
        );
    }
    // Qwen3 without a block: the text is all content.
    let server = server(ReasoningParser::Qwen3);
    let body = chat(json!({"temperature": 0, "max_tokens": 8,
                           "logit_bias": {OPEN.to_string(): -100}}));
    let (_, answer) = server.post("/v1/chat/completions", &body).await;
    let message = &answer["choices"][0]["message"];
    assert_eq!(message["reasoning_content"], Value::Null, "{answer}");
    assert!(!text(&message["content"]).is_empty(), "{answer}");
    let details = &answer["usage"]["completion_tokens_details"];
    assert_eq!(details["reasoning_tokens"], 0, "{answer}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_schema_holds_the_text_after_the_reasoning_and_speculation_changes_nothing() {
    let schema = json!({"type": "object", "properties": {"ok": {"type": "boolean"}},
                        "required": ["ok"]});
    let compiled = Schema::compile(&schema).unwrap();
    let format = json!({"type": "json_schema", "json_schema": {"name": "s", "schema": schema}});
    for parser in [ReasoningParser::Qwen3, ReasoningParser::DeepSeekR1] {
        let server = server(parser);
        let (mut reasoned, mut whole) = (0, 0);
        for seed in 0..6 {
            let mut answers = Vec::new();
            for algorithm in ["none", "ddtree"] {
                let body = chat(json!({"temperature": 1.0, "seed": seed, "max_tokens": 96,
                    "speculative": {"algorithm": algorithm}, "response_format": format,
                    "logit_bias": thinking_biases()}));
                let (status, answer) = server.post("/v1/chat/completions", &body).await;
                assert_eq!(status, 200, "{answer}");
                answers.push(answer["choices"][0].clone());
            }
            assert_eq!(answers[0], answers[1], "{parser:?} seed {seed}");
            let choice = &answers[0];
            let content = text(&choice["message"]["content"]);
            let mut state = Matcher::new(&compiled);
            assert!(state.feed(&compiled, content.as_bytes()), "{content:?}");
            if choice["finish_reason"] == "stop" {
                serde_json::from_str::<Value>(&content).expect("a whole value");
                whole += 1;
            }
            reasoned += usize::from(!text(&choice["message"]["reasoning_content"]).is_empty());
        }
        assert!(
            reasoned > 0 && whole > 0,
            "{parser:?}: {reasoned} reasoned, {whole} whole"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_template_reads_the_requests_variables_and_refuses_grove_s_own() {
    let server = server(ReasoningParser::Qwen3);
    let prompt_tokens = |answer: &Value| answer["usage"]["prompt_tokens"].as_u64().unwrap();
    let (_, thinking) = server
        .post("/v1/chat/completions", &chat(json!({"max_tokens": 1})))
        .await;
    let (status, quiet) = server
        .post(
            "/v1/chat/completions",
            &chat(json!({"max_tokens": 1, "chat_template_kwargs": {"enable_thinking": false}})),
        )
        .await;
    assert_eq!(status, 200, "{quiet}");
    // `<think>`, `\n\n`'s two bytes, `</think>` and two more.
    assert_eq!(prompt_tokens(&quiet), prompt_tokens(&thinking) + 6);
    // The server's defaults (`--chat-template-kwargs`), which a request overrides by name.
    let mut settings = config("tiny", 6, 4096, 4, 16);
    settings.chat_template_kwargs = json!({"enable_thinking": false})
        .as_object()
        .unwrap()
        .clone();
    let defaulted = TestServer::start(thinking_served(), settings);
    let (_, answer) = defaulted
        .post("/v1/chat/completions", &chat(json!({"max_tokens": 1})))
        .await;
    assert_eq!(prompt_tokens(&answer), prompt_tokens(&quiet));
    let body = chat(json!({"max_tokens": 1, "chat_template_kwargs": {"enable_thinking": true}}));
    let (_, answer) = defaulted.post("/v1/chat/completions", &body).await;
    assert_eq!(prompt_tokens(&answer), prompt_tokens(&thinking));
    for (kwargs, words) in [
        (json!({"messages": []}), "`messages`"),
        (
            json!({"add_generation_prompt": false}),
            "`add_generation_prompt`",
        ),
        (json!(["enable_thinking"]), "an object"),
    ] {
        let body = chat(json!({"chat_template_kwargs": kwargs}));
        let (status, answer) = server.post("/v1/chat/completions", &body).await;
        assert_eq!(status, 400, "{answer}");
        assert_eq!(answer["error"]["param"], "chat_template_kwargs", "{answer}");
        let message = answer["error"]["message"].as_str().unwrap();
        assert!(message.contains(words), "{message}");
    }
    // A schema after the block needs the tags as tokens.
    let mut settings = config("tiny", 6, 4096, 4, 16);
    settings.stop_token_ids = vec![256];
    settings.reasoning_parser = Some(ReasoningParser::DeepSeekR1);
    let untagged = TestServer::start(default_served(), settings);
    let body = chat(json!({"response_format": {"type": "json_object"}}));
    let (status, answer) = untagged.post("/v1/chat/completions", &body).await;
    assert_eq!(status, 400, "{answer}");
    assert_eq!(answer["error"]["param"], "response_format", "{answer}");
}

/// An assistant turn sent back with its `reasoning_content` gives the template that text, as
/// Qwen3's template reads it; without it the turn renders as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reasoning_sent_back_in_a_turn_reaches_the_template() {
    let server = server(ReasoningParser::Qwen3);
    let turns = |reasoning: Option<&str>| {
        let mut answer = json!({"role": "assistant", "content": "4"});
        if let Some(reasoning) = reasoning {
            answer["reasoning_content"] = json!(reasoning);
        }
        json!({"model": "tiny", "max_tokens": 1, "messages": [
            {"role": "user", "content": "2+2?"}, answer, {"role": "user", "content": "and 3+3?"}]})
    };
    let prompt_tokens = |answer: &Value| answer["usage"]["prompt_tokens"].as_u64().unwrap();
    let (status, without) = server.post("/v1/chat/completions", &turns(None)).await;
    assert_eq!(status, 200, "{without}");
    let (status, with) = server
        .post("/v1/chat/completions", &turns(Some("two and two")))
        .await;
    assert_eq!(status, 200, "{with}");
    let block = json!({"model": "tiny", "prompt": "<think>\ntwo and two\n</think>\n\n",
                       "add_special_tokens": false});
    let (status, counted) = server.post("/tokenize", &block).await;
    assert_eq!(status, 200, "{counted}");
    let block_tokens = counted["count"].as_u64().unwrap();
    assert_eq!(prompt_tokens(&with), prompt_tokens(&without) + block_tokens);
}
