//! The `grove` binary as a user runs it: JSON output on the golden target, the embedded
//! default model, `bench`, and bad input that must give a clear error and a non-zero exit,
//! never a panic.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

/// The byte-level random fixture (ids 0-255 are bytes).
const TINY_MODEL: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../assets/tiny-qwen3");

fn golden_dir() -> PathBuf {
    std::env::var_os("GROVE_GOLDEN_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/golden"))
}

fn grove(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_grove"))
        .args(args)
        .env("RUST_BACKTRACE", "0")
        .output()
        .expect("run grove")
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// The names of a bench report's methods, in its order.
fn method_names(report: &Value) -> Vec<&str> {
    report["methods"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["method"].as_str().unwrap())
        .collect()
}

/// Runs a command that must fail cleanly and returns its error text.
fn failure(args: &[&str]) -> String {
    let output = grove(args);
    let message = stderr(&output);
    assert!(!output.status.success(), "{args:?} succeeded");
    assert_eq!(output.status.code(), Some(1), "{args:?}: {message}");
    assert!(
        !message.contains("panicked"),
        "{args:?} panicked: {message}"
    );
    message
}

#[test]
fn generate_json_on_the_golden_target_matches_the_reference() {
    let (case, prompt) = golden_case(1);
    let case = &case;
    let target = golden_dir().join("target");
    let output = grove(&[
        "generate",
        "--model-path",
        target.to_str().unwrap(),
        "--prompt-ids",
        &prompt,
        "--max-new-tokens",
        "64",
        "--format",
        "json",
        "--page-size",
        "4",
    ]);
    assert!(output.status.success(), "{}", stderr(&output));
    let json: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(json["token_ids"], case["greedy_ar"]["new_tokens"]);
    assert_eq!(json["finish_reason"], "length");
    let stats = &json["stats"];
    assert_eq!(stats["prompt_tokens"], case["prompt_len"]);
    assert_eq!(stats["new_tokens"], 64);
    assert_eq!(stats["rounds"], 63);
    assert_eq!(stats["mean_accept_length"], 1.0);
    assert_eq!(stats["accept_lengths"].as_array().unwrap().len(), 63);
    assert!(stats["decode_tokens_per_s"].as_f64().unwrap() > 0.0);
    assert!(stats["prefill_tokens_per_s"].as_f64().unwrap() > 0.0);
    // The report names the kernels: the level, the quantized products' kernel and the
    // arithmetic of bfloat16 weights' products (bf16 dot only at AVX-512 on AVX-512 BF16).
    let kernels = &json["kernels"];
    let level = kernels["level"].as_str().unwrap();
    assert!(
        ["scalar", "avx2", "avx512", "amx"].contains(&level),
        "{kernels}"
    );
    assert!(kernels["quantized"].is_string(), "{kernels}");
    let bf16 = kernels["dense_bf16"].as_str().unwrap();
    let avx512 = level == "avx512" || level == "amx";
    assert!(bf16 == "f32" || (bf16 == "bf16 dot" && avx512), "{kernels}");
    // Where the VNNI kernel multiplies, where it adds Q6_K's zero point on this CPU.
    let q6k = kernels.get("q6k_zero_point").and_then(Value::as_str);
    match kernels["quantized"].as_str() {
        Some("avx512-vnni") => assert!(
            matches!(q6k, Some("per super-block" | "sub-block start")),
            "{kernels}"
        ),
        _ => assert_eq!(q6k, None, "{kernels}"),
    }
    // On an AMX CPU start-up ran the tiles' trial in a child process: it must have run (and
    // found the tiles' bits the VNNI kernel's); elsewhere there is no trial to report.
    let forced = std::env::var("GROVE_KERNEL").is_ok_and(|v| !v.trim().is_empty());
    match (level, forced) {
        ("amx", false) => {
            let tiles = &kernels["amx_tiles"];
            assert_eq!(tiles["agrees"], true, "{kernels}");
            assert_eq!(
                tiles["formats"].as_array().map(Vec::len),
                Some(4),
                "{kernels}"
            );
        }
        ("amx", true) => assert_eq!(kernels["amx_tiles"]["forced"], true, "{kernels}"),
        _ => assert!(kernels.get("amx_tiles").is_none(), "{kernels}"),
    }
    if level != "scalar" {
        let output = Command::new(env!("CARGO_BIN_EXE_grove"))
            .args(["generate", "--model-path", target.to_str().unwrap()])
            .args([
                "--prompt-ids",
                &prompt,
                "--max-new-tokens",
                "2",
                "--format",
                "json",
            ])
            .env("GROVE_KERNEL", "avx2")
            .output()
            .expect("run grove");
        assert!(output.status.success(), "{}", stderr(&output));
        let json: Value = serde_json::from_slice(&output.stdout).unwrap();
        let kernels = &json["kernels"];
        assert_eq!(kernels["level"], "avx2", "{kernels}");
        assert_eq!(kernels["dense_bf16"], "f32", "{kernels}");
    }
}

#[test]
fn the_embedded_default_pair_generates_text_and_chat() {
    // The README's main command: DDTree with the default pair's own drafter.
    let output = grove(&[
        "generate",
        "--prompt",
        "def fib(n):",
        "--max-new-tokens",
        "12",
        "--ignore-eos",
        "--speculative-algorithm",
        "ddtree",
    ]);
    assert!(output.status.success(), "{}", stderr(&output));
    let log = stderr(&output);
    assert!(
        log.contains("12 new tokens") && log.contains("tau"),
        "{log}"
    );
    let output = grove(&[
        "generate",
        "--model-path",
        TINY_MODEL,
        "--prompt",
        "hi",
        "--chat",
        "--max-new-tokens",
        "4",
        "--format",
        "json",
        "--temperature",
        "0.7",
        "--seed",
        "1",
    ]);
    assert!(output.status.success(), "{}", stderr(&output));
    let json: Value = serde_json::from_slice(&output.stdout).unwrap();
    // "<|im_start|>" "user\n" "hi" "<|im_end|>" "\n" "<|im_start|>" "assistant\n": special
    // tokens are one id each, the rest one id per byte.
    assert_eq!(json["stats"]["prompt_tokens"], 1 + 5 + 2 + 1 + 1 + 1 + 10);
}

/// `--speculative-algorithm ngram` needs no drafter: on a prompt that repeats itself it drafts
/// from the prompt, and prints what plain decoding prints; its flags are checked by name.
#[test]
fn ngram_drafts_from_the_text_without_a_drafter_and_prints_plain_decodings_text() {
    let prompt = "def area(w, h):\n    return w * h\n\n\ndef area(w, h):\n";
    let run = |extra: &[&str]| {
        let mut args = vec![
            "generate",
            "--prompt",
            prompt,
            "--max-new-tokens",
            "24",
            "--format",
            "json",
        ];
        args.extend_from_slice(extra);
        grove(&args)
    };
    let plain = run(&[]);
    assert!(plain.status.success(), "{}", stderr(&plain));
    let plain: Value = serde_json::from_slice(&plain.stdout).unwrap();
    let ngram = run(&[
        "--speculative-algorithm",
        "ngram",
        "--speculative-ngram-min-match",
        "1",
        "--speculative-ngram-max-match",
        "3",
    ]);
    assert!(ngram.status.success(), "{}", stderr(&ngram));
    let ngram: Value = serde_json::from_slice(&ngram.stdout).unwrap();
    assert_eq!(ngram["text"], plain["text"]);
    assert_eq!(ngram["stats"]["algorithm"], "ngram");
    assert!(
        ngram["stats"]["tree_nodes"].as_u64().unwrap() > 0,
        "{ngram}"
    );
    let refused = run(&[
        "--speculative-algorithm",
        "ngram",
        "--speculative-ngram-min-match",
        "3",
        "--speculative-ngram-max-match",
        "2",
    ]);
    assert_eq!(refused.status.code(), Some(1));
    assert!(
        stderr(&refused).contains("speculative_ngram_max_match"),
        "{}",
        stderr(&refused)
    );
}

/// `tiny-model --gguf` writes the checkpoint twice, as safetensors and as an F32 GGUF file,
/// and both generate the same greedy tokens, whichever KV cache each keeps (f32 for the
/// checkpoint, f16 for the file unless `--kv-cache-dtype` says otherwise; bf16 on request).
#[test]
fn tiny_model_writes_a_gguf_file_that_generates_what_its_checkpoint_does() {
    let dir = tempfile::tempdir().unwrap();
    let (out, gguf) = (dir.path().join("tiny"), dir.path().join("tiny.gguf"));
    let (out, gguf) = (out.to_str().unwrap(), gguf.to_str().unwrap());
    let output = grove(&["tiny-model", "--out", out, "--seed", "5", "--gguf", gguf]);
    assert!(output.status.success(), "{}", stderr(&output));
    let tokens = |model: &str, cache: &str, expected_cache: &str| -> Value {
        let output = grove(&[
            "generate",
            "--model-path",
            model,
            "--prompt-ids",
            "10,200,30,45",
            "--max-new-tokens",
            "8",
            "--ignore-eos",
            "--kv-cache-dtype",
            cache,
            "--format",
            "json",
        ]);
        assert!(output.status.success(), "{}", stderr(&output));
        let json: Value = serde_json::from_slice(&output.stdout).unwrap();
        assert_eq!(json["kv_cache_dtype"], expected_cache, "{model} {cache}");
        json["token_ids"].clone()
    };
    let from_safetensors = tokens(out, "auto", "f32");
    assert_eq!(from_safetensors.as_array().map(Vec::len), Some(8));
    assert_eq!(tokens(gguf, "auto", "f16"), from_safetensors);
    assert_eq!(tokens(gguf, "f32", "f32"), from_safetensors);
    assert_eq!(tokens(out, "F16", "f16"), from_safetensors);
    // bfloat16 keeps 8 bits of each value: it may round a random model's greedy choice
    // another way, but it generates, and says which cache it kept.
    assert_eq!(
        tokens(gguf, "bf16", "bf16").as_array().map(Vec::len),
        Some(8)
    );
    // A usage error (clap's exit code 2) naming the flag and the values it takes.
    let refused = grove(&["generate", "--kv-cache-dtype", "q8_0", "--prompt", "x"]);
    let message = stderr(&refused);
    assert_eq!(refused.status.code(), Some(2), "{message}");
    assert!(
        message.contains("--kv-cache-dtype") && message.contains("auto, f32, f16, bf16"),
        "{message}"
    );
}

/// Without `--max-new-tokens`, generation runs until a stop token or the full context (as
/// llama.cpp's `-n -1`), and the stats line says which cut it.
#[test]
fn generate_defaults_to_the_context_and_says_why_it_stopped() {
    let output = grove(&["generate", "--prompt", "def fib(n):", "--ignore-eos"]);
    assert!(output.status.success(), "{}", stderr(&output));
    let log = stderr(&output);
    // The default pair's context is 1024 tokens; the prompt is 6 of them.
    assert!(
        log.contains("1018 new tokens") && log.contains("finish=length (cut: the context is full)"),
        "{log}"
    );
    let output = grove(&[
        "generate",
        "--prompt",
        "def fib(n):",
        "--max-new-tokens",
        "3",
    ]);
    let log = stderr(&output);
    assert!(
        log.contains("finish=length (cut at --max-new-tokens)"),
        "{log}"
    );
    assert!(log.contains("tokens accepted per round (tau)"), "{log}");
}

#[test]
fn chat_template_flag_replaces_the_models_template_and_bad_ones_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let chat = |template: &Path| {
        vec![
            "generate".to_string(),
            "--model-path".into(),
            TINY_MODEL.into(),
            "--prompt".into(),
            "hi".into(),
            "--chat".into(),
            "--max-new-tokens".into(),
            "2".into(),
            "--format".into(),
            "json".into(),
            "--chat-template".into(),
            template.to_str().unwrap().into(),
        ]
    };
    fn args(v: &[String]) -> Vec<&str> {
        v.iter().map(String::as_str).collect()
    }
    write(
        dir.path(),
        "brackets.jinja",
        "{% for m in messages %}[{{ m.content }}]{% endfor %}",
    );
    let output = grove(&args(&chat(&dir.path().join("brackets.jinja"))));
    assert!(output.status.success(), "{}", stderr(&output));
    let json: Value = serde_json::from_slice(&output.stdout).unwrap();
    // "[hi]": four byte ids, none of the model's own ChatML markers.
    assert_eq!(json["stats"]["prompt_tokens"], 4);

    let missing = failure(&args(&chat(&dir.path().join("absent.jinja"))));
    assert!(
        missing.contains("--chat-template") && missing.contains("absent.jinja"),
        "{missing}"
    );
    write(dir.path(), "broken.jinja", "{% for m in messages %}");
    let broken = failure(&args(&chat(&dir.path().join("broken.jinja"))));
    assert!(
        broken.contains("--chat-template") && broken.contains("chat template"),
        "{broken}"
    );
}

