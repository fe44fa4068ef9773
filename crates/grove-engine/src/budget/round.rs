//! The automatic budget's three points in a round (`RoundRunner::step`): before drafting
//! (who drafts), after drafting (how many nodes each tree keeps) and after verifying (what the
//! step cost, into the table).

use std::time::Duration;

use grove_spec::{merge_trees, DraftTree};

use super::{choose_drafting, choose_nodes, AutoBudget, BudgetTracePoint, DraftOption};
use crate::runner::{RoundRunner, StepTimings};
use crate::sequence::Sequence;
use crate::speculation::Method;

/// Per sequence of a batch, the drafter's tree and the lookup tree its tree was merged from.
pub(crate) type Sources = Vec<Option<(DraftTree, DraftTree)>>;

/// Every this many choices, one node past the first drop is verified too (see `choose_nodes`).
const EXPLORE_EVERY: u64 = 8;

impl RoundRunner<'_> {
    /// Decides which sequences draft this round (`Sequence::draft_now`): every sequence with a
    /// fixed budget; those with an automatic one when their recent drafted rounds predict a
    /// higher throughput than not drafting, or when it is time to look again.
    pub(crate) fn plan_drafting(&self, batch: &mut [&mut Sequence<'_>], context: usize) {
        let mut auto = AutoBudget::lock(&self.auto);
        let mut options: Vec<Option<DraftOption>> = Vec::with_capacity(batch.len());
        for sequence in batch.iter_mut() {
            options.push(match (sequence.method.uses_drafter(), sequence.auto) {
                (false, _) => None,
                (true, false) => Some(DraftOption {
                    value: 0.0,
                    rows: sequence.method.budget() as f64,
                    forced: true,
                }),
                (true, true) if sequence.budget.dormant() => {
                    sequence.drop_draft_context();
                    None
                }
                (true, true) => {
                    auto.look_cost = auto.look_cost(context, sequence.budget.rows());
                    Some(sequence.budget.option(auto.look_cost))
                }
            });
        }
        let chosen = if auto.costs.is_empty() {
            options.iter().map(Option::is_some).collect()
        } else {
            choose_drafting(batch.len(), &options, |drafting, rows| {
                auto.round_seconds(context, drafting, rows.round() as usize)
                    .unwrap_or(f64::INFINITY)
            })
        };
        for ((sequence, option), drafts) in batch.iter_mut().zip(&options).zip(chosen) {
            if let Method::Lookup { .. } = sequence.method {
                // A lookup costs next to nothing: every round looks, and the nodes it verifies
                // are chosen after (`choose_budgets`).
                sequence.draft_now = true;
                continue;
            }
            sequence.draft_now = drafts;
            if !drafts && sequence.method.drafts() {
                sequence.rounds_without_drafts += 1;
            }
            if !sequence.auto {
                continue;
            }
            match option {
                Some(option) => {
                    sequence.budget.planned(drafts, option.forced);
                    if sequence.budget.falls_dormant() {
                        sequence.drop_draft_context();
                    }
                }
                None => sequence.budget.skipped_dormant(),
            }
            auto.prior = sequence.budget;
        }
    }

    /// Merges each sequence's lookup tree (where it has one) into its tree, then cuts each
    /// automatic-budget tree to the nodes that pay (DSpark's rule over the batch, with the
    /// step's measured draft time). Returns every sequence's verified nodes' calibrated
    /// acceptance, and the two trees each merged tree was made of, in batch order.
    pub(crate) fn choose_budgets(
        &self,
        batch: &[&mut Sequence<'_>],
        trees: &mut [DraftTree],
        lookups: Vec<Option<DraftTree>>,
        context: usize,
        draft: Duration,
    ) -> (Vec<Vec<f64>>, Sources) {
        let mut auto = AutoBudget::lock(&self.auto);
        let mut gains: Vec<Vec<f64>> = batch
            .iter()
            .zip(trees.iter())
            .map(|(s, t)| auto.calibration_mut(s.method).gains(t))
            .collect();
        let mut sources: Sources = vec![None; trees.len()];
        for (index, looked_up) in lookups.into_iter().enumerate() {
            let Some(looked_up) = looked_up.filter(|t| !t.is_empty()) else {
                continue;
            };
            let looked_up_gains = auto.lookup_calibration.gains(&looked_up);
            let drafted = std::mem::take(&mut trees[index]);
            let (mut merged, mut merged_gains) =
                merge_trees(&drafted, &gains[index], &looked_up, &looked_up_gains);
            // The union may hold up to twice the nodes a round reserved rows for.
            let budget = batch[index].method.budget();
            merged.truncate(budget);
            merged_gains.truncate(budget);
            (trees[index], gains[index]) = (merged, merged_gains);
            sources[index] = Some((drafted, looked_up));
        }
        let choosing: Vec<bool> = batch
            .iter()
            .zip(trees.iter())
            .map(|(s, t)| s.auto && !t.is_empty())
            .collect();
        if !choosing.contains(&true) || auto.costs.verify(context, 1).is_none() {
            return (gains, sources);
        }
        let fixed_rows: usize = trees
            .iter()
            .zip(&choosing)
            .map(|(t, &c)| if c { 1 } else { t.tokens.len() })
            .sum();
        let fixed_tokens: f64 = gains
            .iter()
            .zip(&choosing)
            .map(|(g, &c)| 1.0 + if c { 0.0 } else { g.iter().sum() })
            .sum();
        let open: Vec<&[f64]> = gains
            .iter()
            .zip(&choosing)
            .map(|(g, &c)| if c { &g[..] } else { &[][..] })
            .collect();
        let draft = draft.as_secs_f64();
        auto.choices += 1;
        let explore = auto.choices.is_multiple_of(EXPLORE_EVERY);
        let mut taken = choose_nodes(
            &open,
            fixed_rows,
            fixed_tokens,
            |rows| draft + auto.costs.verify(context, rows).unwrap_or(f64::INFINITY),
            explore,
        );
        drop(auto);
        // A look verifies at least the best node: an under-confident drafter whose predictions
        // never pay on their face would otherwise never be observed, and never calibrated.
        for ((nodes, sequence), &chose) in taken.iter_mut().zip(batch).zip(&choosing) {
            if chose && sequence.budget.looking() {
                *nodes = (*nodes).max(1);
            }
        }
        for ((tree, gains), (&nodes, &chose)) in trees
            .iter_mut()
            .zip(gains.iter_mut())
            .zip(taken.iter().zip(&choosing))
        {
            if chose {
                tree.truncate(nodes);
                gains.truncate(nodes);
            }
        }
        (gains, sources)
    }

    /// Folds the step's verify and draft times into the cost table (the draft's with the
    /// drafter's context extends: a sequence drafting every round extends every round).
    pub(crate) fn observe_costs(&self, timings: &StepTimings, context: usize) {
        let mut auto = AutoBudget::lock(&self.auto);
        let verify = timings.verify.as_secs_f64();
        auto.costs
            .observe_verify(context, timings.verified_rows, verify);
        let draft = timings.draft + timings.tree_build;
        if timings.drafted > 0 {
            auto.costs
                .observe_draft(context, timings.drafted, draft.as_secs_f64());
        }
        tracing::trace!(
            context,
            drafted = timings.drafted,
            nodes = ?timings.budgets,
            accepted = timings.accepted,
            predicted = timings.predicted_accepted,
            draft_ms = draft.as_secs_f64() * 1e3,
            verify_ms = verify * 1e3,
            "auto budget step"
        );
        auto.record(BudgetTracePoint {
            seconds: 0.0,
            sequences: timings.sequences,
            drafted: timings.drafted,
            nodes: timings.budgets.iter().sum(),
            verify_ms: verify * 1e3,
            draft_ms: draft.as_secs_f64() * 1e3,
        });
    }
}
