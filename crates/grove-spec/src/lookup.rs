//! Drafts without a drafter: the text so far often repeats itself (code that is edited and
//! written back, a document quoted in the answer, a list whose items share their shape), and
//! what followed an earlier occurrence of the last few tokens is a draft that costs nothing to
//! make. This is prompt lookup decoding (Saxena, 2023; vLLM's `ngram` method with its
//! `prompt_lookup_min`/`prompt_lookup_max`), made a tree: every earlier occurrence of the
//! longest matching suffix offers its continuation, and continuations that agree share nodes,
//! so where the text went several ways after the same words, each way is verified at once.
//!
//! 1. The suffix: the longest `n` in `min_match..=max_match` for which the last `n` tokens
//!    (ending with the anchor) occurred earlier, each occurrence ending before the anchor, in
//!    the text itself or in other texts (each [`NgramCorpus`] given: earlier requests', a
//!    server's documents).
//! 2. The trie: the continuations after the [`MAX_OCCURRENCES`] most recent occurrences of
//!    that suffix (the text's own first, then the corpus's), each as deep as the tree may go;
//!    a node counts the continuations through it.
//! 3. The tree: the `budget` nodes of the trie most continuations pass through (fewer depths,
//!    then the more recent occurrence, break ties), which is a tree because a child never
//!    counts more continuations than its parent. A node's score is the log of its share of
//!    the continuations: the draft's own estimate of its chance, for the budget to calibrate.

use grove_core::TokenId;

use crate::corpus::{NgramCorpus, Occurrences};
use crate::tree::DraftTree;

/// Earlier occurrences of the suffix whose continuations a tree is made of, most recent
/// first: enough for the few ways a text repeats itself, and a bound on a round's work.
pub const MAX_OCCURRENCES: usize = 32;

/// How long a suffix of the text must match an earlier stretch to be drafted from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LookupConfig {
    /// The shortest match drafted from (at least 1).
    pub min_match: usize,
    /// The longest suffix compared: a longer match is as good as this one.
    pub max_match: usize,
}

impl LookupConfig {
    /// Matches of 2 to 4 tokens: one token matches too often to predict much.
    pub const DEFAULT: Self = Self {
        min_match: 2,
        max_match: 4,
    };
}

