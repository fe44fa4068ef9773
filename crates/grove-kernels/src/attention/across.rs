//! A piece for a few queries (a decode row's query heads of one KV head: 1 to 4 on most GQA
//! models) with the keys across the vector lanes instead of the queries.
//!
//! The lanes form (`lanes.rs`) gives each query a lane, so a block of 8 lanes holding a decode
//! row's 2 query heads (Qwen3's 16 over 8 KV heads) does a quarter of useful work per
//! multiply-add, and broadcasts a key element for each. Here a vector holds one element of 8
//! keys: each tile of 8 keys is transposed once (8 x 8 blocks of `vunpck`/`vshufps`/
//! `vperm2f128`) into a buffer in L1, and every multiply-add is a query element broadcast
//! against 8 keys. Several tiles run side by side, so each query has 2 to 8 independent
//! chains in flight.
//!
//! The arithmetic of each (query, key) is the lanes form's, step for step: the dot chained
//! over the head dimension from zero, one fused multiply-add per element (`q * k + acc`, the
//! product commutes exactly), then times the scale; the largest score, `exp(score - largest)`
//! and their sum in key order; the weighted sums through the same `weighted_sums_laid`. So a
//! token decoded here and verified in a tree (the lanes form) gets the same bits; the tests
//! hold every count and shape to the lanes form bit for bit.
// SAFETY (all of the module): every function is compiled for AVX2 and FMA and reached only
// where the CPU has them (`Inputs::piece_avx2`, which `cpu::level` guards, and the test, which
// checks); every load and store is inside a slice whose length is asserted first.
#![allow(unsafe_code)]
#![allow(clippy::needless_range_loop)]

use std::cell::RefCell;

use super::lanes::{exp_nonpositive, PieceKeys};
use super::pieces::Piece;
use super::{weighted_sums_laid, WeightLayout};

/// The most queries this form takes; past it the lanes form fills enough of its lanes.
pub(super) const MOST_QUERIES: usize = 4;

thread_local! {
    /// `[tile][dim][key of the tile]`: the keys of the tiles in flight, transposed.
    static TILES: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// The piece in this form, where it applies: at most [`MOST_QUERIES`] queries and a head
/// dimension of whole 8-element vectors. Called only where the CPU has AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn piece_avx2<'a>(
    queries: &[&[f32]],
    head_dim: usize,
    scale: f32,
    keys: &PieceKeys<impl Fn(usize) -> &'a [f32], impl Fn(usize) -> &'a [f32]>,
) -> Option<Piece> {
    let (count, d, n) = (queries.len(), head_dim, keys.n);
    if count == 0 || count > MOST_QUERIES || !d.is_multiple_of(8) || n == 0 {
        return None;
    }
    assert!(
        queries.iter().all(|q| q.len() == d),
        "a query is not head_dim long"
    );
    // `[query][key]`: the scores, then their terms.
    let mut scores = vec![0f32; count * n];
    TILES.with_borrow_mut(|tiles| match count {
        1 => scores_avx2::<1, 8>(queries, d, scale, &keys.key, n, tiles, &mut scores),
        2 => scores_avx2::<2, 4>(queries, d, scale, &keys.key, n, tiles, &mut scores),
        3 => scores_avx2::<3, 2>(queries, d, scale, &keys.key, n, tiles, &mut scores),
        _ => scores_avx2::<4, 2>(queries, d, scale, &keys.key, n, tiles, &mut scores),
    });
    let (mut max, mut sum) = (vec![0f32; count], vec![0f32; count]);
    for (q, terms) in scores.chunks_exact_mut(n).enumerate() {
        // The lanes form's order: the largest from minus infinity, then each term and the
        // running sum key after key.
        max[q] = terms.iter().fold(f32::NEG_INFINITY, |m, &s| m.max(s));
        let mut total = 0f32;
        for term in terms.iter_mut() {
            *term = exp_nonpositive(*term - max[q]);
            total += *term;
        }
        sum[q] = total;
    }
    let mut out = vec![0f32; count * d];
    let layout = WeightLayout {
        n,
        query: n,
        key: 1,
    };
    weighted_sums_laid::<true>(&mut out, d, &scores, layout, &keys.value);
    Some(Piece { max, sum, out })
}

/// The scaled dots of `Q` queries with the piece's `n` keys into `scores` (`[query][key]`),
/// `T` tiles of 8 keys at a time (`Q * T` chains of multiply-adds in registers).
#[target_feature(enable = "avx2,fma")]
unsafe fn scores_avx2<'a, const Q: usize, const T: usize>(
    queries: &[&[f32]],
    d: usize,
    scale: f32,
    key: &impl Fn(usize) -> &'a [f32],
    n: usize,
    tiles: &mut Vec<f32>,
    scores: &mut [f32],
) {
    use std::arch::x86_64::*;
    assert!(queries.len() == Q && d.is_multiple_of(8) && scores.len() == Q * n);
    tiles.resize(T * d * 8, 0.0);
    let queries: [&[f32]; Q] = std::array::from_fn(|q| &queries[q][..d]);
    for first in (0..n).step_by(8 * T) {
        // The next group's keys, requested while this one's multiply (rows of a layer's KV
        // store lie a page apart on models with many KV heads: past the hardware prefetcher).
        for k in first + 8 * T..(first + 16 * T).min(n) {
            super::prefetch(key(k).as_ptr().cast(), 4 * d);
        }
        for t in 0..T {
            // Past the last key, the first key of the group again: its scores are dropped.
            let rows: [&[f32]; 8] = std::array::from_fn(|j| {
                let k = first + 8 * t + j;
                let key = key(if k < n { k } else { first });
                assert_eq!(key.len(), d, "a key is not head_dim long");
                key
            });
            transpose_tile(&rows, &mut tiles[t * d * 8..(t + 1) * d * 8]);
        }
        let mut acc = [[_mm256_setzero_ps(); T]; Q];
        for e in 0..d {
            // SAFETY: `t * d * 8 + e * 8 + 8 <= T * d * 8 = tiles.len()`.
            let k: [__m256; T] =
                std::array::from_fn(|t| _mm256_loadu_ps(tiles.as_ptr().add((t * d + e) * 8)));
            for q in 0..Q {
                let x = _mm256_set1_ps(queries[q][e]);
                for t in 0..T {
                    acc[q][t] = _mm256_fmadd_ps(x, k[t], acc[q][t]);
                }
            }
        }
        let factor = _mm256_set1_ps(scale);
        for q in 0..Q {
            for t in 0..T {
                let start = first + 8 * t;
                if start >= n {
                    break;
                }
                let mut dots = [0f32; 8];
                _mm256_storeu_ps(dots.as_mut_ptr(), _mm256_mul_ps(acc[q][t], factor));
                let kept = 8.min(n - start);
                scores[q * n + start..][..kept].copy_from_slice(&dots[..kept]);
            }
        }
    }
}

