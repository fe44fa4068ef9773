//! `--speculative-ddtree-budget auto`: the draft nodes each round verifies, chosen per round and
//! per sequence from this machine's measured costs (`cost.rs`) and the drafter's calibrated
//! predictions (`acceptance.rs`), by the rules in `choice.rs`.
//!
//! Each step asks twice. Before drafting: which sequences draft at all (a sequence whose recent
//! drafted rounds did not pay for the drafter skips it, and looks again after a back-off that
//! doubles while drafting keeps not paying). After drafting: how many of each tree's nodes are
//! verified (a prefix of the best-first tree: exactly the tree that budget builds). Neither
//! choice changes what is emitted: the walk samples the target at each visited node whatever
//! the tree, so greedy output equals plain decoding's and sampling stays exact.
//!
//! One [`AutoBudget`] serves every engine of a generator (the table outlives one-shot calls).

mod acceptance;
mod choice;
mod cost;
mod measure;
mod round;

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use serde::Serialize;

use crate::speculation::Method;

pub(crate) use acceptance::Calibration;
pub(crate) use choice::{choose_drafting, choose_nodes, DraftOption};
pub use cost::{CostCell, CostTable};
pub(crate) use measure::measure_costs;

/// Rounds a sequence skips drafting before it looks again, doubling per look that did not
/// pay, up to [`MAX_SKIP`]; both times what a look costs in plain rounds (at least 1), so that
/// looking never costs more than about an eighth of the time, and in the long run well under
/// a hundredth, however slow the drafter.
const FIRST_SKIP: usize = 8;
const MAX_SKIP: usize = 256;

/// Looks in a row that did not pay after which a sequence stops keeping the drafter's context
/// (the drafter's share of every round, about a fortieth of a decode step on the default pair):
/// it decodes plainly to its end. Later sequences look again when the engine's back-off says so.
const DORMANT_AFTER: u32 = 3;

/// Weight of a drafted round in a sequence's recent value (its first rounds are averaged).
const VALUE_EMA: f64 = 0.3;

/// Drafted rounds a sequence looks for before its value may stop it drafting: one round is
/// too noisy to judge a drafter by (one that accepts 1.7 tokens a round on Qwen2.5-Coder-1.5B
/// accepts none in a third of its rounds, and a first look that happened to accept none
/// sent `grove generate` to 8 plain rounds).
const FIRST_LOOK: u32 = 3;

/// The fewest depths an automatic budget drafts to once it knows how deep its trees go.
const MIN_DEPTHS: usize = 4;

/// What drafting gave a sequence lately, and when it looks again.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct SequenceBudget {
    /// Accepted drafts of its drafted rounds (`None`: it has not drafted yet).
    value: Option<f64>,
    /// Draft nodes its drafted rounds verified.
    rows: f64,
    /// Rounds since it last drafted.
    skipped: usize,
    /// Looks in a row after which drafting did not pay.
    failures: u32,
    /// It drafted in the last round (only because it had to look).
    looked: bool,
    /// It keeps no drafter context: drafting did not pay, so it decodes plainly.
    dormant: bool,
    /// Rounds it drafted (a new sequence starts from the prior's count).
    drafted_rounds: u32,
    /// How deep its verified trees went lately, less one per drafted round since (`None`:
    /// not known, or a tree reached the depth drafted: draft every depth).
    reach: Option<usize>,
}

impl SequenceBudget {
    /// Rounds to skip before the next look, when a look costs `look_cost` plain rounds more
    /// than a plain round.
    fn look_after(&self, look_cost: f64) -> f64 {
        let rounds = (FIRST_SKIP << self.failures.saturating_sub(1).min(16)).min(MAX_SKIP);
        rounds as f64 * look_cost.max(1.0)
    }

    /// Rows its drafted rounds verify, for predicting a round that drafts.
    pub fn rows(&self) -> f64 {
        self.rows
    }

    /// It drafts this round because it had to look, not because drafting paid lately.
    pub fn looking(&self) -> bool {
        self.looked
    }

    pub fn dormant(&self) -> bool {
        self.dormant
    }

    /// A round of a dormant sequence: it only counts toward the engine's next look.
    pub fn skipped_dormant(&mut self) {
        self.skipped += 1;
    }

    /// Whether, after this round's plan, it should stop keeping the drafter's context.
    pub fn falls_dormant(&mut self) -> bool {
        if !self.dormant && !self.looked && self.skipped > 0 && self.failures >= DORMANT_AFTER {
            self.dormant = true;
        }
        self.dormant
    }

    /// This round's option for the drafting plan (`look_cost`: see [`Self::look_after`]).
    pub fn option(&self, look_cost: f64) -> DraftOption {
        DraftOption {
            value: self.value.unwrap_or(0.0),
            rows: self.rows,
            forced: self.value.is_none()
                || self.drafted_rounds < FIRST_LOOK
                || self.skipped as f64 >= self.look_after(look_cost),
        }
    }