#[test]
fn bench_prints_the_verify_cost_curve() {
    let target = golden_dir().join("target");
    let output = grove(&[
        "bench",
        "--model-path",
        target.to_str().unwrap(),
        "--prompt-tokens",
        "16",
        "--new-tokens",
        "8",
        "--repetitions",
        "2",
        "--context",
        "32",
        "--rows",
        "1,2,4,8",
    ]);
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(stderr(&output).contains("verify cost after 32 tokens"));
    let json: Value = serde_json::from_slice(&output.stdout).unwrap();
    let curve = json["verify_cost"].as_array().unwrap();
    assert_eq!(curve.len(), 4);
    // Each point's ratio is its median time over the one-row median, measured in this run.
    let ms = |point: &Value| point["ms"]["median"].as_f64().unwrap();
    let one_row = ms(&curve[0]);
    assert!(one_row > 0.0, "{json}");
    for (point, rows) in curve.iter().zip([1, 2, 4, 8]) {
        assert_eq!(point["rows"], rows);
        let ratio = point["ratio_to_one_row"].as_f64().unwrap();
        assert!((ratio - ms(point) / one_row).abs() < 1e-9, "{point}");
        assert!(point["ms"]["min"].as_f64().unwrap() <= ms(point));
    }
    assert!(
        json["methods"][0]["decode_tokens_per_s"]["median"]
            .as_f64()
            .unwrap()
            > 0.0
    );
}

