//! A piece of a long row's attention over bfloat16 K/V rows in bfloat16 arithmetic: the
//! queries and the softmax's terms rounded to bfloat16 pairs once, and every score and
//! weighted sum a chain of `vdpbf16ps` lanes ([`step`]), 32 multiply-adds an instruction where
//! the f32 forms' fused multiply-adds do 16. Over a long context a verify's attention is bound
//! by those instructions (16 tree rows over 4096 tokens: 5.6 G multiply-adds on the 1.5B), so
//! this halves its floor; bfloat16 scores and weights are what FlashAttention computes over a
//! bfloat16 cache on a GPU.
//!
//! Each query is a lane of its own (one query per lane, as `lanes.rs`), chained over the head
//! dimension's pairs for a score and over the keys' pairs for a weighted sum, so a query gets
//! the same bits in any block beside any other queries: a token decoded alone and verified in
//! a tree agree bit for bit. The portable reference ([`piece_reference`]) is the same chains
//! one query at a time; the AVX-512 BF16 form is held to it bit for bit.

use half::bf16;

use super::lanes::exp_nonpositive;
use super::pieces::Piece;
use crate::strips::dot::{pairs, step};

/// A piece's `n` keys and values, bfloat16 rows `d` long, by position in the piece.
pub(super) struct DotKeys<K, V> {
    pub n: usize,
    pub key: K,
    pub value: V,
}

/// Pair `p` of a bfloat16 row (elements `2p` and `2p + 1`, the even one in the low half), as
/// `vdpbf16ps` reads a 32-bit lane.
#[inline(always)]
fn word(row: &[bf16], p: usize) -> u32 {
    u32::from(row[2 * p].to_bits()) | u32::from(row[2 * p + 1].to_bits()) << 16
}

/// Dimension `j` of keys `2m` and `2m + 1`'s values as one pair (a zero past the last key).
#[inline(always)]
fn value_pair<'a>(value: &impl Fn(usize) -> &'a [bf16], n: usize, m: usize, j: usize) -> u32 {
    let high = if 2 * m + 1 < n {
        u32::from(value(2 * m + 1)[j].to_bits()) << 16
    } else {
        0
    };
    u32::from(value(2 * m)[j].to_bits()) | high
}

/// The piece's softmax before normalization for each query, one query at a time: the
/// definition the vector form is held to.
pub(super) fn piece_reference<'a>(
    queries: &[&[f32]],
    d: usize,
    scale: f32,
    keys: &DotKeys<impl Fn(usize) -> &'a [bf16], impl Fn(usize) -> &'a [bf16]>,
) -> Piece {
    assert!(d.is_multiple_of(2), "an odd head dimension");
    let (n, count) = (keys.n, queries.len());
    let (mut max, mut sum, mut out) = (vec![0f32; count], vec![0f32; count], vec![0f32; count * d]);
    for (q, query) in queries.iter().enumerate() {
        let query = pairs(query, 1, d);
        let scores: Vec<f32> = (0..n)
            .map(|k| {
                let key = (keys.key)(k);
                (0..d / 2).fold(0f32, |acc, p| step(acc, word(key, p), query[p])) * scale
            })
            .collect();
        max[q] = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let terms: Vec<f32> = scores
            .iter()
            .map(|&s| exp_nonpositive(s - max[q]))
            .collect();
        sum[q] = terms.iter().fold(0f32, |total, &t| total + t);
        let terms = pairs(&terms, 1, n);
        for (j, o) in out[q * d..][..d].iter_mut().enumerate() {
            *o = (0..n.div_ceil(2)).fold(0f32, |acc, m| {
                step(acc, value_pair(&keys.value, n, m, j), terms[m])
            });
        }
    }
    Piece { max, sum, out }
}

/// [`piece_reference`] in AVX-512 BF16 where the CPU has it, else the reference itself.
pub(super) fn piece<'a>(
    queries: &[&[f32]],
    d: usize,
    scale: f32,
    keys: &DotKeys<impl Fn(usize) -> &'a [bf16], impl Fn(usize) -> &'a [bf16]>,
) -> Piece {
    #[cfg(target_arch = "x86_64")]
    if crate::strips::Bf16Arithmetic::here() == crate::strips::Bf16Arithmetic::Dot {
        // SAFETY: `Dot` is chosen only where the CPU has AVX-512 F and BF16.
        #[allow(unsafe_code)]
        return unsafe { avx512::piece(queries, d, scale, keys) };
    }
    piece_reference(queries, d, scale, keys)
}