    /// Records the plan's verdict for this round.
    pub fn planned(&mut self, drafts: bool, forced: bool) {
        if drafts {
            if !forced {
                self.failures = 0;
            }
            self.looked = forced;
            self.skipped = 0;
        } else {
            if self.looked {
                // It looked last round, and what it saw does not pay.
                self.failures += 1;
            }
            self.looked = false;
            self.skipped += 1;
        }
    }

    /// The depths to draft to, of at most `most`: twice its recent reach and two more (at
    /// least [`MIN_DEPTHS`]). A tree of `m` nodes is at most `m` deep, and each depth costs
    /// the drafter's LM head a row (most of a draft on a real target); a tree that reaches
    /// the depths drafted opens every depth for the next round.
    pub fn depths(&self, most: usize) -> usize {
        self.reach
            .map_or(most, |reach| (2 * reach + 2).max(MIN_DEPTHS))
            .min(most)
    }

    /// Folds in how deep a drafted round's verified tree went (`depth`) of the `drafted`
    /// depths it had.
    pub fn reached(&mut self, depth: usize, drafted: usize) {
        self.reach = match self.reach {
            _ if depth >= drafted => None,
            Some(reach) => Some(depth.max(reach.saturating_sub(1))),
            None => Some(depth),
        };
    }

    /// Folds in a drafted round: `accepted` drafts of `rows` verified nodes (what drafting
    /// gave, observed: it does not wait for the calibration to trust the drafter).
    pub fn drafted(&mut self, accepted: f64, rows: usize) {
        let rows = rows as f64;
        self.drafted_rounds = self.drafted_rounds.saturating_add(1);
        // The mean of the first rounds, then a moving average.
        let weight = (1.0 / f64::from(self.drafted_rounds)).max(VALUE_EMA);
        (self.value, self.rows) = match self.value {
            None => (Some(accepted), rows),
            Some(v) => (
                Some(v + weight * (accepted - v)),
                self.rows + weight * (rows - self.rows),
            ),
        };
    }
}

/// One step's choice, for the benchmark's trace.
#[derive(Debug, Clone, Serialize)]
pub struct BudgetTracePoint {
    /// Seconds since the trace started.
    pub seconds: f64,
    pub sequences: usize,
    /// Sequences that drafted.
    pub drafted: usize,
    /// Draft nodes verified, summed over the batch.
    pub nodes: usize,
    /// The step's verify and draft time.
    pub verify_ms: f64,
    pub draft_ms: f64,
}

/// The measured costs, calibration and recent value shared by a generator's engines.
#[derive(Debug)]
pub(crate) struct AutoBudget {
    pub costs: CostTable,
    pub calibration: Calibration,
    /// Lookup drafts' own: their scores are shares of earlier continuations, not a drafter's.
    pub lookup_calibration: Calibration,
    /// What new sequences start from: the last drafted sequence's state.
    pub prior: SequenceBudget,
    /// Node choices made (every few explore one node further).
    pub choices: u64,
    /// What a look cost lately, in plain rounds (see [`SequenceBudget::look_after`]).
    pub look_cost: f64,
    trace: Option<(Instant, Vec<BudgetTracePoint>)>,
}

impl AutoBudget {
    pub fn shared() -> Arc<Mutex<Self>> {
        Arc::new(Mutex::new(Self {
            costs: CostTable::default(),
            calibration: Calibration::default(),
            lookup_calibration: Calibration::default(),
            prior: SequenceBudget::default(),
            choices: 0,
            look_cost: 1.0,
            trace: None,
        }))
    }

    /// The calibration of `method`'s drafts.
    pub fn calibration_mut(&mut self, method: Method) -> &mut Calibration {
        match method {
            Method::Lookup { .. } => &mut self.lookup_calibration,
            _ => &mut self.calibration,
        }
    }

    /// Locks `shared`, whatever a panicking holder left (the table stays usable).
    pub fn lock(shared: &Mutex<Self>) -> MutexGuard<'_, Self> {
        shared.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A new sequence's state: what drafting gave lately and how long ago anyone looked (so
    /// short requests still look now and then).
    pub fn new_sequence(&self) -> SequenceBudget {
        let prior = self.prior;
        SequenceBudget {
            looked: false,
            // Drafting has not paid lately: it starts without the drafter's context, unless it
            // is time for the engine to look again.
            dormant: prior.failures >= DORMANT_AFTER
                && (prior.skipped as f64) < prior.look_after(self.look_cost),
            ..prior
        }
    }

    /// Predicted seconds of a round at mean context `context` with `drafting` sequences
    /// drafting and `rows` rows verified (`None` before anything was measured).
    pub fn round_seconds(&self, context: usize, drafting: usize, rows: usize) -> Option<f64> {
        Some(self.costs.draft(context, drafting)? + self.costs.verify(context, rows)?)
    }

