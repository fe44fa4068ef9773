//! The startup measurement that seeds the cost table: verify forwards of 1 up to the most rows
//! a round may verify, and drafter blocks, at a short context, on the engine's own pools and
//! threads. It stops after about [`DEADLINE`] (a slow model measures fewer row counts; the
//! rounds fill in the rest), so the first request waits at most about that long.

use std::time::{Duration, Instant};

use candle_core::Tensor;
use grove_model::{ForwardBatch, LogitRows, ModelError, Segment};

use super::CostTable;
use crate::drafter::DraftBlock;
use crate::runner::RoundRunner;
use crate::sequence::Pools;
use crate::EngineError;

/// About how long the measurement may take.
const DEADLINE: Duration = Duration::from_millis(1200);

/// Row counts measured: every count up to 4, then two per doubling, and `max_rows`.
fn row_counts(max_rows: usize) -> Vec<usize> {
    let mut counts: Vec<usize> = (1..=4).collect();
    let mut power = 4;
    while power < max_rows {
        counts.extend([power * 3 / 2, power * 2]);
        power *= 2;
    }
    counts.retain(|&c| c < max_rows);
    counts.push(max_rows);
    counts
}

/// Seeds `costs` with verify forwards of up to `max_rows` rows and one-block drafts, unless
/// the pools are too full to measure in (then the rounds measure everything).
pub(crate) fn measure_costs(
    runner: &RoundRunner<'_>,
    pools: &mut Pools,
    max_rows: usize,
    costs: &mut CostTable,
) -> Result<(), EngineError> {
    // Without a drafter (lookup drafts) only the verify costs are measured.
    let drafter = runner.speculation.and_then(|s| s.drafter);
    let block = drafter.map_or(0, |d| d.block_size());
    let mut table = pools.pool.new_table();
    let mut draft_table = pools.draft_pool.new_table();
    if table.reserve(max_rows.max(block)).is_err() || draft_table.reserve(2 * block).is_err() {
        return Ok(());
    }
    let start = Instant::now();
    let taps = drafter.map_or(&[][..], |d| d.target_taps());
    let mut forward = |rows: usize| -> Result<(Duration, Vec<Tensor>), EngineError> {
        let tokens: Vec<u32> = (0..rows as u32).collect();
        let positions: Vec<usize> = (0..rows).collect();
        let batch = ForwardBatch {
            segments: vec![Segment::causal(&table, &tokens, &positions, LogitRows::All)],
            taps,
        };
        let begin = Instant::now();
        let output = runner.model.forward(&batch, &mut pools.kv)?;
        Ok((begin.elapsed(), output.taps))
    };
    // The first forward pays for cold caches and thread start-up: not counted.
    let (_, warm_taps) = forward(block.max(1))?;
    // Two passes when there is time, keeping each count's faster run: a shared machine only
    // ever adds time.
    let counts = row_counts(max_rows);
    let mut fastest: Vec<Option<Duration>> = vec![None; counts.len()];
    'passes: for _ in 0..2 {
        for (&rows, best) in counts.iter().zip(&mut fastest) {
            if start.elapsed() > DEADLINE {
                break 'passes;
            }
            let (elapsed, _) = forward(rows)?;
            *best = Some(best.map_or(elapsed, |b| b.min(elapsed)));
        }
    }
    for (&rows, best) in counts.iter().zip(&fastest) {
        if let Some(best) = best {
            costs.observe_verify(0, rows, best.as_secs_f64());
        }
    }
    let Some(drafter) = drafter.filter(|_| !warm_taps.is_empty()) else {
        return Ok(());
    };
    let features = Tensor::cat(&warm_taps, 1).map_err(ModelError::from)?;
    drafter.extend(&mut pools.draft_kv, &mut draft_table, &features)?;
    let position = draft_table.len();
    for attempt in 0..2 {
        // Every depth, as an automatic budget drafts.
        let mut blocks = [DraftBlock {
            table: &mut draft_table,
            anchor: 0,
            position,
            depths: block - 1,
        }];
        let begin = Instant::now();
        drafter.draft(runner.model, &mut pools.draft_kv, &mut blocks)?;
        if attempt == 1 {
            costs.observe_draft(0, 1, begin.elapsed().as_secs_f64());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn row_counts_cover_the_range_densely_at_first() {
        assert_eq!(row_counts(1), [1]);
        assert_eq!(row_counts(7), [1, 2, 3, 4, 6, 7]);
        assert_eq!(row_counts(33), [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 33]);
    }
}
