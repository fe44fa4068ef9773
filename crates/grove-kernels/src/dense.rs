//! The dot products attention's scores use ([`dot`], [`scaled_dots_many`]), and a streaming
//! matmul on row-major weights, `y = x W^T` with `x: [rows, k]`, `W: [n, k]`: each weight row
//! read once and dotted with every input row while it sits in L1, one pass over the weights for
//! up to [`MAX_STREAMING_ROWS`] rows (candle's f32 gemm packs the whole weight matrix on every
//! call, which at one row reads and writes it twice). Models multiply by weights in column
//! strips instead (`strips.rs`: no horizontal sum per row pair, any row count); the streaming
//! product stays as the benchmark's baseline for them.

use rayon::prelude::*;

/// Above this many rows candle's blocked gemm wins (measured on the development machine: equal
/// at 16 rows on a Qwen3-0.6B-shaped model, streaming ahead below).
pub const MAX_STREAMING_ROWS: usize = 8;

/// Weight rows per parallel task: enough work to amortize scheduling, small enough to balance.
const ROWS_PER_TASK: usize = 64;

/// Below this many multiply-adds a product runs on the calling thread: handing it to the pool
/// would cost more (a wake-up and a context switch) than it saves.
const PARALLEL_MIN_WORK: usize = 1 << 20;

/// `x W^T` as `[rows, n]`.
pub fn matmul_transposed(x: &[f32], rows: usize, weight: &[f32], n: usize, k: usize) -> Vec<f32> {
    debug_assert_eq!(x.len(), rows * k);
    debug_assert_eq!(weight.len(), n * k);
    // Computed weight-row major ([n, rows]) so each task writes one contiguous block.
    let mut transposed = vec![0f32; n * rows];
    let task = |(outputs, weights): (&mut [f32], &[f32])| {
        for (out, w) in outputs.chunks_exact_mut(rows).zip(weights.chunks_exact(k)) {
            for (value, input) in out.iter_mut().zip(x.chunks_exact(k)) {
                *value = dot(input, w);
            }
        }
    };
    if n * k * rows >= PARALLEL_MIN_WORK {
        transposed
            .par_chunks_mut(ROWS_PER_TASK * rows)
            .zip(weight.par_chunks(ROWS_PER_TASK * k))
            .for_each(task);
    } else {
        transposed
            .chunks_mut(ROWS_PER_TASK * rows)
            .zip(weight.chunks(ROWS_PER_TASK * k))
            .for_each(task);
    }
    let mut output = vec![0f32; rows * n];
    for (j, column) in transposed.chunks_exact(rows).enumerate() {
        for (i, &value) in column.iter().enumerate() {
            output[i * n + j] = value;
        }
    }
    output
}

/// Dot product; uses AVX2 + FMA when the CPU has them.
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if crate::cpu::allows(crate::cpu::Level::Avx2) {
        // SAFETY: the level includes the features `dot_fma` is compiled for (AVX2, FMA), which
        // `Level::supported` found on this CPU.
        #[allow(unsafe_code)]
        return unsafe { dot_fma(a, b) };
    }
    dot_portable(a, b)
}

const LANES: usize = 16;

