//! `grove bench`'s default run: prefill and decode speed of plain decoding, DFlash and DDTree
//! over several repetitions (median and spread, ratios to plain decoding in the same run), and
//! the verify cost curve.

use anyhow::{Context, Result};
use grove_core::{SamplingParams, StopCondition, TokenId};
use grove_engine::{
    AutoBudgetReport, Budget, DFlashSpec, Drafter, GenerateRequest, Generator, GeneratorOptions,
    SpeculationSettings,
};
use grove_model::Model;
use rand::{Rng, SeedableRng};
use serde::Serialize;

use super::args::BenchArgs;
use super::measure::{print_verify_curve, verify_curve, Spread, VerifyPoint};
use crate::loading::{self, SpecAlgorithm};

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
    kernels: serde_json::Value,
    kv_cache_dtype: &'static str,
    drafter: Option<String>,
    threads: usize,
    page_size: usize,
    prompt_tokens: usize,
    new_tokens: usize,
    repetitions: usize,
    methods: Vec<MethodReport>,
    verify_context: usize,
    verify_cost: Vec<VerifyPoint>,
    /// The automatic budget's cost table and calibration after the runs (when one ran).
    auto_budget: Option<AutoBudgetReport>,
}

pub fn run(args: &BenchArgs, threads: usize) -> Result<()> {
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

    let methods = methods_to_compare(args, model, drafter.as_ref())?;
    let samples = measure(args, &methods, repetitions, &mut random_tokens)?;
    let method_reports = method_reports(&methods, samples);
    let auto_budget = methods
        .iter()
        .find(|(_, g)| g.auto_budget())
        .map(|(_, g)| g.auto_budget_report());
    let verify_cost = verify_curve(model, args, repetitions, &mut random_tokens)?;
    let report = BenchReport {
        model: loaded.dir.display().to_string(),
        kernels: crate::kernels(),
        kv_cache_dtype: model.kv_dtype().name(),
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
        auto_budget,
    };
    print_report(&report);
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&report)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    println!("{}", serde_json::to_string(&report)?);
    Ok(())
}

/// Plain decoding, then DFlash and DDTree at each budget when there is a drafter, or lookup
/// drafts at each budget with `--speculative-algorithm ngram`.
fn methods_to_compare<'a>(
    args: &BenchArgs,
    model: &'a dyn Model,
    drafter: Option<&'a grove_model::DFlashDrafter>,
) -> Result<Vec<(String, Generator<'a>)>> {
    let options = GeneratorOptions {
        page_size: args.model.page_size,
        ..Default::default()
    };
    let mut methods: Vec<(String, Generator)> =
        vec![("none".into(), Generator::new(model, None, options.clone()))];
    let budgets = if args.budgets.is_empty() {
        vec![args.spec.ddtree_budget()]
    } else {
        args.budgets.clone()
    };
    if args.spec.speculative_algorithm == SpecAlgorithm::Ngram {
        for budget in budgets {
            let settings = SpeculationSettings {
                budget: Some(budget),
                ..args.spec.settings()
            };
            let generator = Generator::new(model, None, options.clone())
                .with_speculation(settings, drafter.map(|d| d as &dyn Drafter))?;
            methods.push((budget_name("ngram", budget), generator));
        }
        return Ok(methods);
    }
    let Some(drafter) = drafter else {
        return Ok(methods);
    };
    let num_draft_tokens = args.spec.num_draft_tokens(drafter);
    let dflash = Generator::new(model, None, options.clone()).with_dflash(DFlashSpec {
        drafter,
        num_draft_tokens,
    })?;
    methods.push(("dflash".into(), dflash));
    if args.spec.speculative_algorithm == SpecAlgorithm::DDTree {
        for budget in budgets {
            let generator = Generator::new(model, None, options.clone());
            methods.push(speculative_method(
                args,
                generator,
                drafter,
                grove_engine::SpecAlgorithm::DDTree,
                budget,
            )?);
        }
    }
    Ok(methods)
}

