//! A piece for a few queries (a decode row's query heads of one KV head: 1 to 4 on most GQA
//! models) with the keys across the vector lanes instead of the queries.
//!
//! The lanes form (`lanes.rs`) gives each query a lane, so a block of 8 lanes holding a decode
//! row's 2 query heads (Qwen3's 16 over 8 KV heads) does a quarter of useful work per
//! multiply-add, and broadcasts a key element for each. Here a vector holds one element of 8
//! keys: each tile of 8 keys is transposed once (8 x 8 blocks of `vunpck`/`vshufps`/
//! `vperm2f128`) into a buffer in L1, and every multiply-add is a query element broadcast
//! against 8 keys. Several tiles run side by side, so each query has 2 to 8 independent
//! chains in flight. With AVX-512 a tile is 16 keys (two such blocks side by side) and the
//! form takes up to 8 queries: the lanes form's 16-lane block holds a Qwen2.5 decode row's 6
//! or 7 query heads of a KV head at under half its width.
//!
//! The arithmetic of each (query, key) is the lanes form's, step for step: the dot chained
//! over the head dimension from zero, one fused multiply-add per element (`q * k + acc`, the
//! product commutes exactly), then times the scale; the largest score, `exp(score - largest)`
//! and their sum in key order; the weighted sums through the same `weighted_sums_laid`. So a
//! token decoded here and verified in a tree (the lanes form) gets the same bits; the tests
//! hold every count and shape to the lanes form bit for bit.
// SAFETY (all of the module): every function is compiled for AVX2 and FMA (the 16-lane ones
// for AVX-512 F too) and reached only where the CPU has them (`Inputs::piece_avx2` and
// `Inputs::piece_avx512`, which `cpu::level` guards, and the tests, which check); every load
// and store is inside a slice whose length is asserted first.
#![allow(unsafe_code)]
#![allow(clippy::needless_range_loop)]

use std::cell::RefCell;

use super::lanes::{exp_nonpositive, PieceKeys};
use super::pieces::Piece;
use super::rows::Listed;
use super::{weighted_sums_listed, Element, WeightLayout};

/// The most queries this form takes at 8 lanes; past it the lanes form fills enough of its
/// lanes.
pub(super) const MOST_QUERIES: usize = 4;
/// The same at 16 lanes, where a decode row of Qwen2.5's 6 or 7 query heads per KV head fills
/// under half of the lanes form's block.
pub(super) const MOST_QUERIES_512: usize = 8;

thread_local! {
    /// `[tile][dim][key of the tile]`: the keys of the tiles in flight, transposed.
    static TILES: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// A piece's keys and values, listed once (`Listed`).
struct Rows<'a, E> {
    keys: Listed<'a, E>,
    values: Listed<'a, E>,
}

/// The piece in this form, where it applies: at most [`MOST_QUERIES`] queries and a head
/// dimension of whole 8-element vectors. Called only where the CPU has AVX2 and FMA.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn piece_avx2<'a, E: Element>(
    queries: &[&[f32]],
    head_dim: usize,
    scale: f32,
    keys: &PieceKeys<impl Fn(usize) -> &'a [E], impl Fn(usize) -> &'a [E]>,
) -> Option<Piece> {
    let (q, d) = (queries, head_dim);
    in_form(queries, d, keys, MOST_QUERIES, |rows, tiles, s| {
        match q.len() {
            1 => scores_avx2::<1, 8, E>(q, scale, rows, tiles, s),
            2 => scores_avx2::<2, 4, E>(q, scale, rows, tiles, s),
            3 => scores_avx2::<3, 2, E>(q, scale, rows, tiles, s),
            _ => scores_avx2::<4, 2, E>(q, scale, rows, tiles, s),
        }
    })
}

