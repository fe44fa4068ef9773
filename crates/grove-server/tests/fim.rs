//! Completions' `suffix`: fill-in-the-middle through the model's FIM tokens, the prompt laid
//! out prefix-suffix-middle exactly as a client sending those token ids would.

mod common;

use std::sync::Arc;

use candle_core::Device;
use common::*;
use grove_model::{Decoder, Model, TextTokenizer};
use grove_server::ServedModel;
use grove_testkit::random_checkpoint::byte_level_tokenizer_json;
use serde_json::json;

const FIM: [(&str, u32); 4] = [
    ("<|fim_prefix|>", 259),
    ("<|fim_suffix|>", 260),
    ("<|fim_middle|>", 261),
    ("<|fim_pad|>", 262),
];

/// The embedded default model with its byte-level tokenizer and Qwen2.5-Coder's FIM tokens.
fn fim_served() -> ServedModel {
    let dir = repo_dir().join("assets/tiny-qwen3");
    let target = Decoder::load(&dir, &Device::Cpu).unwrap();
    let mut tokenizer = byte_level_tokenizer_json();
    let added = tokenizer["added_tokens"].as_array_mut().unwrap();
    for (content, id) in FIM {
        added.push(
            json!({"id": id, "content": content, "single_word": false, "lstrip": false,
                          "rstrip": false, "normalized": false, "special": true}),
        );
    }
    let with_fim = tempfile::tempdir().unwrap();
    std::fs::write(
        with_fim.path().join("tokenizer.json"),
        tokenizer.to_string(),
    )
    .unwrap();
    ServedModel {
        model: Box::new(target) as Box<dyn Model>,
        drafter: None,
        tokenizer: Some(Arc::new(TextTokenizer::load(with_fim.path()).unwrap())),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_suffix_fills_the_middle_as_the_fim_token_ids_would() {
    let mut settings = config("tiny", 6, 1024, 4, 16);
    settings.engine.speculation = grove_engine::SpeculationSettings::default();
    let server = TestServer::start(fim_served(), settings);
    let (status, filled) = server
        .post(
            "/v1/completions",
            json!({"model": "tiny", "prompt": "def f(", "suffix": ")\n", "max_tokens": 6,
                   "temperature": 0, "return_token_ids": true}),
        )
        .await;
    assert_eq!(status, 200, "{filled}");
    let ids: Vec<u32> = [259]
        .into_iter()
        .chain("def f(".bytes().map(u32::from))
        .chain([260])
        .chain(")\n".bytes().map(u32::from))
        .chain([261])
        .collect();
    assert_eq!(filled["usage"]["prompt_tokens"], ids.len());
    let (_, by_ids) = server
        .post(
            "/v1/completions",
            json!({"model": "tiny", "prompt": ids, "max_tokens": 6, "temperature": 0,
                   "return_token_ids": true}),
        )
        .await;
    assert_eq!(
        filled["choices"][0]["token_ids"],
        by_ids["choices"][0]["token_ids"]
    );
    assert_eq!(filled["choices"][0]["text"], by_ids["choices"][0]["text"]);
    // At the start of a file: an empty prefix.
    let (status, answer) = server
        .post(
            "/v1/completions",
            json!({"model": "tiny", "prompt": "", "suffix": "x = 1\n", "max_tokens": 2}),
        )
        .await;
    assert_eq!(status, 200, "{answer}");
}