/// Eight keys' elements as `[dim][key]` into `to` (`d * 8` floats): each 8 x 8 block by
/// unpacking pairs, shuffling quarters and swapping halves.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn transpose_tile(rows: &[&[f32]; 8], to: &mut [f32]) {
    use std::arch::x86_64::*;
    let d = rows[0].len();
    assert!(to.len() == d * 8 && rows.iter().all(|r| r.len() == d));
    for c in (0..d).step_by(8) {
        // SAFETY: `c + 8 <= d`, every row is `d` long and `to` is `d * 8` (checked).
        let r: [__m256; 8] = std::array::from_fn(|j| _mm256_loadu_ps(rows[j].as_ptr().add(c)));
        // Pairs of keys: elements 0, 1, 4, 5 (low) and 2, 3, 6, 7 (high) interleaved.
        let low: [__m256; 4] = std::array::from_fn(|p| _mm256_unpacklo_ps(r[2 * p], r[2 * p + 1]));
        let high: [__m256; 4] = std::array::from_fn(|p| _mm256_unpackhi_ps(r[2 * p], r[2 * p + 1]));
        // Four keys' element e (low half) and e + 4 (high half), for e = 0, 1, 2, 3, for keys
        // 0-3 (h = 0) and 4-7 (h = 1).
        let quads: [[__m256; 4]; 2] = std::array::from_fn(|h| {
            let (l0, l1, h0, h1) = (low[2 * h], low[2 * h + 1], high[2 * h], high[2 * h + 1]);
            [
                _mm256_shuffle_ps::<0x44>(l0, l1),
                _mm256_shuffle_ps::<0xEE>(l0, l1),
                _mm256_shuffle_ps::<0x44>(h0, h1),
                _mm256_shuffle_ps::<0xEE>(h0, h1),
            ]
        });
        let out = to.as_mut_ptr().add(c * 8);
        for e in 0..4 {
            let (a, b) = (quads[0][e], quads[1][e]);
            _mm256_storeu_ps(out.add(e * 8), _mm256_permute2f128_ps::<0x20>(a, b));
            _mm256_storeu_ps(out.add((e + 4) * 8), _mm256_permute2f128_ps::<0x31>(a, b));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::lanes::piece_in_lanes;
    use super::super::lanes::tests::{bits, wave};
    use super::*;

    /// Every count of queries it takes, head dimensions of 1 to 32 vectors and pieces of 1 to
    /// 256 keys (whole and partial tiles and groups of tiles): the lanes form's bits.
    #[test]
    fn keys_across_lanes_give_the_lanes_forms_bits() {
        use crate::cpu::{level, Level};
        let test = "keys_across_lanes_give_the_lanes_forms_bits";
        if crate::skip_without("avx2", level() >= Level::Avx2, test) {
            return;
        }
        for d in [8, 32, 64, 128, 256] {
            for n in [1, 7, 8, 9, 31, 33, 64, 65, 200, 256] {
                let (keys, values) = (wave(n * d, 1.0), wave(n * d, 2.0));
                let piece = PieceKeys {
                    n,
                    key: |i: usize| &keys[i * d..(i + 1) * d],
                    value: |i: usize| &values[i * d..(i + 1) * d],
                };
                let all = wave(5 * d, 3.0);
                let queries: Vec<&[f32]> = all.chunks_exact(d).collect();
                for count in 1..=MOST_QUERIES {
                    let case = format!("d {d}, n {n}, {count} queries");
                    let reference = piece_in_lanes::<8>(&queries[..count], d, 0.3, &piece);
                    // SAFETY: AVX2 and FMA are present (checked above).
                    let ours = unsafe { piece_avx2(&queries[..count], d, 0.3, &piece) }
                        .expect("the form applies");
                    assert_eq!(bits(&ours.max), bits(&reference.max), "{case}");
                    assert_eq!(bits(&ours.sum), bits(&reference.sum), "{case}");
                    assert_eq!(bits(&ours.out), bits(&reference.out), "{case}");
                }
                // Past its counts, and for a head dimension of partial vectors, it declines.
                // SAFETY: as above.
                assert!(unsafe { piece_avx2(&queries[..5], d, 0.3, &piece) }.is_none());
            }
        }
        let odd = wave(12, 1.0);
        let piece = PieceKeys {
            n: 1,
            key: |_| &odd[..12],
            value: |_| &odd[..12],
        };
        // SAFETY: as above.
        assert!(unsafe { piece_avx2(&[&odd[..12]], 12, 0.3, &piece) }.is_none());
    }
}
