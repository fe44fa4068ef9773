//! `grove bench --compare-llama-cpp`: grove against llama.cpp on the same GGUF file, prompt and
//! thread count, in one run. Repetitions alternate (grove, then llama.cpp in a fresh process)
//! so both see the same machine state; the first pair warms up and is not counted.
//!
//! Also measured here: this machine's memory read bandwidth (a parallel sum over 1 GiB, once in
//! every repetition, between grove's run and llama.cpp's), and from it the decode floor:
//! bandwidth / bytes of weights a step reads. Decoding a small model is a stream over its
//! weights, so tokens/s over that floor says how much of the memory system a kernel uses. Each
//! run is set against the bandwidth measured beside it: on a shared machine both move with the
//! neighbors' load (20% from one minute to the next here), and a floor from another moment
//! would mostly measure that.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use grove_core::{SamplingParams, StopCondition, TokenId};
use grove_engine::{GenerateRequest, Generator, GeneratorOptions};
use grove_model::gguf::GgufFile;
use grove_model::Model;
use rand::{Rng, SeedableRng};
use rayon::prelude::*;
use serde::Serialize;
use serde_json::{json, Value};

use super::args::BenchArgs;
use super::measure::{verify_curve, Spread, VerifyPoint};
use crate::loading;

#[derive(Debug, Serialize)]
struct Side {
    prefill_tokens_per_s: Spread,
    decode_tokens_per_s: Spread,
    peak_rss_bytes: u64,
}

#[derive(Debug, Serialize)]
struct Comparison {
    model: String,
    file_bytes: u64,
    threads: usize,
    prompt_tokens: usize,
    new_tokens: usize,
    repetitions: usize,
    grove: Side,
    llama_cpp: Side,
    prefill_ratio: f64,
    decode_ratio: f64,
    /// Bytes of the KV pool grove allocated for one request of this size.
    grove_kv_bytes: u64,
    grove_kv_dtype: &'static str,
    /// Grove's peak RSS / (file + KV pool).
    grove_rss_over_file_and_kv: f64,
    /// Median of the tests, one per repetition.
    memory_read_gb_per_s: f64,
    /// The best test.
    memory_read_gb_per_s_max: f64,
    weight_bytes_per_token: u64,
    /// Median bandwidth / weight bytes per token.
    decode_floor_tokens_per_s: f64,
    /// Median over repetitions of decode tokens/s over the floor of the test beside the run.
    grove_fraction_of_floor: f64,
    llama_cpp_fraction_of_floor: f64,
    /// Median decode tokens/s over the floor of the best test (the most demanding reading).
    grove_fraction_of_best_floor: f64,
    verify_context: usize,
    verify_cost: Vec<VerifyPoint>,
    /// The same forwards in llama.cpp (every row's logits), after its own random context.
    llama_cpp_verify_cost: Vec<VerifyPoint>,
}

