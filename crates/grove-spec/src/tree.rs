//! DDTree: the draft tree of the `B` most likely prefixes under the drafter's per-depth
//! marginals. Paper: "DDTree" (arXiv 2604.12989), reference liranringel/ddtree `build_ddtree_tree`.
//!
//! 1. Each depth `d` offers its top-K tokens with log-probs `lp[d][r]`, rank `r` best first.
//! 2. A prefix's score is the sum of its log-probs (f64 from the f32 values); a child scores
//!    less than its parent, so the top-B prefixes form a tree.
//! 3. Best-first search: pop the best entry, make it a node, push its next sibling (same parent,
//!    rank + 1) and its first child (depth + 1, rank 0); stop after `B` nodes.
//! 4. Equal scores pop in lexicographic order of their rank tuples (Python `heapq` on
//!    `(-score, ranks)`), so node order matches the reference bit for bit.
//! 5. Nodes are stored in pop order; index 0 is the root (the anchor), `parent[i] < i`.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use grove_core::TokenId;

use crate::candidates::DepthCandidates;

/// A draft tree. Node 0 is the root (the anchor token, not stored here).
///
/// Invariant: `parents[i] < i` for every node `i >= 1`; `depths[i] = depths[parents[i]] + 1`;
/// no two children of one node share a token.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct DraftTree {
    pub tokens: Vec<TokenId>, // [nodes + 1], tokens[0] is the root's (set by the caller)
    pub parents: Vec<usize>,  // [nodes + 1], parents[0] = 0 (unused)
    pub depths: Vec<usize>,   // [nodes + 1], depths[0] = 0
    /// The drafter's log-probability of each node's path (its heap score); 0 for the root.
    /// Non-increasing in node order.
    pub scores: Vec<f64>, // [nodes + 1]
    children: Vec<Vec<usize>>, // [nodes + 1], in pop order
}

/// A heap entry: a candidate prefix not yet popped.
#[derive(Debug)]
struct Entry {
    score: f64,
    ranks: Vec<u32>,
    parent: usize,
    depth: usize, // 1-based
    rank: usize,
}

impl PartialEq for Entry {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Entry {}

impl PartialOrd for Entry {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Entry {
    /// Max-heap order: higher score first, then the lexicographically smaller rank tuple.
    fn cmp(&self, other: &Self) -> Ordering {
        self.score
            .total_cmp(&other.score)
            .then_with(|| other.ranks.cmp(&self.ranks))
    }
}

impl DraftTree {
    /// The tree of the anchor alone.
    pub(crate) fn root(root: TokenId) -> Self {
        Self {
            tokens: vec![root],
            parents: vec![0],
            depths: vec![0],
            scores: vec![0.0],
            children: vec![Vec::new()],
        }
    }

    /// Builds the tree of the best `budget` prefixes with `root` as node 0. `candidates[d]` are
    /// the choices at depth `d + 1`; the depth is at most `candidates.len()`.
    pub fn build(root: TokenId, candidates: &[DepthCandidates], budget: usize) -> Self {
        Self::build_where(root, candidates, budget, |_, _| true)
    }