/// `out[q * n + i] = dot(queries[q], key(i)) * scale` for each query `q` and `i < n`, with
/// `out` `[queries, n]`: attention's scores, bit for bit as [`dot`] computes each. On AVX-512
/// CPUs sixteen keys at a time: their lane sums are transposed so that one vector add per lane
/// does sixteen keys' sequential sums at once, where a `dot` per key waits on its sixteen
/// dependent adds (and makes a call and a feature check): 160 keys of 64 values in L2 here,
/// 8.3 -> 5.2 ns a key. Each block of sixteen keys goes through every query while it is in L1:
/// the query heads that share a KV head read its keys once, where one head at a time read them
/// from L2 or further for each.
pub fn scaled_dots_many<'a>(
    queries: &[&[f32]],
    key: impl Fn(usize) -> &'a [f32],
    scale: f32,
    out: &mut [f32],
) {
    let Some(width) = queries.first().map(|q| q.len()) else {
        return;
    };
    assert!(
        queries.iter().all(|q| q.len() == width),
        "queries differ in length"
    );
    assert!(
        out.len().is_multiple_of(queries.len()),
        "scores are not [queries, n]"
    );
    let n = out.len() / queries.len();
    #[cfg(target_arch = "x86_64")]
    if width.is_multiple_of(LANES) && crate::cpu::allows(crate::cpu::Level::Avx512) {
        // SAFETY: the level includes the features `scaled_dots_avx512` is compiled for (with
        // FMA, which `dot` uses at this level, so the bits are the same), found on this CPU.
        #[allow(unsafe_code)]
        return unsafe { scaled_dots_avx512(queries, &key, scale, out, n) };
    }
    #[cfg(target_arch = "x86_64")]
    if width.is_multiple_of(LANES) && crate::cpu::allows(crate::cpu::Level::Avx2) {
        // SAFETY: the level includes AVX2 and FMA (which `dot` uses at this level, so the
        // bits are the same), found on this CPU.
        #[allow(unsafe_code)]
        return unsafe { scaled_dots_avx2(queries, &key, scale, out, n) };
    }
    for (query, out) in queries.iter().zip(out.chunks_exact_mut(n.max(1))) {
        for (i, out) in out.iter_mut().enumerate() {
            *out = dot(query, key(i)) * scale;
        }
    }
}

/// [`scaled_dots_many`] for queries of whole 16-lane chunks. For each key the same fused
/// multiply-adds per lane as [`dot_lanes`], then `((empty + lane 0) + lane 1) + ... + lane 15`
/// and the empty tail added, as `dot` sums them.
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
#[target_feature(enable = "avx512f,fma")]
unsafe fn scaled_dots_avx512<'a>(
    queries: &[&[f32]],
    key: &impl Fn(usize) -> &'a [f32],
    scale: f32,
    out: &mut [f32],
    n: usize,
) {
    use std::arch::x86_64::*;
    let width = queries[0].len();
    let chunks = width / LANES;
    // What `dot` starts its lane sum from and adds for its (here empty) tail.
    let empty = _mm512_set1_ps([0f32; 0].iter().sum::<f32>());
    let scales = _mm512_set1_ps(scale);
    let mut block = 0;
    while block + LANES <= n {
        let keys: [*const f32; LANES] = block_keys(key, block, width);
        for (q, query) in queries.iter().enumerate() {
            // Chunk by chunk across the sixteen keys: sixteen independent chains of
            // multiply-adds (one key at a time waited on its own chain's latency).
            let mut sums = [_mm512_setzero_ps(); LANES];
            for c in 0..chunks {
                // SAFETY: `c * LANES + LANES <= width` for the query and every key.
                let q = unsafe { _mm512_loadu_ps(query.as_ptr().add(c * LANES)) };
                for (sum, key) in sums.iter_mut().zip(keys) {
                    let k = unsafe { _mm512_loadu_ps(key.add(c * LANES)) };
                    *sum = _mm512_fmadd_ps(q, k, *sum);
                }
            }
            let lanes = transpose16(sums);
            let mut total = empty;
            for lane in lanes {
                total = _mm512_add_ps(total, lane);
            }
            total = _mm512_mul_ps(_mm512_add_ps(total, empty), scales);
            let row = &mut out[q * n..(q + 1) * n];
            assert!(block + LANES <= row.len());
            // SAFETY: `block + LANES <= n`, the row's length (checked).
            unsafe { _mm512_storeu_ps(row.as_mut_ptr().add(block), total) };
        }
        block += LANES;
    }
    dots_from(queries, key, scale, out, n, block);
}

/// The addresses of keys `block..block + N`, each checked to be `width` long.
fn block_keys<'a, const N: usize>(
    key: &impl Fn(usize) -> &'a [f32],
    block: usize,
    width: usize,
) -> [*const f32; N] {
    std::array::from_fn(|k| {
        let key = key(block + k);
        assert_eq!(key.len(), width, "key and query differ in length");
        key.as_ptr()
    })
}

