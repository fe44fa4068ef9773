//! Choosing the next token from a row of logits: greedy argmax, or a draw from the processed
//! distribution `softmax(logits / T)` restricted by top-k then top-p, from a seeded stream.
//! Speculative verification draws with the same sampler, so every emitted token is a draw from
//! exactly this distribution.

use grove_core::{SamplingParams, TokenId};
use std::cmp::Reverse;
use std::collections::BinaryHeap;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha12Rng;

/// A per-request sampler. Two samplers with the same seed and inputs produce the same tokens.
#[derive(Debug, Clone)]
pub struct Sampler {
    params: SamplingParams,
    rng: ChaCha12Rng,
}

impl Sampler {
    pub fn new(params: SamplingParams) -> Self {
        let rng = match params.seed {
            Some(seed) => ChaCha12Rng::seed_from_u64(seed),
            None => ChaCha12Rng::from_os_rng(),
        };
        Self { params, rng }
    }

    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// The next token for one row of logits.
    pub fn sample(&mut self, logits: &[f32]) -> TokenId {
        if self.params.is_greedy() {
            return argmax(logits);
        }
        let target = self.rng.random::<f64>();
        draw(logits, &self.params, target)
    }
}

/// The token that `target` (uniform in [0, 1)) picks from [`processed_distribution`]: the
/// first one, most likely first, where the running sum of probabilities passes `target`.
///
/// Without sorting the whole vocabulary (9 ms a draw over Qwen2.5's 151936 tokens; now
/// 0.6 ms with top-k, 1.5 ms without): with top-k, its k tokens come from one pass with a
/// heap; without, only the tokens within `gap` of the largest scaled logit are sorted, the
/// gap widened (to every token at last) until they hold the mass that top-p and the draw
/// need. They are the head of the full order, and their probabilities are the definition's
/// but for the normalizer, summed here in vocabulary order (the same terms, so the same
/// value to rounding; the f64 `exp` of every token is most of the 1.5 ms).
fn draw(logits: &[f32], params: &SamplingParams, target: f64) -> TokenId {
    let temperature = f64::from(params.temperature);
    let scaled = |logit: f32| f64::from(logit) / temperature;
    let finite = || logits.iter().copied().filter(|logit| logit.is_finite());
    let (count, max) = finite().fold((0, None), |(count, max): (usize, Option<f32>), logit| {
        let max = max.map_or(logit, |max| {
            if logit.total_cmp(&max).is_gt() {
                logit
            } else {
                max
            }
        });
        (count + 1, Some(max))
    });
    let Some(max) = max.map(scaled) else {
        return argmax(logits);
    };
    if params.top_k > 0 && params.top_k < count {
        // The definition's arithmetic on the k likeliest (their own normalizer).
        let likeliest = likeliest(logits, params.top_k, scaled);
        return walk(&normalized(likeliest, params), target, logits);
    }
    let total: f64 = finite().map(|logit| (scaled(logit) - max).exp()).sum();
    let mut gap = 8.0;
    loop {
        let mut head = head_within(logits, temperature, max - gap);
        let whole = head.len() == count;
        gap = if gap < 1e4 { gap * 2.0 } else { f64::INFINITY };
        head.sort_unstable_by(by_rank);
        for entry in head.iter_mut() {
            entry.1 = (entry.1 - max).exp() / total;
        }
        if params.top_p < 1.0 {
            let keep = top_p_len(&head, params.top_p);
            if keep.is_some() || whole {
                head.truncate(keep.unwrap_or(head.len()));
                return walk(&renormalized(head), target, logits);
            }
        } else if let Some(token) = passed_at(&head, target) {
            return token;
        } else if whole {
            return walk(&head, target, logits);
        }
    }
}

