//! Structured output on the embedded default pair (a trained target, its trained drafter and
//! its byte-level tokenizer): under a JSON Schema or JSON mode, DDTree, DFlash and lookup
//! drafts (ngram) emit what
//! plain decoding emits, greedy and seeded, and every text is one the schema allows (a whole
//! value where it stopped, a beginning of one where it ran out of tokens); `grove generate
//! --json-schema` holds its text to the schema in the file, and names what it cannot enforce.

use std::path::PathBuf;
use std::sync::Arc;

use candle_core::Device;
use grove_core::SamplingParams;
use grove_engine::structured::{Grammar, Matcher, Schema, TokenBytes};
use grove_engine::{
    Budget, DDTreeSpec, DFlashSpec, GenerateRequest, Generator, GeneratorOptions, SpecAlgorithm,
    SpeculationSettings,
};
use grove_model::{DFlashDrafter, Decoder, TextTokenizer};
use serde_json::{json, Value};

fn assets() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../assets/default")
}

fn schema() -> Value {
    json!({"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 12, "pattern": "^[a-z_][a-z0-9_]*$"},
        "lines": {"type": "integer", "minimum": 1, "maximum": 500},
        "kind": {"enum": ["function", "class", "module"]},
        "pure": {"type": "boolean"}
    }, "required": ["name", "lines", "kind", "pure"]})
}

#[test]
fn speculation_is_lossless_under_a_schema_and_the_text_keeps_to_it() {
    let target = Decoder::load(&assets().join("target"), &Device::Cpu).unwrap();
    let tokenizer = TextTokenizer::load(&assets().join("target")).unwrap();
    let resolve = |t: &str| tokenizer.token_to_id(t);
    let drafter =
        DFlashDrafter::load(&assets().join("drafter"), &target, resolve, &Device::Cpu).unwrap();
    let options = GeneratorOptions::default;
    let plain = Generator::new(&target, Some(&tokenizer), options());
    let dflash = Generator::new(&target, Some(&tokenizer), options())
        .with_dflash(DFlashSpec {
            drafter: &drafter,
            num_draft_tokens: drafter.config().block_size,
        })
        .unwrap();
    let ddtree = Generator::new(&target, Some(&tokenizer), options())
        .with_ddtree(DDTreeSpec {
            drafter: &drafter,
            budget: 8,
            top_k: 8,
        })
        .unwrap();
    let ngram = Generator::new(&target, Some(&tokenizer), options())
        .with_speculation(
            SpeculationSettings {
                algorithm: SpecAlgorithm::Ngram,
                budget: Some(Budget::Fixed(8)),
                ..Default::default()
            },
            None,
        )
        .unwrap();
    let vocab = Arc::new(TokenBytes::new(tokenizer.token_bytes()));
    let eos = tokenizer.eos_token_id().expect("an eos token");
    let grammars = [Schema::compile(&schema()).unwrap(), Schema::any_object()];
    let samplings = [
        SamplingParams::greedy(),
        SamplingParams {
            temperature: 0.8,
            top_k: 0,
            top_p: 0.95,
            seed: Some(9),
        },
    ];
    let (mut drafted, mut stopped, mut looked_up) = (0, 0, 0);
    for schema in grammars {
        let grammar = Grammar::new(schema, Arc::clone(&vocab));
        for sampling in &samplings {
            for prompt in ["# describe f as JSON\n", "def f(x):\n    return {"] {
                let mut request =
                    GenerateRequest::greedy(&tokenizer.encode(prompt, true).unwrap(), 64);
                request.sampling = sampling.clone();
                request.stop.stop_token_ids = vec![eos];
                request.grammar = Some(grammar.clone());
                let reference = plain.generate(&request, |_| {}).unwrap();
                for (method, generator) in [("dflash", &dflash), ("ddtree", &ddtree)] {
                    let output = generator.generate(&request, |_| {}).unwrap();
                    assert_eq!(
                        output.token_ids, reference.token_ids,
                        "{method} on {prompt:?}"
                    );
                    drafted += output.stats.tree_nodes;
                }
                let output = ngram.generate(&request, |_| {}).unwrap();
                assert_eq!(output.token_ids, reference.token_ids, "ngram on {prompt:?}");
                looked_up += output.stats.tree_nodes;
                let mut state = Matcher::new(&grammar.schema);
                assert!(
                    state.feed(&grammar.schema, reference.text.as_bytes()),
                    "{:?} leaves the schema",
                    reference.text
                );
                if reference.finish_reason == grove_core::FinishReason::Stop {
                    assert!(state.can_end(&grammar.schema), "{:?}", reference.text);
                    serde_json::from_str::<Value>(&reference.text).expect("a whole value");
                    stopped += 1;
                }
            }
        }
    }
    assert!(drafted > 0, "nothing was drafted");
    assert!(looked_up > 0, "nothing was looked up");
    assert!(stopped > 0, "no text ended in a whole value");
}

#[test]
fn generate_prints_a_value_of_the_schema_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("schema.json");
    std::fs::write(&path, schema().to_string()).unwrap();
    let grove = |extra: &[&str]| {
        let mut args = vec![
            "generate",
            "--prompt",
            "# f as JSON\n",
            "--max-new-tokens",
            "96",
        ];
        args.extend_from_slice(extra);
        std::process::Command::new(env!("CARGO_BIN_EXE_grove"))
            .args(args)
            .output()
            .unwrap()
    };
    let output = grove(&[
        "--json-schema",
        path.to_str().unwrap(),
        "--speculative-algorithm",
        "ddtree",
        "--format",
        "json",
    ]);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let answer: Value = serde_json::from_slice(&output.stdout).unwrap();
    let text = answer["text"].as_str().unwrap();
    let schema = Schema::compile(&schema()).unwrap();
    let mut state = Matcher::new(&schema);
    assert!(state.feed(&schema, text.as_bytes()), "{text:?}");
    // This small model indents deeply: its value may not end within the tokens asked for.
    if answer["finish_reason"] == "stop" {
        let value: Value = serde_json::from_str(text).unwrap();
        let keys: Vec<&str> = value
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        assert_eq!(keys, ["name", "lines", "kind", "pure"], "{text}");
    }
    std::fs::write(&path, r#"{"type": "integer", "multipleOf": 5}"#).unwrap();
    let refused = grove(&["--json-schema", path.to_str().unwrap()]);
    assert_eq!(refused.status.code(), Some(1));
    let message = String::from_utf8_lossy(&refused.stderr);
    assert!(message.contains("`multipleOf`"), "{message}");
}
