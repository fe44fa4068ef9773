//! What every benchmark measures with: the spread of repeated samples and the verify cost curve
//! (one forward of T causal rows after a fixed context, as a ratio to the 1-row time: what a
//! draft tree of a given size can cost on this machine before speculation stops paying).

use std::time::Instant;

use anyhow::Result;
use grove_core::TokenId;
use grove_kv::PagePool;
use grove_model::{ForwardBatch, LogitRows, Model, Segment};
use serde::Serialize;

use super::args::BenchArgs;

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

impl VerifyPoint {
    /// The points of `(rows, times in ms)`, each one's ratio to the first one's median.
    pub(crate) fn curve(times: impl IntoIterator<Item = (usize, Vec<f64>)>) -> Vec<Self> {
        let mut points: Vec<Self> = Vec::new();
        for (rows, times) in times {
            let ms = Spread::of(times);
            let one_row = points.first().map_or(ms.median, |p| p.ms.median);
            points.push(Self {
                rows,
                ratio_to_one_row: ms.median / one_row,
                ms,
            });
        }
        points
    }
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

    let mut curve = Vec::new();
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
        curve.push((rows, times));
    }
    Ok(VerifyPoint::curve(curve))
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