/// The same form in 512-bit vectors (16 keys a vector), for at most [`MOST_QUERIES_512`]
/// queries and a head dimension of whole 8-element vectors. Called only where the CPU has
/// AVX-512 F (and AVX2 and FMA, which every such CPU has: `cpu::Level::Avx512`).
#[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
pub(super) unsafe fn piece_avx512<'a, E: Element>(
    queries: &[&[f32]],
    head_dim: usize,
    scale: f32,
    keys: &PieceKeys<impl Fn(usize) -> &'a [E], impl Fn(usize) -> &'a [E]>,
) -> Option<Piece> {
    let (q, d) = (queries, head_dim);
    in_form(
        queries,
        d,
        keys,
        MOST_QUERIES_512,
        |rows, tiles, s| match q.len() {
            1 => scores_avx512::<1, 8, E>(q, scale, rows, tiles, s),
            2 => scores_avx512::<2, 6, E>(q, scale, rows, tiles, s),
            3 => scores_avx512::<3, 4, E>(q, scale, rows, tiles, s),
            4 => scores_avx512::<4, 4, E>(q, scale, rows, tiles, s),
            5 => scores_avx512::<5, 2, E>(q, scale, rows, tiles, s),
            6 => scores_avx512::<6, 2, E>(q, scale, rows, tiles, s),
            7 => scores_avx512::<7, 2, E>(q, scale, rows, tiles, s),
            _ => scores_avx512::<8, 2, E>(q, scale, rows, tiles, s),
        },
    )
}

/// The piece, where a form takes these queries (1 to `most` of them, a head dimension of
/// whole 8-element vectors, at least one key): `scores_of(rows, tiles, scores)` fills the
/// scores (`[query][key]`) with the form's kernel from the listed keys and values, then the
/// softmax and the weighted sums.
#[inline(always)]
fn in_form<'a, E: Element>(
    queries: &[&[f32]],
    d: usize,
    keys: &PieceKeys<impl Fn(usize) -> &'a [E], impl Fn(usize) -> &'a [E]>,
    most: usize,
    scores_of: impl FnOnce(&Rows<'a, E>, &mut Vec<f32>, &mut [f32]),
) -> Option<Piece> {
    let (count, n) = (queries.len(), keys.n);
    if count == 0 || count > most || !d.is_multiple_of(8) || n == 0 {
        return None;
    }
    assert!(
        queries.iter().all(|q| q.len() == d),
        "a query is not head_dim long"
    );
    // `[query][key]`: the scores, then their terms.
    let mut scores = vec![0f32; count * n];
    let rows = Rows {
        keys: Listed::keys(n, d, &keys.key),
        values: Listed::values(n, d, &keys.value),
    };
    TILES.with_borrow_mut(|tiles| scores_of(&rows, tiles, &mut scores));
    Some(softmax_and_sums(scores, count, &rows.values))
}

/// The piece from its scores (`[query][key]`, `count` queries): the lanes form's order, the
/// largest from minus infinity, then each term, and the running sum key after key.
#[inline(always)]
fn softmax_and_sums<E: Element>(mut scores: Vec<f32>, count: usize, values: &Listed<E>) -> Piece {
    let (n, d) = (values.rows().len(), values.width());
    let (max, sum) = match count {
        1 => softmax_in_order::<1>(&mut scores, n),
        2 => softmax_in_order::<2>(&mut scores, n),
        3 => softmax_in_order::<3>(&mut scores, n),
        4 => softmax_in_order::<4>(&mut scores, n),
        5 => softmax_in_order::<5>(&mut scores, n),
        6 => softmax_in_order::<6>(&mut scores, n),
        7 => softmax_in_order::<7>(&mut scores, n),
        _ => softmax_in_order::<8>(&mut scores, n),
    };
    let mut out = vec![0f32; count * d];
    let layout = WeightLayout {
        n,
        query: n,
        key: 1,
    };
    weighted_sums_listed::<true, _>(&mut out, &scores, layout, values);
    Piece { max, sum, out }
}

/// `Q` queries' scores (`[query][key]`, `n` keys) into their terms, and each query's largest
/// score and sum of terms, both in key order. The queries go side by side, so their running
/// largest and sums are `Q` independent chains: one query's 4096 keys at a time, each add
/// waited on the one before (a fifth of a decode row's attention, `perf annotate`). The terms
/// in a pass of their own (independent: in vectors).
#[inline(always)]
fn softmax_in_order<const Q: usize>(scores: &mut [f32], n: usize) -> (Vec<f32>, Vec<f32>) {
    let mut largest = [f32::NEG_INFINITY; Q];
    {
        let rows: [&[f32]; Q] = std::array::from_fn(|q| &scores[q * n..(q + 1) * n]);
        for key in 0..n {
            for q in 0..Q {
                largest[q] = largest[q].max(rows[q][key]);
            }
        }
    }
    for (terms, m) in scores.chunks_exact_mut(n).zip(largest) {
        for term in terms.iter_mut() {
            *term = exp_nonpositive(*term - m);
        }
    }
    let rows: [&[f32]; Q] = std::array::from_fn(|q| &scores[q * n..(q + 1) * n]);
    let mut total = [0f32; Q];
    for key in 0..n {
        for q in 0..Q {
            total[q] += rows[q][key];
        }
    }
    (largest.to_vec(), total.to_vec())
}

