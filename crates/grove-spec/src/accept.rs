//! Accept: the target's choices walked through a verified tree. The accepted path follows the
//! target from the root while a child carries its choice; the target's choice where none does
//! is the bonus token, the next anchor. Accept is about tokens; commit (moving the path's K/V)
//! is the KV store's business.

use grove_core::TokenId;

use crate::tree::DraftTree;

/// What one round accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AcceptResult {
    /// `[accepted + 1]`: tree nodes from the root (the anchor) down the accepted drafts.
    pub path: Vec<usize>,
    /// `[accepted]`: the accepted drafts' tokens, in order.
    pub tokens: Vec<TokenId>,
    /// The target's choice after the last accepted node.
    pub bonus: TokenId,
    /// Tokens the round emits: `tokens` then `bonus`, or fewer when a stop or the length
    /// limit ended the request inside the round ([`AcceptResult::cut`]).
    pub emitted: usize,
}

impl AcceptResult {
    /// Walks `tree`: `choose(node)` is the target's token after `node`'s prefix, asked once
    /// per visited node in path order (nodes off the path are never asked, so a sampler draws
    /// exactly as plain decoding would).
    pub fn walk(tree: &DraftTree, choose: impl FnMut(usize) -> TokenId) -> Self {
        let (path, bonus) = tree.walk(choose);
        let tokens: Vec<TokenId> = path[1..].iter().map(|&node| tree.tokens[node]).collect();
        let emitted = tokens.len() + 1;
        Self {
            path,
            tokens,
            bonus,
            emitted,
        }
    }

    /// The tokens the round emits, in order: the accepted drafts, then the bonus.
    pub fn new_tokens(&self) -> impl Iterator<Item = TokenId> + '_ {
        self.tokens
            .iter()
            .copied()
            .chain([self.bonus])
            .take(self.emitted)
    }

    /// Keeps only the first `emitted` new tokens (at least one: a round always emits).
    pub fn cut(&mut self, emitted: usize) {
        assert!(
            (1..=self.tokens.len() + 1).contains(&emitted),
            "a round emits 1..={} tokens, not {emitted}",
            self.tokens.len() + 1
        );
        self.emitted = emitted;
    }

    /// Accepted drafts that were emitted (tau - 1).
    pub fn accepted_emitted(&self) -> usize {
        self.emitted - 1
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::candidates::DepthCandidates;

    /// A tree whose depth `d` offers tokens `10 d + r` for ranks `r < k`.
    fn tree(depths: usize, k: usize, budget: usize) -> DraftTree {
        let candidates: Vec<DepthCandidates> = (0..depths)
            .map(|d| DepthCandidates {
                token_ids: (0..k).map(|r| (10 * (d + 1) + r) as TokenId).collect(),
                log_probs: (0..k).map(|r| -(r as f32) - 0.5).collect(),
            })
            .collect();
        DraftTree::build(0, &candidates, budget)
    }

    proptest! {
        #[test]
        fn the_walk_follows_the_target_and_stops_at_the_first_miss(
            depths in 0usize..6, k in 1usize..4, budget in 0usize..20,
            choices in prop::collection::vec(0u32..4, 8),
        ) {
            let tree = tree(depths, k, budget);
            // The target picks rank `choices[d]` at depth d (rank 3 is never drafted at k <= 3).
            let mut asked = Vec::new();
            let result = AcceptResult::walk(&tree, |node| {
                asked.push(node);
                let depth = tree.depths[node] + 1;
                (10 * depth) as TokenId + choices[tree.depths[node]]
            });
            // Every node asked is on the path, in order; the last one asked gave the bonus.
            prop_assert_eq!(&asked, &result.path);
            prop_assert_eq!(result.emitted, result.path.len());
            for (i, &node) in result.path.iter().enumerate().skip(1) {
                prop_assert_eq!(tree.parents[node], result.path[i - 1]);
                prop_assert_eq!(result.tokens[i - 1], tree.tokens[node]);
                prop_assert_eq!(tree.depths[node], i);
            }
            let last = *result.path.last().unwrap();
            prop_assert_eq!(tree.child(last, result.bonus), None);
            let emitted: Vec<TokenId> = result.new_tokens().collect();
            prop_assert_eq!(emitted.len(), result.tokens.len() + 1);
            prop_assert_eq!(*emitted.last().unwrap(), result.bonus);
        }
    }

    #[test]
    fn a_cut_round_emits_only_its_first_tokens() {
        let tree = tree(3, 1, 3);
        let mut result = AcceptResult::walk(&tree, |node| (10 * (tree.depths[node] + 1)) as u32);
        assert_eq!(result.tokens, [10, 20, 30]);
        assert_eq!(result.bonus, 40);
        result.cut(2);
        assert_eq!(result.new_tokens().collect::<Vec<_>>(), [10, 20]);
        assert_eq!(result.accepted_emitted(), 1);
    }

    #[test]
    #[should_panic(expected = "a round emits")]
    fn a_round_cannot_emit_nothing() {
        let mut result = AcceptResult::walk(&DraftTree::build(0, &[], 0), |_| 1);
        result.cut(0);
    }
}
