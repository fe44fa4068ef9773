//! The cost of one structured-output mask (`Grammar::mask`) over a real vocabulary, in the
//! states a JSON text passes through: before the value, inside a string, after a key's colon,
//! after a value. Qwen2.5's 151665-token GGUF vocabulary when installed
//! (`$GROVE_MODELS_DIR/qwen2.5-coder-0.5b-instruct.gguf`), else the embedded default's.
//! `cargo bench -p grove-engine --bench structured`.

use std::path::PathBuf;
use std::sync::Arc;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use grove_engine::structured::{Grammar, Schema, TokenBytes};
use grove_model::gguf::GgufFile;
use grove_model::tokenizer::TextTokenizer;
use serde_json::json;

fn vocabulary() -> (String, Arc<TokenBytes>) {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let models = std::env::var_os("GROVE_MODELS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("models"));
    let qwen = models.join("qwen2.5-coder-0.5b-instruct.gguf");
    let (name, tokenizer) = match GgufFile::open(&qwen).and_then(|f| f.tokenizer()) {
        Ok(tokenizer) => ("qwen2.5", tokenizer),
        Err(_) => (
            "default",
            TextTokenizer::load(&root.join("assets/default/target")).expect("the default pair"),
        ),
    };
    let bytes = TokenBytes::new(tokenizer.token_bytes());
    (format!("{name}_{}", bytes.len()), Arc::new(bytes))
}

fn mask(c: &mut Criterion) {
    let (name, vocab) = vocabulary();
    let schema = Schema::compile(&json!({"type": "object", "properties": {
        "name": {"type": "string", "pattern": "^[A-Z][a-z]+( [A-Z][a-z]+)*$"},
        "age": {"type": "integer"},
        "tags": {"type": "array", "items": {"type": "string"}}
    }, "required": ["name", "age", "tags"]}))
    .unwrap();
    let mut group = c.benchmark_group(format!("mask_{name}"));
    for (grammar_name, grammar) in [
        (
            "json_object",
            Grammar::new(Schema::any_object(), Arc::clone(&vocab)),
        ),
        ("schema", Grammar::new(schema, Arc::clone(&vocab))),
    ] {
        for (state_name, text) in [
            ("start", ""),
            ("in_string", "{\"name\": \"Ada Lo"),
            ("in_string_after_space", "{\"name\": \"Ada "),
            ("after_colon", "{\"name\": \"Ada\", \"age\":"),
            ("after_value", "{\"name\": \"Ada\", \"age\": 36"),
        ] {
            let mut state = grammar.start();
            assert!(state.feed(&grammar.schema, text.as_bytes()), "{text}");
            let mut allowed = vec![false; vocab.len()];
            group.bench_with_input(
                BenchmarkId::new(grammar_name, state_name),
                &state,
                |b, state| b.iter(|| grammar.mask(state, &[0], &mut allowed)),
            );
        }
    }
    group.finish();
}

criterion_group!(benches, mask);
criterion_main!(benches);