    /// [`DraftTree::build`] over the prefixes `admit` lets in: `admit(parent, token)` is asked
    /// once for each prefix the search pops, in pop order, and a refused one becomes no node
    /// and opens no children (its next sibling still competes). When admission is closed under
    /// prefixes (a token the target can never choose after its parent's path, such as one a
    /// schema refuses), the tree is the best `budget` admitted prefixes: the budget goes to
    /// drafts that can be accepted. A caller tracking per-node state pushes it when admitting:
    /// an admitted prefix becomes node `len() + 1`.
    pub fn build_where(
        root: TokenId,
        candidates: &[DepthCandidates],
        budget: usize,
        mut admit: impl FnMut(usize, TokenId) -> bool,
    ) -> Self {
        let mut tree = Self::root(root);
        let available = |depth: usize| candidates.get(depth - 1).map_or(0, |c| c.token_ids.len());
        let mut heap = BinaryHeap::new();
        if budget > 0 && available(1) > 0 {
            heap.push(Entry {
                score: f64::from(candidates[0].log_probs[0]),
                ranks: vec![0],
                parent: 0,
                depth: 1,
                rank: 0,
            });
        }
        while let Some(entry) = heap.pop() {
            if tree.len() >= budget {
                break;
            }
            let index = tree.tokens.len();
            let level = &candidates[entry.depth - 1];
            let token = level.token_ids[entry.rank];
            let admitted = admit(entry.parent, token);
            if admitted {
                tree.tokens.push(token);
                tree.parents.push(entry.parent);
                tree.depths.push(entry.depth);
                tree.scores.push(entry.score);
                tree.children.push(Vec::new());
                tree.children[entry.parent].push(index);
            }
            if entry.rank + 1 < available(entry.depth) {
                let mut ranks = entry.ranks.clone();
                *ranks.last_mut().expect("non-empty") += 1;
                heap.push(Entry {
                    score: entry.score - f64::from(level.log_probs[entry.rank])
                        + f64::from(level.log_probs[entry.rank + 1]),
                    ranks,
                    parent: entry.parent,
                    depth: entry.depth,
                    rank: entry.rank + 1,
                });
            }
            if admitted && available(entry.depth + 1) > 0 {
                let mut ranks = entry.ranks;
                ranks.push(0);
                heap.push(Entry {
                    score: entry.score + f64::from(candidates[entry.depth].log_probs[0]),
                    ranks,
                    parent: index,
                    depth: entry.depth + 1,
                    rank: 0,
                });
            }
        }
        tree
    }

    /// A chain: at each depth the best candidate `admit(parent, token)` lets in after the chain
    /// so far (asked in rank order), ending at the first depth where it lets none in. With
    /// everything admitted it is [`DraftTree::build`]'s tree of one candidate a depth.
    pub fn chain_where(
        root: TokenId,
        candidates: &[DepthCandidates],
        mut admit: impl FnMut(usize, TokenId) -> bool,
    ) -> Self {
        let mut tree = Self::root(root);
        for (depth, level) in (1..).zip(candidates) {
            let parent = depth - 1;
            let Some(rank) =
                (0..level.token_ids.len()).find(|&r| admit(parent, level.token_ids[r]))
            else {
                break;
            };
            tree.tokens.push(level.token_ids[rank]);
            tree.parents.push(parent);
            tree.depths.push(depth);
            tree.scores
                .push(tree.scores[parent] + f64::from(level.log_probs[rank]));
            tree.children.push(Vec::new());
            tree.children[parent].push(depth);
        }
        tree
    }

    /// Adds a node under `parent` (already in the tree, and without a child carrying `token`)
    /// whose path scores `score`; returns its index.
    pub(crate) fn push(&mut self, parent: usize, token: TokenId, score: f64) -> usize {
        debug_assert!(
            self.child(parent, token).is_none(),
            "a second child {token}"
        );
        let index = self.tokens.len();
        self.tokens.push(token);
        self.parents.push(parent);
        self.depths.push(self.depths[parent] + 1);
        self.scores.push(score);
        self.children.push(Vec::new());
        self.children[parent].push(index);
        index
    }

    /// Keeps the first `budget` nodes: the tree `build` makes with that budget from the same
    /// candidates (nodes are in pop order, and a smaller top-K never removes a node among the
    /// first `budget` pops: a node's better siblings pop before it). A tree built with
    /// admission keeps its best `budget` admitted prefixes of the same candidates.
    pub fn truncate(&mut self, budget: usize) {
        let keep = budget.min(self.len()) + 1;
        self.tokens.truncate(keep);
        self.parents.truncate(keep);
        self.depths.truncate(keep);
        self.scores.truncate(keep);
        self.children.truncate(keep);
        for children in &mut self.children {
            children.retain(|&c| c < keep);
        }
    }

    /// The drafter's probability of every non-root node's path, in node order: the expected
    /// number of accepted nodes of a tree is their sum when the drafter is calibrated.
    pub fn path_probabilities(&self) -> impl Iterator<Item = f64> + '_ {
        self.scores[1..].iter().map(|s| s.exp())
    }

    /// The drafts on `node`'s path, the root's child first (none for the root).
    pub fn path(&self, node: usize) -> Vec<TokenId> {
        let mut path = Vec::with_capacity(self.depths[node]);
        let mut at = node;
        while at != 0 {
            path.push(self.tokens[at]);
            at = self.parents[at];
        }
        path.reverse();
        path
    }