#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
mod avx512 {
    use std::arch::x86_64::*;

    use half::bf16;

    use super::{exp_nonpositive, pairs, value_pair, DotKeys, Piece};

    /// A thread's buffers, kept between pieces (see `lanes.rs`'s).
    #[derive(Default)]
    struct Scratch {
        transposed: Vec<u32>,
        values: Vec<u32>,
        rows: Vec<*const u32>,
        scores: Vec<f32>,
        terms: Vec<u32>,
        sums: Vec<f32>,
        doubled: Vec<u32>,
    }

    thread_local! {
        static SCRATCH: std::cell::RefCell<Scratch> = std::cell::RefCell::new(Scratch::default());
    }

    /// `buffer`'s first `len` values, grown (never cleared: every use writes what it reads).
    fn grown<T: Copy + Default>(buffer: &mut Vec<T>, len: usize) -> &mut [T] {
        if buffer.len() < len {
            buffer.resize(len, T::default());
        }
        &mut buffer[..len]
    }

    /// Lanes of a block: one query each.
    const L: usize = 16;
    /// Keys per tile of the scores.
    const KEYS: usize = 6;
    /// Head dimensions per tile of the weighted sums.
    const DIMS: usize = 8;

    #[inline(always)]
    unsafe fn dot(acc: __m512, a: __m512i, b: __m512i) -> __m512 {
        let bf16s = |v: __m512i| std::mem::transmute::<__m512i, __m512bh>(v);
        _mm512_dpbf16_ps(acc, bf16s(a), bf16s(b))
    }

