//! `grove bench`'s flags, shared by every kind of run.

use std::path::PathBuf;

use clap::Args;

use grove_engine::Budget;

use crate::loading::{parse_budget, ModelArgs, SpecArgs};

#[derive(Debug, Args)]
pub struct BenchArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// With a drafter, none, dflash and (for ddtree) every budget run on the same prompts,
    /// alternating, in one run.
    #[command(flatten)]
    pub spec: SpecArgs,
    /// DDTree (or ngram) budgets to compare (with --speculative-algorithm ddtree or ngram),
    /// numbers or `auto`
    /// (e.g. 1,2,4,8,auto); default: the one --speculative-ddtree-budget gives.
    #[arg(long, value_delimiter = ',', value_parser = parse_budget)]
    pub budgets: Vec<Budget>,
    /// Prompt length for the prefill/decode measurement.
    #[arg(long, default_value_t = 128)]
    pub prompt_tokens: usize,
    /// Tokens generated per decode measurement.
    #[arg(long, default_value_t = 64)]
    pub new_tokens: usize,
    /// Repetitions of every measurement; medians are reported.
    #[arg(long, default_value_t = 5)]
    pub repetitions: usize,
    /// Context length before the verify-cost forwards.
    #[arg(long, default_value_t = 512)]
    pub context: usize,
    /// Row counts of the verify cost curve.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8,16,32,64")]
    pub rows: Vec<usize>,
    /// Also write the results as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Measure through the HTTP server instead: throughput and latency per method at each
    /// --concurrency (streaming clients, each sending --requests-per-client requests).
    #[arg(long)]
    pub serve: bool,
    /// Concurrent clients for --serve.
    #[arg(long, value_delimiter = ',', default_value = "1,4,16")]
    pub concurrency: Vec<usize>,
    /// Requests each client sends in turn, for --serve.
    #[arg(long, default_value_t = 4)]
    pub requests_per_client: usize,
    /// Compare with llama.cpp (llama-cpp-python, scripts/llama_cpp_reference.py) on the same
    /// GGUF file: prefill and decode tokens/s alternating in one run, peak RSS of both, memory
    /// bandwidth and decode as a fraction of the bandwidth floor, and grove's verify curve.
    #[arg(long)]
    pub compare_llama_cpp: bool,

    /// Run the automatic budget and plain decoding alternately on code prompts for --duration
    /// seconds, another process taking a core from half-way, and write load_change.json (the
    /// chosen budgets step by step) and load_change.png into this directory.
    #[arg(long)]
    pub load_change: Option<PathBuf>,
    /// Seconds of --load-change.
    #[arg(long, default_value_t = 40.0)]
    pub duration: f64,

    /// Run none / dflash / ddtree over the --budgets sweep on fixed code prompts and write
    /// report.json plus charts (budget.png, acceptance.png) into this directory.
    #[arg(long)]
    pub report: Option<PathBuf>,
}
