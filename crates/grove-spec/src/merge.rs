//! One tree from two sources of drafts: a drafter's tree and a lookup tree over the same root
//! hold different guesses (the drafter's at what is likely, lookup's at what the text repeats),
//! and one verify can check both. Each node keeps the better of its sources' predictions of
//! acceptance, and the nodes are ordered by it, so an automatic budget cuts the union where it
//! stops paying, as it cuts either tree alone.

use grove_core::TokenId;

use crate::tree::DraftTree;

/// The union of `a` and `b` (trees over the same root) with each node's predicted acceptance:
/// the larger of the two sources' where both hold it (`gains_a`, `gains_b`: one per non-root
/// node, in node order, none above its parent's). Nodes are ordered by it, then by depth, then
/// `a`'s before `b`'s, so that every prefix of the order is a tree; a node's score is the log of
/// its gain.
pub fn merge_trees(
    a: &DraftTree,
    gains_a: &[f64],
    b: &DraftTree,
    gains_b: &[f64],
) -> (DraftTree, Vec<f64>) {
    debug_assert_eq!(a.tokens[0], b.tokens[0], "two roots");
    debug_assert_eq!((a.len(), b.len()), (gains_a.len(), gains_b.len()));
    let mut union = DraftTree::root(a.tokens[0]);
    let mut gains = vec![f64::INFINITY];
    for (tree, tree_gains) in [(a, gains_a), (b, gains_b)] {
        let mut at = vec![0; tree.tokens.len()];
        for node in 1..tree.tokens.len() {
            let (parent, token) = (at[tree.parents[node]], tree.tokens[node]);
            let gain = tree_gains[node - 1];
            at[node] = match union.child(parent, token) {
                Some(child) => {
                    gains[child] = gains[child].max(gain);
                    child
                }
                None => {
                    gains.push(gain);
                    union.push(parent, token, 0.0)
                }
            };
        }
    }
    let mut order: Vec<usize> = (1..union.tokens.len()).collect();
    order.sort_by(|&x, &y| {
        gains[y]
            .total_cmp(&gains[x])
            .then(union.depths[x].cmp(&union.depths[y]))
            .then(x.cmp(&y))
    });
    let mut merged = DraftTree::root(a.tokens[0]);
    let mut index = vec![0; union.tokens.len()];
    let mut merged_gains = Vec::with_capacity(order.len());
    for node in order {
        let parent = index[union.parents[node]];
        debug_assert!(
            parent != 0 || union.parents[node] == 0,
            "a child ordered before its parent"
        );
        let gain = gains[node];
        index[node] = merged.push(parent, union.tokens[node], gain.ln());
        merged_gains.push(gain);
    }
    (merged, merged_gains)
}

impl DraftTree {
    /// Its nodes whose paths are also nodes of `other`, in its own order with its own scores
    /// (what of a source tree a merged, cut tree verified).
    pub fn restrict(&self, other: &DraftTree) -> DraftTree {
        let mut kept = DraftTree::root(self.tokens[0]);
        // Each node's (index in `kept`, index in `other`) when kept.
        let mut at: Vec<Option<(usize, usize)>> = vec![None; self.tokens.len()];
        at[0] = Some((0, 0));
        for node in 1..self.tokens.len() {
            let Some((parent, other_parent)) = at[self.parents[node]] else {
                continue;
            };
            let token = self.tokens[node];
            if let Some(other_node) = other.child(other_parent, token) {
                let index = kept.push(parent, token, self.scores[node]);
                at[node] = Some((index, other_node));
            }
        }
        kept
    }

