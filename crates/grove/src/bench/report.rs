//! `grove bench --report DIR`: none, DFlash (whole block, and its chain length chosen each
//! round) and DDTree over a budget sweep on a fixed set of
//! code prompts, in one run; writes `report.json` and two charts like the DDTree paper's:
//! speedup and tau against the tree budget, and the per-round acceptance-length distribution of
//! DFlash and the best DDTree budget.

use std::path::Path;

use anyhow::{bail, Context, Result};
use grove_core::{SamplingParams, StopCondition};
use grove_engine::{
    Budget, DFlashSpec, GenerateRequest, Generator, GeneratorOptions, SpecAlgorithm,
};
use plotters::prelude::*;
use serde::Serialize;

use super::args::BenchArgs;
use super::measure::Spread;
use super::methods::speculative_method;
use crate::loading;

/// Code prompts: function headers and docstrings of the kind HumanEval poses.
pub const PROMPTS: [&str; 10] = [
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "def is_palindrome(text):\n    \"\"\"Return True if text reads the same backwards.\"\"\"\n",
    "import os\n\n\ndef list_python_files(root):\n",
    "class Stack:\n    def __init__(self):\n",
    "def parse_args(argv):\n    parser = argparse.ArgumentParser(",
    "def read_lines(path):\n    with open(path) as f:\n",
    "    def __repr__(self):\n        return ",
    "def merge_sorted(a, b):\n    result = []\n",
    "for i in range(len(items)):\n    if ",
    "def count_words(text):\n    counts = {}\n",
];

#[derive(Debug, Serialize)]
struct MethodResult {
    method: String,
    /// Non-root nodes per round (0 for none; the chain length for DFlash; the ceiling for
    /// `auto`).
    budget: usize,
    /// The budget was chosen each round (`dflash-auto`, `ddtree-auto`).
    auto: bool,
    /// Draft nodes verified per round, on average.
    mean_budget: f64,
    decode_tokens_per_s: Spread,
    mean_accept_length: f64,
    speedup_vs_none: f64,
    /// `accept_histogram[k]`: rounds that emitted `k + 1` tokens.
    accept_histogram: Vec<usize>,
}

#[derive(Debug, Serialize)]
struct Report {
    model: String,
    drafter: String,
    threads: usize,
    prompts: usize,
    new_tokens: usize,
    repetitions: usize,
    methods: Vec<MethodResult>,
}

/// Greedy requests of `new_tokens` tokens for [`PROMPTS`], stopping at the model's stop tokens.
pub(super) fn code_requests(
    tokenizer: &grove_model::TextTokenizer,
    stop_token_ids: &[u32],
    new_tokens: usize,
) -> Result<Vec<GenerateRequest>> {
    PROMPTS
        .iter()
        .map(|text| {
            Ok(GenerateRequest {
                prompt: tokenizer.encode(text, true)?,
                sampling: SamplingParams::greedy(),
                stop: StopCondition {
                    max_new_tokens: new_tokens,
                    stop_token_ids: stop_token_ids.to_vec(),
                    stop_strings: Vec::new(),
                },
                speculation: Default::default(),
                logprobs: None,
                prompt_logprobs: false,
                adjustments: Default::default(),
                grammar: None,
            })
        })
        .collect()
}

pub fn run(args: &BenchArgs, dir: &Path) -> Result<()> {
    loading::with_threads(args.model.threads, |threads| report(args, dir, threads))
}