/// `bench --speculative-algorithm ngram` measures lookup drafts at each budget beside plain
/// decoding, without a drafter (no DFlash column to compare with).
#[test]
fn bench_compares_none_and_lookup_budgets_without_a_drafter() {
    let output = grove(&[
        "bench",
        "--speculative-algorithm",
        "ngram",
        "--budgets",
        "4,auto",
        "--new-tokens",
        "16",
        "--repetitions",
        "1",
        "--rows",
        "1",
    ]);
    assert!(output.status.success(), "{}", stderr(&output));
    let json: Value = serde_json::from_slice(&output.stdout).unwrap();
    let names = method_names(&json);
    assert_eq!(names, ["none", "ngram-b4", "ngram-auto"]);
    assert!(json["methods"][1]["decode_speedup_vs_dflash"].is_null());
}

#[test]
fn bench_compares_none_and_dflash_in_one_run() {
    let target = golden_dir().join("target");
    let drafter = golden_dir().join("drafter");
    let output = grove(&[
        "bench",
        "--model-path",
        target.to_str().unwrap(),
        "--speculative-algorithm",
        "dflash",
        "--speculative-draft-model-path",
        drafter.to_str().unwrap(),
        "--prompt-tokens",
        "16",
        "--new-tokens",
        "32",
        "--repetitions",
        "2",
        "--context",
        "32",
        "--rows",
        "1,8",
    ]);
    assert!(output.status.success(), "{}", stderr(&output));
    let json: Value = serde_json::from_slice(&output.stdout).unwrap();
    let methods = json["methods"].as_array().unwrap();
    assert_eq!(methods.len(), 2);
    assert_eq!(methods[0]["method"], "none");
    assert_eq!(methods[0]["mean_accept_length"], 1.0);
    assert_eq!(methods[1]["method"], "dflash");
    assert!(
        methods[1]["mean_accept_length"].as_f64().unwrap() > 1.5,
        "{}",
        methods[1]
    );
    assert!(stderr(&output).contains("decode x none"));
}