impl Default for LookupConfig {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// A trie node: its parent (0 is the root), token, depth and the continuations through it.
#[derive(Debug, Clone, Copy)]
struct TrieNode {
    parent: usize,
    token: TokenId,
    depth: usize,
    count: usize,
}

/// The draft tree of at most `budget` nodes, at most `max_depth` deep, from the earlier
/// continuations of `history`'s longest matching suffix, in `history` and in each of
/// `corpora` in turn (each matches as its own config says). `history` ends with the anchor
/// (the tree's root).
/// `admit(parent, token)` is asked before a trie node is made, in the order the trie grows
/// (node `i` of that order is the `i`-th admitted, the root 0); a refused token ends that
/// continuation there.
pub fn lookup_tree(
    history: &[TokenId],
    corpora: &[&NgramCorpus],
    config: LookupConfig,
    budget: usize,
    max_depth: usize,
    mut admit: impl FnMut(usize, TokenId) -> bool,
) -> DraftTree {
    let root = *history.last().expect("the history holds the anchor");
    let mut tree = DraftTree::root(root);
    let depth_cap = budget.min(max_depth);
    if depth_cap == 0 {
        return tree;
    }
    let mut found = occurrences(history, config);
    for corpus in corpora {
        found.join(corpus.occurrences(history, depth_cap));
    }
    let continuations = found.continuations;
    let mut trie = vec![TrieNode {
        parent: 0,
        token: root,
        depth: 0,
        count: continuations.len(),
    }];
    let mut children: Vec<Vec<usize>> = vec![Vec::new()];
    for continuation in &continuations {
        let mut at = 0;
        for &token in continuation.iter().take(depth_cap) {
            let found = children[at]
                .iter()
                .copied()
                .find(|&c| trie[c].token == token);
            let next = match found {
                Some(child) => child,
                None if admit(at, token) => {
                    trie.push(TrieNode {
                        parent: at,
                        token,
                        depth: trie[at].depth + 1,
                        count: 0,
                    });
                    children.push(Vec::new());
                    children[at].push(trie.len() - 1);
                    trie.len() - 1
                }
                None => break,
            };
            trie[next].count += 1;
            at = next;
        }
    }
    // Most continuations first, then shallower, then made earlier (a more recent occurrence):
    // a parent sorts before each of its children.
    let mut order: Vec<usize> = (1..trie.len()).collect();
    order.sort_by(|&a, &b| {
        (trie[b].count.cmp(&trie[a].count))
            .then(trie[a].depth.cmp(&trie[b].depth))
            .then(a.cmp(&b))
    });
    let total = continuations.len() as f64;
    let mut in_tree = vec![0; trie.len()];
    for &node in order.iter().take(budget) {
        let TrieNode {
            parent,
            token,
            count,
            ..
        } = trie[node];
        in_tree[node] = tree.push(in_tree[parent], token, (count as f64 / total).ln());
    }
    tree
}

/// The continuations of `history`'s longest matching suffix in `history` itself, the most
/// recent occurrence first (at most [`MAX_OCCURRENCES`]); none when no suffix of `min_match`
/// tokens occurred before.
fn occurrences(history: &[TokenId], config: LookupConfig) -> Occurrences<'_> {
    let len = history.len();
    let min = config.min_match.max(1);
    let max = config.max_match.max(min);
    if len < min + 1 {
        return Occurrences::default();
    }
    let last = len - 1;
    let mut best = 0;
    let mut starts = Vec::new();
    // `end`: where an earlier stretch ends; its continuation starts at `end + 1` (never past
    // the anchor, and the anchor's own suffix is not an earlier occurrence).
    for end in (0..last).rev() {
        if history[end] != history[last] {
            continue;
        }
        let matched = 1
            + (1..max.min(end + 1))
                .take_while(|&k| history[end - k] == history[last - k])
                .count();
        if matched < min || matched < best {
            continue;
        }
        if matched > best {
            best = matched;
            starts.clear();
        }
        if starts.len() < MAX_OCCURRENCES {
            starts.push(end + 1);
        }
    }
    Occurrences {
        matched: best,
        continuations: starts.into_iter().map(|start| &history[start..]).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn everything(_: usize, _: TokenId) -> bool {
        true
    }

    fn paths(tree: &DraftTree) -> Vec<Vec<TokenId>> {
        (1..tree.tokens.len()).map(|n| tree.path(n)).collect()
    }

    #[test]
    fn one_earlier_occurrence_drafts_what_followed_it() {
        // ... 5 6 7 8 9 ... 5 6 | anchor 6: "5 6" occurred before, followed by 7 8 9.
        let history = [1, 5, 6, 7, 8, 9, 2, 5, 6];
        let tree = lookup_tree(&history, &[], LookupConfig::default(), 8, 8, everything);
        assert_eq!(tree.tokens, vec![6, 7, 8, 9, 2, 5, 6]);
        assert_eq!(tree.parents, vec![0, 0, 1, 2, 3, 4, 5]);
        assert!(tree.scores.iter().all(|&s| s == 0.0), "{:?}", tree.scores);
        // The budget and the depth cap cut the chain.
        assert_eq!(
            lookup_tree(&history, &[], LookupConfig::default(), 2, 8, everything).tokens,
            vec![6, 7, 8]
        );
        assert_eq!(
            lookup_tree(&history, &[], LookupConfig::default(), 8, 1, everything).tokens,
            vec![6, 7]
        );
    }

    #[test]
    fn no_match_of_the_shortest_length_drafts_nothing() {
        let history = [1, 2, 3, 4, 3];
        let config = LookupConfig {
            min_match: 2,
            max_match: 3,
        };
        assert!(lookup_tree(&history, &[], config, 8, 8, everything).is_empty());
        let single = LookupConfig {
            min_match: 1,
            max_match: 3,
        };
        assert_eq!(
            lookup_tree(&history, &[], single, 8, 8, everything).tokens,
            vec![3, 4, 3]
        );
        assert!(lookup_tree(&[7], &[], single, 8, 8, everything).is_empty());
    }

    #[test]
    fn the_longest_match_wins_and_its_occurrences_branch_by_count() {
        // "1 2" is followed by 3 twice and by 4 once; "0 1 2" only by 4 and 9: the longer
        // match decides.
        let history = [1, 2, 3, 8, 1, 2, 3, 8, 0, 1, 2, 4, 0, 1, 2, 9, 7, 0, 1, 2];
        let config = LookupConfig {
            min_match: 2,
            max_match: 3,
        };
        let tree = lookup_tree(&history, &[], config, 16, 2, everything);
        // Most recent first on a tie: 9 (then 7) before 4 (then 0).
        assert_eq!(paths(&tree), vec![vec![9], vec![4], vec![9, 7], vec![4, 0]]);
        let half = 0.5f64.ln();
        assert_eq!(tree.scores, vec![0.0, half, half, half, half]);
        let shorter = LookupConfig {
            min_match: 2,
            max_match: 2,
        };
        let tree = lookup_tree(&history, &[], shorter, 3, 3, everything);
        // Four occurrences of "1 2": 3 follows two of them, 9 and 4 one each.
        // Two-way counts first, then the shallowest of the rest, the most recent first.
        assert_eq!(paths(&tree), vec![vec![3], vec![3, 8], vec![9]]);
        assert_eq!(tree.scores[1], 0.5f64.ln());
    }

    #[test]
    fn a_refused_token_ends_its_continuation_and_admission_sees_trie_order() {
        let history = [1, 2, 3, 4, 5, 1, 2, 3, 6, 1, 2];
        let mut asked = Vec::new();
        let tree = lookup_tree(
            &history,
            &[],
            LookupConfig::default(),
            8,
            8,
            |parent, token| {
                asked.push((parent, token));
                token != 4
            },
        );
        // Most recent first: 3 6 1 2 (node 1..4), then 3 4 is refused at 4.
        assert_eq!(asked, vec![(0, 3), (1, 6), (2, 1), (3, 2), (1, 4)]);
        assert_eq!(paths(&tree)[..2], [vec![3], vec![3, 6]]);
        assert_eq!(tree.len(), 4);
    }

    proptest! {
        /// Every node's path is what followed an earlier occurrence of a suffix of the history
        /// at least `min_match` long, and the tree is well formed with non-increasing scores.
        #[test]
        fn every_path_follows_an_earlier_match(
            history in proptest::collection::vec(0u32..4, 1..60),
            min in 1usize..4,
            extra in 0usize..3,
            budget in 0usize..20,
            depth in 0usize..10,
        ) {
            let config = LookupConfig { min_match: min, max_match: min + extra };
            let tree = lookup_tree(&history, &[], config, budget, depth, everything);
            prop_assert!(tree.len() <= budget);
            prop_assert_eq!(tree.tokens[0], *history.last().unwrap());
            let last = history.len() - 1;
            for node in 1..tree.tokens.len() {
                prop_assert!(tree.parents[node] < node);
                prop_assert_eq!(tree.depths[node], tree.depths[tree.parents[node]] + 1);
                prop_assert!(tree.depths[node] <= depth);
                prop_assert!(tree.scores[node] <= tree.scores[node - 1] + 1e-12);
                let path = tree.path(node);
                let follows = (0..last).any(|end| {
                    end + 1 >= min
                        && (0..min).all(|k| history[end - k] == history[last - k])
                        && history[end + 1..].starts_with(&path)
                });
                prop_assert!(follows, "{:?} follows no match", path);
            }
            // Something to draft whenever a suffix of min_match tokens occurred before.
            let matchable = (0..last).any(|end| {
                end + 1 >= min && (0..min).all(|k| history[end - k] == history[last - k])
            });
            prop_assert_eq!(tree.is_empty(), !matchable || budget == 0 || depth == 0);
        }
    }
}
