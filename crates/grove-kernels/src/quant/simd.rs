//! What the SIMD kernels share: the activations' quantizer, the weights' prefetches and the
//! memory test decode speed is compared with, each in AVX-512 and AVX2. The products
//! themselves are in `simd_columns.rs` (AVX-512 VNNI) and `avx2_columns.rs`.
// SAFETY (all of the module): every function is compiled for the features of the kernel it
// serves (AVX-512 F/BW/DQ/VNNI + F16C, or AVX2 + FMA + F16C; the prefetches for plain x86-64)
// and reached only for a kernel this CPU runs (`Kernel::runs_here`, checked by the products
// before they quantize); every load reads inside slices whose lengths the callers checked.
#![allow(unsafe_code)]

use std::arch::x86_64::*;

use super::rows::Parts;
use super::Kernel;

/// How far ahead of the chunk being multiplied its weights are requested (`prefetch`). The
/// hardware prefetcher alone left one row of decoding at 7.4 GB/s per core on a 151936 x 896
/// Q8_0 head (the memory test reads 9-10); asking 3 KiB ahead brought both threads to 21 GB/s.
/// Measured here with 512 B to 8 KiB: 2-4 KiB best for every format.
pub(super) const PREFETCH: usize = 3072;
/// How far ahead the weights are requested into L2 only (a second `prefetch`, `prefetcht1`).
/// A core's stream is bound by the misses it has in flight; requests into L2 add to those of
/// the L1 requests above. A plain two-thread read of 1 GiB here: 14-24 GB/s with the L1
/// requests alone, 24-29 with these 16 KiB ahead as well (8-32 KiB alike); a 300000 x 896
/// Q5_0 product from memory on two threads: 8.9-9.7 -> 6.3-6.8 ms.
pub(super) const PREFETCH_L2: usize = 16384;
/// How far ahead a product of few rows asks for its weights where it asks into L1 only
/// ([`L1_ONLY_ROWS`]). On the Zen 5 the `decode_stream` example's one-row products read 61.2
/// GB/s (median) at 3 KiB and 66.8 at 6 KiB where the memory gave over 70, 47.5 and 46.5
/// where it gave about 50 (docs/benchmarks.md, session 63).
pub(super) const PREFETCH_FEW_ROWS: usize = 6144;
/// The most activation rows whose products ask for their weights into L1 only where
/// `cpu::few_rows_request_l1_only`: a decode step's and a small tree's. Tiles of 5 rows and
/// more, which spend longer on each weight, were slower without the requests into L2 (the
/// `decode_stream` example at 5 and 6 rows, the 1.5B's 8-row verify; session 63).
pub(super) const L1_ONLY_ROWS: usize = 4;

/// The quantizer of `rows.rs` in AVX-512 or AVX2 (on the parts of some whole rows): per block
/// the absolute maximum, then the values scaled, rounded to nearest-even (`vcvtps2dq` under
/// the default rounding mode, as the portable version's magic-number rounding), clamped to i8
/// and summed per 16 (AVX-512: 64 values at a time, `quantize_64`).
pub(super) fn quantize(kernel: Kernel, x: &[f32], parts: Parts<'_>) {
    let n = x.len();
    assert!(parts.block.is_multiple_of(32) && n.is_multiple_of(parts.block));
    assert!(parts.q.len() == n && parts.scale.len() == n / parts.block);
    assert!(parts.sum16.len() == n / 16 && parts.sum32.len() == n / 32);
    // SAFETY: the rows were made for a kernel this CPU runs (`QuantizedRows::for_kernel`'s
    // callers check); every load and store is inside the slices, whose lengths are asserted
    // above.
    unsafe {
        match kernel {
            Kernel::Avx512Vnni | Kernel::Amx => quantize_avx512(x, parts),
            _ => quantize_avx2(x, parts),
        }
    }
}