    /// Number of non-root nodes.
    pub fn len(&self) -> usize {
        self.tokens.len() - 1
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Parent of every row for the verify forward: `None` for the root.
    pub fn row_parents(&self) -> Vec<Option<usize>> {
        (0..self.tokens.len())
            .map(|i| (i > 0).then(|| self.parents[i]))
            .collect()
    }

    /// The child of `node` carrying `token`, if any.
    pub fn child(&self, node: usize, token: TokenId) -> Option<usize> {
        self.children[node]
            .iter()
            .copied()
            .find(|&c| self.tokens[c] == token)
    }

    /// Follows the target's choices from the root: `choose(node)` is the target's token after
    /// `node`'s prefix. Returns the accepted path (root first) and the bonus token, the choice
    /// at the last accepted node that no child matched.
    pub fn walk(&self, mut choose: impl FnMut(usize) -> TokenId) -> (Vec<usize>, TokenId) {
        let mut path = vec![0];
        loop {
            let current = *path.last().expect("path starts at the root");
            let token = choose(current);
            match self.child(current, token) {
                Some(child) => path.push(child),
                None => return (path, token),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::candidates::top_k_candidates;
    use proptest::prelude::*;
    use rand::{Rng, SeedableRng};

    fn random_candidates(
        seed: u64,
        depths: usize,
        vocab: usize,
        k: usize,
    ) -> (Vec<Vec<f32>>, Vec<DepthCandidates>) {
        let mut rng = rand_chacha::ChaCha12Rng::seed_from_u64(seed);
        let logits: Vec<Vec<f32>> = (0..depths)
            .map(|_| (0..vocab).map(|_| rng.random_range(-3.0..3.0)).collect())
            .collect();
        let candidates = logits
            .iter()
            .map(|row| top_k_candidates(row, k, 1))
            .collect();
        (logits, candidates)
    }

    /// Every prefix of up to `depths` tokens with its summed log-prob, by brute force.
    fn all_prefixes(candidates: &[DepthCandidates], vocab: usize) -> Vec<(Vec<TokenId>, f64)> {
        let mut lp: Vec<Vec<f64>> = vec![vec![f64::NEG_INFINITY; vocab]; candidates.len()];
        for (d, c) in candidates.iter().enumerate() {
            for (t, l) in c.token_ids.iter().zip(&c.log_probs) {
                lp[d][*t as usize] = f64::from(*l);
            }
        }
        let mut out = Vec::new();
        let mut frontier: Vec<(Vec<TokenId>, f64)> = vec![(Vec::new(), 0.0)];
        for level in &lp {
            let mut next = Vec::new();
            for (prefix, score) in &frontier {
                for (t, l) in level.iter().enumerate() {
                    if l.is_finite() {
                        let mut p = prefix.clone();
                        p.push(t as TokenId);
                        next.push((p, score + l));
                    }
                }
            }
            out.extend(next.iter().cloned());
            frontier = next;
        }
        out
    }

    proptest! {
        #[test]
        fn the_tree_is_the_brute_force_top_b_and_well_formed(seed in 0u64..1000, depths in 1usize..4, vocab in 2usize..7, budget in 1usize..24) {
            let k = budget.min(vocab);
            let (_, candidates) = random_candidates(seed, depths, vocab, k);
            let tree = DraftTree::build(99, &candidates, budget);
            let mut prefixes = all_prefixes(&candidates, vocab);
            let expected_nodes = budget.min(prefixes.len());
            prop_assert_eq!(tree.len(), expected_nodes);
            if budget <= vocab {
                prop_assert_eq!(tree.len(), budget);
            }
            for i in 1..tree.tokens.len() {
                prop_assert!(tree.parents[i] < i);
                prop_assert_eq!(tree.depths[i], tree.depths[tree.parents[i]] + 1);
                let siblings: Vec<TokenId> = tree.children[tree.parents[i]].iter().map(|&c| tree.tokens[c]).collect();
                prop_assert_eq!(siblings.iter().filter(|&&t| t == tree.tokens[i]).count(), 1);
            }
            // The selected prefixes are a top-B set: none left out scores above one kept
            // (ties may go either way; the exact tie order is pinned by the golden test).
            prefixes.sort_by(|a, b| b.1.total_cmp(&a.1));
            let chosen: Vec<Vec<TokenId>> = (1..tree.tokens.len()).map(|i| tree.path(i)).collect();
            let worst_kept = chosen.iter().map(|p| prefixes.iter().find(|(q, _)| q == p).unwrap().1).fold(f64::INFINITY, f64::min);
            let best_left = prefixes.iter().filter(|(q, _)| !chosen.contains(q)).map(|(_, s)| *s).fold(f64::NEG_INFINITY, f64::max);
            prop_assert!(best_left <= worst_kept + 1e-9, "left out {} > kept {}", best_left, worst_kept);
        }
    }

    /// A prefix-closed admission rule: `path + [token]` is admitted when a hash of it is not
    /// 0 mod 3 (and its own prefixes were).
    fn admissible(path: &[TokenId], token: TokenId) -> bool {
        let hash = path
            .iter()
            .chain([&token])
            .fold(7u64, |h, &t| h.wrapping_mul(31).wrapping_add(u64::from(t)));
        hash % 3 != 0
    }

    proptest! {
        #[test]
        fn an_admitting_tree_is_the_brute_force_top_b_of_admitted_prefixes(seed in 0u64..1000, depths in 1usize..4, vocab in 2usize..7, budget in 1usize..24) {
            let k = budget.min(vocab);
            let (_, candidates) = random_candidates(seed, depths, vocab, k);
            let mut paths: Vec<Vec<TokenId>> = vec![Vec::new()];
            let mut asked = 0;
            let tree = DraftTree::build_where(99, &candidates, budget, |parent, token| {
                asked += 1;
                let ok = admissible(&paths[parent], token);
                if ok {
                    let mut path = paths[parent].clone();
                    path.push(token);
                    paths.push(path);
                }
                ok
            });
            prop_assert_eq!(paths.len(), tree.tokens.len());
            let admitted: Vec<(Vec<TokenId>, f64)> = all_prefixes(&candidates, vocab)
                .into_iter()
                .filter(|(p, _)| (1..=p.len()).all(|n| admissible(&p[..n - 1], p[n - 1])))
                .collect();
            prop_assert_eq!(tree.len(), budget.min(admitted.len()));
            for (i, path) in paths.iter().enumerate().skip(1) {
                prop_assert_eq!(&tree.path(i), path);
                prop_assert!(tree.parents[i] < i);
                prop_assert_eq!(tree.depths[i], tree.depths[tree.parents[i]] + 1);
            }
            prop_assert!(tree.scores.windows(2).all(|w| w[1] <= w[0]));
            let score = |p: &Vec<TokenId>| admitted.iter().find(|(q, _)| q == p).map(|(_, s)| *s);
            let kept: Vec<f64> = paths[1..].iter().map(|p| score(p).expect("an admitted prefix")).collect();
            let worst_kept = kept.iter().copied().fold(f64::INFINITY, f64::min);
            let best_left = admitted.iter().filter(|(q, _)| !paths.contains(q)).map(|(_, s)| *s).fold(f64::NEG_INFINITY, f64::max);
            prop_assert!(best_left <= worst_kept + 1e-9, "left out {} > kept {}", best_left, worst_kept);
            // Admitting everything is `build`.
            prop_assert_eq!(DraftTree::build_where(99, &candidates, budget, |_, _| true), DraftTree::build(99, &candidates, budget));
        }
    }

    proptest! {
        #[test]
        fn an_admitting_chain_takes_each_depths_best_admitted_token(seed in 0u64..1000, depths in 0usize..6, vocab in 2usize..7) {
            let (_, candidates) = random_candidates(seed, depths, vocab, vocab);
            let mut path: Vec<TokenId> = Vec::new();
            let chain = DraftTree::chain_where(3, &candidates, |parent, token| {
                assert_eq!(parent, path.len(), "asked after the chain so far");
                let ok = admissible(&path, token);
                if ok {
                    path.push(token);
                }
                ok
            });
            prop_assert_eq!(&chain.tokens[1..], &path[..]);
            let mut score = 0.0;
            for (d, &token) in path.iter().enumerate() {
                let level = &candidates[d];
                let rank = level.token_ids.iter().position(|&t| t == token).unwrap();
                // Every better candidate was refused after the same chain.
                prop_assert!(level.token_ids[..rank].iter().all(|&t| !admissible(&path[..d], t)));
                score += f64::from(level.log_probs[rank]);
                prop_assert_eq!(chain.parents[d + 1], d);
                prop_assert!((chain.scores[d + 1] - score).abs() < 1e-12);
            }
            // It ends at a depth where nothing was admitted, or at the last depth.
            if let Some(level) = candidates.get(path.len()) {
                prop_assert!(level.token_ids.iter().all(|&t| !admissible(&path, t)));
            }
            let best: Vec<DepthCandidates> = candidates
                .iter()
                .map(|c| DepthCandidates { token_ids: c.token_ids[..1].to_vec(), log_probs: c.log_probs[..1].to_vec() })
                .collect();
            prop_assert_eq!(DraftTree::chain_where(3, &best, |_, _| true), DraftTree::build(3, &best, depths));
        }
    }

    #[test]
    fn a_nodes_path_is_read_up_its_parents() {
        let (_, candidates) = random_candidates(4, 3, 5, 3);
        let tree = DraftTree::build(9, &candidates, 10);
        assert!(tree.path(0).is_empty());
        for node in 1..tree.tokens.len() {
            let path = tree.path(node);
            assert_eq!(path.len(), tree.depths[node]);
            assert_eq!(path.last(), Some(&tree.tokens[node]));
            assert_eq!(path[..path.len() - 1], tree.path(tree.parents[node]));
        }
    }

    #[test]
    fn walk_follows_matching_children_and_returns_the_bonus() {
        let (_, candidates) = random_candidates(3, 4, 6, 4);
        let tree = DraftTree::build(7, &candidates, 12);
        // The rank-0 spine: every depth's best token.
        let spine: Vec<TokenId> = candidates.iter().map(|c| c.token_ids[0]).collect();
        let (path, bonus) = tree.walk(|node| spine.get(tree.depths[node]).copied().unwrap_or(1000));
        assert_eq!(
            path.len(),
            1 + spine.len().min(tree.depths.iter().copied().max().unwrap())
        );
        assert_eq!(bonus, 1000);
        for (m, &node) in path.iter().enumerate() {
            assert_eq!(tree.depths[node], m);
        }
        let (path, bonus) = tree.walk(|_| 999);
        assert_eq!((path, bonus), (vec![0], 999));
    }

    proptest! {
        #[test]
        fn a_truncated_tree_is_the_tree_of_the_smaller_budget(seed in 0u64..500, depths in 1usize..5, vocab in 2usize..8, budget in 1usize..20, smaller in 0usize..20) {
            let (_, candidates) = random_candidates(seed, depths, vocab, budget.min(vocab));
            let mut tree = DraftTree::build(5, &candidates, budget);
            prop_assert!(tree.scores.windows(2).all(|w| w[1] <= w[0]));
            tree.truncate(smaller);
            // The smaller budget's own build, with its own (smaller) top-K.
            let k = smaller.min(budget).min(vocab);
            let narrow: Vec<DepthCandidates> = candidates
                .iter()
                .map(|c| DepthCandidates {
                    token_ids: c.token_ids[..k.min(c.token_ids.len())].to_vec(),
                    log_probs: c.log_probs[..k.min(c.log_probs.len())].to_vec(),
                })
                .collect();
            prop_assert_eq!(tree, DraftTree::build(5, &narrow, smaller.min(budget)));
        }
    }

    #[test]
    fn path_probabilities_are_the_products_along_each_path() {
        let (_, candidates) = random_candidates(2, 3, 5, 3);
        let tree = DraftTree::build(0, &candidates, 9);
        for (node, p) in (1..).zip(tree.path_probabilities()) {
            let mut expected = 1.0;
            let mut n = node;
            while n != 0 {
                let level = &candidates[tree.depths[n] - 1];
                let rank = level
                    .token_ids
                    .iter()
                    .position(|&t| t == tree.tokens[n])
                    .unwrap();
                expected *= f64::from(level.log_probs[rank]).exp();
                n = tree.parents[n];
            }
            assert!(
                (p - expected).abs() < 1e-9,
                "node {node}: {p} vs {expected}"
            );
        }
    }

    #[test]
    fn zero_budget_gives_a_root_only_tree() {
        let (_, candidates) = random_candidates(1, 3, 5, 3);
        let tree = DraftTree::build(4, &candidates, 0);
        assert!(tree.is_empty());
        assert_eq!(tree.row_parents(), vec![None]);
    }
}