/// The `k` likeliest finite logits, scaled, in the definition's order: one pass keeping the
/// best `k` in a heap (a value's total-order bits above, the complement of its token id
/// below, so that equal values rank in vocabulary order).
fn likeliest(logits: &[f32], k: usize, scaled: impl Fn(f32) -> f64) -> Vec<(TokenId, f64)> {
    let rank = |token: usize, logit: f32| {
        let bits = logit.to_bits();
        let ordered = if bits >> 31 == 1 {
            !bits
        } else {
            bits | 1 << 31
        };
        (u64::from(ordered) << 32) | u64::from(u32::MAX - token as u32)
    };
    let mut heap: BinaryHeap<Reverse<u64>> = BinaryHeap::with_capacity(k + 1);
    for (token, &logit) in logits.iter().enumerate() {
        if !logit.is_finite() {
            continue;
        }
        let key = rank(token, logit);
        if heap.len() < k {
            heap.push(Reverse(key));
        } else if let Some(mut worst) = heap.peek_mut() {
            if key > worst.0 {
                *worst = Reverse(key);
            }
        }
    }
    let mut keys: Vec<u64> = heap.into_iter().map(|Reverse(key)| key).collect();
    keys.sort_unstable_by(|a, b| b.cmp(a));
    keys.into_iter()
        .map(|key| {
            let token = (u32::MAX - key as u32) as usize;
            (token as TokenId, scaled(logits[token]))
        })
        .collect()
}

/// The finite logits whose scaled value (`logit / temperature`) is at least `floor`, with
/// those values, in vocabulary order: the head of the definition's order. A first pass
/// compares the f32 logits with a bound a little below the floor's (vectorized), and the few
/// that pass are checked exactly.
fn head_within(logits: &[f32], temperature: f64, floor: f64) -> Vec<(TokenId, f64)> {
    let bound = (floor * temperature) as f32;
    let bound = bound - bound.abs() * 1e-6 - f32::MIN_POSITIVE;
    logits
        .iter()
        .enumerate()
        .filter(|&(_, &logit)| logit >= bound && logit.is_finite())
        .map(|(i, &logit)| (i as TokenId, f64::from(logit) / temperature))
        .filter(|&(_, value)| value >= floor)
        .collect()
}

/// The definition's order: larger scaled logit first, equal ones in vocabulary order.
fn by_rank(a: &(TokenId, f64), b: &(TokenId, f64)) -> std::cmp::Ordering {
    b.1.total_cmp(&a.1).then(a.0.cmp(&b.0))
}

/// The token a draw `target` picks from `support` (most likely first): where the running sum
/// passes it, or the last token if rounding left a sliver of mass.
fn walk(support: &[(TokenId, f64)], target: f64, logits: &[f32]) -> TokenId {
    passed_at(support, target)
        .or(support.last().map(|&(token, _)| token))
        .unwrap_or_else(|| argmax(logits))
}

/// The token of `support` (most likely first) where the running sum passes `target`, if it
/// does.
fn passed_at(support: &[(TokenId, f64)], target: f64) -> Option<TokenId> {
    let mut left = target;
    support.iter().find_map(|&(token, probability)| {
        left -= probability;
        (left < 0.0).then_some(token)
    })
}

/// How many of `support`'s tokens (most likely first) top-p keeps: the fewest whose
/// probabilities' running sum reaches `top_p`; `None` if all of them do not.
fn top_p_len(support: &[(TokenId, f64)], top_p: f32) -> Option<usize> {
    let mut cumulative = 0.0;
    support
        .iter()
        .position(|&(_, p)| {
            cumulative += p;
            cumulative >= f64::from(top_p)
        })
        .map(|i| i + 1)
}

/// `support`'s probabilities divided by their sum.
fn renormalized(mut support: Vec<(TokenId, f64)>) -> Vec<(TokenId, f64)> {
    let kept: f64 = support.iter().map(|&(_, p)| p).sum();
    for entry in support.iter_mut() {
        entry.1 /= kept;
    }
    support
}

/// Scaled logits in the definition's order (after top-k) as probabilities: softmax, then
/// top-p.
fn normalized(mut order: Vec<(TokenId, f64)>, params: &SamplingParams) -> Vec<(TokenId, f64)> {
    let max = order.first().map_or(0.0, |&(_, l)| l);
    let mut total = 0.0;
    for entry in order.iter_mut() {
        entry.1 = (entry.1 - max).exp();
        total += entry.1;
    }
    for entry in order.iter_mut() {
        entry.1 /= total;
    }
    if params.top_p < 1.0 {
        let keep = top_p_len(&order, params.top_p).unwrap_or(order.len());
        order.truncate(keep);
        order = renormalized(order);
    }
    order
}