/// [`quantize`] in AVX2, 8 values at a time: the same operations, so the same bits.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn quantize_avx2(x: &[f32], parts: Parts<'_>) {
    let (block, q, scale, sum16, sum32) = parts.split();
    let (low, high) = (_mm256_set1_epi32(-128), _mm256_set1_epi32(127));
    let sign = _mm256_set1_ps(-0.0);
    for (b, d_out) in scale.iter_mut().enumerate() {
        let start = b * block;
        let values = x.as_ptr().add(start);
        let mut amax = _mm256_setzero_ps();
        for i in (0..block).step_by(8) {
            amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, _mm256_loadu_ps(values.add(i))));
        }
        let mut lanes = [0f32; 8];
        _mm256_storeu_ps(lanes.as_mut_ptr(), amax);
        let d = lanes.iter().fold(0f32, |m, &v| m.max(v)) / 127.0;
        let inverse = _mm256_set1_ps(if d > 0.0 { 1.0 / d } else { 0.0 });
        for i in (0..block).step_by(16) {
            let [a, b] = [0, 8].map(|h| {
                let scaled = _mm256_mul_ps(_mm256_loadu_ps(values.add(i + h)), inverse);
                _mm256_min_epi32(_mm256_max_epi32(_mm256_cvtps_epi32(scaled), low), high)
            });
            // 16 i32 to 16 i8 (the packs work per 128-bit lane: the permute puts them in order).
            let words = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_packs_epi32(a, b));
            let bytes = _mm_packs_epi16(
                _mm256_castsi256_si128(words),
                _mm256_extracti128_si256::<1>(words),
            );
            _mm_storeu_si128(q.as_mut_ptr().add(start + i).cast(), bytes);
            let total = _mm256_add_epi32(a, b);
            let mut sums = [0i32; 8];
            _mm256_storeu_si256(sums.as_mut_ptr().cast(), total);
            *sum16.get_unchecked_mut((start + i) / 16) = sums.iter().sum();
        }
        *d_out = d;
    }
    for (sum, pair) in sum32.iter_mut().zip(sum16.chunks_exact(2)) {
        *sum = pair[0] + pair[1];
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,f16c,bmi2")]
unsafe fn quantize_avx512(x: &[f32], parts: Parts<'_>) {
    let (block, q, scale, sum16, sum32) = parts.split();
    let mut b = 0;
    while b < scale.len() {
        let start = b * block;
        let values = x.as_ptr().add(start);
        let (q, sums) = (
            q.as_mut_ptr().add(start),
            sum16.as_mut_ptr().add(start / 16),
        );
        if block == 32 && b + 1 < scale.len() {
            // Two blocks of 32 make the 64 values of one group.
            let (first, second) = (block_scale(values, 32), block_scale(values.add(32), 32));
            let (i, j) = (inverse_of(first), inverse_of(second));
            quantize_64(values, [i, i, j, j], q, sums);
            (scale[b], scale[b + 1]) = (first, second);
            b += 2;
            continue;
        }
        let d = block_scale(values, block);
        let i = inverse_of(d);
        if block.is_multiple_of(64) {
            for g in (0..block).step_by(64) {
                quantize_64(values.add(g), [i; 4], q.add(g), sums.add(g / 16));
            }
        } else {
            for v in (0..block).step_by(16) {
                let rounded = rounded(values.add(v), i);
                _mm_storeu_si128(q.add(v).cast(), _mm512_cvtepi32_epi8(rounded));
                *sums.add(v / 16) = _mm512_reduce_add_epi32(rounded);
            }
        }
        scale[b] = d;
        b += 1;
    }
    for (sum, pair) in sum32.iter_mut().zip(sum16.chunks_exact(2)) {
        *sum = pair[0] + pair[1];
    }
}

/// `1 / d` in every lane (0 for a block of zeros).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,f16c,bmi2")]
unsafe fn inverse_of(d: f32) -> __m512 {
    _mm512_set1_ps(if d > 0.0 { 1.0 / d } else { 0.0 })
}

/// The scale of the `block` values at `values`: their absolute maximum over 127.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,f16c,bmi2")]
unsafe fn block_scale(values: *const f32, block: usize) -> f32 {
    let mut amax = _mm512_setzero_ps();
    for i in (0..block).step_by(16) {
        amax = max_ps(amax, _mm512_abs_ps(_mm512_loadu_ps(values.add(i))));
    }
    _mm512_reduce_max_ps(amax) / 127.0
}

/// 16 values times `inverse`, rounded to nearest-even and clamped to i8.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,f16c,bmi2")]
unsafe fn rounded(values: *const f32, inverse: __m512) -> __m512i {
    let (low, high) = (_mm512_set1_epi32(-128), _mm512_set1_epi32(127));
    let scaled = _mm512_mul_ps(_mm512_loadu_ps(values), inverse);
    _mm512_min_epi32(_mm512_max_epi32(cvtps_epi32(scaled), low), high)
}

/// 64 values quantized (each 16 by its `inverse`) into `q`, and their four sums of 16 into
/// `sums`: the bytes stored in one vector, and summed by one `vpdpbusd` against ones and two
/// adds within each 128-bit lane, where a horizontal sum per 16 values was most of the
/// quantizer's work.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,f16c,bmi2")]
unsafe fn quantize_64(values: *const f32, inverse: [__m512; 4], q: *mut i8, sums: *mut i32) {
    // No closure: it would be compiled without this function's features.
    let mut bytes = [_mm_setzero_si128(); 4];
    for v in 0..4 {
        bytes[v] = _mm512_cvtepi32_epi8(rounded(values.add(16 * v), inverse[v]));
    }
    let low = _mm256_inserti128_si256::<1>(_mm256_castsi128_si256(bytes[0]), bytes[1]);
    let high = _mm256_inserti128_si256::<1>(_mm256_castsi128_si256(bytes[2]), bytes[3]);
    let all = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(low), high);
    _mm512_storeu_si512(q.cast(), all);
    _mm_storeu_si128(sums.cast(), sums_of_sixteen(all));
}

