//! The two passes over a row of logits that per-depth candidates need, written for the
//! compiler's vectors: a row's log-sum-exp, and its best `k` in one streaming pass.
//!
//! Both visit every logit of every drafted depth each round (15 rows of 32,768 to 151,936
//! values), so their cost is the drafter's, next to its forward. A libm `expf` call per value
//! and a sort key per value made them several times slower than the forward's LM head.

use grove_core::TokenId;

/// Lanes the passes keep side by side: four 128-bit vectors on any x86-64.
const LANES: usize = 16;

/// `log(sum(exp(x)))` over `values`, max-shifted and summed in f32 lanes: the reference's
/// value (`torch.logsumexp`) to a few f32 ulps. `-inf` for an empty or all `-inf` row; NaN
/// where a value is NaN or `+inf` (as the sequential formula gives).
pub fn log_sum_exp(values: &[f32]) -> f32 {
    let max = row_max(values);
    if !max.is_finite() {
        if max == f32::NEG_INFINITY {
            return max;
        }
        return f32::NAN;
    }
    let mut sums = [0f32; LANES];
    let mut chunks = values.chunks_exact(LANES);
    for chunk in &mut chunks {
        for (sum, &v) in sums.iter_mut().zip(chunk) {
            *sum += exp_non_positive(v - max);
        }
    }
    let mut sum = pairwise(sums);
    for &v in chunks.remainder() {
        sum += exp_non_positive(v - max);
    }
    max + sum.ln()
}

/// The largest value (NaNs skipped, as `f32::max` does); `-inf` for none.
fn row_max(values: &[f32]) -> f32 {
    let mut lanes = [f32::NEG_INFINITY; LANES];
    let mut chunks = values.chunks_exact(LANES);
    for chunk in &mut chunks {
        for (lane, &v) in lanes.iter_mut().zip(chunk) {
            *lane = lane.max(v);
        }
    }
    let tail = chunks.remainder().iter().copied();
    lanes
        .into_iter()
        .chain(tail)
        .fold(f32::NEG_INFINITY, f32::max)
}

/// The lanes' sum, halves added until one is left.
fn pairwise(mut lanes: [f32; LANES]) -> f32 {
    let mut width = LANES;
    while width > 1 {
        width /= 2;
        for i in 0..width {
            lanes[i] += lanes[i + width];
        }
    }
    lanes[0]
}

/// `exp(x)` for `x <= 0` (NaN stays NaN), within 2 ulps of the correctly rounded value, in
/// operations a vector does: `2^n * p(r)` with `n = round(x / ln 2)`, `r = x - n ln 2` in two
/// parts (Cody and Waite), and Cephes' `expf` polynomial on `|r| <= ln 2 / 2` (its
/// coefficients, from S. L. Moshier's Cephes library). Below -87 the value is taken as 0:
/// `exp(-87)` is 1.6e-38, and every row's sum holds `exp(0) = 1`.
#[inline(always)]
fn exp_non_positive(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    // ln 2 in two parts: the first has few bits, so `n * LN2_HI` is exact.
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    // Adding 1.5 * 2^23 rounds to an integer, which the low mantissa bits then hold.
    const ROUND: f32 = 12_582_912.0;
    let clamped = x.max(-87.0);
    let shifted = clamped * LOG2E + ROUND;
    let n = shifted - ROUND;
    let r = clamped - n * LN2_HI - n * LN2_LO;
    let p = 1.987_569_1e-4;
    let p = p * r + 1.398_199_9e-3;
    let p = p * r + 8.333_452e-3;
    let p = p * r + 4.166_579_6e-2;
    let p = p * r + 1.666_666_5e-1;
    let p = p * r + 0.5;
    let p = p * r * r + r + 1.0;
    // 2^n from its exponent bits: n is in -126..=0 here.
    let exponent = (shifted.to_bits() as i32 - ROUND.to_bits() as i32 + 127) << 23;
    let value = p * f32::from_bits(exponent as u32);
    if x < -87.0 {
        0.0
    } else if x.is_nan() {
        x
    } else {
        value
    }
}