/// The keys past the vector blocks (`first..n`), a [`dot`] each.
fn dots_from<'a>(
    queries: &[&[f32]],
    key: &impl Fn(usize) -> &'a [f32],
    scale: f32,
    out: &mut [f32],
    n: usize,
    first: usize,
) {
    for (query, row) in queries.iter().zip(out.chunks_exact_mut(n.max(1))) {
        for (i, out) in row.iter_mut().enumerate().skip(first) {
            *out = dot(query, key(i)) * scale;
        }
    }
}

/// Keys per block of [`scaled_dots_avx2`]: one 8-wide vector of scores.
const AVX2_KEYS: usize = 8;

/// [`scaled_dots_many`] on AVX2 for queries of whole 16-lane chunks, eight keys at a time: for
/// each key the same fused multiply-adds per lane as [`dot_fma`] (its sixteen lanes in two
/// vectors), then the eight keys' lane vectors transposed so that `dot`'s sequential sum
/// `((empty + lane 0) + lane 1) + ... + lane 15`, its empty tail added, runs for all eight in
/// vector adds (a `dot` per key summed its lanes one scalar add after another: a long
/// prompt's attention spent most of its time there).
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
#[target_feature(enable = "avx2,fma")]
unsafe fn scaled_dots_avx2<'a>(
    queries: &[&[f32]],
    key: &impl Fn(usize) -> &'a [f32],
    scale: f32,
    out: &mut [f32],
    n: usize,
) {
    use std::arch::x86_64::*;
    let width = queries[0].len();
    let chunks = width / LANES;
    let empty = _mm256_set1_ps([0f32; 0].iter().sum::<f32>());
    let scales = _mm256_set1_ps(scale);
    let mut block = 0;
    while block + AVX2_KEYS <= n {
        let keys: [*const f32; AVX2_KEYS] = block_keys(key, block, width);
        for (q, query) in queries.iter().enumerate() {
            let mut low = [_mm256_setzero_ps(); AVX2_KEYS];
            let mut high = [_mm256_setzero_ps(); AVX2_KEYS];
            // Four keys at a time, chunk by chunk: each query chunk is loaded once for four
            // keys, and the eight sums stay in registers.
            for group in (0..AVX2_KEYS).step_by(4) {
                for c in 0..chunks {
                    // SAFETY: `c * LANES + LANES <= width` for the query and every key.
                    let (q_low, q_high) = unsafe {
                        (
                            _mm256_loadu_ps(query.as_ptr().add(c * LANES)),
                            _mm256_loadu_ps(query.as_ptr().add(c * LANES + 8)),
                        )
                    };
                    for k in group..group + 4 {
                        // SAFETY: as above.
                        let (k_low, k_high) = unsafe {
                            (
                                _mm256_loadu_ps(keys[k].add(c * LANES)),
                                _mm256_loadu_ps(keys[k].add(c * LANES + 8)),
                            )
                        };
                        low[k] = _mm256_fmadd_ps(q_low, k_low, low[k]);
                        high[k] = _mm256_fmadd_ps(q_high, k_high, high[k]);
                    }
                }
            }
            let mut total = empty;
            for lane in transpose8(low).into_iter().chain(transpose8(high)) {
                total = _mm256_add_ps(total, lane);
            }
            total = _mm256_mul_ps(_mm256_add_ps(total, empty), scales);
            let row = &mut out[q * n..(q + 1) * n];
            assert!(block + AVX2_KEYS <= row.len());
            // SAFETY: `block + AVX2_KEYS <= n`, the row's length (checked).
            unsafe { _mm256_storeu_ps(row.as_mut_ptr().add(block), total) };
        }
        block += AVX2_KEYS;
    }
    dots_from(queries, key, scale, out, n, block);
}