    /// What a look (one drafted round verifying `rows` nodes) costs beyond a plain round, in
    /// plain rounds (1 before anything was measured).
    pub fn look_cost(&self, context: usize, rows: f64) -> f64 {
        let rows = 1 + rows.round().max(1.0) as usize;
        match (
            self.round_seconds(context, 1, rows),
            self.costs.verify(context, 1),
        ) {
            (Some(look), Some(plain)) if plain > 0.0 => (look - plain) / plain,
            _ => 1.0,
        }
    }

    pub fn start_trace(&mut self) {
        self.trace = Some((Instant::now(), Vec::new()));
    }

    pub fn take_trace(&mut self) -> Vec<BudgetTracePoint> {
        self.trace
            .take()
            .map_or_else(Vec::new, |(_, points)| points)
    }

    pub fn record(&mut self, mut point: BudgetTracePoint) {
        if let Some((start, points)) = self.trace.as_mut() {
            point.seconds = start.elapsed().as_secs_f64();
            points.push(point);
        }
    }
}

/// What `grove bench` prints: the cost table, the calibration and the choice trace.
#[derive(Debug, Clone, Serialize)]
pub struct AutoBudgetReport {
    pub verify: Vec<CostCell>,
    pub draft: Vec<CostCell>,
    /// Observed / predicted acceptance per depth (1 = a calibrated drafter).
    pub calibration: Vec<f64>,
}

impl AutoBudget {
    pub fn report(&self) -> AutoBudgetReport {
        AutoBudgetReport {
            verify: self.costs.verify_cells(),
            draft: self.costs.draft_cells(),
            calibration: self.calibration.factors(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sequence_whose_drafting_never_pays_looks_again_ever_later() {
        let mut state = SequenceBudget::default();
        assert!(state.option(1.0).forced, "never drafted: it must look");
        state.planned(true, true);
        state.drafted(0.1, 3);
        let mut looks = Vec::new();
        for round in 0..1000 {
            let option = state.option(1.0);
            // Costs never favour drafting: only forced looks draft.
            state.planned(option.forced, option.forced);
            if option.forced {
                looks.push(round);
                state.drafted(0.1, 3);
            }
        }
        // The first look goes on for its rounds, then the back-off starts.
        let first = FIRST_LOOK as usize - 1;
        assert_eq!(looks[..first], (0..first).collect::<Vec<_>>());
        let looks = &looks[first..];
        let gaps: Vec<usize> = looks.windows(2).map(|w| w[1] - w[0]).collect();
        assert_eq!(looks[0], first + FIRST_SKIP);
        assert!(gaps.windows(2).all(|w| w[1] >= w[0]), "{gaps:?}");
        assert_eq!(*gaps.last().unwrap(), MAX_SKIP + 1);
    }

    #[test]
    fn a_first_look_of_a_few_rounds_is_judged_by_their_mean() {
        let mut state = SequenceBudget::default();
        for (round, accepted) in [0.0, 3.0, 3.0].into_iter().enumerate() {
            assert!(state.option(1.0).forced, "round {round} of the first look");
            state.planned(true, true);
            state.drafted(accepted, 4);
        }
        assert!(!state.option(1.0).forced, "the look is over");
        assert_eq!(state.option(1.0).value, 2.0);
        // Then each round moves the value by the moving average's weight.
        state.planned(true, false);
        state.drafted(0.0, 4);
        assert!((state.option(1.0).value - 2.0 * (1.0 - VALUE_EMA)).abs() < 1e-12);
    }

    #[test]
    fn drafts_reach_twice_as_deep_as_trees_went_lately_and_all_the_way_when_one_hits_the_end() {
        let mut state = SequenceBudget::default();
        assert_eq!(state.depths(15), 15, "nothing known: every depth");
        state.reached(5, 15);
        assert_eq!(state.depths(15), 12);
        assert_eq!(state.depths(10), 10, "never past the most");
        // Shallower trees lower the reach one round at a time.
        for (depth, expected) in [(1, 10), (2, 8), (0, 6), (0, 4), (0, MIN_DEPTHS)] {
            state.reached(depth, state.depths(15));
            assert_eq!(state.depths(15), expected, "after a tree {depth} deep");
        }
        // A tree as deep as what was drafted: the next round drafts every depth.
        state.reached(MIN_DEPTHS, state.depths(15));
        assert_eq!(state.depths(15), 15);
        state.reached(3, 15);
        assert_eq!(state.depths(15), 8);
    }

    #[test]
    fn drafting_that_pays_resets_the_back_off() {
        let mut state = SequenceBudget {
            value: Some(2.0),
            rows: 4.0,
            failures: 5,
            ..Default::default()
        };
        state.planned(true, false);
        assert_eq!(state.failures, 0);
        assert_eq!(state.look_after(1.0), FIRST_SKIP as f64);
        assert_eq!(
            state.look_after(3.0),
            3.0 * FIRST_SKIP as f64,
            "a costly look waits longer"
        );
    }
}