/// The scaled dots of `Q` queries with the piece's `n` keys into `scores` (`[query][key]`),
/// `T` tiles of 8 keys at a time (`Q * T` chains of multiply-adds in registers). The value
/// rows are asked into L2 a group ahead: the weighted sums read them next.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn scores_avx2<const Q: usize, const T: usize, E: Element>(
    queries: &[&[f32]],
    scale: f32,
    rows: &Rows<'_, E>,
    tiles: &mut Vec<f32>,
    scores: &mut [f32],
) {
    use std::arch::x86_64::*;
    let (key, value) = (rows.keys.rows(), rows.values.rows());
    let (n, d) = (key.len(), rows.keys.width());
    assert!(queries.len() == Q && d.is_multiple_of(8) && scores.len() == Q * n);
    tiles.resize(T * d * 8, 0.0);
    let queries: [&[f32]; Q] = std::array::from_fn(|q| &queries[q][..d]);
    for first in (0..n).step_by(8 * T) {
        // The next group's keys, requested while this one's multiply (rows of a layer's KV
        // store lie a page apart on models with many KV heads: past the hardware prefetcher).
        for k in first + 8 * T..(first + 16 * T).min(n) {
            super::prefetch(key[k].cast(), size_of::<E>() * d);
            super::prefetch_l2(value[k].cast(), size_of::<E>() * d);
        }
        for t in 0..T {
            // Past the last key, the first key of the group again: its scores are dropped.
            let rows: [*const E; 8] = std::array::from_fn(|j| {
                let k = first + 8 * t + j;
                key[if k < n { k } else { first }]
            });
            // SAFETY: every listed key is `d` long; the tile is `d * 8` floats.
            transpose_into(&rows, d, tiles[t * d * 8..(t + 1) * d * 8].as_mut_ptr(), 8);
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

/// Eight keys' elements into `to`: element `e` of key `j` at `to[e * stride + j]` (the 8 keys
/// of a 256-bit tile, or one half of a 512-bit tile's 16), each 8 x 8 block by unpacking
/// pairs, shuffling quarters and swapping halves.
///
/// # Safety
/// AVX2 and FMA; `d` elements readable at each row, `d` a multiple of 8, and `to` valid for
/// `(d - 1) * stride + 8` floats.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn transpose_into<E: Element>(
    rows: &[*const E; 8],
    d: usize,
    to: *mut f32,
    stride: usize,
) {
    use std::arch::x86_64::*;
    for c in (0..d).step_by(8) {
        // SAFETY: `c + 8 <= d`, and `d` elements are readable at each row (the caller).
        let r: [__m256; 8] = std::array::from_fn(|j| E::load8(rows[j].add(c)));
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
        let out = to.add(c * stride);
        for e in 0..4 {
            let (a, b) = (quads[0][e], quads[1][e]);
            _mm256_storeu_ps(out.add(e * stride), _mm256_permute2f128_ps::<0x20>(a, b));
            _mm256_storeu_ps(
                out.add((e + 4) * stride),
                _mm256_permute2f128_ps::<0x31>(a, b),
            );
        }
    }
}

/// [`transpose_into`] for f16 rows into an f16 tile, 32 elements of the 8 keys at a time in
/// 16-bit lanes (three rounds of unpacking: pairs, quads, eights, within each 128-bit lane),
/// which takes under half the instructions of widening first and moving 32-bit lanes; the
/// tile's reader widens each 16 keys' element as it loads it ([`Element::load16`]).
///
/// # Safety
/// AVX-512 F and BW; `d` (a multiple of 8) elements readable at each row, and `to` valid for
/// `(d - 1) * stride + 8` elements.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
pub(super) unsafe fn transpose_halves(
    rows: &[*const half::f16; 8],
    d: usize,
    to: *mut half::f16,
    stride: usize,
) {
    use std::arch::x86_64::*;
    for c in (0..d).step_by(32) {
        // The last run may be 8, 16 or 24 elements: the rest of each load masked off (a masked
        // load reads nothing past the row), and only its 128-bit lanes stored.
        let lanes = (d - c).min(32) / 8;
        let mask = if lanes == 4 {
            !0
        } else {
            (1u32 << (8 * lanes)) - 1
        };
        // SAFETY: the first `8 * lanes` elements from `c` are inside each row (the caller).
        let r: [__m512i; 8] =
            std::array::from_fn(|j| _mm512_maskz_loadu_epi16(mask, rows[j].add(c).cast()));
        // Keys 2p and 2p + 1 side by side: elements 0-3 (low) and 4-7 (high) of each lane.
        let pairs: [__m512i; 8] = std::array::from_fn(|i| {
            let (a, b) = (r[2 * (i % 4)], r[2 * (i % 4) + 1]);
            if i < 4 {
                _mm512_unpacklo_epi16(a, b)
            } else {
                _mm512_unpackhi_epi16(a, b)
            }
        });
        // Keys 0-3 (and 4-7) of elements 0-1, 2-3 (from the low pairs), 4-5, 6-7 (the high).
        let quads: [[__m512i; 4]; 2] = std::array::from_fn(|h| {
            let (low, high) = (&pairs[..4], &pairs[4..]);
            let (a, b, c, e) = (low[2 * h], low[2 * h + 1], high[2 * h], high[2 * h + 1]);
            [
                _mm512_unpacklo_epi32(a, b),
                _mm512_unpackhi_epi32(a, b),
                _mm512_unpacklo_epi32(c, e),
                _mm512_unpackhi_epi32(c, e),
            ]
        });
        // Element k of the 8 keys in each lane `l` (element `c + 8 l + k`).
        let eights: [__m512i; 8] = std::array::from_fn(|k| {
            let (a, b) = (quads[0][k / 2], quads[1][k / 2]);
            if k % 2 == 0 {
                _mm512_unpacklo_epi64(a, b)
            } else {
                _mm512_unpackhi_epi64(a, b)
            }
        });
        for (k, v) in eights.into_iter().enumerate() {
            // SAFETY: element `c + 8 l + k < d` for `l < lanes`: inside `to` (the caller).
            let at = |l: usize| to.add((c + 8 * l + k) * stride).cast::<__m128i>();
            _mm_storeu_si128(at(0), _mm512_castsi512_si128(v));
            if lanes > 1 {
                _mm_storeu_si128(at(1), _mm512_extracti32x4_epi32::<1>(v));
            }
            if lanes > 2 {
                _mm_storeu_si128(at(2), _mm512_extracti32x4_epi32::<2>(v));
            }
            if lanes > 3 {
                _mm_storeu_si128(at(3), _mm512_extracti32x4_epi32::<3>(v));
            }
        }
    }
}

/// The dots of `Q` queries (`d` elements at each pointer) with the `T` transposed tiles at
/// `tiles` (`[tile][dim][16 keys]`), chained over the dimensions from zero: accumulator
/// `q * T + t`. The accumulators are one flat array passed by value (LLVM left a nested one in
/// memory).
///
/// # Safety
/// AVX-512 F; the queries and `T * d * 16` floats at `tiles` readable.
#[inline(always)]
unsafe fn dots_avx512<const Q: usize, const T: usize, E: Element>(
    queries: &[*const f32; Q],
    tiles: *const E,
    d: usize,
) -> [std::arch::x86_64::__m512; 16] {
    use std::arch::x86_64::*;
    const { assert!(Q * T <= 16) };
    let mut acc = [_mm512_setzero_ps(); 16];
    for e in 0..d {
        let k: [__m512; T] = std::array::from_fn(|t| E::load16(tiles.add((t * d + e) * 16)));
        for q in 0..Q {
            let x = _mm512_set1_ps(*queries[q].add(e));
            for t in 0..T {
                acc[q * T + t] = _mm512_fmadd_ps(x, k[t], acc[q * T + t]);
            }
        }
    }
    acc
}

/// [`scores_avx2`] with 16 keys a tile: each tile's two halves of 8 keys transposed into
/// `[dim][16 keys]`, and each multiply-add a query element broadcast against 16 keys. The
/// value rows are asked into L2 a group ahead too: the weighted sums read them next, and a
/// piece's fit there (from memory, as a long context's are, they waited on every row).
#[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
unsafe fn scores_avx512<const Q: usize, const T: usize, E: Element>(
    queries: &[&[f32]],
    scale: f32,
    rows: &Rows<'_, E>,
    tiles: &mut Vec<f32>,
    scores: &mut [f32],
) {
    use std::arch::x86_64::*;
    let (key, value) = (rows.keys.rows(), rows.values.rows());
    let (n, d) = (key.len(), rows.keys.width());
    assert!(queries.len() == Q && d.is_multiple_of(8) && scores.len() == Q * n);
    // The tiles in `E` (f16 keys stay f16 until loaded), in the f32 buffer: `E` is no larger
    // and no more aligned than f32.
    tiles.resize(T * d * 16, 0.0);
    const { assert!(size_of::<E>() <= 4 && align_of::<E>() <= 4) };
    let tiles = tiles.as_mut_ptr().cast::<E>();
    let queries: [*const f32; Q] = std::array::from_fn(|q| queries[q][..d].as_ptr());
    for first in (0..n).step_by(16 * T) {
        for t in 0..T {
            for half in 0..2 {
                // Past the last key, the first key of the group again: its scores are dropped.
                let base = first + 16 * t + 8 * half;
                // The next 8 keys, asked for as these are read: a whole group's requests at
                // once (up to 96 keys) ran slower from memory, and so did a group ahead.
                for k in base + 8..(base + 16).min(n) {
                    super::prefetch(key[k].cast(), size_of::<E>() * d);
                    super::prefetch_l2(value[k].cast(), size_of::<E>() * d);
                }
                let rows: [*const E; 8] = std::array::from_fn(|j| {
                    let k = base + j;
                    key[if k < n { k } else { first }]
                });
                // SAFETY: every listed key is `d` long; the tile is `d * 16` elements from
                // `t * d * 16`, and this half's last element lands at
                // `(d - 1) * 16 + 8 * half + 7 < d * 16`.
                E::transpose8(&rows, d, tiles.add(t * d * 16 + 8 * half), 16);
            }
        }
        // SAFETY: every query is `d` long and each tile `d * 16` elements from `t * d * 16`.
        let acc = dots_avx512::<Q, T, E>(&queries, tiles, d);
        let factor = _mm512_set1_ps(scale);
        for q in 0..Q {
            for t in 0..T {
                let start = first + 16 * t;
                if start >= n {
                    break;
                }
                let mut dots = [0f32; 16];
                _mm512_storeu_ps(dots.as_mut_ptr(), _mm512_mul_ps(acc[q * T + t], factor));
                let kept = 16.min(n - start);
                scores[q * n + start..][..kept].copy_from_slice(&dots[..kept]);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::lanes::piece_in_lanes;
    use super::super::lanes::tests::{bits, wave};
    use super::*;

    type Rows<'a, E> = &'a dyn Fn(usize) -> &'a [E];
    type Form<E> =
        for<'a> fn(&[&[f32]], usize, &PieceKeys<Rows<'a, E>, Rows<'a, E>>) -> Option<Piece>;

    /// A form against the lanes form (`L` lanes): every count of queries up to `most`, head
    /// dimensions `ds`, pieces of `ns` keys, over f32 rows (`form`) and over f16 rows
    /// (`halves`, against the lanes form over f32 rows of the same values); past `most`
    /// queries, and for a head dimension of partial vectors, the form declines.
    fn check_form<const L: usize>(
        most: usize,
        ds: &[usize],
        ns: &[usize],
        form: Form<f32>,
        halves: Form<half::f16>,
    ) {
        for &d in ds {
            for &n in ns {
                let (keys, values) = (wave(n * d, 1.0), wave(n * d, 2.0));
                let half = |v: &[f32]| -> Vec<half::f16> {
                    v.iter().map(|&x| half::f16::from_f32(x)).collect()
                };
                let (half_keys, half_values) = (half(&keys), half(&values));
                let widen =
                    |v: &[half::f16]| -> Vec<f32> { v.iter().map(|h| h.to_f32()).collect() };
                let (wide_keys, wide_values) = (widen(&half_keys), widen(&half_values));
                let (key, value) = (
                    |i: usize| &keys[i * d..][..d],
                    |i: usize| &values[i * d..][..d],
                );
                let piece = PieceKeys {
                    n,
                    key: &key as Rows<'_, f32>,
                    value: &value as Rows<'_, f32>,
                };
                let wide_key = |i: usize| &wide_keys[i * d..][..d];
                let wide_value = |i: usize| &wide_values[i * d..][..d];
                let widened = PieceKeys {
                    n,
                    key: &wide_key as Rows<'_, f32>,
                    value: &wide_value as Rows<'_, f32>,
                };
                let half_key = |i: usize| &half_keys[i * d..(i + 1) * d];
                let half_value = |i: usize| &half_values[i * d..(i + 1) * d];
                let halved = PieceKeys {
                    n,
                    key: &half_key as Rows<'_, half::f16>,
                    value: &half_value as Rows<'_, half::f16>,
                };
                let all = wave((most + 1) * d, 3.0);
                let queries: Vec<&[f32]> = all.chunks_exact(d).collect();
                for count in 1..=most {
                    let queries = &queries[..count];
                    let case = format!("{L} lanes, d {d}, n {n}, {count} queries");
                    let reference = piece_in_lanes::<L, _>(queries, d, 0.3, &piece);
                    let ours = form(queries, d, &piece).expect("the form applies");
                    assert_same(&ours, &reference, &case);
                    let reference = piece_in_lanes::<L, _>(queries, d, 0.3, &widened);
                    let ours = halves(queries, d, &halved).expect("the form applies");
                    assert_same(&ours, &reference, &format!("{case}, f16 rows"));
                }
                assert!(form(&queries[..most + 1], d, &piece).is_none());
                assert!(halves(&queries[..most + 1], d, &halved).is_none());
            }
        }
        let odd = wave(12, 1.0);
        let row = |_: usize| &odd[..12];
        let piece = PieceKeys {
            n: 1,
            key: &row as Rows<'_, f32>,
            value: &row as Rows<'_, f32>,
        };
        assert!(form(&[&odd[..12]], 12, &piece).is_none());
    }

    fn assert_same(ours: &Piece, reference: &Piece, case: &str) {
        assert_eq!(bits(&ours.max), bits(&reference.max), "{case}");
        assert_eq!(bits(&ours.sum), bits(&reference.sum), "{case}");
        assert_eq!(bits(&ours.out), bits(&reference.out), "{case}");
    }

    /// Every count of queries it takes, head dimensions of 1 to 32 vectors and pieces of 1 to
    /// 256 keys (whole and partial tiles and groups of tiles): the lanes form's bits.
    #[test]
    fn keys_across_lanes_give_the_lanes_forms_bits() {
        use crate::cpu::{level, Level};
        let test = "keys_across_lanes_give_the_lanes_forms_bits";
        if crate::skip_without("avx2", level() >= Level::Avx2, test) {
            return;
        }
        let ns = [1, 7, 8, 9, 31, 33, 64, 65, 200, 256];
        // SAFETY (both): AVX2, FMA and F16C are present (checked above: the level).
        check_form::<8>(
            MOST_QUERIES,
            &[8, 32, 64, 128, 256],
            &ns,
            |q, d, piece| unsafe { piece_avx2(q, d, 0.3, piece) },
            |q, d, piece| unsafe { piece_avx2(q, d, 0.3, piece) },
        );
    }

    /// The 16-lane form: every count of queries it takes (Qwen2.5's 6 and 7 query heads per
    /// KV head among them) over whole and partial tiles and groups of tiles, and head
    /// dimensions that end in each partial run of f16 transposes (8, 16, 24 elements): the
    /// lanes form's bits.
    #[test]
    fn sixteen_keys_across_lanes_give_the_lanes_forms_bits() {
        use crate::cpu::{level, Level};
        let test = "sixteen_keys_across_lanes_give_the_lanes_forms_bits";
        if crate::skip_without("avx512", level() >= Level::Avx512, test) {
            return;
        }
        let ns = [1, 15, 16, 17, 31, 32, 33, 47, 95, 97, 200, 256];
        // SAFETY (both): AVX-512 F, AVX2, FMA and F16C are present (checked above: the level).
        check_form::<16>(
            MOST_QUERIES_512,
            &[8, 16, 24, 40, 64, 128, 256],
            &ns,
            |q, d, piece| unsafe { piece_avx512(q, d, 0.3, piece) },
            |q, d, piece| unsafe { piece_avx512(q, d, 0.3, piece) },
        );
    }
}
