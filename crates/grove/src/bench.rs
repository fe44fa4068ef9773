//! `grove bench`: prefill and decode speed over several repetitions (median and spread), and the
//! verify cost curve: the time of one forward over T causal rows after a fixed context, as a
//! ratio to the 1-row time. The curve says what a draft tree of a given size can cost on this
//! machine before speculation stops paying.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result};
use clap::Args;
use grove_core::{SamplingParams, StopCondition, TokenId};
use grove_engine::{DDTreeSpec, DFlashSpec, GenerateRequest, Generator, GeneratorOptions};
use grove_kv::PagePool;
use grove_model::{ForwardBatch, LogitRows, Model, Segment};
use rand::{Rng, SeedableRng};
use serde::Serialize;

use crate::loading::{self, ModelArgs, SpecAlgorithm, SpecArgs};

#[derive(Debug, Args)]
pub struct BenchArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// With a drafter, none, dflash and (for ddtree) every budget run on the same prompts,
    /// alternating, in one run.
    #[command(flatten)]
    pub spec: SpecArgs,
    /// DDTree budgets to compare (with --speculative-algorithm ddtree); default: the one
    /// --speculative-ddtree-budget gives.
    #[arg(long, value_delimiter = ',')]
    pub budgets: Vec<usize>,
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

    /// Run none / dflash / ddtree over the --budgets sweep on fixed code prompts and write
    /// report.json plus charts (budget.png, acceptance.png) into this directory.
    #[arg(long)]
    pub report: Option<PathBuf>,
}

/// Median, min and max of repeated measurements.
#[derive(Debug, Clone, Serialize)]
pub struct Spread {
    pub median: f64,
    pub min: f64,
    pub max: f64,
}

impl Spread {
    pub fn of(mut samples: Vec<f64>) -> Self {
        samples.sort_by(f64::total_cmp);
        let n = samples.len();
        let median = if n % 2 == 1 {
            samples[n / 2]
        } else {
            (samples[n / 2 - 1] + samples[n / 2]) / 2.0
        };
        Self {
            median,
            min: samples[0],
            max: samples[n - 1],
        }
    }
}

#[derive(Debug, Serialize)]
pub(crate) struct VerifyPoint {
    pub rows: usize,
    pub ms: Spread,
    pub ratio_to_one_row: f64,
}

/// What the measured runs of one method recorded.
#[derive(Debug, Default)]
struct Samples {
    prefill: Vec<f64>,
    decode: Vec<f64>,
    /// Tau of every round.
    tau: Vec<usize>,
    tree_nodes: usize,
}

/// One decoding method's measurements.
#[derive(Debug, Serialize)]
struct MethodReport {
    method: String,
    prefill_tokens_per_s: Spread,
    decode_tokens_per_s: Spread,
    /// Mean tau over all rounds of all measured runs.
    mean_accept_length: f64,
    /// Median decode tokens/s relative to `none` in the same run.
    decode_speedup_vs_none: f64,
    /// Median decode tokens/s relative to `dflash` in the same run, when it ran.
    decode_speedup_vs_dflash: Option<f64>,
    /// Non-root tree nodes verified per round.
    mean_tree_nodes: f64,
}

#[derive(Debug, Serialize)]
struct BenchReport {
    model: String,
    drafter: Option<String>,
    threads: usize,
    page_size: usize,
    prompt_tokens: usize,
    new_tokens: usize,
    repetitions: usize,
    methods: Vec<MethodReport>,
    verify_context: usize,
    verify_cost: Vec<VerifyPoint>,
}

pub fn run(args: BenchArgs) -> Result<()> {
    if args.serve {
        return crate::bench_serve::run(&args);
    }
    if let Some(dir) = &args.report {
        return crate::bench_report::run(&args, dir);
    }
    if args.compare_llama_cpp {
        return loading::with_threads(args.model.threads, |threads| {
            crate::bench_llama::run(&args, threads)
        });
    }
    loading::with_threads(args.model.threads, |threads| bench(&args, threads))
}