pub fn run(args: &BenchArgs, threads: usize) -> Result<()> {
    let path = args.model.model_dir();
    if !grove_model::gguf::is_gguf(&path) {
        bail!(
            "--compare-llama-cpp needs --model-path FILE.gguf (got {})",
            path.display()
        );
    }
    // Read before loading, and dropped: the metadata would otherwise count in grove's RSS.
    let (weight_bytes_per_token, file_bytes) = {
        let file = GgufFile::open(&path)?;
        (file.weight_bytes_per_token(), file.file_bytes())
    };
    let loaded = loading::load(&args.model)?;
    let model = &loaded.model;
    let config = model.config();
    let mut rng = rand_chacha::ChaCha12Rng::seed_from_u64(0);
    let vocab = config.vocab_size as TokenId;
    let mut random_tokens =
        |n: usize| -> Vec<TokenId> { (0..n).map(|_| rng.random_range(0..vocab)).collect() };
    let prompt = random_tokens(args.prompt_tokens);

    let repetitions = args.repetitions.max(1);
    let runs = alternate(model, args, &path, &prompt, weight_bytes_per_token, threads)?;
    let Alternation {
        ours,
        theirs,
        grove_rss,
        llama_rss,
        bandwidths,
        grove_fractions,
        llama_fractions,
    } = runs;
    let verify_cost = verify_curve(model, args, repetitions, &mut random_tokens)?;
    let llama_cpp_verify_cost = llama_cpp_verify_curve(&path, args, repetitions, threads)?;

    let grove = ours.side(grove_rss);
    let llama_cpp = theirs.side(llama_rss);
    let kv_tokens = (args.prompt_tokens + args.new_tokens) as u64;
    let value_bytes = model.kv_dtype().size() as u64;
    let grove_kv_bytes =
        kv_tokens * config.num_layers as u64 * config.kv_width() as u64 * 2 * value_bytes;
    let bandwidth = Spread::of(bandwidths);
    let floor = bandwidth.median * 1e9 / weight_bytes_per_token as f64;
    let best_floor = bandwidth.max * 1e9 / weight_bytes_per_token as f64;
    let report = Comparison {
        model: path.display().to_string(),
        file_bytes,
        threads,
        prompt_tokens: args.prompt_tokens,
        new_tokens: args.new_tokens,
        repetitions,
        prefill_ratio: grove.prefill_tokens_per_s.median / llama_cpp.prefill_tokens_per_s.median,
        decode_ratio: grove.decode_tokens_per_s.median / llama_cpp.decode_tokens_per_s.median,
        grove_kv_bytes,
        grove_kv_dtype: model.kv_dtype().name(),
        grove_rss_over_file_and_kv: grove_rss as f64 / (file_bytes + grove_kv_bytes) as f64,
        memory_read_gb_per_s: bandwidth.median,
        memory_read_gb_per_s_max: bandwidth.max,
        weight_bytes_per_token,
        decode_floor_tokens_per_s: floor,
        grove_fraction_of_floor: Spread::of(grove_fractions).median,
        llama_cpp_fraction_of_floor: Spread::of(llama_fractions).median,
        grove_fraction_of_best_floor: grove.decode_tokens_per_s.median / best_floor,
        grove,
        llama_cpp,
        verify_context: args.context,
        verify_cost,
        llama_cpp_verify_cost,
    };
    print(&report);
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&report)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    println!("{}", serde_json::to_string(&report)?);
    Ok(())
}

#[derive(Debug, Default)]
struct Samples {
    prefill: Vec<f64>,
    decode: Vec<f64>,
}

impl Samples {
    fn side(self, peak_rss_bytes: u64) -> Side {
        Side {
            prefill_tokens_per_s: Spread::of(self.prefill),
            decode_tokens_per_s: Spread::of(self.decode),
            peak_rss_bytes,
        }
    }
}

/// What grove and llama.cpp measured, alternating run by run.
#[derive(Default)]
struct Alternation {
    ours: Samples,
    theirs: Samples,
    grove_rss: u64,
    llama_rss: u64,
    /// One floor per repetition (GB/s), and each side's decode over it.
    bandwidths: Vec<f64>,
    grove_fractions: Vec<f64>,
    llama_fractions: Vec<f64>,
}

