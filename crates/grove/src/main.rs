//! `grove`: LLM inference with DFlash/DDTree speculative decoding.
//!
//! Subcommands: `generate` (one prompt, text or JSON out), `serve` (the OpenAI API), `bench` (prefill/decode speed and the
//! verify cost curve), `tiny-model` (writes the seeded random checkpoint used as the default).
// `unsafe` lives in grove-kernels only.
#![forbid(unsafe_code)]

mod amx;
mod bench;
mod corpus;
mod generate;
mod loading;
mod serve;
mod train;
mod training_chart;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "grove",
    version,
    about = "LLM inference with DFlash/DDTree speculative decoding"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Log level: error, warn, info, debug or trace (or tracing directives such as
    /// `grove_server=debug`). Default: info for `serve` (an access line per request, one per
    /// finished request, a throughput line every 10 s), warn otherwise; `RUST_LOG` is read when
    /// this is not given.
    #[arg(long, global = true)]
    log_level: Option<String>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Generate text for one prompt.
    Generate(generate::GenerateArgs),
    /// Serve the OpenAI API (completions, chat, SSE streaming, metrics).
    Serve(serve::ServeArgs),
    /// Measure prefill and decode speed, and the verify cost curve.
    Bench(bench::BenchArgs),
    /// Train a small Qwen3 code model from scratch (tokenizer included).
    TrainTarget(train::TrainTargetArgs),
    /// Train a DFlash drafter for a target (z-lab format out).
    TrainDrafter(train::TrainDrafterArgs),
    /// Write a seeded random Qwen3 checkpoint with a byte-level tokenizer.
    TinyModel(loading::TinyModelArgs),
    /// Multiply on AMX tiles and on the VNNI kernel, and print their agreement and times as
    /// JSON: the trial start-up runs in a child process (`amx.rs`).
    #[command(name = "kernel-trial", hide = true)]
    KernelTrial,
}

/// The kernels this process runs, as reports name them: the instruction level, the quantized
/// products' kernel (`GROVE_KERNEL` forces a lower level), where AMX tiles multiply
/// (`amx_tiles`, on AMX CPUs), the formats it hands to another kernel where there are any
/// (`quantized_by_format`), where the AVX-512 VNNI kernel adds Q6_K's zero point
/// (`q6k_zero_point`: "per super-block" on CPUs with two `vpdpbusd`s a cycle, else
/// "sub-block start"), and the arithmetic of bfloat16 checkpoints' products and of a bf16 KV
/// cache's long rows (`dense_bf16`: "bf16 dot" on AVX-512 BF16, else "f32").
pub fn kernels() -> serde_json::Value {
    let kernel = grove_kernels::quant::Kernel::detect();
    let mut json = serde_json::json!({
        "level": grove_kernels::cpu::level().name(),
        "quantized": kernel.name(),
        "dense_bf16": grove_kernels::strips::Bf16Arithmetic::here().name(),
    });
    if let Some(tiles) = amx::report() {
        json["amx_tiles"] = tiles;
    }
    if let Some(zero) = kernel.q6k_zero_point() {
        json["q6k_zero_point"] = zero.into();
    }
    let handed_on = kernel.handed_on();
    if !handed_on.is_empty() {
        let by_format = handed_on
            .iter()
            .map(|(format, to)| (format.to_string(), to.name().into()));
        json["quantized_by_format"] = serde_json::Value::Object(by_format.collect());
    }
    json
}

/// [`kernels`] in words.
pub fn kernels_line() -> String {
    let kernel = grove_kernels::quant::Kernel::detect();
    let handed_on: Vec<String> = (kernel.handed_on().iter())
        .map(|(format, to)| format!("; {format} {}", to.name()))
        .collect();
    let tiles = amx::report_line().map_or(String::new(), |line| format!(", {line}"));
    let q6k = (kernel.q6k_zero_point()).map_or(String::new(), |at| format!(", Q6_K zero {at}"));
    format!(
        "kernels {} (quantized products {}{}{}{}; bf16 weights and bf16 cache {})",
        grove_kernels::cpu::level().name(),
        kernel.name(),
        q6k,
        tiles,
        handed_on.concat(),
        grove_kernels::strips::Bf16Arithmetic::here().name()
    )
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let default_level = match cli.command {
        Command::Serve(_) => "info",
        _ => "warn",
    };
    let filter = match (&cli.log_level, std::env::var("RUST_LOG")) {
        (Some(level), _) => tracing_subscriber::EnvFilter::try_new(level),
        (None, Ok(directives)) => tracing_subscriber::EnvFilter::try_new(directives),
        (None, Err(_)) => tracing_subscriber::EnvFilter::try_new(default_level),
    };
    let filter = match filter {
        Ok(filter) => filter,
        Err(error) => {
            eprintln!("error: --log-level: {error}");
            return ExitCode::FAILURE;
        }
    };
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    if !grove_kernels::memory::keep_freed_buffers() {
        tracing::debug!("the allocator keeps its own thresholds for large buffers");
    }
    // A bad GROVE_KERNEL is an error here, before any kernel would panic on it.
    if let Err(error) = grove_kernels::cpu::Level::from_env() {
        eprintln!("error: {error}");
        return ExitCode::FAILURE;
    }
    // Where the CPU has AMX tiles, a trial decides where they multiply, before any product.
    if !matches!(cli.command, Command::KernelTrial | Command::TinyModel(_)) {
        amx::settle();
    }
    let result = match cli.command {
        Command::Generate(args) => generate::run(args),
        Command::Serve(args) => serve::run(args),
        Command::Bench(args) => bench::run(args),
        Command::TrainTarget(args) => train::run_target(args),
        Command::TrainDrafter(args) => train::run_drafter(args),
        Command::TinyModel(args) => loading::write_tiny_model(args),
        Command::KernelTrial => amx::print_trial(),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}
