//! Predicted acceptance: a tree's expected accepted nodes are the sum of its nodes' path
//! probabilities under the drafter, if the drafter is calibrated. It rarely is, so each depth
//! compares the drafter's conditional probabilities (a node's given its parent's) with the
//! acceptance observed there over a sliding window of rounds, and scales them by the ratio. A
//! depth with little evidence borrows the ratio of the depth above (an under-confident drafter
//! is usually under-confident at every depth), so a few rounds at one depth open the next.

use grove_spec::DraftTree;

/// Rounds in the window (older rounds' weight decays by `1 - 1/WINDOW` per round).
const WINDOW: f64 = 64.0;

/// Pseudo-rounds of prior belief: depth 1 in a calibrated drafter, deeper ones in the ratio
/// of the depth above.
const PRIOR: f64 = 1.0;

/// Per-depth predicted and observed conditional acceptance, decayed sums.
#[derive(Debug, Clone, Default)]
pub(crate) struct Calibration {
    predicted: Vec<f64>,
    observed: Vec<f64>,
}

impl Calibration {
    /// Every depth's observed over predicted conditional acceptance, depth 1 first, out to
    /// `depth`.
    fn ratios(&self, depth: usize) -> Vec<f64> {
        let mut ratios = Vec::with_capacity(depth);
        let mut prior = 1.0;
        for i in 0..depth {
            let predicted = self.predicted.get(i).copied().unwrap_or(0.0);
            let observed = self.observed.get(i).copied().unwrap_or(0.0);
            prior = (observed + PRIOR * prior) / (predicted + PRIOR);
            ratios.push(prior);
        }
        ratios
    }

    /// Every node's calibrated probability of being accepted, in node order: its parent's
    /// times its own calibrated conditional probability (at most 1).
    pub fn gains(&self, tree: &DraftTree) -> Vec<f64> {
        let depth = tree.depths.iter().copied().max().unwrap_or(0);
        let ratios = self.ratios(depth);
        let mut gains = vec![1.0; tree.tokens.len()];
        for node in 1..tree.tokens.len() {
            let parent = tree.parents[node];
            let conditional = (tree.scores[node] - tree.scores[parent]).exp();
            let calibrated = (conditional * ratios[tree.depths[node] - 1]).min(1.0);
            gains[node] = gains[parent] * calibrated;
        }
        gains.remove(0);
        gains
    }

    /// Adds one verified round: `tree` as verified and the depth its accepted path reached.
    /// A depth counts only when its parent was accepted: what the drafter predicted is the
    /// conditional probability of the accepted node's children, observed is whether one of
    /// them was accepted.
    pub fn observe(&mut self, tree: &DraftTree, accepted_path: &[usize]) {
        let depth = tree.depths.iter().copied().max().unwrap_or(0);
        if depth == 0 {
            return;
        }
        if self.predicted.len() < depth {
            self.predicted.resize(depth, 0.0);
            self.observed.resize(depth, 0.0);
        }
        let decay = 1.0 - 1.0 / WINDOW;
        for (p, o) in self.predicted.iter_mut().zip(&mut self.observed) {
            *p *= decay;
            *o *= decay;
        }
        for (d, &parent) in accepted_path.iter().enumerate() {
            let children = (1..tree.tokens.len()).filter(|&n| tree.parents[n] == parent);
            let mut any = false;
            for child in children {
                any = true;
                self.predicted[d] += (tree.scores[child] - tree.scores[parent]).exp();
            }
            if any && d + 1 < accepted_path.len() {
                self.observed[d] += 1.0;
            }
        }
    }

    /// Calibration ratios by depth (for reports; 1 = a calibrated drafter).
    pub fn factors(&self) -> Vec<f64> {
        self.ratios(self.predicted.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use grove_spec::DepthCandidates;

    /// A chain of `depth` nodes, each with drafter probability `p` given its parent.
    fn chain(depth: usize, p: f32) -> DraftTree {
        let candidates: Vec<DepthCandidates> = (0..depth)
            .map(|d| DepthCandidates {
                token_ids: vec![d as u32],
                log_probs: vec![p.ln()],
            })
            .collect();
        DraftTree::build(9, &candidates, depth)
    }

    #[test]
    fn an_uncalibrated_depth_trusts_the_drafter() {
        let tree = chain(3, 0.5);
        let gains = Calibration::default().gains(&tree);
        let expected = [0.5, 0.25, 0.125];
        for (g, e) in gains.iter().zip(expected) {
            assert!((g - e).abs() < 1e-6, "{gains:?}");
        }
    }

    #[test]
    fn an_overconfident_drafter_is_discounted_where_it_fails() {
        let mut calibration = Calibration::default();
        let tree = chain(2, 0.9);
        // Depth 1 always accepted, depth 2 never, over many rounds.
        for _ in 0..500 {
            calibration.observe(&tree, &[0, 1]);
        }
        let factors = calibration.factors();
        assert!((factors[0] - 1.0 / 0.9).abs() < 0.02, "{factors:?}");
        assert!(factors[1] < 0.02, "{factors:?}");
        let gains = calibration.gains(&tree);
        assert!(gains[0] > 0.99 && gains[0] <= 1.0, "{gains:?}");
        assert!(gains[1] < 0.02);
    }

    #[test]
    fn an_underconfident_drafter_opens_the_depths_below_the_ones_it_was_right_at() {
        let mut calibration = Calibration::default();
        // Verified one node deep, accepted every time, at a predicted 0.1.
        let shallow = chain(1, 0.1);
        for _ in 0..10 {
            calibration.observe(&shallow, &[0, 1]);
        }
        let deep = chain(4, 0.1);
        let gains = calibration.gains(&deep);
        // Depth 1 learned about 5x; depths 2-4 borrow it (not observed yet).
        assert!(gains[0] > 0.5, "{gains:?}");
        assert!(gains[3] > 0.05, "{gains:?}");
        assert!(gains.windows(2).all(|w| w[1] <= w[0]), "{gains:?}");
    }

    #[test]
    fn siblings_off_the_accepted_path_do_not_count_against_deeper_depths() {
        let mut calibration = Calibration::default();
        // Root with two children (0.5 and 0.3), the first with one child (0.5); the walk
        // accepts the second child: depth 1 observed, depth 2 never asked.
        let candidates = [
            DepthCandidates {
                token_ids: vec![1, 2],
                log_probs: vec![0.5f32.ln(), 0.3f32.ln()],
            },
            DepthCandidates {
                token_ids: vec![3],
                log_probs: vec![0.5f32.ln()],
            },
        ];
        let tree = DraftTree::build(0, &candidates, 3);
        let second = tree.child(0, 2).unwrap();
        calibration.observe(&tree, &[0, second]);
        assert!((calibration.predicted[0] - 0.8).abs() < 1e-6);
        assert_eq!(calibration.predicted[1], 0.0);
        assert_eq!(calibration.observed, [1.0, 0.0]);
    }
}