fn report(args: &BenchArgs, dir: &Path, threads: usize) -> Result<()> {
    let loaded = loading::load(&args.model)?;
    let Some(drafter_path) = args.spec.drafter_path(&loaded)? else {
        bail!("--report needs a drafter: --speculative-algorithm ddtree --speculative-draft-model-path DIR");
    };
    let drafter = args.spec.load_drafter_from(&loaded, &drafter_path)?;
    let tokenizer = loaded
        .tokenizer
        .as_ref()
        .context("--report uses text prompts: the model needs tokenizer.json")?;
    let stop_token_ids = loaded.stop_token_ids()?;
    let block = drafter.config().block_size;
    let budgets = if args.budgets.is_empty() {
        let mut budgets: Vec<Budget> = [1, 2, 4, 8, 16, 32].map(Budget::Fixed).to_vec();
        budgets.push(Budget::Auto);
        budgets
    } else {
        args.budgets.clone()
    };
    let methods = methods_to_compare(args, &loaded.model, tokenizer, &drafter, &budgets)?;
    let requests = code_requests(tokenizer, &stop_token_ids, args.new_tokens)?;
    let repetitions = args.repetitions.max(1);
    let results = measure(&methods, &requests, repetitions, block)?;
    let report = Report {
        model: loaded.dir.display().to_string(),
        drafter: drafter_path.display().to_string(),
        threads,
        prompts: PROMPTS.len(),
        new_tokens: args.new_tokens,
        repetitions,
        methods: results,
    };
    write(&report, dir)
}

/// Plain decoding, DFlash with the drafter's block and DDTree at each of `budgets`, each with
/// its budget.
fn methods_to_compare<'a>(
    args: &BenchArgs,
    model: &'a grove_model::Decoder,
    tokenizer: &'a grove_model::TextTokenizer,
    drafter: &'a grove_model::DFlashDrafter,
    budgets: &[Budget],
) -> Result<Vec<(String, usize, Generator<'a>)>> {
    let block = drafter.config().block_size;
    let options = GeneratorOptions {
        page_size: args.model.page_size,
        ..Default::default()
    };
    let mut methods: Vec<(String, usize, Generator)> = vec![
        (
            "none".into(),
            0,
            Generator::new(model, Some(tokenizer), options.clone()),
        ),
        (
            "dflash".into(),
            block - 1,
            Generator::new(model, Some(tokenizer), options.clone()).with_dflash(DFlashSpec {
                drafter,
                num_draft_tokens: block,
            })?,
        ),
    ];
    // DFlash choosing its chain length each round, as the automatic tree budget does: the
    // fair chain to set the trees beside.
    let runs = std::iter::once((SpecAlgorithm::DFlash, Budget::Auto)).chain(
        budgets
            .iter()
            .map(|&budget| (SpecAlgorithm::DDTree, budget)),
    );
    for (algorithm, budget) in runs {
        let generator = Generator::new(model, Some(tokenizer), options.clone());
        let (name, generator) = speculative_method(args, generator, drafter, algorithm, budget)?;
        methods.push((name, generator.max_budget(), generator));
    }
    Ok(methods)
}

/// Decode speed and acceptance of every method on every prompt, methods alternating, after
/// one warm-up repetition.
fn measure(
    methods: &[(String, usize, Generator)],
    requests: &[GenerateRequest],
    repetitions: usize,
    block: usize,
) -> Result<Vec<MethodResult>> {
    let mut speeds: Vec<Vec<f64>> = vec![Vec::new(); methods.len()];
    let mut nodes = vec![0; methods.len()];
    let mut histograms: Vec<Vec<usize>> = vec![vec![0; block]; methods.len()];
    for repetition in 0..repetitions + 1 {
        for request in requests {
            // Methods alternate on each prompt, so drift on a shared machine hits all alike.
            for (index, (_, _, generator)) in methods.iter().enumerate() {
                let stats = generator.generate(request, |_| {})?.stats;
                if repetition == 0 || stats.rounds == 0 {
                    continue; // warm-up, or nothing decoded
                }
                speeds[index].push(stats.decode_tokens_per_s);
                nodes[index] += stats.tree_nodes;
                for &tau in &stats.accept_lengths {
                    histograms[index][tau - 1] += 1;
                }
            }
        }
    }
    let none_speed = Spread::of(speeds[0].clone()).median;
    let results: Vec<MethodResult> = methods
        .iter()
        .zip(speeds)
        .zip(histograms)
        .zip(nodes)
        .map(
            |((((name, budget, generator), speeds), histogram), nodes)| {
                let spread = Spread::of(speeds);
                let rounds: usize = histogram.iter().sum();
                let tokens: usize = histogram.iter().enumerate().map(|(k, n)| (k + 1) * n).sum();
                MethodResult {
                    method: name.clone(),
                    budget: *budget,
                    auto: generator.auto_budget(),
                    mean_budget: nodes as f64 / rounds.max(1) as f64,
                    speedup_vs_none: spread.median / none_speed,
                    decode_tokens_per_s: spread,
                    mean_accept_length: tokens as f64 / rounds.max(1) as f64,
                    accept_histogram: histogram,
                }
            },
        )
        .collect();
    Ok(results)
}

