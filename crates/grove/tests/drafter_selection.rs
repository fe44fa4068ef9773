//! Which drafter `generate` speculates with when none is named: the one whose
//! `grove-drafter.json` names the loaded target, found under `GROVE_DRAFTERS_DIR` (the shipped
//! `assets/drafters/` by default); none found, or a named drafter made for another target, is a
//! clear error naming why.

use std::path::Path;
use std::process::Output;

use candle_core::Device;
use grove_model::drafter_manifest::{DrafterManifest, TargetFingerprint};
use grove_model::{Decoder, TextTokenizer};
use grove_testkit::{RandomCheckpoint, RandomDrafter};

const TINY_MODEL: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../assets/tiny-qwen3");
const TINY_MODEL_SEED: u64 = 20261129;

fn generate(drafters: &Path, extra: &[&str]) -> Output {
    let mut args = vec![
        "generate",
        "--model-path",
        TINY_MODEL,
        "--prompt-ids",
        "72,101,108,108,111",
        "--max-new-tokens",
        "16",
        "--format",
        "json",
    ];
    args.extend_from_slice(extra);
    std::process::Command::new(env!("CARGO_BIN_EXE_grove"))
        .args(&args)
        .env("GROVE_DRAFTERS_DIR", drafters)
        .env("RUST_BACKTRACE", "0")
        .output()
        .expect("run grove")
}

fn token_ids(output: &Output) -> serde_json::Value {
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let json: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    json["token_ids"].clone()
}

/// A random drafter for the tiny fixture under `dir`, with a manifest naming `target`.
fn drafter(dir: &Path, target: TargetFingerprint) {
    drafter_with_products(dir, target, None);
}

fn drafter_with_products(dir: &Path, target: TargetFingerprint, products: Option<&str>) {
    RandomDrafter::tiny(5)
        .write(&RandomCheckpoint::tiny_qwen3(TINY_MODEL_SEED), dir)
        .unwrap();
    DrafterManifest {
        target,
        target_name: "tiny-qwen3".into(),
        command: "test".into(),
        products: products.map(str::to_owned),
    }
    .write(dir)
    .unwrap();
}

#[test]
fn the_drafter_made_for_the_target_is_found_and_others_are_refused() {
    let root = tempfile::tempdir().unwrap();
    let drafters = root.path().join("drafters");
    std::fs::create_dir_all(&drafters).unwrap();
    let ddtree = ["--speculative-algorithm", "ddtree"];

    let output = generate(&drafters, &ddtree);
    let message = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(message.contains("no drafter in"), "{message}");

    let model = Decoder::load(Path::new(TINY_MODEL), &Device::Cpu).unwrap();
    let tokenizer = TextTokenizer::load(Path::new(TINY_MODEL)).unwrap();
    let here = TargetFingerprint::of(&model, Some(&tokenizer));
    let mut other = here.clone();
    other.shape = other.shape.replace("layers=", "layers=9");
    drafter(&drafters.join("a-other"), other);
    drafter(&drafters.join("b-this"), here);

    let plain = token_ids(&generate(&drafters, &[]));
    let found = generate(&drafters, &ddtree);
    assert!(String::from_utf8_lossy(&found.stderr).contains("b-this"));
    assert_eq!(token_ids(&found), plain);

    let other_path = drafters.join("a-other");
    let mut named = ddtree.to_vec();
    named.extend([
        "--speculative-draft-model-path",
        other_path.to_str().unwrap(),
    ]);
    let output = generate(&drafters, &named);
    let message = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(
        message.contains("trained for tiny-qwen3") && message.contains("layers=9"),
        "{message}"
    );
}

#[test]
fn a_drafter_run_in_q8_0_is_lossless_and_an_unknown_format_is_refused() {
    let root = tempfile::tempdir().unwrap();
    let drafters = root.path().join("drafters");
    let model = Decoder::load(Path::new(TINY_MODEL), &Device::Cpu).unwrap();
    let tokenizer = TextTokenizer::load(Path::new(TINY_MODEL)).unwrap();
    let here = TargetFingerprint::of(&model, Some(&tokenizer));
    drafter_with_products(&drafters.join("q8"), here.clone(), Some("q8_0"));
    let plain = token_ids(&generate(&drafters, &[]));
    for algorithm in ["dflash", "ddtree"] {
        let found = generate(&drafters, &["--speculative-algorithm", algorithm]);
        assert_eq!(token_ids(&found), plain, "{algorithm}");
    }

    let odd = root.path().join("odd");
    drafter_with_products(&odd.join("q4"), here, Some("q4_0"));
    let output = generate(&odd, &["--speculative-algorithm", "ddtree"]);
    let message = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(
        message.contains("`products`") && message.contains("q4_0"),
        "{message}"
    );
}