/// Index of the largest logit; the first one wins a tie, as `torch.argmax` does (a NaN never
/// wins, and a NaN first logit gives 0: the first index is the running best, and only a
/// larger value replaces it).
///
/// In two passes that vectorize, where one loop carrying the best index does not: the largest
/// value 16 lanes at a time, then the first 16-logit chunk holding it. Over Qwen2.5's 151936
/// logits the one loop took 120-200 us of every decoding step.
pub fn argmax(logits: &[f32]) -> TokenId {
    const LANES: usize = 16;
    let Some(&first) = logits.first() else {
        return 0;
    };
    if first.is_nan() {
        return 0;
    }
    let mut lanes = [first; LANES];
    let chunks = logits.chunks_exact(LANES);
    let tail = chunks.remainder();
    for chunk in chunks {
        for (best, &value) in lanes.iter_mut().zip(chunk) {
            if value > *best {
                *best = value;
            }
        }
    }
    let max = lanes.iter().chain(tail).fold(
        first,
        |best, &value| if value > best { value } else { best },
    );
    let holds_max = |chunk: &[f32]| chunk.iter().fold(false, |hit, &value| hit | (value == max));
    let chunk = logits.chunks(LANES).position(holds_max).unwrap_or(0);
    let within = logits[chunk * LANES..]
        .iter()
        .position(|&value| value == max)
        .unwrap_or(0);
    (chunk * LANES + within) as TokenId
}

