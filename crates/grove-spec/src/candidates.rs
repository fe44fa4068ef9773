//! Per-depth candidates from draft logits: the top-K token ids and their log-probabilities
//! `logit - logsumexp(logits)` in f32, without materializing a softmax.
//!
//! A vocabulary can be split into contiguous shards (a vocab-parallel LM head): each shard
//! reports its local top-K and local log-sum-exp, and the merge is O(shards x K): the global
//! LSE is the log-sum-exp of the local ones and the global top-K is taken from the shards' K
//! candidates. Equal logits are ordered by the lower token id, in one shard or across shards,
//! so any sharding gives exactly the unsharded result.

use grove_core::TokenId;

use crate::scan::{log_sum_exp, top_k};

/// The top-K of one depth, best first.
#[derive(Debug, Clone, PartialEq)]
pub struct DepthCandidates {
    pub token_ids: Vec<TokenId>, // [K]
    pub log_probs: Vec<f32>,     // [K], f32 as the reference computes them
}

/// One vocabulary shard's view of a row: its best K (global ids) and its local LSE.
#[derive(Debug, Clone, PartialEq)]
pub struct ShardCandidates {
    pub token_ids: Vec<TokenId>,
    pub logits: Vec<f32>,
    pub log_sum_exp: f32,
}

/// Orders (token, logit) best first: higher logit, then lower id.
fn better(a: (TokenId, f32), b: (TokenId, f32)) -> std::cmp::Ordering {
    b.1.total_cmp(&a.1).then(a.0.cmp(&b.0))
}

/// The best `k` of a shard whose first logit is token `offset`.
pub fn shard_top_k(logits: &[f32], offset: TokenId, k: usize) -> ShardCandidates {
    let (token_ids, logits_kept) = top_k(logits, offset, k).into_iter().unzip();
    ShardCandidates {
        token_ids,
        logits: logits_kept,
        log_sum_exp: log_sum_exp(logits),
    }
}

/// Merges shard results into the global top-`k` with log-probabilities.
pub fn merge_shards(shards: &[ShardCandidates], k: usize) -> DepthCandidates {
    let shard_sums: Vec<f32> = shards.iter().map(|s| s.log_sum_exp).collect();
    let log_sum_exp = log_sum_exp(&shard_sums);
    let mut all: Vec<(TokenId, f32)> = shards
        .iter()
        .flat_map(|s| s.token_ids.iter().copied().zip(s.logits.iter().copied()))
        .collect();
    all.sort_by(|a, b| better(*a, *b));
    all.truncate(k);
    DepthCandidates {
        token_ids: all.iter().map(|&(t, _)| t).collect(),
        log_probs: all.iter().map(|&(_, l)| l - log_sum_exp).collect(),
    }
}

/// Top-`k` candidates of one row of logits, split into `shards` contiguous vocabulary ranges
/// (1 = unsharded).
pub fn top_k_candidates(logits: &[f32], k: usize, shards: usize) -> DepthCandidates {
    let shards = shards.clamp(1, logits.len().max(1));
    let size = logits.len().div_ceil(shards);
    let parts: Vec<ShardCandidates> = logits
        .chunks(size.max(1))
        .enumerate()
        .map(|(i, chunk)| shard_top_k(chunk, (i * size) as TokenId, k))
        .collect();
    if parts.len() == 1 {
        // Unsharded: the LSE over the whole row directly, as the reference computes it.
        let part = &parts[0];
        return DepthCandidates {
            token_ids: part.token_ids.clone(),
            log_probs: part.logits.iter().map(|l| l - part.log_sum_exp).collect(),
        };
    }
    merge_shards(&parts, k)
}

/// Turns candidates taken from a reduced vocabulary's logits (column `i` is target token
/// `ids[i]`) into target ids. With `ids` increasing, the result equals the candidates of the
/// target-wide row holding those logits and `-inf` elsewhere: ties still go to the lower id,
/// and the other tokens add nothing to the log-sum-exp.
pub fn map_to_target_ids(candidates: &mut [DepthCandidates], ids: &[TokenId]) {
    for depth in candidates {
        for token in &mut depth.token_ids {
            *token = ids[*token as usize];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    #[test]
    fn sharded_top_k_equals_unsharded_including_ties_and_ragged_shards() {
        let mut rng = rand_chacha::ChaCha12Rng::seed_from_u64(1);
        for vocab in [7usize, 50, 101, 1000] {
            // Coarse values make ties common.
            let logits: Vec<f32> = (0..vocab)
                .map(|_| (rng.random_range(0..12) as f32) * 0.5)
                .collect();
            let whole = top_k_candidates(&logits, 9, 1);
            for shards in 2..=4 {
                let split = top_k_candidates(&logits, 9, shards);
                assert_eq!(
                    split.token_ids, whole.token_ids,
                    "vocab {vocab} shards {shards}"
                );
                for (a, b) in split.log_probs.iter().zip(&whole.log_probs) {
                    assert!(
                        (a - b).abs() < 1e-5,
                        "vocab {vocab} shards {shards}: {a} vs {b}"
                    );
                }
            }
            // Ties go to the lower id; the argmax is the first candidate.
            let best = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            assert_eq!(
                whole.token_ids[0] as usize,
                logits.iter().position(|&l| l == best).unwrap()
            );
            assert!(whole.token_ids.windows(2).all(|w| {
                let (a, b) = (logits[w[0] as usize], logits[w[1] as usize]);
                a > b || (a == b && w[0] < w[1])
            }));
        }
    }

    #[test]
    fn a_reduced_rows_candidates_mapped_equal_the_target_wide_rows() {
        let mut rng = rand_chacha::ChaCha12Rng::seed_from_u64(2);
        let vocab = 400;
        for reduced in [1usize, 9, 60] {
            let mut ids: Vec<TokenId> = (0..vocab as TokenId).collect();
            while ids.len() > reduced {
                ids.remove(rng.random_range(0..ids.len()));
            }
            // Coarse values make ties common.
            let small: Vec<f32> = (0..reduced)
                .map(|_| (rng.random_range(0..6) as f32) * 0.5)
                .collect();
            let mut wide = vec![f32::NEG_INFINITY; vocab];
            for (&id, &logit) in ids.iter().zip(&small) {
                wide[id as usize] = logit;
            }
            for shards in [1, 3] {
                let whole = top_k_candidates(&wide, 8, shards);
                let mut mapped = vec![top_k_candidates(&small, 8, shards)];
                map_to_target_ids(&mut mapped, &ids);
                assert_eq!(
                    mapped[0].token_ids,
                    whole.token_ids[..mapped[0].token_ids.len()]
                );
                for (a, b) in mapped[0].log_probs.iter().zip(&whole.log_probs) {
                    assert!((a - b).abs() < 1e-6, "{reduced} {shards}: {a} vs {b}");
                }
            }
        }
    }

    #[test]
    fn log_probs_are_normalized() {
        let logits = [1.0f32, 2.0, 3.0, 0.5];
        let all = top_k_candidates(&logits, 4, 1);
        let total: f32 = all.log_probs.iter().map(|l| l.exp()).sum();
        assert!((total - 1.0).abs() < 1e-6);
        assert_eq!(all.token_ids, vec![2, 1, 0, 3]);
    }
}