#[test]
fn generate_with_dflash_on_the_golden_pair_is_lossless_and_reports_rounds() {
    let (case, prompt) = golden_case(2);
    let case = &case;
    let (target, drafter) = (golden_dir().join("target"), golden_dir().join("drafter"));
    let output = grove(&[
        "generate",
        "--model-path",
        target.to_str().unwrap(),
        "--prompt-ids",
        &prompt,
        "--speculative-algorithm",
        "DFLASH",
        "--speculative-draft-model-path",
        drafter.to_str().unwrap(),
        // The reference's block (the default chooses the length each round).
        "--speculative-num-draft-tokens",
        "8",
        "--max-new-tokens",
        "64",
        "--format",
        "json",
    ]);
    assert!(output.status.success(), "{}", stderr(&output));
    let json: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(json["token_ids"], case["greedy_ar"]["new_tokens"]);
    let stats = &json["stats"];
    assert_eq!(
        stats["accept_lengths"].as_array().unwrap().len(),
        case["dflash"]["num_rounds"].as_u64().unwrap() as usize
    );
    assert_eq!(stats["accepted_per_position"].as_array().unwrap().len(), 7);
    for field in ["t_draft_us", "t_verify_us", "t_commit_us"] {
        assert!(stats[field].as_u64().unwrap() > 0, "{field}");
    }
    let shorter = grove(&[
        "generate",
        "--model-path",
        target.to_str().unwrap(),
        "--prompt-ids",
        &prompt,
        "--speculative-algorithm",
        "dflash",
        "--speculative-draft-model-path",
        drafter.to_str().unwrap(),
        "--speculative-num-draft-tokens",
        "4",
        "--max-new-tokens",
        "64",
        "--format",
        "json",
    ]);
    let shorter: Value = serde_json::from_slice(&shorter.stdout).unwrap();
    assert_eq!(shorter["token_ids"], case["greedy_ar"]["new_tokens"]);
    assert!(shorter["stats"]["accept_lengths"]
        .as_array()
        .unwrap()
        .iter()
        .all(|t| t.as_u64().unwrap() <= 4));
}

