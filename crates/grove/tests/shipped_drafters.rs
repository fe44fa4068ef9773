//! The drafters shipped in `assets/drafters/`: each complete (config, weights within 64 MiB,
//! manifest naming its target, README), and, where its target is installed
//! (`GROVE_MODELS_DIR`; CI installs only the 0.5B), found on its own and lossless: greedy
//! DFlash and DDTree give plain greedy's tokens, and seeded sampling gives seeded plain
//! sampling's.

use std::path::{Path, PathBuf};

use grove_model::drafter_manifest::DrafterManifest;
use grove_model::DFlashConfig;

const SHIPPED: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../assets/drafters");

fn shipped() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(SHIPPED)
        .expect("assets/drafters")
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.is_dir())
        .collect();
    dirs.sort();
    dirs
}

/// `key=value` of the fingerprint's shape string, as a number.
fn shape_number(shape: &str, key: &str) -> usize {
    shape
        .split_whitespace()
        .find_map(|part| part.strip_prefix(&format!("{key}=")))
        .unwrap_or_else(|| panic!("`{key}=` in {shape:?}"))
        .parse()
        .unwrap()
}

#[test]
fn every_shipped_drafter_is_complete_and_names_its_target() {
    let dirs = shipped();
    assert!(!dirs.is_empty(), "no drafter under {SHIPPED}");
    for dir in dirs {
        let manifest = DrafterManifest::read(&dir)
            .unwrap()
            .unwrap_or_else(|| panic!("{}: no grove-drafter.json", dir.display()));
        assert!(manifest.target.vocabulary.is_some(), "{}", dir.display());
        DrafterManifest::q8_0_products(&dir).unwrap();
        let config: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap())
                .unwrap();
        let config = DFlashConfig::from_json(&config, |_| None).unwrap();
        let shape = &manifest.target.shape;
        assert_eq!(config.layers.hidden_size, shape_number(shape, "hidden"));
        assert_eq!(
            config.num_target_layers,
            Some(shape_number(shape, "layers"))
        );
        let vocab = shape_number(shape, "vocab");
        assert!((config.mask_token_id as usize) < vocab);
        assert!(config.draft_vocab_size.is_some_and(|n| n < vocab));
        let weights = dir.join("model.safetensors");
        let bytes = std::fs::metadata(&weights).unwrap().len();
        assert!(bytes <= 64 << 20, "{}: {bytes} bytes", weights.display());
        assert!(dir.join("README.md").is_file(), "{}", dir.display());
    }
}

fn models_dir() -> PathBuf {
    std::env::var_os("GROVE_MODELS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../models")))
}

/// `grove generate --format json` on `model` with `extra` flags: the token ids and stderr.
fn generate(model: &Path, prompt: &str, extra: &[&str]) -> (serde_json::Value, String) {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_grove"))
        .args(["generate", "--model-path"])
        .arg(model)
        .args([
            "--prompt",
            prompt,
            "--max-new-tokens",
            "40",
            "--format",
            "json",
        ])
        .args(extra)
        .output()
        .expect("run grove");
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(output.status.success(), "{stderr}");
    let json: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    (json["token_ids"].clone(), stderr)
}

#[test]
fn the_shipped_drafter_of_an_installed_target_is_picked_and_lossless() {
    let model = models_dir().join("qwen2.5-coder-1.5b.gguf");
    if !model.is_file() {
        eprintln!(
            "skipped: {} is absent (python3 scripts/install_models.py qwen2.5-coder-1.5b)",
            model.display()
        );
        return;
    }
    let prompts = [
        "def quicksort(items):\n",
        "import json\n\n\ndef load_config(path):\n    \"\"\"Read a JSON file.\"\"\"\n",
        "class Counter:\n    def __init__(self):\n",
    ];
    let sampled = ["--temperature", "0.7", "--seed", "11"];
    for prompt in prompts {
        for sampling in [&[][..], &sampled[..]] {
            let (plain, _) = generate(&model, prompt, sampling);
            for algorithm in ["dflash", "ddtree"] {
                let mut extra = vec!["--speculative-algorithm", algorithm];
                extra.extend_from_slice(sampling);
                let (ids, stderr) = generate(&model, prompt, &extra);
                assert_eq!(ids, plain, "{algorithm} {sampling:?} on {prompt:?}");
                assert!(stderr.contains("qwen2.5-coder-1.5b"), "{stderr}");
            }
        }
    }
}