/// `report.json`, the table on stderr and the charts.
fn write(report: &Report, dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    std::fs::write(
        dir.join("report.json"),
        serde_json::to_string_pretty(report)?,
    )?;
    eprintln!("  method       budget  mean nodes  decode tok/s   x none   tau");
    for m in &report.methods {
        eprintln!(
            "  {:<12} {:>6} {:>11.2} {:>13.1} {:>8.2} {:>5.2}",
            m.method,
            m.budget,
            m.mean_budget,
            m.decode_tokens_per_s.median,
            m.speedup_vs_none,
            m.mean_accept_length
        );
    }
    match register_font() {
        Ok(()) => {
            charts(report, dir)?;
            eprintln!(
                "wrote {}/report.json, budget.png, acceptance.png",
                dir.display()
            );
        }
        Err(error) => eprintln!(
            "wrote {}/report.json; charts skipped: {error:#}",
            dir.display()
        ),
    }
    Ok(())
}

/// Registers a system sans-serif TTF for chart text (plotters draws glyphs itself).
pub(crate) fn register_font() -> Result<()> {
    const CANDIDATES: [&str; 3] = [
        "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
        "/usr/share/fonts/dejavu/DejaVuSans.ttf",
        "/usr/share/fonts/TTF/DejaVuSans.ttf",
    ];
    let path = CANDIDATES
        .iter()
        .find(|p| Path::new(p).is_file())
        .context("no DejaVuSans.ttf found for chart text (apt install fonts-dejavu-core)")?;
    let bytes: &'static [u8] = Box::leak(std::fs::read(path)?.into_boxed_slice());
    plotters::style::register_font("sans-serif", FontStyle::Normal, bytes)
        .map_err(|_| anyhow::anyhow!("{path} is not a usable font"))?;
    Ok(())
}

fn charts(report: &Report, dir: &Path) -> Result<()> {
    let trees: Vec<&MethodResult> = report
        .methods
        .iter()
        .filter(|m| m.method.starts_with("ddtree") && !m.auto)
        .collect();
    let auto = report
        .methods
        .iter()
        .find(|m| m.auto && m.method.starts_with("ddtree"));
    let dflash = report
        .methods
        .iter()
        .find(|m| m.method == "dflash")
        .context("dflash ran")?;
    budget_chart(&trees, dflash, auto, dir)?;
    // The best fixed budget, or the automatic one where no fixed budget ran (`--budgets auto`).
    let best = (trees.iter().copied())
        .max_by(|a, b| a.speedup_vs_none.total_cmp(&b.speedup_vs_none))
        .or(auto)
        .context("a ddtree budget ran")?;
    acceptance_chart(dflash, best, dir)
}

