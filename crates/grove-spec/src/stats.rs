//! Acceptance statistics of one request: what each round emitted, where its drafts stopped
//! being accepted, and how many draft nodes it verified. One `record` per round.

use crate::accept::AcceptResult;

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AcceptanceStats {
    /// Tau per round: accepted drafts + 1 (the target's own token), cut at a stop.
    pub accept_lengths: Vec<usize>,
    /// `accepted_per_position[j]`: rounds whose draft at position `j` (0-based) was accepted
    /// and emitted; as long as the deepest draft a round can make.
    pub accepted_per_position: Vec<usize>,
    /// `accepted_depth_histogram[d]`: rounds whose emitted path reached depth `d`.
    pub accepted_depth_histogram: Vec<usize>,
    /// Non-root draft nodes verified, over all rounds.
    pub tree_nodes: usize,
}

impl AcceptanceStats {
    /// Statistics for rounds whose trees are at most `max_depth` deep.
    pub fn new(max_depth: usize) -> Self {
        Self {
            accept_lengths: Vec::new(),
            accepted_per_position: vec![0; max_depth],
            accepted_depth_histogram: vec![0; max_depth + 1],
            tree_nodes: 0,
        }
    }

    /// Adds one round that verified `tree_nodes` draft nodes and accepted `result` (a round
    /// deeper than the statistics were made for lengthens them).
    pub fn record(&mut self, result: &AcceptResult, tree_nodes: usize) {
        let accepted = result.accepted_emitted();
        if accepted > self.accepted_per_position.len() {
            self.accepted_per_position.resize(accepted, 0);
            self.accepted_depth_histogram.resize(accepted + 1, 0);
        }
        for position in self.accepted_per_position.iter_mut().take(accepted) {
            *position += 1;
        }
        self.accept_lengths.push(result.emitted);
        self.accepted_depth_histogram[accepted] += 1;
        self.tree_nodes += tree_nodes;
    }

    pub fn rounds(&self) -> usize {
        self.accept_lengths.len()
    }

    /// Mean tau over the rounds (0 before the first).
    pub fn mean_accept_length(&self) -> f64 {
        if self.accept_lengths.is_empty() {
            return 0.0;
        }
        self.accept_lengths.iter().sum::<usize>() as f64 / self.accept_lengths.len() as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::candidates::DepthCandidates;
    use crate::tree::DraftTree;

    #[test]
    fn each_round_counts_once_in_every_statistic() {
        let chain = DraftTree::build(
            0,
            &(1..=3)
                .map(|d| DepthCandidates {
                    token_ids: vec![d],
                    log_probs: vec![-0.1],
                })
                .collect::<Vec<_>>(),
            3,
        );
        let mut stats = AcceptanceStats::new(3);
        // All three drafts accepted, then none, then two of which one was cut by a stop.
        let all = AcceptResult::walk(&chain, |node| node as u32 + 1);
        let none = AcceptResult::walk(&chain, |_| 9);
        let mut cut = AcceptResult::walk(&chain, |node| if node < 2 { node as u32 + 1 } else { 9 });
        cut.cut(2);
        for result in [&all, &none, &cut] {
            stats.record(result, chain.len());
        }
        assert_eq!(stats.accept_lengths, [4, 1, 2]);
        assert_eq!(stats.accepted_per_position, [2, 1, 1]);
        assert_eq!(stats.accepted_depth_histogram, [1, 1, 0, 1]);
        assert_eq!(stats.tree_nodes, 9);
        assert_eq!(stats.rounds(), 3);
        assert!((stats.mean_accept_length() - 7.0 / 3.0).abs() < 1e-12);
        // Made for shallower trees, the statistics lengthen for a deeper round.
        let mut short = AcceptanceStats::new(1);
        short.record(&all, chain.len());
        assert_eq!(short.accepted_per_position, [1, 1, 1]);
        assert_eq!(short.accepted_depth_histogram, [0, 0, 0, 1]);
    }
}