/// An 8 x 8 transpose: lane `k` of output `l` is lane `l` of row `k` (pairs of lanes, then
/// pairs of pairs, then the 128-bit halves).
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
#[target_feature(enable = "avx2")]
fn transpose8(rows: [std::arch::x86_64::__m256; 8]) -> [std::arch::x86_64::__m256; 8] {
    use std::arch::x86_64::*;
    let pairs: [__m256; 8] = std::array::from_fn(|i| {
        let (a, b) = (rows[i & !1], rows[i | 1]);
        if i % 2 == 0 {
            _mm256_unpacklo_ps(a, b)
        } else {
            _mm256_unpackhi_ps(a, b)
        }
    });
    // Entry `4 h + m`, 128-bit half `j`: lane `4 j + m` of rows `4 h .. 4 h + 4`.
    let quads: [__m256; 8] = std::array::from_fn(|index| {
        let (h, m) = (index / 4, index % 4);
        let (a, b) = (pairs[4 * h + m / 2], pairs[4 * h + 2 + m / 2]);
        if m % 2 == 0 {
            _mm256_shuffle_ps::<0x44>(a, b)
        } else {
            _mm256_shuffle_ps::<0xEE>(a, b)
        }
    });
    std::array::from_fn(|l| {
        let (low, high) = (quads[l % 4], quads[4 + l % 4]);
        if l < 4 {
            _mm256_permute2f128_ps::<0x20>(low, high)
        } else {
            _mm256_permute2f128_ps::<0x31>(low, high)
        }
    })
}

/// `rows` transposed: lane `k` of output `l` is lane `l` of row `k`. Pairs of 32-bit lanes,
/// then 64-bit pairs (each 128-bit lane now holds a 4 x 4 block transposed), then the 128-bit
/// lanes of four vectors at a time.
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
#[target_feature(enable = "avx512f")]
fn transpose16(rows: [std::arch::x86_64::__m512; LANES]) -> [std::arch::x86_64::__m512; LANES] {
    use std::arch::x86_64::*;
    let pairs: [__m512; LANES] = std::array::from_fn(|i| {
        let (a, b) = (rows[i & !1], rows[i | 1]);
        if i % 2 == 0 {
            _mm512_unpacklo_ps(a, b)
        } else {
            _mm512_unpackhi_ps(a, b)
        }
    });
    // Entry `4 i + m`, 128-bit lane `j`: lane `4 j + m` of rows `4 i .. 4 i + 4`.
    let quads: [__m512; LANES] = std::array::from_fn(|index| {
        let (i, m) = (index / 4, index % 4);
        let (a, b) = (
            _mm512_castps_pd(pairs[4 * i + m / 2]),
            _mm512_castps_pd(pairs[4 * i + 2 + m / 2]),
        );
        _mm512_castpd_ps(if m % 2 == 0 {
            _mm512_unpacklo_pd(a, b)
        } else {
            _mm512_unpackhi_pd(a, b)
        })
    });
    let mut out = [_mm512_setzero_ps(); LANES];
    for m in 0..4 {
        let low_01 = _mm512_shuffle_f32x4::<0x44>(quads[m], quads[4 + m]);
        let high_01 = _mm512_shuffle_f32x4::<0xEE>(quads[m], quads[4 + m]);
        let low_23 = _mm512_shuffle_f32x4::<0x44>(quads[8 + m], quads[12 + m]);
        let high_23 = _mm512_shuffle_f32x4::<0xEE>(quads[8 + m], quads[12 + m]);
        out[m] = _mm512_shuffle_f32x4::<0x88>(low_01, low_23);
        out[4 + m] = _mm512_shuffle_f32x4::<0xDD>(low_01, low_23);
        out[8 + m] = _mm512_shuffle_f32x4::<0x88>(high_01, high_23);
        out[12 + m] = _mm512_shuffle_f32x4::<0xDD>(high_01, high_23);
    }
    out
}

fn dot_portable(a: &[f32], b: &[f32]) -> f32 {
    dot_lanes(a, b, |x, y, acc| acc + x * y)
}

/// The same loop compiled for AVX2 with fused multiply-adds (two 8-wide accumulators).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn dot_fma(a: &[f32], b: &[f32]) -> f32 {
    dot_lanes(a, b, |x, y, acc| x.mul_add(y, acc))
}