/// Greedy decoding of `prompt` by grove then llama.cpp, each repetition after a warm-up, with
/// a memory read test beside each for the bandwidth floor.
fn alternate(
    model: &dyn Model,
    args: &BenchArgs,
    path: &Path,
    prompt: &[TokenId],
    weight_bytes_per_token: u64,
    threads: usize,
) -> Result<Alternation> {
    let repetitions = args.repetitions.max(1);
    let generator = Generator::new(model, None, GeneratorOptions::default());
    let request = GenerateRequest {
        prompt: prompt.to_vec(),
        sampling: SamplingParams::greedy(),
        stop: StopCondition {
            max_new_tokens: args.new_tokens,
            ..Default::default()
        },
        speculation: Default::default(),
        logprobs: None,
        prompt_logprobs: false,
        adjustments: Default::default(),
        grammar: None,
    };
    let mut runs = Alternation::default();
    let mut memory_test = None;
    for repetition in 0..repetitions + 1 {
        let stats = generator.generate(&request, |_| {})?.stats;
        if repetition == 0 {
            // The generation's peak, before the bandwidth test's 1 GiB buffer exists (the
            // verify curve's longer context and 64-row logits are not counted either).
            runs.grove_rss = peak_rss_bytes()?;
            let answer = llama_cpp_bench(path, prompt, args.new_tokens, threads)?;
            runs.llama_rss = answer["peak_rss_bytes"].as_u64().unwrap_or(0);
            memory_test = Some(MemoryTest::new());
            continue; // warm-up
        }
        let bandwidth = memory_test
            .as_ref()
            .expect("made in the warm-up")
            .gb_per_s();
        let answer = llama_cpp_bench(path, prompt, args.new_tokens, threads)?;
        runs.llama_rss = runs
            .llama_rss
            .max(answer["peak_rss_bytes"].as_u64().unwrap_or(0));
        runs.ours.prefill.push(stats.prefill_tokens_per_s);
        runs.ours.decode.push(stats.decode_tokens_per_s);
        runs.theirs
            .prefill
            .push(first(&answer, "prefill_tokens_per_s")?);
        runs.theirs
            .decode
            .push(first(&answer, "decode_tokens_per_s")?);
        let floor = bandwidth * 1e9 / weight_bytes_per_token as f64;
        let llama_decode = *runs.theirs.decode.last().expect("pushed");
        runs.bandwidths.push(bandwidth);
        runs.grove_fractions.push(stats.decode_tokens_per_s / floor);
        runs.llama_fractions.push(llama_decode / floor);
        eprintln!(
            "  repetition {repetition}: decode grove {:.1} / llama.cpp {:.1} tok/s; \
             bandwidth {bandwidth:.1} GB/s: {:.0}% / {:.0}% of its floor",
            stats.decode_tokens_per_s,
            llama_decode,
            100.0 * stats.decode_tokens_per_s / floor,
            100.0 * llama_decode / floor,
        );
    }
    Ok(runs)
}

fn first(answer: &Value, key: &str) -> Result<f64> {
    answer[key][0]
        .as_f64()
        .with_context(|| format!("llama.cpp answer lacks `{key}`"))
}

/// One repetition of llama.cpp's prefill + greedy decode, in a fresh process.
fn llama_cpp_bench(
    path: &Path,
    prompt: &[TokenId],
    new_tokens: usize,
    threads: usize,
) -> Result<Value> {
    reference(json!({
        "command": "bench", "model": path, "prompt": prompt, "new_tokens": new_tokens,
        "threads": threads, "repetitions": 1,
    }))
}

/// llama.cpp's verify cost curve on the same context and row counts as grove's.
fn llama_cpp_verify_curve(
    path: &Path,
    args: &BenchArgs,
    repetitions: usize,
    threads: usize,
) -> Result<Vec<VerifyPoint>> {
    let answer = reference(json!({
        "command": "verify", "model": path, "context": args.context, "rows": args.rows,
        "threads": threads, "repetitions": repetitions,
    }))?;
    let times: Vec<Vec<f64>> = serde_json::from_value(answer["ms"].clone())
        .context("llama.cpp's verify answer lacks `ms`")?;
    Ok(VerifyPoint::curve(args.rows.iter().copied().zip(times)))
}

/// One request to `scripts/llama_cpp_reference.py`, in a fresh process.
fn reference(request: Value) -> Result<Value> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/llama_cpp_reference.py");
    let mut child = Command::new("python3")
        .arg(&script)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .context("running python3 (llama-cpp-python: bash scripts/install_llama_cpp.sh)")?;
    child
        .stdin
        .take()
        .context("stdin")?
        .write_all(request.to_string().as_bytes())?;
    let output = child.wait_with_output()?;
    if !output.status.success() {
        bail!(
            "{} failed ({}): is llama-cpp-python installed? (bash scripts/install_llama_cpp.sh)",
            script.display(),
            output.status
        );
    }
    Ok(serde_json::from_slice(&output.stdout)?)
}

/// This process's peak resident set (VmHWM).
fn peak_rss_bytes() -> Result<u64> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|rest| {
            rest.trim()
                .trim_end_matches("kB")
                .trim()
                .parse::<u64>()
                .ok()
        })
        .map(|kb| kb * 1024)
        .context("VmHWM in /proc/self/status")
}