fn bench(args: &BenchArgs, threads: usize) -> Result<()> {
    let loaded = loading::load(&args.model)?;
    let drafter = args.spec.load_drafter(&loaded)?;
    let model = &loaded.model;
    let repetitions = args.repetitions.max(1);
    let vocab = model.config().vocab_size;
    let mut rng = rand_chacha::ChaCha12Rng::seed_from_u64(0);
    let mut random_tokens = |n: usize| -> Vec<TokenId> {
        (0..n)
            .map(|_| rng.random_range(0..vocab as TokenId))
            .collect()
    };

    let options = GeneratorOptions {
        page_size: args.model.page_size,
        ..Default::default()
    };
    let mut methods: Vec<(String, Generator)> =
        vec![("none".into(), Generator::new(model, None, options.clone()))];
    if let Some(drafter) = &drafter {
        let num_draft_tokens = args.spec.num_draft_tokens(drafter);
        let dflash = Generator::new(model, None, options.clone()).with_dflash(DFlashSpec {
            drafter,
            num_draft_tokens,
        })?;
        methods.push(("dflash".into(), dflash));
        if args.spec.speculative_algorithm == SpecAlgorithm::DDTree {
            let budgets = if args.budgets.is_empty() {
                vec![args.spec.ddtree_budget(drafter)]
            } else {
                args.budgets.clone()
            };
            for budget in budgets {
                let top_k = args.spec.speculative_ddtree_topk.unwrap_or(budget);
                let tree =
                    Generator::new(model, None, options.clone()).with_ddtree(DDTreeSpec {
                        drafter,
                        budget,
                        top_k,
                    })?;
                methods.push((format!("ddtree-b{budget}"), tree));
            }
        }
    }
    let mut samples: Vec<Samples> = methods.iter().map(|_| Samples::default()).collect();
    for repetition in 0..repetitions + 1 {
        let request = GenerateRequest {
            prompt: random_tokens(args.prompt_tokens),
            sampling: SamplingParams::greedy(),
            stop: StopCondition {
                max_new_tokens: args.new_tokens,
                ..Default::default()
            },
            speculation: Default::default(),
        };
        for ((_, generator), sample) in methods.iter().zip(samples.iter_mut()) {
            let stats = generator.generate(&request, |_| {})?.stats;
            // The first repetition warms caches and the thread pool; it is not counted.
            if repetition > 0 {
                sample.prefill.push(stats.prefill_tokens_per_s);
                sample.decode.push(stats.decode_tokens_per_s);
                sample.tau.extend(stats.accept_lengths);
                sample.tree_nodes += stats.tree_nodes;
            }
        }
    }
    let mut method_reports: Vec<MethodReport> = methods
        .iter()
        .zip(samples)
        .map(|((name, _), sample)| MethodReport {
            method: name.clone(),
            prefill_tokens_per_s: Spread::of(sample.prefill),
            decode_tokens_per_s: Spread::of(sample.decode),
            mean_accept_length: sample.tau.iter().sum::<usize>() as f64
                / sample.tau.len().max(1) as f64,
            mean_tree_nodes: sample.tree_nodes as f64 / sample.tau.len().max(1) as f64,
            decode_speedup_vs_none: 1.0,
            decode_speedup_vs_dflash: None,
        })
        .collect();
    let baseline = method_reports[0].decode_tokens_per_s.median;
    let dflash = method_reports.get(1).map(|m| m.decode_tokens_per_s.median);
    for report in &mut method_reports {
        report.decode_speedup_vs_none = report.decode_tokens_per_s.median / baseline;
        report.decode_speedup_vs_dflash = dflash.map(|d| report.decode_tokens_per_s.median / d);
    }

    let verify_cost = verify_curve(model, args, repetitions, &mut random_tokens)?;
    let report = BenchReport {
        model: loaded.dir.display().to_string(),
        drafter: args
            .spec
            .speculative_draft_model_path
            .as_ref()
            .map(|p| p.display().to_string()),
        threads,
        page_size: args.model.page_size,
        prompt_tokens: args.prompt_tokens,
        new_tokens: args.new_tokens,
        repetitions,
        methods: method_reports,
        verify_context: args.context,
        verify_cost,
    };
    print_report(&report);
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&report)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    println!("{}", serde_json::to_string(&report)?);
    Ok(())
}

