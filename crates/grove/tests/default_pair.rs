//! The embedded default pair (`assets/default`): a trained target and its trained DFlash
//! drafter. Greedy DDTree and DFlash equal plain greedy decoding on code prompts, and the
//! drafter is a trained one: mean tau well above what a random drafter reaches. The tokens'
//! log-probabilities are plain decoding's too, and `grove generate --logprobs` prints them (and
//! takes the penalties).

use std::path::PathBuf;

use candle_core::Device;
use grove_engine::{DDTreeSpec, DFlashSpec, GenerateRequest, Generator, GeneratorOptions};
use grove_model::{DFlashDrafter, Decoder, TextTokenizer};

fn assets() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../assets/default")
}

const PROMPTS: [&str; 10] = [
    "def fibonacci(n):\n",
    "import os\nimport sys\n\n\ndef main():\n",
    "class Node:\n    def __init__(self, value):\n",
    "    for line in lines:\n",
    "def is_prime(n):\n    \"\"\"Return True if n is prime.\"\"\"\n",
    "    if not isinstance(key, str):\n        raise TypeError(",
    "def read_config(path):\n    with open(path) as f:\n",
    "    def __repr__(self):\n",
    "try:\n    import threading\nexcept ImportError:\n",
    "    return self._data[",
];

#[test]
fn ddtree_and_dflash_on_the_default_pair_are_lossless_with_a_trained_drafter() {
    let target = Decoder::load(&assets().join("target"), &Device::Cpu).unwrap();
    let tokenizer = TextTokenizer::load(&assets().join("target")).unwrap();
    let resolve = |t: &str| tokenizer.token_to_id(t);
    let drafter =
        DFlashDrafter::load(&assets().join("drafter"), &target, resolve, &Device::Cpu).unwrap();
    let block = drafter.config().block_size;
    let plain = Generator::new(&target, Some(&tokenizer), GeneratorOptions::default());
    let dflash = Generator::new(&target, Some(&tokenizer), GeneratorOptions::default())
        .with_dflash(DFlashSpec {
            drafter: &drafter,
            num_draft_tokens: block,
        })
        .unwrap();
    let ddtree = Generator::new(&target, Some(&tokenizer), GeneratorOptions::default())
        .with_ddtree(DDTreeSpec {
            drafter: &drafter,
            budget: 8,
            top_k: 8,
        })
        .unwrap();
    let (mut tokens, mut rounds) = (0, 0);
    for prompt in PROMPTS {
        let mut request = GenerateRequest::greedy(&tokenizer.encode(prompt, true).unwrap(), 48);
        request.logprobs = Some(3);
        let reference = plain.generate(&request, |_| {}).unwrap();
        let chain = dflash.generate(&request, |_| {}).unwrap();
        let tree = ddtree.generate(&request, |_| {}).unwrap();
        assert_eq!(chain.token_ids, reference.token_ids, "dflash on {prompt:?}");
        assert_eq!(tree.token_ids, reference.token_ids, "ddtree on {prompt:?}");
        assert_eq!(reference.logprobs.len(), reference.token_ids.len());
        assert_eq!(chain.logprobs, reference.logprobs, "dflash on {prompt:?}");
        assert_eq!(tree.logprobs, reference.logprobs, "ddtree on {prompt:?}");
        tokens += tree.stats.accept_lengths.iter().sum::<usize>();
        rounds += tree.stats.rounds;
    }
    let tau = tokens as f64 / rounds as f64;
    println!(
        "default pair, DDTree B=8: mean tau {tau:.2} over {} prompts",
        PROMPTS.len()
    );
    assert!(
        tau > 1.5,
        "mean tau {tau:.2}: the drafter is not a trained one"
    );
}

#[test]
fn generate_prints_log_probabilities_and_takes_penalties_when_asked() {
    let grove = |extra: &[&str]| {
        let mut args = vec!["generate", "--prompt", "def f(x):", "--max-new-tokens", "8"];
        args.extend_from_slice(extra);
        std::process::Command::new(env!("CARGO_BIN_EXE_grove"))
            .args(args)
            .output()
            .unwrap()
    };
    let output = grove(&[
        "--speculative-algorithm",
        "ddtree",
        "--logprobs",
        "2",
        "--format",
        "json",
    ]);
    assert!(output.status.success());
    let json: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let (ids, logprobs) = (
        json["token_ids"].as_array().unwrap(),
        json["logprobs"].as_array().unwrap(),
    );
    assert_eq!(logprobs.len(), ids.len());
    for (entry, id) in logprobs.iter().zip(ids) {
        assert_eq!(&entry["token"], id);
        assert!(entry["logprob"].as_f64().unwrap() <= 0.0);
        assert_eq!(entry["top"].as_array().unwrap().len(), 2);
    }
    let refused = grove(&["--logprobs", "21"]);
    assert!(!refused.status.success());
    let message = String::from_utf8_lossy(&refused.stderr);
    assert!(
        message.contains("--logprobs") && message.contains("21"),
        "{message}"
    );
    let penalized = grove(&["--presence-penalty", "-0.5", "--frequency-penalty", "1.5"]);
    assert!(penalized.status.success());
    let refused = grove(&["--frequency-penalty", "3"]);
    assert_eq!(refused.status.code(), Some(1));
    let message = String::from_utf8_lossy(&refused.stderr);
    assert!(
        message.contains("frequency_penalty") && message.contains("[-2, 2]"),
        "{message}"
    );
}
