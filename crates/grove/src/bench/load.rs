//! `grove bench --load-change DIR`: the automatic budget under a changing load. Code prompts run
//! back to back for `--duration` seconds, alternating between the automatic budget and plain
//! decoding; half-way through another process starts taking a core (a shell busy loop). Writes
//! `load_change.json` (every request's speed, every step's choice and cost) and
//! `load_change.png`: the speeds, the nodes the automatic budget verified and the share of steps
//! that drafted, and the measured step costs, over time, with the load's start marked.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use grove_engine::{Budget, BudgetTracePoint, Generator, GeneratorOptions};
use plotters::prelude::*;
use serde::Serialize;

use super::args::BenchArgs;
use super::methods::speculative_method;
use super::report::{code_requests, register_font};
use crate::loading;

/// One request as it ran.
#[derive(Debug, Serialize)]
struct RequestPoint {
    /// Seconds since the run started, at the request's end.
    seconds: f64,
    method: &'static str,
    decode_tokens_per_s: f64,
    mean_budget: f64,
    rounds_without_drafts: usize,
    rounds: usize,
}

#[derive(Debug, Serialize)]
struct LoadReport {
    model: String,
    threads: usize,
    duration_s: f64,
    /// When the other process started.
    load_at_s: f64,
    requests: Vec<RequestPoint>,
    /// Every step of the automatic budget's engines.
    trace: Vec<BudgetTracePoint>,
}

/// A busy loop in another process, killed when dropped.
struct Spinner(Child);

impl Spinner {
    fn start() -> Result<Self> {
        let child = Command::new("sh")
            .args(["-c", "while :; do :; done"])
            .stdin(Stdio::null())
            .spawn()
            .context("starting the busy loop (sh)")?;
        Ok(Self(child))
    }
}