/// The sums of each 16 of 64 signed bytes.
#[cfg(not(miri))]
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,f16c,bmi2")]
unsafe fn sums_of_sixteen(bytes: __m512i) -> __m128i {
    let fours = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8(1), bytes);
    let eights = _mm512_add_epi32(fours, _mm512_shuffle_epi32::<0b01_00_11_10>(fours));
    let sixteens = _mm512_add_epi32(eights, _mm512_shuffle_epi32::<0b10_11_00_01>(eights));
    _mm512_castsi512_si128(_mm512_maskz_compress_epi32(0x1111, sixteens))
}

/// [`sums_of_sixteen`] where Miri runs the kernels, which has no `vpdpbusd` or
/// `vpcompressd`: the same sums, one byte at a time.
#[cfg(miri)]
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,f16c,bmi2")]
unsafe fn sums_of_sixteen(bytes: __m512i) -> __m128i {
    let mut values = [0i8; 64];
    _mm512_storeu_si512(values.as_mut_ptr().cast(), bytes);
    let sums: [i32; 4] =
        std::array::from_fn(|s| values[16 * s..][..16].iter().map(|&v| i32::from(v)).sum());
    _mm_loadu_si128(sums.as_ptr().cast())
}

/// `vmaxps` on 512 bits.
#[cfg(not(miri))]
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,f16c,bmi2")]
unsafe fn max_ps(a: __m512, b: __m512) -> __m512 {
    _mm512_max_ps(a, b)
}

/// `vcvtps2dq` on 512 bits (under the default rounding, to nearest even).
#[cfg(not(miri))]
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,f16c,bmi2")]
unsafe fn cvtps_epi32(a: __m512) -> __m512i {
    _mm512_cvtps_epi32(a)
}