/// DFlash or DDTree at `budget` (a number, or `auto`: then `ddtree-auto`, `dflash-auto`),
/// named for the tables.
pub(super) fn speculative_method<'a>(
    args: &BenchArgs,
    generator: Generator<'a>,
    drafter: &'a grove_model::DFlashDrafter,
    algorithm: grove_engine::SpecAlgorithm,
    budget: Budget,
) -> Result<(String, Generator<'a>)> {
    let settings = SpeculationSettings {
        algorithm,
        budget: Some(budget),
        ..args.spec.settings()
    };
    let generator = generator.with_speculation(settings, Some(drafter as &dyn Drafter))?;
    let prefix = match algorithm {
        grove_engine::SpecAlgorithm::DFlash => "dflash",
        _ => "ddtree",
    };
    Ok((budget_name(prefix, budget), generator))
}

/// A method's name in the tables: `ddtree-b4`, `ngram-auto`.
fn budget_name(prefix: &str, budget: Budget) -> String {
    match budget {
        Budget::Fixed(nodes) => format!("{prefix}-b{nodes}"),
        Budget::Auto => format!("{prefix}-auto"),
    }
}

/// Every method on the same random prompt per repetition, alternating, after one warm-up.
fn measure(
    args: &BenchArgs,
    methods: &[(String, Generator)],
    repetitions: usize,
    random_tokens: &mut impl FnMut(usize) -> Vec<TokenId>,
) -> Result<Vec<Samples>> {
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
            logprobs: None,
            prompt_logprobs: false,
            adjustments: Default::default(),
            grammar: None,
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
    Ok(samples)
}

/// Each method's spreads, with its speed as a ratio to plain decoding and to DFlash.
fn method_reports(methods: &[(String, Generator)], samples: Vec<Samples>) -> Vec<MethodReport> {
    let mut reports: Vec<MethodReport> = methods
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
    let baseline = reports[0].decode_tokens_per_s.median;
    let dflash = reports
        .iter()
        .find(|m| m.method == "dflash")
        .map(|m| m.decode_tokens_per_s.median);
    for report in &mut reports {
        report.decode_speedup_vs_none = report.decode_tokens_per_s.median / baseline;
        report.decode_speedup_vs_dflash = dflash.map(|d| report.decode_tokens_per_s.median / d);
    }
    reports
}

fn print_report(report: &BenchReport) {
    let spread = |s: &Spread| format!("{:>8.1} (min {:.1}, max {:.1})", s.median, s.min, s.max);
    eprintln!(
        "model {} | threads {} | page size {} | KV {} | {}",
        report.model,
        report.threads,
        report.page_size,
        report.kv_cache_dtype,
        crate::kernels_line()
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
    if let Some(auto) = &report.auto_budget {
        print_cost_table(auto);
    }
}

/// The automatic budget's measured costs (by context class and count) and calibration.
pub(super) fn print_cost_table(auto: &AutoBudgetReport) {
    for (name, unit, cells) in [
        ("verify", "rows", &auto.verify),
        ("draft", "sequences", &auto.draft),
    ] {
        eprintln!("auto budget: {name} cost (ms, moving average of measured steps)");
        let mut contexts: Vec<usize> = cells.iter().map(|c| c.context).collect();
        contexts.dedup();
        for context in contexts {
            let row: Vec<String> = cells
                .iter()
                .filter(|c| c.context == context)
                .map(|c| format!("{} {}: {:.2} (n={})", c.count, unit, c.ms, c.observations))
                .collect();
            eprintln!("  context >= {context:>5}: {}", row.join(", "));
        }
    }
    let factors: Vec<String> = auto.calibration.iter().map(|f| format!("{f:.2}")).collect();
    eprintln!(
        "auto budget: observed / predicted acceptance by depth: {}",
        factors.join(" ")
    );
}