impl Drop for Spinner {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub fn run(args: &BenchArgs, dir: &Path) -> Result<()> {
    loading::with_threads(args.model.threads, |threads| measure(args, dir, threads))
}

fn measure(args: &BenchArgs, dir: &Path, threads: usize) -> Result<()> {
    let loaded = loading::load(&args.model)?;
    let Some(drafter) = args.spec.load_drafter(&loaded)? else {
        bail!("--load-change needs a drafter: --speculative-algorithm ddtree (and its path)");
    };
    let tokenizer = loaded
        .tokenizer
        .as_ref()
        .context("--load-change uses text prompts: the model needs a tokenizer")?;
    let stop_token_ids = loaded.stop_token_ids()?;
    let options = GeneratorOptions {
        page_size: args.model.page_size,
        ..Default::default()
    };
    let plain = Generator::new(&loaded.model, Some(tokenizer), options.clone());
    let generator = Generator::new(&loaded.model, Some(tokenizer), options);
    let (_, auto) = speculative_method(
        args,
        generator,
        &drafter,
        grove_engine::SpecAlgorithm::DDTree,
        Budget::Auto,
    )?;
    let requests = code_requests(tokenizer, &stop_token_ids, args.new_tokens)?;
    // Warm both (the automatic budget measures its costs on its first request).
    auto.generate(&requests[0], |_| {})?;
    plain.generate(&requests[0], |_| {})?;

    let duration = Duration::from_secs_f64(args.duration.max(2.0));
    let start = Instant::now();
    auto.start_budget_trace();
    let mut spinner = None;
    let mut points = Vec::new();
    for (index, request) in requests.iter().cycle().enumerate() {
        let elapsed = start.elapsed();
        if elapsed >= duration {
            break;
        }
        if spinner.is_none() && elapsed >= duration / 2 {
            eprintln!(
                "{:.1} s: another process starts taking a core",
                elapsed.as_secs_f64()
            );
            spinner = Some(Spinner::start()?);
        }
        let (method, generator) = if index % 2 == 0 {
            ("ddtree-auto", &auto)
        } else {
            ("none", &plain)
        };
        let stats = generator.generate(request, |_| {})?.stats;
        points.push(RequestPoint {
            seconds: start.elapsed().as_secs_f64(),
            method,
            decode_tokens_per_s: stats.decode_tokens_per_s,
            mean_budget: stats.mean_budget,
            rounds_without_drafts: stats.rounds_without_drafts,
            rounds: stats.rounds,
        });
    }
    drop(spinner);
    let report = LoadReport {
        model: loaded.dir.display().to_string(),
        threads,
        duration_s: duration.as_secs_f64(),
        load_at_s: duration.as_secs_f64() / 2.0,
        requests: points,
        trace: auto.take_budget_trace(),
    };
    write(&report, dir)
}

/// Median decode speed of `method`'s requests between `from` and `to` seconds.
fn median_speed(report: &LoadReport, method: &str, from: f64, to: f64) -> f64 {
    let mut speeds: Vec<f64> = report
        .requests
        .iter()
        .filter(|r| r.method == method && r.seconds >= from && r.seconds < to)
        .map(|r| r.decode_tokens_per_s)
        .collect();
    speeds.sort_by(f64::total_cmp);
    speeds.get(speeds.len() / 2).copied().unwrap_or(0.0)
}

fn write(report: &LoadReport, dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    std::fs::write(
        dir.join("load_change.json"),
        serde_json::to_string_pretty(report)?,
    )?;
    let (half, end) = (report.load_at_s, report.duration_s * 2.0);
    for (label, from, to) in [("before the load", 0.0, half), ("under load", half, end)] {
        let (auto, none) = (
            median_speed(report, "ddtree-auto", from, to),
            median_speed(report, "none", from, to),
        );
        eprintln!(
            "{label}: auto {auto:.1} tok/s, none {none:.1} tok/s, auto / none {:.3}",
            auto / none.max(1e-9)
        );
    }
    match register_font() {
        Ok(()) => {
            chart(report, dir)?;
            eprintln!("wrote {}/load_change.json, load_change.png", dir.display());
        }
        Err(error) => eprintln!(
            "wrote {}/load_change.json; chart skipped: {error:#}",
            dir.display()
        ),
    }
    Ok(())
}

/// Means of `value` over the trace's steps in windows of `window` seconds: `(mid, mean)`.
fn windowed(
    trace: &[BudgetTracePoint],
    window: f64,
    value: impl Fn(&BudgetTracePoint) -> Option<f64>,
) -> Vec<(f64, f64)> {
    let end = trace.last().map_or(0.0, |p| p.seconds);
    let mut out = Vec::new();
    let mut from = 0.0;
    while from < end {
        let values: Vec<f64> = trace
            .iter()
            .filter(|p| p.seconds >= from && p.seconds < from + window)
            .filter_map(&value)
            .collect();
        if !values.is_empty() {
            out.push((
                from + window / 2.0,
                values.iter().sum::<f64>() / values.len() as f64,
            ));
        }
        from += window;
    }
    out
}

/// Three panels over time: decode speed per request, the automatic budget's choice, step costs.
fn chart(report: &LoadReport, dir: &Path) -> Result<()> {
    let path = dir.join("load_change.png");
    let root = BitMapBackend::new(&path, (1000, 900)).into_drawing_area();
    root.fill(&WHITE)?;
    let panels = root.split_evenly((3, 1));
    let x_end = report.duration_s * 1.05;
    let green = RGBColor(0, 150, 70);

    let speed_max = report
        .requests
        .iter()
        .map(|r| r.decode_tokens_per_s)
        .fold(1.0, f64::max)
        * 1.15;
    let mut chart = panel(&panels[0], "decode tok/s per request", x_end, speed_max)?;
    for (method, color) in [("ddtree-auto", green), ("none", BLACK)] {
        let points: Vec<(f64, f64)> = report
            .requests
            .iter()
            .filter(|r| r.method == method)
            .map(|r| (r.seconds, r.decode_tokens_per_s))
            .collect();
        chart
            .draw_series(points.iter().map(|&p| Circle::new(p, 3, color.filled())))?
            .label(method)
            .legend(move |(x, y)| Circle::new((x + 8, y), 3, color.filled()));
    }
    load_marker(&mut chart, report.load_at_s, speed_max)?;
    legend(&mut chart)?;

    let window = 0.5;
    let nodes = windowed(&report.trace, window, |p| Some(p.nodes as f64));
    let drafted = windowed(&report.trace, window, |p| {
        Some(p.drafted as f64 / p.sequences.max(1) as f64)
    });
    let nodes_max = nodes.iter().map(|p| p.1).fold(1.0, f64::max) * 1.15;
    let mut chart = panel(
        &panels[1],
        "auto: nodes verified per step",
        x_end,
        nodes_max,
    )?;
    chart
        .draw_series(LineSeries::new(nodes, green.stroke_width(2)))?
        .label("mean nodes per step (0.5 s windows)")
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], green.stroke_width(2)));
    chart
        .draw_series(LineSeries::new(
            drafted.iter().map(|&(x, share)| (x, share * nodes_max)),
            BLUE.stroke_width(1),
        ))?
        .label("share of steps that drafted (top = all)")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], BLUE));
    load_marker(&mut chart, report.load_at_s, nodes_max)?;
    legend(&mut chart)?;

    let plain_verify = windowed(&report.trace, window, |p| {
        (p.drafted == 0).then_some(p.verify_ms)
    });
    let draft = windowed(&report.trace, window, |p| {
        (p.drafted > 0).then_some(p.draft_ms)
    });
    let ms_max = plain_verify
        .iter()
        .chain(&draft)
        .map(|p| p.1)
        .fold(1.0, f64::max)
        * 1.15;
    let mut chart = panel(&panels[2], "measured step cost (ms)", x_end, ms_max)?;
    chart
        .draw_series(LineSeries::new(plain_verify, BLACK.stroke_width(2)))?
        .label("verify, steps without drafts")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], BLACK.stroke_width(2)));
    chart
        .draw_series(LineSeries::new(draft, RED.stroke_width(2)))?
        .label("draft, steps that drafted")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], RED.stroke_width(2)));
    load_marker(&mut chart, report.load_at_s, ms_max)?;
    legend(&mut chart)?;
    root.present()?;
    Ok(())
}

type Panel<'a> = ChartContext<
    'a,
    BitMapBackend<'a>,
    Cartesian2d<plotters::coord::types::RangedCoordf64, plotters::coord::types::RangedCoordf64>,
>;

fn panel<'a>(
    area: &DrawingArea<BitMapBackend<'a>, plotters::coord::Shift>,
    label: &str,
    x_end: f64,
    y_max: f64,
) -> Result<Panel<'a>> {
    let mut chart = ChartBuilder::on(area)
        .caption(label, ("sans-serif", 18))
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(50)
        .build_cartesian_2d(0.0..x_end, 0.0..y_max)?;
    chart
        .configure_mesh()
        .x_desc("seconds")
        .y_desc(label)
        .draw()?;
    Ok(chart)
}

fn load_marker(chart: &mut Panel<'_>, at: f64, y_max: f64) -> Result<()> {
    chart
        .draw_series(LineSeries::new([(at, 0.0), (at, y_max)], RED.mix(0.5)))?
        .label("another process takes a core")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], RED.mix(0.5)));
    Ok(())
}

fn legend(chart: &mut Panel<'_>) -> Result<()> {
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()?;
    Ok(())
}