/// The best `k` of `logits` (column `i` is token `offset + i`), best first: higher logit in
/// `f32::total_cmp`'s order, then lower id. One pass: a chunk of lanes is looked at value by
/// value only when one of its values could enter the `k` kept so far.
pub(crate) fn top_k(logits: &[f32], offset: TokenId, k: usize) -> Vec<(TokenId, f32)> {
    let mut best: Vec<(TokenId, f32)> = Vec::with_capacity(k + 1);
    if k == 0 {
        return best;
    }
    let admit = |id: TokenId, v: f32, best: &mut Vec<(TokenId, f32)>| {
        // Ids arrive in increasing order, so an equal logit never displaces a kept one.
        if best.len() == k && v.total_cmp(&best[k - 1].1).is_le() {
            return;
        }
        let at = best.partition_point(|&(_, b)| b.total_cmp(&v).is_ge());
        best.insert(at, (id, v));
        best.truncate(k);
    };
    let mut chunks = logits.chunks_exact(LANES);
    let mut id = offset;
    for chunk in &mut chunks {
        // A chunk with a NaN (or under a NaN bar) is ordered exactly, value by value.
        let bar = if best.len() == k {
            best[k - 1].1
        } else {
            f32::NEG_INFINITY
        };
        let open = best.len() < k
            || bar.is_nan()
            || chunk
                .iter()
                .fold(false, |any, &v| any | (v >= bar) | v.is_nan());
        if open {
            for (i, &v) in chunk.iter().enumerate() {
                admit(id + i as TokenId, v, &mut best);
            }
        }
        id += LANES as TokenId;
    }
    for (i, &v) in chunks.remainder().iter().enumerate() {
        admit(id + i as TokenId, v, &mut best);
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    /// The formula as written: libm's `exp`, summed first to last.
    fn reference_log_sum_exp(values: &[f32]) -> f32 {
        let max = values.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        if max == f32::NEG_INFINITY {
            return max;
        }
        let sum: f32 = values.iter().map(|&v| (v - max).exp()).sum();
        max + sum.ln()
    }

    /// Every value sorted by the order [`top_k`] keeps.
    fn reference_top_k(logits: &[f32], offset: TokenId, k: usize) -> Vec<(TokenId, f32)> {
        let mut all: Vec<(TokenId, f32)> =
            (offset..).zip(logits.iter().copied()).collect::<Vec<_>>();
        all.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        all.truncate(k);
        all
    }

    #[test]
    fn exp_is_within_two_ulps_of_libm_over_its_range() {
        let mut worst = 0u32;
        let mut x = 0f32;
        while x > -87.0 {
            let (ours, libm) = (exp_non_positive(x), x.exp());
            let ulps = (ours.to_bits() as i64 - libm.to_bits() as i64).unsigned_abs() as u32;
            worst = worst.max(ulps);
            x = f32::from_bits(x.to_bits() + 4099).min(x - 1e-3);
        }
        assert!(worst <= 2, "{worst} ulps");
        assert_eq!(exp_non_positive(0.0), 1.0);
        assert_eq!(exp_non_positive(-88.0), 0.0);
        assert_eq!(exp_non_positive(f32::NEG_INFINITY), 0.0);
        assert!(exp_non_positive(f32::NAN).is_nan());
    }

    #[test]
    fn log_sum_exp_agrees_with_the_sequential_formula() {
        let mut rng = rand_chacha::ChaCha12Rng::seed_from_u64(3);
        for len in [1usize, 5, 16, 17, 100, 32_768, 151_936] {
            let values: Vec<f32> = (0..len).map(|_| rng.random_range(-30.0..20.0)).collect();
            let (ours, reference) = (log_sum_exp(&values), reference_log_sum_exp(&values));
            assert!(
                (ours - reference).abs() <= 2e-6 * reference.abs().max(1.0),
                "{len}"
            );
        }
        let inf = f32::INFINITY;
        assert_eq!(log_sum_exp(&[]), -inf);
        assert_eq!(log_sum_exp(&[-inf; 40]), -inf);
        assert_eq!(log_sum_exp(&[-inf, 0.0]), 0.0);
        assert!(log_sum_exp(&[1.0, inf]).is_nan());
        assert!(log_sum_exp(&[1.0, f32::NAN, 2.0]).is_nan());
    }

    #[test]
    fn top_k_keeps_the_sorted_orders_best_with_ties_nans_and_signed_zeros() {
        let mut rng = rand_chacha::ChaCha12Rng::seed_from_u64(4);
        let specials = [
            f32::NAN,
            -f32::NAN,
            0.0,
            -0.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
        ];
        for len in [0usize, 1, 15, 16, 33, 1000, 40_000] {
            for k in [0usize, 1, 2, 7, 32, 64] {
                // Coarse values make ties common; now and then a special value.
                let logits: Vec<f32> = (0..len)
                    .map(|_| match rng.random_range(0..50) {
                        0 => specials[rng.random_range(0..specials.len())],
                        _ => rng.random_range(-20..12) as f32 * 0.5,
                    })
                    .collect();
                let ours = top_k(&logits, 7, k);
                let reference = reference_top_k(&logits, 7, k);
                let bits = |v: &[(TokenId, f32)]| -> Vec<(TokenId, u32)> {
                    v.iter().map(|&(t, l)| (t, l.to_bits())).collect()
                };
                assert_eq!(bits(&ours), bits(&reference), "len {len} k {k}");
            }
        }
    }

    #[test]
    fn top_k_opens_every_chunk_that_could_enter() {
        // Each chunk beats the last: the pass that skips chunks must still take them all.
        let logits: Vec<f32> = (0..200).map(|i| i as f32).collect();
        let ids: Vec<TokenId> = top_k(&logits, 0, 3).iter().map(|&(t, _)| t).collect();
        assert_eq!(ids, [199, 198, 197]);
        // +0 beats -0 in `total_cmp`'s order though the two compare equal as floats.
        let mut zeros = vec![-0.0f32; 2 * LANES];
        zeros[LANES..].fill(-1.0);
        zeros[LANES + 1] = 0.0;
        assert_eq!(top_k(&zeros, 0, 1), [(LANES as TokenId + 1, 0.0)]);
    }
}