/// The distribution a non-greedy draw uses: tokens with their probabilities (summing to 1),
/// most likely first, after temperature, top-k and top-p.
pub fn processed_distribution(logits: &[f32], params: &SamplingParams) -> Vec<(TokenId, f64)> {
    let temperature = f64::from(params.temperature);
    let mut order: Vec<(TokenId, f64)> = logits
        .iter()
        .enumerate()
        .filter(|(_, l)| l.is_finite())
        .map(|(i, &l)| (i as TokenId, f64::from(l) / temperature))
        .collect();
    // Stable sort: equal logits keep vocabulary order, so the result is deterministic.
    order.sort_by(|a, b| b.1.total_cmp(&a.1));
    if params.top_k > 0 {
        order.truncate(params.top_k);
    }
    normalized(order, params)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The definition: the first index whose value is larger than every value before it
    /// that was the best so far.
    fn argmax_plain(logits: &[f32]) -> TokenId {
        let mut best = 0;
        for (index, &value) in logits.iter().enumerate() {
            if value > logits[best] {
                best = index;
            }
        }
        best as TokenId
    }

    #[test]
    fn argmax_equals_the_plain_loop_with_ties_nans_and_signed_zeros() {
        let mut rng = ChaCha12Rng::seed_from_u64(7);
        let specials = [f32::NAN, 0.0, -0.0, f32::INFINITY, f32::NEG_INFINITY, 3.0];
        for len in [0, 1, 2, 15, 16, 17, 33, 100, 151_936] {
            for case in 0..20 {
                // Few distinct values, so maxima repeat; some cases sprinkled with specials.
                let mut logits: Vec<f32> = (0..len)
                    .map(|_| f32::from(rng.random_range(-3i8..=3)))
                    .collect();
                if case % 2 == 1 && len > 0 {
                    for _ in 0..(len / 7).max(1) {
                        let at = rng.random_range(0..len);
                        logits[at] = specials[rng.random_range(0..specials.len())];
                    }
                }
                assert_eq!(
                    argmax(&logits),
                    argmax_plain(&logits),
                    "{len} logits, case {case}: {:?}",
                    &logits[..len.min(40)]
                );
            }
        }
        assert_eq!(argmax(&[f32::NAN, 5.0, 7.0]), 0);
        assert_eq!(argmax(&[1.0, f32::NAN, 7.0, 7.0]), 2);
        assert_eq!(argmax(&[-0.0, 0.0]), 0);
    }

    fn params(temperature: f32, top_k: usize, top_p: f32, seed: u64) -> SamplingParams {
        SamplingParams {
            temperature,
            top_k,
            top_p,
            seed: Some(seed),
        }
    }

    #[test]
    fn greedy_takes_the_first_maximum() {
        let mut sampler = Sampler::new(SamplingParams::greedy());
        assert_eq!(sampler.sample(&[0.1, 2.0, 2.0, -1.0]), 1);
    }

    #[test]
    fn seeded_sampling_is_reproducible() {
        let logits: Vec<f32> = (0..50).map(|i| (i as f32 * 0.37).sin()).collect();
        let draw = |seed| {
            let mut sampler = Sampler::new(params(1.0, 0, 1.0, seed));
            (0..64).map(|_| sampler.sample(&logits)).collect::<Vec<_>>()
        };
        assert_eq!(draw(7), draw(7));
        assert_ne!(draw(7), draw(8));
    }

    #[test]
    fn draws_equal_a_walk_over_the_whole_sorted_distribution() {
        // Against the definition: the full processed distribution, then the walk. The
        // normalizers differ only in summation order, so the draws agree (a draw landing
        // within rounding of a boundary would be a one in 10^12 event).
        let mut rng = ChaCha12Rng::seed_from_u64(5);
        for (len, spread) in [(3, 1.0f32), (50, 4.0), (1000, 8.0), (151_936, 12.0)] {
            let logits: Vec<f32> = (0..len)
                .map(|i| match i % 97 {
                    13 => f32::NEG_INFINITY,
                    // Repeated values: ties in the order.
                    20..=23 => 1.5,
                    _ => rng.random_range(-spread..spread),
                })
                .collect();
            for (temperature, top_k, top_p) in [
                (1.0, 0, 1.0),
                (0.7, 0, 1.0),
                (0.05, 0, 1.0),
                (3.0, 0, 1.0),
                (1.0, 40, 1.0),
                (0.8, 0, 0.9),
                (1.2, 200, 0.5),
                (1.0, 0, 0.999),
                (1.0, len + 5, 1.0),
            ] {
                let params = params(temperature, top_k, top_p, 0);
                let support = processed_distribution(&logits, &params);
                for _ in 0..(300_000 / len).clamp(5, 200) {
                    let target = rng.random::<f64>();
                    assert_eq!(
                        draw(&logits, &params, target),
                        walk(&support, target, &logits),
                        "{len} logits, T {temperature}, top-k {top_k}, top-p {top_p}, target {target}"
                    );
                }
            }
        }
    }

    #[test]
    fn top_k_restricts_the_support() {
        let logits = [0.0, 3.0, 1.0, 2.0, -1.0, 2.5];
        let mut sampler = Sampler::new(params(5.0, 2, 1.0, 1));
        for _ in 0..500 {
            assert!([1, 5].contains(&sampler.sample(&logits)));
        }
    }

    #[test]
    fn top_p_keeps_the_smallest_set_reaching_p() {
        // Probabilities 0.5, 0.3, 0.15, 0.05 at T = 1.
        let logits: Vec<f32> = [0.5f32, 0.3, 0.15, 0.05].iter().map(|p| p.ln()).collect();
        let support = processed_distribution(&logits, &params(1.0, 0, 0.75, 0));
        let tokens: Vec<TokenId> = support.iter().map(|&(t, _)| t).collect();
        assert_eq!(tokens, vec![0, 1]);
        assert!((support[0].1 - 0.625).abs() < 1e-6);
        let mut sampler = Sampler::new(params(1.0, 0, 0.75, 3));
        let mut seen = [0usize; 4];
        for _ in 0..2000 {
            seen[sampler.sample(&logits) as usize] += 1;
        }
        assert_eq!(seen[2] + seen[3], 0);
        assert!(seen[0] > seen[1] && seen[1] > 500, "{seen:?}");
    }

    #[test]
    fn sampling_frequencies_follow_the_softmax() {
        let logits = [1.0f32, 0.0, -1.0];
        let mut sampler = Sampler::new(params(1.0, 0, 1.0, 11));
        let draws = 20_000;
        let mut counts = [0f64; 3];
        for _ in 0..draws {
            counts[sampler.sample(&logits) as usize] += 1.0;
        }
        let exact = processed_distribution(&logits, &params(1.0, 0, 1.0, 0));
        // Chi-square with 2 degrees of freedom; 13.8 is the 0.1% critical value.
        let chi_square: f64 = exact
            .iter()
            .map(|&(t, p)| (counts[t as usize] - p * draws as f64).powi(2) / (p * draws as f64))
            .sum();
        assert!(chi_square < 13.8, "chi-square {chi_square}");
    }
}