/// [`max_ps`] where Miri runs the kernels (`scripts/miri_avx512.sh`), which has no 512-bit
/// `vmaxps`: the same instruction on each 256-bit half.
#[cfg(miri)]
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,f16c,bmi2")]
unsafe fn max_ps(a: __m512, b: __m512) -> __m512 {
    let (mut x, mut y) = ([0f32; 16], [0f32; 16]);
    _mm512_storeu_ps(x.as_mut_ptr(), a);
    _mm512_storeu_ps(y.as_mut_ptr(), b);
    for h in [0, 8] {
        let most = _mm256_max_ps(
            _mm256_loadu_ps(x.as_ptr().add(h)),
            _mm256_loadu_ps(y.as_ptr().add(h)),
        );
        _mm256_storeu_ps(x.as_mut_ptr().add(h), most);
    }
    _mm512_loadu_ps(x.as_ptr())
}

/// [`cvtps_epi32`] where Miri runs the kernels: the same instruction on each 256-bit half.
#[cfg(miri)]
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,f16c,bmi2")]
unsafe fn cvtps_epi32(a: __m512) -> __m512i {
    let (mut x, mut y) = ([0f32; 16], [0i32; 16]);
    _mm512_storeu_ps(x.as_mut_ptr(), a);
    for h in [0, 8] {
        let ints = _mm256_cvtps_epi32(_mm256_loadu_ps(x.as_ptr().add(h)));
        _mm256_storeu_si256(y.as_mut_ptr().add(h).cast(), ints);
    }
    _mm512_loadu_si512(y.as_ptr().cast())
}

