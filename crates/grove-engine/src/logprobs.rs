//! Log-probabilities of the chosen tokens, for requests that ask (OpenAI's `logprobs`).
//!
//! A token's log-probability is taken from the target's raw logits row that chose it (the
//! log-softmax at temperature 1, before top-k or top-p: vLLM's default `raw_logprobs`), so it
//! describes the model, not the request's sampling settings. Speculation changes nothing: a
//! tree row's logits are the bits of the same position run causally (the lossless tests), so
//! a token verified in a tree gets the log-probability plain decoding gives it.

use grove_core::TokenId;
use grove_spec::log_sum_exp;

/// The most alternatives a request may ask for at each position (OpenAI's `top_logprobs`
/// limit).
pub const MAX_TOP_LOGPROBS: usize = 20;

/// A chosen token's log-probability and, when asked, the most likely tokens' at its position.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct TokenLogprob {
    pub token: TokenId,
    pub logprob: f32,
    /// The most likely tokens with their log-probabilities, most likely first (ties: the lower
    /// id first); as many as the request asked for.
    pub top: Vec<(TokenId, f32)>,
}

impl TokenLogprob {
    /// `token`'s log-probability in `logits` (a row over the vocabulary) and the `top` most
    /// likely tokens'.
    pub fn of(logits: &[f32], token: TokenId, top: usize) -> Self {
        // In f32 lanes, max-shifted (the drafter's own); the f64 formula took several times as
        // long over a 151936-token row (docs/benchmarks.md).
        let log_normalizer = log_sum_exp(logits);
        let logprob = |x: f32| x - log_normalizer;
        Self {
            token,
            logprob: logprob(logits[token as usize]),
            top: most_likely(logits, top.min(MAX_TOP_LOGPROBS))
                .into_iter()
                .map(|id| (id, logprob(logits[id as usize])))
                .collect(),
        }
    }
}

/// The ids of the `k` largest logits, largest first, the lower id first among equals (NaN
/// never ranks).
fn most_likely(logits: &[f32], k: usize) -> Vec<TokenId> {
    // Kept sorted; a logit enters only if it beats the k-th, so most cost one comparison.
    let mut best: Vec<(f32, TokenId)> = Vec::with_capacity(k + 1);
    if k == 0 {
        return Vec::new();
    }
    for (id, &x) in logits.iter().enumerate() {
        if x.is_nan() || (best.len() == k && x <= best[k - 1].0) {
            continue;
        }
        let at = best.partition_point(|&(y, _)| y >= x);
        best.insert(at, (x, id as TokenId));
        best.truncate(k);
    }
    best.into_iter().map(|(_, id)| id).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_probabilities_are_the_log_softmax_and_the_top_tokens_come_in_order() {
        let logits = [1.0f32, 3.0, -2.0, 3.0, 0.5];
        let norm: f64 = logits.iter().map(|&x| f64::from(x).exp()).sum();
        let expected = |i: usize| (f64::from(logits[i]).exp() / norm).ln() as f32;
        let lp = TokenLogprob::of(&logits, 2, 3);
        assert_eq!(lp.token, 2);
        assert!((lp.logprob - expected(2)).abs() < 1e-6);
        let ids: Vec<TokenId> = lp.top.iter().map(|&(id, _)| id).collect();
        assert_eq!(
            ids,
            [1, 3, 0],
            "largest first, the lower id first among equals"
        );
        for &(id, value) in &lp.top {
            assert!((value - expected(id as usize)).abs() < 1e-6);
        }
        assert!(TokenLogprob::of(&logits, 0, 0).top.is_empty());
        assert_eq!(TokenLogprob::of(&logits, 0, 100).top.len(), 5);
    }

    #[test]
    fn masked_and_extreme_logits_give_finite_or_minus_infinite_values() {
        let logits = [f32::NEG_INFINITY, 1e30, 0.0];
        let lp = TokenLogprob::of(&logits, 1, 3);
        assert_eq!(lp.logprob, 0.0);
        assert_eq!(TokenLogprob::of(&logits, 0, 0).logprob, f32::NEG_INFINITY);
        let ids: Vec<TokenId> = lp.top.iter().map(|&(id, _)| id).collect();
        assert_eq!(ids, [1, 2, 0]);
        assert_eq!(
            most_likely(&[0.0, f32::NAN, 1.0], 3),
            [2, 0],
            "NaN never ranks"
        );
    }
}