    /// The nodes that `tokens` lead to from the root, root first, as far as they go.
    pub fn follow(&self, tokens: &[TokenId]) -> Vec<usize> {
        let mut path = vec![0];
        for &token in tokens {
            match self.child(*path.last().expect("the root"), token) {
                Some(child) => path.push(child),
                None => break,
            }
        }
        path
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::candidates::top_k_candidates;
    use crate::lookup::{lookup_tree, LookupConfig};
    use proptest::prelude::*;
    use rand::{Rng, SeedableRng};

    /// Gains that shrink from parent to child, as calibrated predictions do.
    fn gains(tree: &DraftTree, rng: &mut impl Rng) -> Vec<f64> {
        let mut gains = vec![1.0; tree.tokens.len()];
        for node in 1..tree.tokens.len() {
            gains[node] = gains[tree.parents[node]] * rng.random_range(0.05..1.0);
        }
        gains.remove(0);
        gains
    }

    fn paths(tree: &DraftTree) -> Vec<Vec<TokenId>> {
        (1..tree.tokens.len()).map(|n| tree.path(n)).collect()
    }

    #[test]
    fn shared_nodes_keep_the_better_prediction_and_new_ones_their_own() {
        // a: 5, 5-6, 7; b: 5, 5-8.
        let mut a = DraftTree::root(1);
        let five = a.push(0, 5, 0.0);
        a.push(five, 6, 0.0);
        a.push(0, 7, 0.0);
        let mut b = DraftTree::root(1);
        let five_b = b.push(0, 5, 0.0);
        b.push(five_b, 8, 0.0);
        let (merged, gains) = merge_trees(&a, &[0.5, 0.2, 0.4], &b, &[0.9, 0.85]);
        assert_eq!(
            paths(&merged),
            vec![vec![5], vec![5, 8], vec![7], vec![5, 6]]
        );
        assert_eq!(gains, vec![0.9, 0.85, 0.4, 0.2]);
        assert_eq!(merged.scores[1], 0.9f64.ln());
        // What of each source the first three nodes verify, and where a path leads in it.
        let mut cut = merged.clone();
        cut.truncate(3);
        assert_eq!(paths(&a.restrict(&cut)), vec![vec![5], vec![7]]);
        assert_eq!(paths(&b.restrict(&cut)), vec![vec![5], vec![5, 8]]);
        assert_eq!(b.follow(&[5, 8, 3]), vec![0, 1, 2]);
        assert_eq!(a.follow(&[5, 8]), vec![0, 1]);
        assert_eq!(a.follow(&[]), vec![0]);
    }

    proptest! {
        /// The merge holds every path of both trees once, each with the larger of its gains,
        /// in an order whose every prefix is a tree; restricting a source to a cut merge keeps
        /// exactly the source's paths the cut holds.
        #[test]
        fn the_merge_is_the_union_best_first(
            seed in 0u64..500,
            history in proptest::collection::vec(0u32..5, 2..40),
            budget in 1usize..12,
            cut in 0usize..20,
        ) {
            let mut rng = rand_chacha::ChaCha12Rng::seed_from_u64(seed);
            let root = *history.last().unwrap();
            let candidates: Vec<_> = (0..4)
                .map(|_| {
                    let row: Vec<f32> = (0..5).map(|_| rng.random_range(-2.0..2.0)).collect();
                    top_k_candidates(&row, 3, 1)
                })
                .collect();
            let a = DraftTree::build(root, &candidates, budget);
            let b = lookup_tree(&history, &[], LookupConfig { min_match: 1, max_match: 3 }, budget, 6, |_, _| true);
            let (gains_a, gains_b) = (gains(&a, &mut rng), gains(&b, &mut rng));
            let (merged, gains) = merge_trees(&a, &gains_a, &b, &gains_b);
            let mut expected: Vec<(Vec<TokenId>, f64)> = Vec::new();
            for (tree, tree_gains) in [(&a, &gains_a), (&b, &gains_b)] {
                for (path, &gain) in paths(tree).into_iter().zip(tree_gains.iter()) {
                    match expected.iter_mut().find(|(p, _)| *p == path) {
                        Some(entry) => entry.1 = entry.1.max(gain),
                        None => expected.push((path, gain)),
                    }
                }
            }
            prop_assert_eq!(merged.len(), expected.len());
            for (node, path) in paths(&merged).into_iter().enumerate() {
                let &(_, gain) = expected.iter().find(|(p, _)| *p == path).expect("a source path");
                prop_assert_eq!(gains[node], gain);
                prop_assert!(merged.parents[node + 1] <= node);
                if node > 0 {
                    prop_assert!(gains[node] <= gains[node - 1]);
                }
            }
            let mut cut_tree = merged.clone();
            cut_tree.truncate(cut);
            let kept = paths(&cut_tree);
            for source in [&a, &b] {
                let restricted = source.restrict(&cut_tree);
                let wanted: Vec<Vec<TokenId>> = paths(source).into_iter().filter(|p| kept.contains(p)).collect();
                prop_assert_eq!(paths(&restricted), wanted);
            }
        }
    }
}