/// Golden case `index` and its prompt as `--prompt-ids` text.
fn golden_case(index: usize) -> (Value, String) {
    let cases: Value =
        serde_json::from_str(&std::fs::read_to_string(golden_dir().join("cases.json")).unwrap())
            .unwrap();
    let case = cases["cases"][index].clone();
    let prompt: Vec<String> = case["prompt"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.to_string())
        .collect();
    (case, prompt.join(","))
}

fn write(dir: &Path, name: &str, text: &str) {
    std::fs::write(dir.join(name), text).unwrap();
}

#[test]
fn bad_input_gives_a_clear_error_and_exit_code_one() {
    let ids = ["--prompt-ids", "1,2,3"];
    let missing = failure(
        &[
            &["generate", "--model-path", "/nonexistent/model"],
            &ids[..],
        ]
        .concat(),
    );
    assert!(missing.contains("/nonexistent/model"), "{missing}");

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_str().unwrap();
    let no_config = failure(&[&["generate", "--model-path", path], &ids[..]].concat());
    assert!(no_config.contains("config.json"), "{no_config}");

    write(dir.path(), "config.json", "{ not json");
    let malformed = failure(&[&["generate", "--model-path", path], &ids[..]].concat());
    assert!(malformed.contains("invalid config"), "{malformed}");

    write(
        dir.path(),
        "config.json",
        r#"{"model_type": "mamba", "vocab_size": 10}"#,
    );
    let unknown = failure(&[&["generate", "--model-path", path], &ids[..]].concat());
    assert!(
        unknown.contains("model_type") && unknown.contains("mamba"),
        "{unknown}"
    );

    let golden = golden_dir().join("target");
    let golden = golden.to_str().unwrap();
    write(
        dir.path(),
        "config.json",
        &std::fs::read_to_string(golden_dir().join("target/config.json")).unwrap(),
    );
    let no_weights = failure(&[&["generate", "--model-path", path], &ids[..]].concat());
    assert!(no_weights.contains("model.safetensors"), "{no_weights}");

    let long_prompt = vec!["7"; 1000].join(",");
    let too_long = failure(&[
        "generate",
        "--model-path",
        golden,
        "--prompt-ids",
        &long_prompt,
        "--max-new-tokens",
        "64",
    ]);
    assert!(too_long.contains("context of 1024"), "{too_long}");

    let no_tokenizer = failure(&["generate", "--model-path", golden, "--prompt", "hello"]);
    assert!(
        no_tokenizer.contains("tokenizer.json") && no_tokenizer.contains("--prompt-ids"),
        "{no_tokenizer}"
    );

    let bad_top_p = failure(&[
        "generate",
        "--model-path",
        golden,
        "--prompt-ids",
        "1",
        "--top-p",
        "1.5",
    ]);
    assert!(bad_top_p.contains("top_p"), "{bad_top_p}");

    let no_drafter = failure(&[
        "generate",
        "--model-path",
        golden,
        "--prompt-ids",
        "1",
        "--speculative-algorithm",
        "dflash",
    ]);
    assert!(
        no_drafter.contains("--speculative-draft-model-path"),
        "{no_drafter}"
    );
    let drafter = golden_dir().join("drafter");
    let drafter = drafter.to_str().unwrap();
    let spec = [
        "--speculative-algorithm",
        "dflash",
        "--speculative-draft-model-path",
        drafter,
    ];
    let too_many = failure(
        &[
            &[
                "generate",
                "--model-path",
                golden,
                "--prompt-ids",
                "1",
                "--speculative-num-draft-tokens",
                "9",
            ],
            &spec[..],
        ]
        .concat(),
    );
    assert!(
        too_many.contains("speculative_num_draft_tokens"),
        "{too_many}"
    );
    let wrong_target = failure(&[&["generate", "--prompt-ids", "1"], &spec[..]].concat());
    assert!(
        wrong_target.contains("does not fit the target"),
        "{wrong_target}"
    );

    let out_of_vocab = failure(&["generate", "--model-path", golden, "--prompt-ids", "1,5000"]);
    assert!(
        out_of_vocab.contains("5000") && out_of_vocab.contains("1024"),
        "{out_of_vocab}"
    );
}

