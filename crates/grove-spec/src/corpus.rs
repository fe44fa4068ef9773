//! What earlier requests wrote, for lookup drafts to draw on: a request often writes what an
//! earlier one wrote (the same question asked again, a regenerated answer, a file an agent
//! rewrites every turn, the boilerplate of a code base), and its own text cannot predict that.
//! SGLang's `NGRAM` speculation keeps such a corpus across requests
//! (`--speculative-ngram-capacity`); this one is kept per engine, bounded in tokens. A server
//! may also be given texts to draft from ([`NgramCorpus::of_texts`]: SGLang's external
//! corpus), a second corpus that keeps them all.
//!
//! Finished requests' texts (prompt and output) are appended to one buffer, each ended by a
//! token no vocabulary has, and the oldest texts leave when it would pass its capacity. The
//! `n`-grams of two lengths (the shortest and longest match) index it as LZ77 compressors
//! index their window: a table of buckets holds each bucket's most recent position, and each
//! position the distance back to the previous one in its bucket. A lookup walks the chain of
//! the text's last `n` tokens, newest first, for at most [`CHAIN_STEPS`] positions, and
//! compares tokens (buckets are shared, so a chain also passes other keys). Memory: 12 bytes a
//! token and two tables of 8-byte heads; no allocation per key.

use std::collections::VecDeque;

use grove_core::TokenId;

use crate::lookup::{LookupConfig, MAX_OCCURRENCES};

/// Ends every text in the buffer: no match runs across it, no continuation past it.
const END: TokenId = TokenId::MAX;

/// Positions one lookup examines per chain: a bound on a round's work in a corpus of any size.
pub const CHAIN_STEPS: usize = 256;

/// The longest text the buffer may hold: chain distances are 32-bit.
pub const MAX_CAPACITY: usize = 1 << 31;

/// Earlier requests' texts, indexed by their `n`-grams (see the module's comment).
#[derive(Clone)]
pub struct NgramCorpus {
    capacity: usize,
    config: LookupConfig,
    /// The texts, each followed by [`END`]; `tokens[i]` is global position `first + i`.
    tokens: Vec<TokenId>,
    first: u64,
    /// Where each text ends (the global position after its `END`), oldest first.
    ends: VecDeque<u64>,
    /// One chain per indexed length: the longest match, then the shortest (one when equal).
    chains: Vec<Chain>,
}

/// The positions whose last `len` tokens hash to each bucket, linked newest to oldest.
#[derive(Debug, Clone)]
struct Chain {
    len: usize,
    /// Per bucket, the most recent position + 1 (0: none).
    heads: Vec<u64>,
    /// Per buffer position, how far back the previous position of its bucket lies (0: none).
    links: Vec<u32>,
}

/// The continuations of a text's longest suffix that occurred earlier.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Occurrences<'a> {
    /// How many tokens matched (0: nothing did).
    pub matched: usize,
    /// What followed each occurrence, the most recent first, at most [`MAX_OCCURRENCES`].
    pub continuations: Vec<&'a [TokenId]>,
}

impl<'a> Occurrences<'a> {
    /// Adds `other`'s continuations if they matched as long, keeps only `other`'s if longer.
    pub fn join(&mut self, other: Occurrences<'a>) {
        if other.matched > self.matched {
            *self = other;
        } else if other.matched == self.matched && other.matched > 0 {
            let room = MAX_OCCURRENCES.saturating_sub(self.continuations.len());
            self.continuations
                .extend(other.continuations.into_iter().take(room));
        }
    }
}

impl std::fmt::Debug for NgramCorpus {
    /// Its size, not its millions of tokens.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NgramCorpus")
            .field("tokens", &self.tokens.len())
            .field("texts", &self.ends.len())
            .field("capacity", &self.capacity)
            .field("config", &self.config)
            .finish()
    }
}

impl NgramCorpus {
    /// A corpus of exactly `texts` (none is dropped), matching as `config` says: text a
    /// server is given to draft from (its code base, its documents).
    pub fn of_texts(texts: &[Vec<TokenId>], config: LookupConfig) -> Self {
        let capacity: usize = texts.iter().map(|text| text.len() + 1).sum();
        let mut corpus = Self::new(capacity.max(3), config);
        for text in texts {
            corpus.insert(text);
        }
        corpus
    }