/// Times one forward of `rows` causal rows (logits for every row, as a verify needs) after a
/// prefilled context. The rows are never committed, so every measurement sees the same context.
pub(crate) fn verify_curve(
    model: &dyn Model,
    args: &BenchArgs,
    repetitions: usize,
    random_tokens: &mut impl FnMut(usize) -> Vec<TokenId>,
) -> Result<Vec<VerifyPoint>> {
    let max_rows = args.rows.iter().copied().max().unwrap_or(1);
    let page_size = args.model.page_size;
    let pool = PagePool::new((args.context + max_rows).div_ceil(page_size), page_size)?;
    let mut kv = model.new_kv_store(pool.num_slots());
    let mut table = pool.new_table();
    let context = random_tokens(args.context);
    table.reserve(args.context + max_rows)?;
    let positions: Vec<usize> = (0..args.context).collect();
    let batch = ForwardBatch {
        segments: vec![Segment::causal(
            &table,
            &context,
            &positions,
            LogitRows::None,
        )],
        taps: &[],
    };
    model.forward(&batch, &mut kv)?;
    table.append(args.context);

    let mut points: Vec<VerifyPoint> = Vec::new();
    for &rows in &args.rows {
        let tokens = random_tokens(rows);
        let positions: Vec<usize> = (args.context..args.context + rows).collect();
        let mut times = Vec::new();
        for repetition in 0..repetitions + 1 {
            let batch = ForwardBatch {
                segments: vec![Segment::causal(&table, &tokens, &positions, LogitRows::All)],
                taps: &[],
            };
            let start = Instant::now();
            model.forward(&batch, &mut kv)?;
            if repetition > 0 {
                times.push(start.elapsed().as_secs_f64() * 1e3);
            }
        }
        let ms = Spread::of(times);
        let one_row = points.first().map_or(ms.median, |p| p.ms.median);
        points.push(VerifyPoint {
            rows,
            ratio_to_one_row: ms.median / one_row,
            ms,
        });
    }
    Ok(points)
}

fn print_report(report: &BenchReport) {
    let spread = |s: &Spread| format!("{:>8.1} (min {:.1}, max {:.1})", s.median, s.min, s.max);
    eprintln!(
        "model {} | threads {} | page size {}",
        report.model, report.threads, report.page_size
    );
    eprintln!(
        "{} prompt tokens, {} new tokens, median of {} runs",
        report.prompt_tokens, report.new_tokens, report.repetitions
    );
    for method in &report.methods {
        let vs_dflash = method
            .decode_speedup_vs_dflash
            .map_or(String::new(), |r| format!("  x dflash {r:.2}"));
        eprintln!(
            "  {:<11} prefill tok/s {}  decode tok/s {}  tau {:.2}  nodes {:>5.1}  decode x none {:.2}{vs_dflash}",
            method.method,
            spread(&method.prefill_tokens_per_s),
            spread(&method.decode_tokens_per_s),
            method.mean_accept_length,
            method.mean_tree_nodes,
            method.decode_speedup_vs_none
        );
    }
    print_verify_curve(
        report.verify_context,
        report.repetitions,
        &report.verify_cost,
    );
}

pub(crate) fn print_verify_curve(context: usize, repetitions: usize, points: &[VerifyPoint]) {
    eprintln!("verify cost after {context} tokens of context (median of {repetitions}):");
    eprintln!("  rows      ms   x 1-row");
    for point in points {
        eprintln!(
            "  {:>4} {:>8.2} {:>9.2}",
            point.rows, point.ms.median, point.ratio_to_one_row
        );
    }
}