#[test]
fn generate_with_ddtree_matches_the_reference_and_bench_sweeps_budgets() {
    let (case, prompt) = golden_case(3);
    let case = &case;
    let (target, drafter) = (golden_dir().join("target"), golden_dir().join("drafter"));
    let (target, drafter) = (target.to_str().unwrap(), drafter.to_str().unwrap());
    let output = grove(&[
        "generate",
        "--model-path",
        target,
        "--prompt-ids",
        &prompt,
        "--speculative-algorithm",
        "ddtree",
        "--speculative-draft-model-path",
        drafter,
        "--speculative-ddtree-budget",
        "16",
        "--tp-size",
        "3",
        "--max-new-tokens",
        "64",
        "--format",
        "json",
        "--page-size",
        "16",
    ]);
    assert!(output.status.success(), "{}", stderr(&output));
    let json: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(json["token_ids"], case["ddtree"]["16"]["new_tokens"]);
    let stats = &json["stats"];
    let rounds = stats["rounds"].as_u64().unwrap();
    assert!(stats["tree_nodes"].as_u64().unwrap() <= 16 * rounds);
    let histogram: u64 = stats["accepted_depth_histogram"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .sum();
    assert_eq!(histogram, rounds);
    assert!(stats["t_tree_build_us"].is_u64());

    let bench = grove(&[
        "bench",
        "--model-path",
        target,
        "--speculative-algorithm",
        "ddtree",
        "--speculative-draft-model-path",
        drafter,
        "--budgets",
        "2,8,auto",
        "--prompt-tokens",
        "8",
        "--new-tokens",
        "16",
        "--repetitions",
        "1",
        "--context",
        "16",
        "--rows",
        "1",
    ]);
    assert!(bench.status.success(), "{}", stderr(&bench));
    let json: Value = serde_json::from_slice(&bench.stdout).unwrap();
    let names = method_names(&json);
    assert_eq!(
        names,
        ["none", "dflash", "ddtree-b2", "ddtree-b8", "ddtree-auto"]
    );
    // Each ratio is the method's median over the baseline's, measured in the same run.
    let median = |m: &Value| m["decode_tokens_per_s"]["median"].as_f64().unwrap();
    let methods = json["methods"].as_array().unwrap();
    let (none, dflash) = (median(&methods[0]), median(&methods[1]));
    assert!(none > 0.0 && dflash > 0.0, "{json}");
    for method in methods {
        let ratio = |key: &str| method[key].as_f64().unwrap();
        assert!((ratio("decode_speedup_vs_none") - median(method) / none).abs() < 1e-9);
        assert!((ratio("decode_speedup_vs_dflash") - median(method) / dflash).abs() < 1e-9);
        assert!(ratio("mean_accept_length") >= 1.0, "{method}");
    }
    // A tree never verifies more nodes than its budget.
    assert!(methods[2]["mean_tree_nodes"].as_f64().unwrap() <= 2.0);
    assert!(methods[3]["mean_tree_nodes"].as_f64().unwrap() <= 8.0);
    // The automatic budget's measured cost table: the startup measurement's rows at least.
    let verify = json["auto_budget"]["verify"].as_array().unwrap();
    assert!(verify.len() >= 4, "{json}");
    assert!(
        verify.iter().all(|c| c["ms"].as_f64().unwrap() > 0.0),
        "{json}"
    );
    assert!(
        !json["auto_budget"]["draft"].as_array().unwrap().is_empty(),
        "{json}"
    );

    let zero = failure(&[
        "generate",
        "--model-path",
        target,
        "--prompt-ids",
        "1",
        "--speculative-algorithm",
        "ddtree",
        "--speculative-draft-model-path",
        drafter,
        "--speculative-ddtree-budget",
        "0",
    ]);
    assert!(zero.contains("speculative_ddtree_budget"), "{zero}");
}

#[test]
fn bench_report_writes_json_and_charts() {
    let dir = tempfile::tempdir().unwrap();
    let drafter = dir.path().join("drafter");
    grove_testkit::random_checkpoint::RandomDrafter::tiny(3)
        .write(
            &grove_testkit::random_checkpoint::RandomCheckpoint::tiny_qwen3(0),
            &drafter,
        )
        .unwrap();
    // A report of `budgets` into `out`.
    let run_report = |budgets: &str, out: &std::path::Path| {
        grove(&[
            "bench",
            "--model-path",
            TINY_MODEL,
            "--speculative-algorithm",
            "ddtree",
            "--speculative-draft-model-path",
            drafter.to_str().unwrap(),
            "--budgets",
            budgets,
            "--new-tokens",
            "8",
            "--repetitions",
            "1",
            "--threads",
            "1",
            "--report",
            out.to_str().unwrap(),
        ])
    };
    let out = dir.path().join("report");
    let output = run_report("1,4", &out);
    assert!(output.status.success(), "{}", stderr(&output));
    let report: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("report.json")).unwrap()).unwrap();
    let methods = method_names(&report);
    assert_eq!(
        methods,
        ["none", "dflash", "dflash-auto", "ddtree-b1", "ddtree-b4"]
    );
    // Speedups are medians over plain decoding's; tau is the histogram's mean.
    let results = report["methods"].as_array().unwrap();
    let median = |m: &Value| m["decode_tokens_per_s"]["median"].as_f64().unwrap();
    let none = median(&results[0]);
    assert!(none > 0.0, "{report}");
    for method in results {
        let speedup = method["speedup_vs_none"].as_f64().unwrap();
        assert!((speedup - median(method) / none).abs() < 1e-9, "{method}");
        let histogram: Vec<u64> = method["accept_histogram"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n.as_u64().unwrap())
            .collect();
        let rounds: u64 = histogram.iter().sum();
        let tokens: u64 = histogram.iter().zip(1..).map(|(n, tau)| n * tau).sum();
        assert!(rounds > 0, "{method}");
        let tau = method["mean_accept_length"].as_f64().unwrap();
        assert!(
            (tau - tokens as f64 / rounds as f64).abs() < 1e-9,
            "{method}"
        );
    }
    // Plain decoding emits one token a round.
    assert_eq!(results[0]["mean_accept_length"], 1.0);
    if stderr(&output).contains("charts skipped") {
        eprintln!("skipped the chart check: {}", stderr(&output));
    } else {
        for chart in ["budget.png", "acceptance.png"] {
            let bytes = std::fs::read(out.join(chart)).unwrap();
            assert!(bytes.starts_with(b"\x89PNG"), "{chart} is not a PNG");
        }
    }
    // The automatic budget alone: its charts take it where no fixed budget ran.
    let auto_out = dir.path().join("report-auto");
    let output = run_report("auto", &auto_out);
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(auto_out.join("report.json").exists());
}

/// The trial start-up runs on AMX CPUs (`grove kernel-trial`, hidden): its JSON where the CPU
/// has tiles, else an error saying there are none.
#[test]
fn the_tiles_trial_runs_where_there_are_tiles_and_says_so_where_not() {
    let output = grove(&["kernel-trial"]);
    if !output.status.success() {
        let log = stderr(&output);
        assert!(log.contains("gives no AMX tiles"), "{log}");
        let required = std::env::var("GROVE_REQUIRE_AMX").as_deref() == Ok("1");
        assert!(
            !required,
            "GROVE_REQUIRE_AMX=1 but the trial found no tiles: {log}"
        );
        return;
    }
    let json: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(json["agrees"], true, "{json}");
    let tried = grove_kernels::quant::amx_trial::TRIED_ROWS;
    for format in json["formats"].as_array().unwrap() {
        let rows: Vec<u64> = (format["times"].as_array().unwrap().iter())
            .map(|time| time[0].as_u64().unwrap())
            .collect();
        assert_eq!(rows, tried.map(|r| r as u64), "{json}");
    }
}