    /// An empty corpus of at most `capacity` tokens (texts and their ends), matching as
    /// `config` says.
    pub fn new(capacity: usize, config: LookupConfig) -> Self {
        let capacity = capacity.min(MAX_CAPACITY);
        let min = config.min_match.max(1);
        let config = LookupConfig {
            min_match: min,
            max_match: config.max_match.max(min),
        };
        // About a bucket per token, within 4k..4M buckets (32 KiB..32 MiB a table).
        let buckets = capacity.next_power_of_two().clamp(1 << 12, 1 << 22);
        let mut lengths = vec![config.max_match, config.min_match];
        lengths.dedup();
        let chains = lengths
            .into_iter()
            .map(|len| Chain {
                len,
                heads: vec![0; buckets],
                links: Vec::new(),
            })
            .collect();
        Self {
            capacity,
            config,
            tokens: Vec::new(),
            first: 0,
            ends: VecDeque::new(),
            chains,
        }
    }

    /// Tokens held, text ends included.
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Texts held.
    pub fn texts(&self) -> usize {
        self.ends.len()
    }

    /// The suffix lengths it matches.
    pub fn config(&self) -> LookupConfig {
        self.config
    }

    /// Adds a finished request's text (its last `capacity - 1` tokens if longer). When it
    /// does not fit, the oldest texts leave until it fits with an eighth of the capacity to
    /// spare: the buffer moves once per many texts, not once per text. A text of fewer than
    /// two tokens continues nothing.
    pub fn insert(&mut self, text: &[TokenId]) {
        if text.len() < 2 || self.capacity < 3 {
            return;
        }
        let text = &text[text.len().saturating_sub(self.capacity - 1)..];
        if self.tokens.len() + text.len() + 1 > self.capacity {
            let keep = (self.capacity - self.capacity / 8).saturating_sub(text.len() + 1);
            self.drop_oldest(keep);
        }
        let start = self.tokens.len();
        self.tokens.extend_from_slice(text);
        self.tokens.push(END);
        for chain in &mut self.chains {
            chain.links.resize(self.tokens.len(), 0);
            // A position is indexed when its key lies inside the text and a token follows.
            for local in start + chain.len - 1..self.tokens.len() - 2 {
                let bucket = chain.bucket(&self.tokens[local + 1 - chain.len..=local]);
                let position = self.first + local as u64;
                let head = chain.heads[bucket];
                if head > 0 {
                    chain.links[local] = (position + 1 - head) as u32;
                }
                chain.heads[bucket] = position + 1;
            }
        }
        self.ends.push_back(self.first + self.tokens.len() as u64);
    }

    /// Drops the oldest texts until at most `keep` tokens are left; chains that lead into
    /// them end there (older positions are never followed), and heads left pointing into
    /// them read as empty.
    fn drop_oldest(&mut self, keep: usize) {
        let mut end = self.first;
        while self.first + self.tokens.len() as u64 - end > keep as u64 {
            match self.ends.pop_front() {
                Some(next) => end = next,
                None => break,
            }
        }
        let count = (end - self.first) as usize;
        self.tokens.drain(..count);
        for chain in &mut self.chains {
            chain.links.drain(..count);
        }
        self.first = end;
    }

    /// The continuations of `history`'s longest suffix (at least the shortest match, at most
    /// the longest compared) found in the corpus, each at most `depth` tokens and none past
    /// its text's end.
    pub(crate) fn occurrences(&self, history: &[TokenId], depth: usize) -> Occurrences<'_> {
        let mut found = Occurrences::default();
        if depth == 0 || self.tokens.is_empty() {
            return found;
        }
        // The longest length's chain holds every longest match; the shortest one's the rest.
        for chain in &self.chains {
            if found.matched == self.config.max_match || history.len() < chain.len {
                continue;
            }
            found.join(self.walk(chain, history, depth));
        }
        found
    }

    /// Follows `history`'s bucket in `chain`, newest first, keeping the longest matches.
    fn walk<'s>(&'s self, chain: &Chain, history: &[TokenId], depth: usize) -> Occurrences<'s> {
        let last = history.len() - 1;
        let mut found = Occurrences::default();
        let mut next = chain.heads[chain.bucket(&history[history.len() - chain.len..])];
        for _ in 0..CHAIN_STEPS {
            if next <= self.first {
                break;
            }
            let local = (next - 1 - self.first) as usize;
            let matched = (0..self.config.max_match.min(local + 1).min(last + 1))
                .take_while(|&k| self.tokens[local - k] == history[last - k])
                .count();
            if matched >= chain.len && matched >= found.matched {
                let rest = &self.tokens[local + 1..];
                let stop = rest.iter().take(depth).position(|&t| t == END);
                let continuation = &rest[..stop.unwrap_or(depth.min(rest.len()))];
                if matched > found.matched {
                    found.matched = matched;
                    found.continuations.clear();
                }
                if found.continuations.len() < MAX_OCCURRENCES {
                    found.continuations.push(continuation);
                }
                if found.matched == self.config.max_match
                    && found.continuations.len() == MAX_OCCURRENCES
                {
                    break;
                }
            }
            next = match chain.links[local] {
                0 => 0,
                back => next - u64::from(back),
            };
        }
        found
    }
}