/// The wrapping sum of `words`, read as the kernels read weights (64-byte loads, requested
/// [`PREFETCH`] bytes ahead): the memory test that decode speed is compared with.
pub(super) fn streaming_sum(kernel: Kernel, words: &[u64]) -> u64 {
    assert!(kernel.runs_here(), "{kernel:?} on a CPU without it");
    // SAFETY: the CPU has the kernel's features (asserted); loads stay inside `words`.
    unsafe {
        match kernel {
            Kernel::Avx512Vnni | Kernel::Amx => streaming_sum_avx512(words),
            _ => streaming_sum_avx2(words),
        }
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn streaming_sum_avx2(words: &[u64]) -> u64 {
    let lines = words.chunks_exact(8);
    let tail: u64 = lines.remainder().iter().fold(0, |a, &b| a.wrapping_add(b));
    let mut acc = _mm256_setzero_si256();
    for line in lines {
        prefetch(line.as_ptr().cast());
        let p = line.as_ptr().cast::<__m256i>();
        let pair = _mm256_add_epi64(_mm256_loadu_si256(p), _mm256_loadu_si256(p.add(1)));
        acc = _mm256_add_epi64(acc, pair);
    }
    let mut lanes = [0u64; 4];
    _mm256_storeu_si256(lanes.as_mut_ptr().cast(), acc);
    lanes.iter().fold(tail, |a, &b| a.wrapping_add(b))
}

#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,f16c,bmi2")]
unsafe fn streaming_sum_avx512(words: &[u64]) -> u64 {
    let lines = words.chunks_exact(8);
    let tail: u64 = lines.remainder().iter().fold(0, |a, &b| a.wrapping_add(b));
    let mut acc = _mm512_setzero_si512();
    for line in lines {
        prefetch(line.as_ptr().cast());
        acc = _mm512_add_epi64(acc, _mm512_loadu_si512(line.as_ptr().cast()));
    }
    (_mm512_reduce_add_epi64(acc) as u64).wrapping_add(tail)
}

/// Requests for a share's weights at the pace the kernel reads them. Each `advance` moves
/// `step` bytes on and asks for the lines starting in that stretch, [`PREFETCH`] and
/// [`PREFETCH_L2`] bytes ahead ([`prefetch`]): the kernels advance once per pass over a unit
/// (AVX2, by any tile of rows and either half strip) or once per block or sub-block of it
/// (AVX-512), with `step` the unit's bytes over those calls, so a strip's passes together ask
/// for one strip, spread through its multiplies. (Asking only in the first pass over a strip
/// left memory idle in the others: 8 rows cost about the sum of reading the weights and
/// multiplying them. Asking for a whole unit's 37-53 lines at once, before its multiplies,
/// made a verify of 1 to 32 rows slower on a Zen 5 than asking for them a sub-block at a
/// time: docs/benchmarks.md, session 24.)
pub(super) struct Stream {
    at: usize,
    end: usize,
    step: usize,
    /// Where the lines are asked for.
    requests: Requests,
}

/// Where a [`Stream`] asks for its lines.
#[derive(Clone, Copy)]
enum Requests {
    /// Ahead of `at`, [`PREFETCH`] into L1 and [`PREFETCH_L2`] into L2 ([`prefetch`]): the
    /// weights about to be read.
    AheadL1AndL2,
    /// Ahead of `at`, [`PREFETCH_FEW_ROWS`] into L1 only: the weights about to be read by
    /// a tile of at most [`L1_ONLY_ROWS`] rows, where `cpu::few_rows_request_l1_only`.
    AheadL1,
    /// At `at`, into L2 only: the next task's, while this one's are in cache.
    HereL2,
}

impl Stream {
    /// A stream over `len` bytes at `bytes`, `step` bytes an advance, read by a tile of
    /// `rows` activation rows (a tile of few rows asks into L1 only on some CPUs:
    /// [`Requests::AheadL1`]).
    pub fn new(bytes: *const u8, len: usize, step: usize, rows: usize) -> Self {
        let at = bytes as usize;
        let l1_only = rows <= L1_ONLY_ROWS && crate::cpu::few_rows_request_l1_only();
        Self {
            at,
            end: at + len,
            step,
            requests: if l1_only {
                Requests::AheadL1
            } else {
                Requests::AheadL1AndL2
            },
        }
    }

    /// A stream asking for the lines of `len` bytes at `bytes` into L2 only.
    pub fn into_l2(bytes: *const u8, len: usize, step: usize) -> Self {
        Self {
            requests: Requests::HereL2,
            ..Self::new(bytes, len, step, 0)
        }
    }

    /// Asks for the lines of the next `step` bytes. `at` stops at the end, so requests ahead
    /// reach at most [`PREFETCH_L2`] past it: into the next share, which the thread that took
    /// this one usually multiplies next (`threads::for_each_task` deals contiguous shares).
    #[inline]
    pub unsafe fn advance(&mut self) {
        if self.at < self.end {
            let next = self.at + self.step;
            let mut line = self.at.next_multiple_of(64);
            while line < next {
                match self.requests {
                    Requests::AheadL1AndL2 => prefetch(line as *const u8),
                    Requests::AheadL1 => {
                        let ahead = line.wrapping_add(PREFETCH_FEW_ROWS);
                        _mm_prefetch::<_MM_HINT_T0>(ahead as *const i8)
                    }
                    Requests::HereL2 => _mm_prefetch::<_MM_HINT_T1>(line as *const i8),
                }
                line += 64;
            }
            self.at = next;
        }
    }
}

/// Asks for the cache line [`PREFETCH`] bytes past `line` into L1 and the one
/// [`PREFETCH_L2`] past into L2 (the weights a few blocks on). Plain SSE (every x86-64): the
/// AVX2 and AVX-512 kernels and memory tests all call it. Never faults, wherever it points.
#[inline]
pub(super) unsafe fn prefetch(line: *const u8) {
    _mm_prefetch::<_MM_HINT_T0>(line.wrapping_add(PREFETCH).cast());
    _mm_prefetch::<_MM_HINT_T1>(line.wrapping_add(PREFETCH_L2).cast());
}