/// `budget.png`: speedup and tau of each DDTree budget; DFlash, the automatic budget and plain
/// decoding as lines.
fn budget_chart(
    trees: &[&MethodResult],
    dflash: &MethodResult,
    auto: Option<&MethodResult>,
    dir: &Path,
) -> Result<()> {
    let xs: Vec<f64> = trees.iter().map(|m| (m.budget as f64).log2()).collect();
    let x_range = xs.first().copied().unwrap_or(0.0) - 0.3..xs.last().copied().unwrap_or(1.0) + 0.3;

    let path = dir.join("budget.png");
    let root = BitMapBackend::new(&path, (900, 700)).into_drawing_area();
    root.fill(&WHITE)?;
    let (top, bottom) = root.split_vertically(350);
    for (area, label, value) in [
        (
            &top,
            "decode speedup vs none",
            &(|m: &MethodResult| m.speedup_vs_none) as &dyn Fn(&MethodResult) -> f64,
        ),
        (&bottom, "tau (tokens per round)", &|m: &MethodResult| {
            m.mean_accept_length
        }),
    ] {
        let ys: Vec<f64> = trees
            .iter()
            .map(|m| value(m))
            .chain([value(dflash), 1.0])
            .chain(auto.map(value))
            .collect();
        let y_max = ys.iter().copied().fold(0.0, f64::max) * 1.15;
        let mut chart = ChartBuilder::on(area)
            .caption(format!("DDTree budget sweep: {label}"), ("sans-serif", 20))
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(50)
            .build_cartesian_2d(x_range.clone(), 0.0..y_max)?;
        chart
            .configure_mesh()
            .x_desc("tree budget (non-root nodes)")
            .y_desc(label)
            // Ticks fall between budgets too; label only the powers of two.
            .x_label_formatter(&|x| {
                if (x - x.round()).abs() < 1e-6 {
                    format!("{:.0}", 2f64.powf(x.round()))
                } else {
                    String::new()
                }
            })
            .draw()?;
        chart
            .draw_series(LineSeries::new(
                xs.iter().copied().zip(trees.iter().map(|m| value(m))),
                BLUE.stroke_width(2),
            ))?
            .label("DDTree")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], BLUE.stroke_width(2)));
        chart.draw_series(
            xs.iter()
                .zip(trees.iter())
                .map(|(&x, m)| Circle::new((x, value(m)), 4, BLUE.filled())),
        )?;
        chart
            .draw_series(LineSeries::new(
                [(x_range.start, value(dflash)), (x_range.end, value(dflash))],
                RED.stroke_width(2),
            ))?
            .label(format!("DFlash (block {})", dflash.budget + 1))
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], RED.stroke_width(2)));
        if let Some(auto) = auto {
            let color = RGBColor(0, 150, 70);
            chart
                .draw_series(LineSeries::new(
                    [(x_range.start, value(auto)), (x_range.end, value(auto))],
                    color.stroke_width(2),
                ))?
                .label(format!("auto (mean {:.1} nodes)", auto.mean_budget))
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2))
                });
        }
        chart
            .draw_series(LineSeries::new(
                [(x_range.start, 1.0), (x_range.end, 1.0)],
                BLACK.mix(0.4),
            ))?
            .label("none")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], BLACK.mix(0.4)));
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()?;
    }
    root.present()?;
    Ok(())
}

/// `acceptance.png`: how many tokens DFlash's and the best budget's rounds emitted.
fn acceptance_chart(dflash: &MethodResult, best: &MethodResult, dir: &Path) -> Result<()> {
    let path = dir.join("acceptance.png");
    let root = BitMapBackend::new(&path, (900, 420)).into_drawing_area();
    root.fill(&WHITE)?;
    let fractions = |m: &MethodResult| -> Vec<f64> {
        let total: usize = m.accept_histogram.iter().sum();
        m.accept_histogram
            .iter()
            .map(|&n| n as f64 / total.max(1) as f64)
            .collect()
    };
    let (f_dflash, f_tree) = (fractions(dflash), fractions(best));
    let max_len = f_dflash.len();
    let y_max = f_dflash.iter().chain(&f_tree).copied().fold(0.0, f64::max) * 1.15;
    let mut chart = ChartBuilder::on(&root)
        .caption("Tokens emitted per round", ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(50)
        .build_cartesian_2d(0.5..max_len as f64 + 0.5, 0.0..y_max)?;
    chart
        .configure_mesh()
        .x_desc("acceptance length (accepted drafts + 1)")
        .y_desc("fraction of rounds")
        .x_label_formatter(&|x| format!("{x:.0}"))
        .draw()?;
    for (offset, color, fractions, label) in [
        (
            -0.2,
            RED,
            &f_dflash,
            format!("DFlash (mean {:.2})", dflash.mean_accept_length),
        ),
        (
            0.2,
            BLUE,
            &f_tree,
            format!("{} (mean {:.2})", best.method, best.mean_accept_length),
        ),
    ] {
        chart
            .draw_series(fractions.iter().enumerate().map(|(k, &f)| {
                let x = k as f64 + 1.0 + offset;
                Rectangle::new([(x - 0.18, 0.0), (x + 0.18, f)], color.filled())
            }))?
            .label(label)
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 14, y + 5)], color.filled()));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}