impl Chain {
    /// FNV-1a over the key's tokens, folded to the table's size.
    fn bucket(&self, key: &[TokenId]) -> usize {
        let hash = key.iter().fold(0xcbf2_9ce4_8422_2325u64, |hash, &token| {
            (hash ^ u64::from(token)).wrapping_mul(0x0000_0100_0000_01b3)
        });
        ((hash ^ (hash >> 29)) as usize) & (self.heads.len() - 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lookup::lookup_tree;
    use proptest::prelude::*;

    const DEFAULT: LookupConfig = LookupConfig::DEFAULT;

    fn texts(found: &Occurrences<'_>) -> Vec<Vec<TokenId>> {
        found.continuations.iter().map(|c| c.to_vec()).collect()
    }

    #[test]
    fn a_later_text_continues_as_an_earlier_one_did_up_to_its_end() {
        let mut corpus = NgramCorpus::new(1000, DEFAULT);
        corpus.insert(&[1, 2, 3, 4, 5, 6]);
        corpus.insert(&[9, 9, 3, 4, 7]);
        assert_eq!((corpus.len(), corpus.texts()), (13, 2));
        // "3 4": the newer text first; its continuation stops at its end.
        let found = corpus.occurrences(&[8, 3, 4], 8);
        assert_eq!(found.matched, 2);
        assert_eq!(texts(&found), vec![vec![7], vec![5, 6]]);
        // "2 3 4" is longer and only in the first text; the depth cuts it.
        let found = corpus.occurrences(&[2, 3, 4], 1);
        assert_eq!((found.matched, texts(&found)), (3, vec![vec![5]]));
        // No match across a text's end, none of one token, none at depth 0.
        assert_eq!(corpus.occurrences(&[6, 9], 8).matched, 0);
        assert_eq!(corpus.occurrences(&[5, 7], 8).matched, 0);
        assert_eq!(corpus.occurrences(&[3, 4], 0).matched, 0);
        // A text's last token continues nothing.
        assert_eq!(corpus.occurrences(&[4, 7], 8).matched, 0);
    }

    #[test]
    fn the_oldest_texts_leave_and_the_capacity_holds() {
        let mut corpus = NgramCorpus::new(12, DEFAULT);
        corpus.insert(&[1, 2, 3, 4]);
        corpus.insert(&[5, 6, 7, 8]);
        assert_eq!(corpus.len(), 10);
        corpus.insert(&[9, 10, 11]);
        // 10 + 4 > 12: the first text left.
        assert_eq!((corpus.len(), corpus.texts()), (9, 2));
        assert_eq!(corpus.occurrences(&[1, 2], 8).matched, 0);
        assert_eq!(texts(&corpus.occurrences(&[5, 6], 8)), vec![vec![7, 8]]);
        // A text longer than the corpus keeps its end.
        corpus.insert(&(0..40).collect::<Vec<_>>());
        assert_eq!((corpus.len(), corpus.texts()), (12, 1));
        assert_eq!(texts(&corpus.occurrences(&[30, 31], 2)), vec![vec![32, 33]]);
        assert_eq!(corpus.occurrences(&[28, 29], 8).matched, 0);
        // Too small to hold a text and its end, or a text too short to continue: nothing.
        let mut tiny = NgramCorpus::new(2, DEFAULT);
        tiny.insert(&[1, 2, 3]);
        corpus.insert(&[4]);
        assert!(tiny.is_empty());
        assert_eq!(corpus.texts(), 1);
    }

    #[test]
    fn a_lookup_tree_takes_the_corpus_when_it_matches_longer_and_the_text_first_on_a_tie() {
        let mut corpus = NgramCorpus::new(1000, DEFAULT);
        corpus.insert(&[1, 2, 3, 4, 5]);
        let everything = |_: usize, _: TokenId| true;
        // The text's own "2 3" matched too, but the corpus's "1 2 3" is longer.
        let history = [2, 3, 9, 1, 2, 3];
        let tree = lookup_tree(&history, &[&corpus], DEFAULT, 8, 8, everything);
        assert_eq!(tree.tokens, vec![3, 4, 5]);
        let own = lookup_tree(&history, &[], DEFAULT, 8, 8, everything);
        assert_eq!(own.tokens, vec![3, 9, 1, 2, 3]);
        // A tie: the text's continuation, then the corpus's, share the trie.
        let history = [7, 3, 6, 0, 7, 3];
        let mut corpus = NgramCorpus::new(1000, DEFAULT);
        corpus.insert(&[7, 3, 6, 5]);
        corpus.insert(&[7, 3, 8]);
        let tree = lookup_tree(&history, &[&corpus], DEFAULT, 8, 1, everything);
        assert_eq!(tree.tokens, vec![3, 6, 8]);
        assert_eq!(tree.scores[1], (2.0f64 / 3.0).ln());
    }

    #[test]
    fn a_corpus_of_given_texts_keeps_them_all_and_lookups_join_every_corpus() {
        let texts = vec![vec![1, 2, 3], vec![4, 5, 6, 7], vec![8]];
        let given = NgramCorpus::of_texts(&texts, DEFAULT);
        // Nothing dropped; the one-token text continues nothing and is not kept.
        assert_eq!((given.len(), given.texts(), given.capacity()), (9, 2, 11));
        // Debug prints its size, not its tokens.
        assert!(format!("{given:?}").contains("tokens: 9"), "{given:?}");
        let mut earlier = NgramCorpus::new(100, DEFAULT);
        earlier.insert(&[4, 5, 9]);
        let everything = |_: usize, _: TokenId| true;
        let history = [0, 4, 5];
        // Both corpora matched "4 5": the first given corpus's continuation comes first.
        let both = lookup_tree(&history, &[&earlier, &given], DEFAULT, 8, 8, everything);
        assert_eq!(both.tokens, vec![5, 9, 6, 7]);
        assert_eq!(both.parents, vec![0, 0, 0, 2]);
        let given_only = lookup_tree(&history, &[&given], DEFAULT, 8, 8, everything);
        assert_eq!(given_only.tokens, vec![5, 6, 7]);
    }

    /// What a lookup finds, by brute force over the texts the corpus still holds.
    fn naive(
        live: &VecDeque<Vec<TokenId>>,
        history: &[TokenId],
        config: LookupConfig,
        depth: usize,
    ) -> (usize, Vec<Vec<TokenId>>) {
        let last = history.len() - 1;
        let mut matches = Vec::new();
        for text in live.iter().rev() {
            for end in (0..text.len().saturating_sub(1)).rev() {
                let matched = (0..config.max_match.min(end + 1).min(last + 1))
                    .take_while(|&k| text[end - k] == history[last - k])
                    .count();
                if matched >= config.min_match {
                    let rest = &text[end + 1..];
                    matches.push((matched, rest[..depth.min(rest.len())].to_vec()));
                }
            }
        }
        let best = matches.iter().map(|m| m.0).max().unwrap_or(0);
        let found = matches
            .into_iter()
            .filter(|m| m.0 == best)
            .map(|m| m.1)
            .take(MAX_OCCURRENCES)
            .collect();
        (best, found)
    }

    proptest! {
        /// In a corpus smaller than a chain's walk, a lookup finds exactly what brute force
        /// finds among the texts not yet dropped, in the same order.
        #[test]
        fn lookups_find_what_brute_force_finds(
            inserted in proptest::collection::vec(
                proptest::collection::vec(0u32..5, 0..30), 1..12),
            history in proptest::collection::vec(0u32..5, 1..12),
            capacity in 0usize..200,
            min in 1usize..4,
            extra in 0usize..3,
            depth in 0usize..8,
        ) {
            let config = LookupConfig { min_match: min, max_match: min + extra };
            let mut corpus = NgramCorpus::new(capacity, config);
            let mut live: VecDeque<Vec<TokenId>> = VecDeque::new();
            for text in &inserted {
                corpus.insert(text);
                if text.len() >= 2 && capacity >= 3 {
                    let kept = text[text.len().saturating_sub(capacity - 1)..].to_vec();
                    let held = |live: &VecDeque<Vec<TokenId>>| {
                        live.iter().map(|t| t.len() + 1).sum::<usize>()
                    };
                    if held(&live) + kept.len() + 1 > capacity {
                        while held(&live) + kept.len() + 1 > capacity - capacity / 8
                            && !live.is_empty()
                        {
                            live.pop_front();
                        }
                    }
                    live.push_back(kept);
                }
                prop_assert!(corpus.len() <= capacity);
                prop_assert_eq!(corpus.texts(), live.len());
            }
            let found = corpus.occurrences(&history, depth);
            let (best, expected) = if depth == 0 {
                (0, Vec::new())
            } else {
                naive(&live, &history, config, depth)
            };
            prop_assert_eq!(found.matched, best);
            prop_assert_eq!(texts(&found), expected);
        }
    }
}