    /// [`super::piece_reference`] with `L` queries a vector, a block at a time.
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512bf16,fma")]
    pub(super) unsafe fn piece<'a>(
        queries: &[&[f32]],
        d: usize,
        scale: f32,
        keys: &DotKeys<impl Fn(usize) -> &'a [bf16], impl Fn(usize) -> &'a [bf16]>,
    ) -> Piece {
        assert!(d.is_multiple_of(2), "an odd head dimension");
        let (n, count, d2) = (keys.n, queries.len(), d / 2);
        let blocks = count.div_ceil(L);
        let mut scratch = SCRATCH.take();
        let s = &mut scratch;
        // `[block][pair][lane]`: each query's pairs down its lane (lanes past the last query
        // hold what they held: their scores are dropped).
        let transposed = grown(&mut s.transposed, blocks * d2 * L);
        for (q, query) in queries.iter().enumerate() {
            assert_eq!(query.len(), d, "a query is not head_dim long");
            let (b, lane) = (q / L, q % L);
            for (p, pair) in pairs(query, 1, d).into_iter().enumerate() {
                transposed[(b * d2 + p) * L + lane] = pair;
            }
        }
        // `[key pair][dim]`: the values paired as the weighted sums read them.
        let values = grown(&mut s.values, n.div_ceil(2) * d);
        paired_values(keys, d, values);
        let rows = grown(&mut s.rows, n);
        for (k, row) in rows.iter_mut().enumerate() {
            let key = (keys.key)(k);
            assert_eq!(key.len(), d, "a key is not head_dim long");
            *row = key.as_ptr().cast();
        }
        let (mut max, mut sum) = (vec![0f32; blocks * L], vec![0f32; blocks * L]);
        let mut out = vec![0f32; count * d];
        let scores = grown(&mut s.scores, n * L);
        let terms = grown(&mut s.terms, n.div_ceil(2) * L);
        let sums = grown(&mut s.sums, d * L);
        for b in 0..blocks {
            let queries = &transposed[b * d2 * L..][..d2 * L];
            if count - b * L <= L / 2 {
                let doubled = grown(&mut s.doubled, d2 * L);
                scores_in_pairs(queries, rows, d2, scale, doubled, scores);
            } else {
                scores_of(queries, rows, d2, scale, scores);
            }
            let lanes = b * L..(b + 1) * L;
            softmax_down(scores, n, &mut max[lanes.clone()], &mut sum[lanes]);
            paired_terms(scores, n, terms);
            let (first, rows) = (b * L, L.min(count - b * L));
            let out = &mut out[first * d..][..rows * d];
            // Along the head dimension where its vectors fit the registers (each output the
            // same chain over the key pairs as in lanes); else in lanes, then transposed.
            match d / L {
                _ if !d.is_multiple_of(L) => weighted_in_lanes(terms, values, n, d, sums, out),
                4 => weighted_rows::<4, 4>(terms, values, n, out),
                8 => weighted_rows::<8, 2>(terms, values, n, out),
                16 => weighted_rows::<16, 1>(terms, values, n, out),
                _ => weighted_in_lanes(terms, values, n, d, sums, out),
            }
        }
        SCRATCH.set(scratch);
        max.truncate(count);
        sum.truncate(count);
        Piece { max, sum, out }
    }

    /// The values paired as the weighted sums' lanes read them, `[key pair][dim]`: 16
    /// dimensions of two keys at a time, widened to 32 bits and the second shifted up.
    #[inline(always)]
    unsafe fn paired_values<'a>(
        keys: &DotKeys<impl Fn(usize) -> &'a [bf16], impl Fn(usize) -> &'a [bf16]>,
        d: usize,
        values: &mut [u32],
    ) {
        let n = keys.n;
        for (m, to) in values.chunks_exact_mut(d).enumerate() {
            let even = (keys.value)(2 * m);
            let odd = (2 * m + 1 < n).then(|| (keys.value)(2 * m + 1));
            assert!(even.len() == d && odd.is_none_or(|odd| odd.len() == d));
            let widened = |row: &[bf16], j: usize| {
                _mm512_cvtepu16_epi32(_mm256_loadu_si256(row.as_ptr().add(j).cast()))
            };
            let whole = d / L * L;
            for j in (0..whole).step_by(L) {
                let high = match odd {
                    Some(odd) => _mm512_slli_epi32::<16>(widened(odd, j)),
                    None => _mm512_setzero_si512(),
                };
                let pair = _mm512_or_si512(widened(even, j), high);
                _mm512_storeu_si512(to.as_mut_ptr().add(j).cast(), pair);
            }
            for (j, to) in to.iter_mut().enumerate().skip(whole) {
                *to = value_pair(&keys.value, n, m, j);
            }
        }
    }

    /// [`scores_of`] for a block of at most `L / 2` queries (a decode row's group of query
    /// heads): two keys a vector, query `i` in lanes `2i` (the even key of a pair) and `2i + 1`
    /// (the odd one), so no lane idles; each score the same chain as in [`scores_of`].
    #[inline(always)]
    unsafe fn scores_in_pairs(
        queries: &[u32],
        rows: &[*const u32],
        d2: usize,
        scale: f32,
        doubled: &mut [u32],
        to: &mut [f32],
    ) {
        // Lane `l` reads query `l / 2`; the sums' even lanes go to the low half, odd to the high.
        let twice = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
        let apart = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
        for p in 0..d2 {
            let q = _mm512_loadu_si512(queries.as_ptr().add(p * L).cast());
            let twice = _mm512_permutexvar_epi32(twice, q);
            _mm512_storeu_si512(doubled.as_mut_ptr().add(p * L).cast(), twice);
        }
        let n = rows.len();
        for first in (0..n).step_by(2 * KEYS) {
            let key = |k: usize| -> *const u32 { rows[if k < n { k } else { first }] };
            let tile: [[*const u32; 2]; KEYS] =
                std::array::from_fn(|t| [key(first + 2 * t), key(first + 2 * t + 1)]);
            let mut acc = [_mm512_setzero_ps(); KEYS];
            for p in 0..d2 {
                let q = _mm512_loadu_si512(doubled.as_ptr().add(p * L).cast());
                for t in 0..KEYS {
                    let [even, odd] =
                        tile[t].map(|k| _mm512_set1_epi32(k.add(p).read_unaligned() as i32));
                    acc[t] = dot(acc[t], _mm512_unpacklo_epi32(even, odd), q);
                }
            }
            for (t, acc) in acc.iter().enumerate() {
                let k = first + 2 * t;
                if k >= n {
                    break;
                }
                let scaled = _mm512_mul_ps(*acc, _mm512_set1_ps(scale));
                let halves = _mm512_permutexvar_ps(apart, scaled);
                _mm256_storeu_ps(to.as_mut_ptr().add(k * L), _mm512_castps512_ps256(halves));
                if k + 1 < n {
                    let high = _mm512_extractf32x8_ps::<1>(halves);
                    _mm256_storeu_ps(to.as_mut_ptr().add((k + 1) * L), high);
                }
            }
        }
    }

    /// A block's scaled scores, `[key][lane]`: tiles of `KEYS` keys, each score one chain
    /// over the pairs in a register.
    #[inline(always)]
    unsafe fn scores_of(
        queries: &[u32],
        rows: &[*const u32],
        d2: usize,
        scale: f32,
        to: &mut [f32],
    ) {
        let n = rows.len();
        for first in (0..n).step_by(KEYS) {
            // Past the last key, the first key of the tile again (its scores are dropped).
            let tile: [*const u32; KEYS] =
                std::array::from_fn(|t| rows[if first + t < n { first + t } else { first }]);
            let mut acc = [_mm512_setzero_ps(); KEYS];
            for p in 0..d2 {
                let q = _mm512_loadu_si512(queries.as_ptr().add(p * L).cast());
                for t in 0..KEYS {
                    let k = _mm512_set1_epi32(tile[t].add(p).read_unaligned() as i32);
                    acc[t] = dot(acc[t], k, q);
                }
            }
            for (t, acc) in acc.iter().enumerate().take(n - first) {
                let scaled = _mm512_mul_ps(*acc, _mm512_set1_ps(scale));
                _mm512_storeu_ps(to.as_mut_ptr().add((first + t) * L), scaled);
            }
        }
    }

    /// Down each lane: the largest score, the terms `exp(score - largest)` in place, and
    /// their sum key after key (plain loops over the lanes: the reference's operations).
    #[inline(always)]
    fn softmax_down(scores: &mut [f32], n: usize, max: &mut [f32], sum: &mut [f32]) {
        let mut largest = [f32::NEG_INFINITY; L];
        for key in scores[..n * L].chunks_exact(L) {
            for (m, &s) in largest.iter_mut().zip(key) {
                *m = m.max(s);
            }
        }
        let mut total = [0f32; L];
        for key in scores[..n * L].chunks_exact_mut(L) {
            for ((s, m), t) in key.iter_mut().zip(largest).zip(&mut total) {
                *s = exp_nonpositive(*s - m);
                *t += *s;
            }
        }
        max.copy_from_slice(&largest);
        sum.copy_from_slice(&total);
    }

    /// Each lane's terms rounded to bfloat16 in pairs of keys, `[key pair][lane]` (a zero past
    /// the last key), as `pairs` rounds them.
    #[inline(always)]
    unsafe fn paired_terms(scores: &[f32], n: usize, to: &mut [u32]) {
        let half = |k: usize| -> __m512i {
            if k < n {
                let values = _mm512_loadu_ps(scores.as_ptr().add(k * L));
                _mm512_cvtepu16_epi32(std::mem::transmute::<__m256bh, __m256i>(
                    _mm512_cvtneps_pbh(values),
                ))
            } else {
                _mm512_setzero_si512()
            }
        };
        for m in 0..n.div_ceil(2) {
            let pair = _mm512_or_si512(half(2 * m), _mm512_slli_epi32::<16>(half(2 * m + 1)));
            _mm512_storeu_si512(to.as_mut_ptr().add(m * L).cast(), pair);
        }
    }

    /// A block's weighted sums into its queries' rows `out` (`V` vectors of `L` dimensions
    /// each), `Q` queries at a time: per key pair, each value vector loaded once for the `Q`
    /// queries and each query's pair of terms broadcast.
    #[inline(always)]
    unsafe fn weighted_rows<const V: usize, const Q: usize>(
        terms: &[u32],
        values: &[u32],
        n: usize,
        out: &mut [f32],
    ) {
        let d = V * L;
        let rows = out.len() / d;
        for first in (0..rows).step_by(Q) {
            let width = Q.min(rows - first);
            let mut acc = [[_mm512_setzero_ps(); V]; Q];
            for m in 0..n.div_ceil(2) {
                let pairs = values.as_ptr().add(m * d);
                let v: [__m512i; V] =
                    std::array::from_fn(|j| _mm512_loadu_si512(pairs.add(j * L).cast()));
                for (q, acc) in acc.iter_mut().enumerate().take(width) {
                    let t = _mm512_set1_epi32(terms[m * L + first + q] as i32);
                    for j in 0..V {
                        acc[j] = dot(acc[j], v[j], t);
                    }
                }
            }
            for (q, acc) in acc.iter().enumerate().take(width) {
                for (j, acc) in acc.iter().enumerate() {
                    _mm512_storeu_ps(out.as_mut_ptr().add((first + q) * d + j * L), *acc);
                }
            }
        }
    }

    /// A block's weighted sums in lanes ([`weighted_sums`]), then into its queries' rows.
    #[inline(always)]
    unsafe fn weighted_in_lanes(
        terms: &[u32],
        values: &[u32],
        n: usize,
        d: usize,
        sums: &mut [f32],
        out: &mut [f32],
    ) {
        weighted_sums(terms, values, n, d, sums);
        for (lane, row) in out.chunks_exact_mut(d).enumerate() {
            for (j, o) in row.iter_mut().enumerate() {
                *o = sums[j * L + lane];
            }
        }
    }

    /// A block's weighted sums, `[dim][lane]`: tiles of `DIMS` dimensions, each sum one chain
    /// over the key pairs in a register.
    #[inline(always)]
    unsafe fn weighted_sums(terms: &[u32], values: &[u32], n: usize, d: usize, to: &mut [f32]) {
        for first in (0..d).step_by(DIMS) {
            let width = DIMS.min(d - first);
            let mut acc = [_mm512_setzero_ps(); DIMS];
            for m in 0..n.div_ceil(2) {
                let t = _mm512_loadu_si512(terms.as_ptr().add(m * L).cast());
                let pairs = values.as_ptr().add(m * d + first);
                for (j, acc) in acc.iter_mut().enumerate().take(width) {
                    *acc = dot(*acc, _mm512_set1_epi32(*pairs.add(j) as i32), t);
                }
            }
            for (j, acc) in acc.iter().enumerate().take(width) {
                _mm512_storeu_ps(to.as_mut_ptr().add((first + j) * L), *acc);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attention::{attend, HeadLayout, KvRows};

    fn wave(n: usize, seed: f32, size: f32) -> Vec<f32> {
        (0..n)
            .map(|i| ((i as f32 + seed) * 0.377).sin() * size)
            .collect()
    }

    fn rounded(v: &[f32]) -> Vec<bf16> {
        v.iter().map(|&x| bf16::from_f32(x)).collect()
    }

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    /// Whether the AVX-512 BF16 form runs here (else the test says it skips, or fails where
    /// `GROVE_REQUIRE_AVX512_BF16=1`).
    fn vector_form_runs(test: &str) -> bool {
        let here = crate::strips::Bf16Arithmetic::here() == crate::strips::Bf16Arithmetic::Dot;
        !crate::skip_without("avx512_bf16", here, test)
    }

    /// Pieces of 1-256 keys (a tile's worth and not) against 1-40 queries (part of a block,
    /// several blocks), at two head dimensions: the vector form's bits are the reference's.
    #[test]
    fn the_vector_form_is_the_reference_bit_for_bit() {
        if !vector_form_runs("the_vector_form_is_the_reference_bit_for_bit") {
            return;
        }
        for d in [48, 64, 128] {
            let (keys, values) = (
                rounded(&wave(256 * d, 1.0, 3.0)),
                rounded(&wave(256 * d, 2.0, 1.5)),
            );
            let queries = wave(40 * d, 3.0, 2.0);
            let rows: Vec<&[f32]> = queries.chunks_exact(d).collect();
            for n in [1, 5, 16, 17, 255, 256] {
                let keys = DotKeys {
                    n,
                    key: |i: usize| &keys[i * d..][..d],
                    value: |i: usize| &values[i * d..][..d],
                };
                for count in [1, 6, 16, 17, 40] {
                    let (a, b) = (
                        piece(&rows[..count], d, 0.09, &keys),
                        piece_reference(&rows[..count], d, 0.09, &keys),
                    );
                    let case = format!("d {d}, {n} keys, {count} queries");
                    assert_eq!(bits(&a.max), bits(&b.max), "{case}");
                    assert_eq!(bits(&a.sum), bits(&b.sum), "{case}");
                    assert_eq!(bits(&a.out), bits(&b.out), "{case}");
                }
            }
        }
    }

    /// A query's piece alone equals the same query's part of a piece of many: its bits do
    /// not depend on its company (a decode step's and a verify's rows agree).
    #[test]
    fn a_query_gets_the_same_bits_in_any_company() {
        let d = 128;
        let (keys, values) = (
            rounded(&wave(100 * d, 4.0, 3.0)),
            rounded(&wave(100 * d, 5.0, 1.0)),
        );
        let queries = wave(35 * d, 6.0, 2.0);
        let rows: Vec<&[f32]> = queries.chunks_exact(d).collect();
        let keys = DotKeys {
            n: 100,
            key: |i: usize| &keys[i * d..][..d],
            value: |i: usize| &values[i * d..][..d],
        };
        let all = piece(&rows, d, 0.1, &keys);
        for q in [0, 7, 16, 34] {
            let alone = piece(&rows[q..=q], d, 0.1, &keys);
            assert_eq!(alone.max[0].to_bits(), all.max[q].to_bits());
            assert_eq!(alone.sum[0].to_bits(), all.sum[q].to_bits());
            assert_eq!(bits(&alone.out), bits(&all.out[q * d..][..d]), "query {q}");
        }
    }

    /// `attend` over bfloat16 rows: a decode row alone gets the bits it gets among a tree's
    /// rows over the same 700 context slots, and both are near softmax attention in f64 over
    /// the same (bfloat16) values.
    #[test]
    fn bf16_rows_attend_alike_alone_and_in_a_tree() {
        let layout = HeadLayout {
            num_heads: 6,
            num_kv_heads: 2,
            head_dim: 64,
        };
        let (kv_width, width, context) = (128, 384, 700);
        let slots = context + 16;
        let (keys, values) = (
            rounded(&wave(slots * kv_width, 7.0, 2.0)),
            rounded(&wave(slots * kv_width, 8.0, 1.0)),
        );
        let queries = wave(16 * width, 9.0, 1.5);
        // Tree rows: the context, then a path of their own (a chain: row r sees r + 1 of them).
        let key_slots: Vec<Vec<usize>> = (0..16).map(|r| (0..=context + r).collect()).collect();
        let (kv, vv) = (KvRows::Bf16(&keys), KvRows::Bf16(&values));
        let tree = attend(&key_slots, layout, 0.125, &queries, kv, vv);
        for r in [0, 5, 15] {
            let alone = attend(
                &key_slots[r..=r],
                layout,
                0.125,
                &queries[r * width..][..width],
                kv,
                vv,
            );
            assert_eq!(bits(&alone), bits(&tree[r * width..][..width]), "row {r}");
            // Against the formula in f64 over the stored values.
            for head in 0..6 {
                let (kv_head, q) = (head / 3, &queries[r * width + head * 64..][..64]);
                let row = |rows: &[bf16], s: usize| -> Vec<f64> {
                    rows[(kv_head * slots + s) * 64..][..64]
                        .iter()
                        .map(|x| f64::from(x.to_f32()))
                        .collect()
                };
                let scores: Vec<f64> = key_slots[r]
                    .iter()
                    .map(|&s| {
                        row(&keys, s)
                            .iter()
                            .zip(q)
                            .map(|(k, &x)| k * f64::from(x))
                            .sum::<f64>()
                            * 0.125
                    })
                    .collect();
                let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let total: f64 = scores.iter().map(|s| (s - max).exp()).sum();
                for j in 0..64 {
                    let exact: f64 = key_slots[r]
                        .iter()
                        .zip(&scores)
                        .map(|(&s, score)| (score - max).exp() / total * row(&values, s)[j])
                        .sum();
                    let ours = f64::from(tree[r * width + head * 64 + j]);
                    assert!(
                        (ours - exact).abs() < 2e-2,
                        "row {r} head {head} dim {j}: {ours} vs {exact}"
                    );
                }
            }
        }
    }
}