/// A parallel read over 1 GiB (on the current rayon pool): far larger than the caches, so it
/// measures DRAM. Read as the quantized kernels read (software prefetch ahead): on this
/// machine a plain sum reached 18 GB/s and the prefetching one 20-22, which the kernels also
/// reach on a large head, so the plain sum would understate the floor.
struct MemoryTest {
    buffer: Vec<u64>,
}

impl MemoryTest {
    fn new() -> Self {
        let words = (1usize << 30) / 8;
        Self {
            buffer: (0..words as u64).collect(),
        }
    }

    /// GB/s, the best of 5 reads (a fraction of a second).
    fn gb_per_s(&self) -> f64 {
        let mut best = 0f64;
        for _ in 0..5 {
            let start = Instant::now();
            let sum: u64 = self
                .buffer
                .par_chunks(1 << 16)
                .map(grove_kernels::quant::streaming_sum)
                .reduce(|| 0, u64::wrapping_add);
            let seconds = start.elapsed().as_secs_f64();
            std::hint::black_box(sum);
            best = best.max((self.buffer.len() * 8) as f64 / seconds / 1e9);
        }
        best
    }
}

fn print(report: &Comparison) {
    let side = |name: &str, s: &Side| {
        eprintln!(
            "  {name:<10} prefill tok/s {:>8.1} (min {:.1}, max {:.1})  decode tok/s {:>6.1} (min {:.1}, max {:.1})  peak RSS {:.0} MB",
            s.prefill_tokens_per_s.median,
            s.prefill_tokens_per_s.min,
            s.prefill_tokens_per_s.max,
            s.decode_tokens_per_s.median,
            s.decode_tokens_per_s.min,
            s.decode_tokens_per_s.max,
            s.peak_rss_bytes as f64 / 1e6
        )
    };
    eprintln!(
        "{} ({:.0} MB) | threads {} | {} prompt + {} new tokens | median of {}",
        report.model,
        report.file_bytes as f64 / 1e6,
        report.threads,
        report.prompt_tokens,
        report.new_tokens,
        report.repetitions
    );
    side("grove", &report.grove);
    side("llama.cpp", &report.llama_cpp);
    eprintln!(
        "  grove / llama.cpp: prefill {:.2}x, decode {:.2}x",
        report.prefill_ratio, report.decode_ratio
    );
    eprintln!(
        "  grove peak RSS / (file + {} KV pool of {:.1} MB): {:.2}",
        report.grove_kv_dtype,
        report.grove_kv_bytes as f64 / 1e6,
        report.grove_rss_over_file_and_kv
    );
    eprintln!(
        "  bandwidth {:.1} GB/s (median; best {:.1}), {:.0} MB of weights per token: floor {:.1} tok/s",
        report.memory_read_gb_per_s,
        report.memory_read_gb_per_s_max,
        report.weight_bytes_per_token as f64 / 1e6,
        report.decode_floor_tokens_per_s,
    );
    eprintln!(
        "  decode / the floor beside each run (median): grove {:.0}%, llama.cpp {:.0}%; grove / the best floor: {:.0}%",
        100.0 * report.grove_fraction_of_floor,
        100.0 * report.llama_cpp_fraction_of_floor,
        100.0 * report.grove_fraction_of_best_floor,
    );
    eprintln!(
        "verify cost after {} tokens of context (median of {}), every row's logits:",
        report.verify_context, report.repetitions
    );
    eprintln!("  rows  grove ms  x 1-row  llama.cpp ms  x 1-row  llama.cpp / grove");
    for (ours, theirs) in report.verify_cost.iter().zip(&report.llama_cpp_verify_cost) {
        eprintln!(
            "  {:>4} {:>9.2} {:>8.2} {:>13.2} {:>8.2} {:>18.2}",
            ours.rows,
            ours.ms.median,
            ours.ratio_to_one_row,
            theirs.ms.median,
            theirs.ratio_to_one_row,
            theirs.ms.median / ours.ms.median
        );
    }
}