/// `LANES` independent accumulators over fixed-size chunks (no bounds checks, so the loop
/// vectorizes); inlined so that each caller compiles it with its own target features.
#[inline(always)]
fn dot_lanes(a: &[f32], b: &[f32], step: impl Fn(f32, f32, f32) -> f32) -> f32 {
    let mut acc = [0f32; LANES];
    let (chunks_a, chunks_b) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    let tail: f32 = chunks_a
        .remainder()
        .iter()
        .zip(chunks_b.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in chunks_a.zip(chunks_b) {
        let (x, y): (&[f32; LANES], &[f32; LANES]) =
            (x.try_into().expect("lanes"), y.try_into().expect("lanes"));
        for l in 0..LANES {
            acc[l] = step(x[l], y[l], acc[l]);
        }
    }
    acc.iter().sum::<f32>() + tail
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Tensor};

    #[test]
    fn streaming_matmul_equals_candle_for_every_small_row_count() {
        let (n, k) = (37, 133); // ragged against lanes and task size
        let weight = Tensor::randn(0f32, 1.0, (n, k), &Device::Cpu).unwrap();
        for rows in [1, 2, 3, 8, MAX_STREAMING_ROWS] {
            let x = Tensor::randn(0f32, 1.0, (rows, k), &Device::Cpu).unwrap();
            let expected: Vec<f32> = x
                .matmul(&weight.t().unwrap())
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1()
                .unwrap();
            let ours = matmul_transposed(
                &x.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
                rows,
                &weight.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
                n,
                k,
            );
            for (a, b) in ours.iter().zip(&expected) {
                assert!(
                    (a - b).abs() < 1e-4 * (1.0 + b.abs()),
                    "rows {rows}: {a} vs {b}"
                );
            }
        }
    }

    #[test]
    fn scaled_dots_equal_dot_bit_for_bit() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
        // Head sizes of whole chunks (the 16-key path) and one that is not (the per-key one);
        // key counts below, at and past a block of 16.
        for d in [16, 64, 128, 256, 72] {
            for n in [0, 1, 15, 16, 17, 40, 300] {
                let keys: Vec<f32> = (0..n * d).map(|_| rng.random_range(-2.0..2.0)).collect();
                let key = |i: usize| &keys[i * d..(i + 1) * d];
                // One query, and several against the same keys.
                for count in [1, 5] {
                    let queries: Vec<Vec<f32>> = (0..count)
                        .map(|_| (0..d).map(|_| rng.random_range(-2.0..2.0)).collect())
                        .collect();
                    let queries: Vec<&[f32]> = queries.iter().map(Vec::as_slice).collect();
                    let mut ours = vec![f32::NAN; queries.len() * n];
                    scaled_dots_many(&queries, key, 0.125, &mut ours);
                    // The AVX2 blocks as well, on CPUs where AVX-512 runs the call above.
                    #[cfg(target_arch = "x86_64")]
                    if d % LANES == 0 && crate::cpu::Level::supported() >= crate::cpu::Level::Avx2 {
                        let mut avx2 = vec![f32::NAN; queries.len() * n];
                        // SAFETY: the CPU has AVX2 and FMA.
                        #[allow(unsafe_code)]
                        unsafe {
                            scaled_dots_avx2(&queries, &key, 0.125, &mut avx2, n)
                        };
                        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                        assert_eq!(bits(&avx2), bits(&ours), "avx2, d {d}, n {n}");
                    }
                    for (q, query) in queries.iter().enumerate() {
                        for i in 0..n {
                            let expected = dot(query, key(i)) * 0.125;
                            let value = ours[q * n + i];
                            assert_eq!(
                                value.to_bits(),
                                expected.to_bits(),
                                "d {d}, n {n}, {q} {i}"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn portable_and_fma_dots_agree() {
        let a: Vec<f32> = (0..101).map(|i| (i as f32 * 0.37).sin()).collect();
        let b: Vec<f32> = (0..101).map(|i| (i as f32 * 0.11).cos()).collect();
        let exact: f64 = a
            .iter()
            .zip(&b)
            .map(|(x, y)| f64::from(*x) * f64::from(*y))
            .sum();
        assert!((f64::from(dot_portable(&a, &b)) - exact).abs() < 1e-4);
        assert!((f64::from(dot(&a, &b)) - exact).abs() < 1e-4);
    }
}
