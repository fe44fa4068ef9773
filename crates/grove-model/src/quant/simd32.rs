//! The AVX-512 kernels of the 32-weight formats (Q8_0, Q5_0), reading the interleaved layout
//! (`interleave.rs`). Per chunk group (16 blocks) the weights' f16 scales are one load and
//! one conversion, multiplied with the activations' block scales; each chunk then costs one
//! permute (its two blocks' scales), one `vpdpbusd`, a conversion and one FMA per row. The
//! zero point (128 or 16) is one FMA per chunk group with the activations' block sums.
// SAFETY (all of the module): the functions are compiled for the features `simd::available`
// checks and reached only after it did (the `_gfni` ones also for GFNI, reached only when
// `gfni()` found it); every pointer is inside a row group that
// `QMatrix::new` sized (`GROUP_ROWS * row_bytes`) or an activation row `QuantizedRows::new`
// sized.
#![allow(unsafe_code)]
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;
use std::sync::atomic::{AtomicBool, Ordering};

use super::interleave::{payload_bytes, ChunkGroup, GROUP_CHUNKS, GROUP_ROWS};
use super::simd::{prefetch, reduce4, Rows};
use super::{QuantFormat, QuantizedRows, CHUNK};

/// A 32-weight format's payload decoded to 64 unsigned bytes `u`, with `w = d * (u - ZERO)`.
pub(super) trait Block32 {
    const FORMAT: QuantFormat;
    const ZERO: f32;
    unsafe fn decode(payload: *const u8) -> __m512i;
}

pub(super) struct Q8_0;
pub(super) struct Q5_0;

impl Block32 for Q8_0 {
    const FORMAT: QuantFormat = QuantFormat::Q8_0;
    const ZERO: f32 = 128.0;

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,f16c")]
    unsafe fn decode(payload: *const u8) -> __m512i {
        // Stored as `q + 128` already.
        _mm512_loadu_si512(payload.cast())
    }
}

impl Block32 for Q5_0 {
    const FORMAT: QuantFormat = QuantFormat::Q5_0;
    const ZERO: f32 = 16.0;

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,f16c")]
    unsafe fn decode(payload: *const u8) -> __m512i {
        // The 32 nibble bytes in both halves (a broadcast load), the upper half shifted by 4,
        // then the low nibbles: weights 0-31, then 32-63.
        let both = _mm512_broadcast_i64x4(_mm256_loadu_si256(payload.cast()));
        const HIGH: i64 = 0x0004_0004_0004_0004;
        let shifts = _mm512_set_epi64(HIGH, HIGH, HIGH, HIGH, 0, 0, 0, 0);
        let nibbles = _mm512_and_si512(_mm512_srlv_epi16(both, shifts), _mm512_set1_epi8(0x0F));
        with_fifth_bits(nibbles, payload)
    }
}

/// `nibbles` plus 16 where a Q5_0 payload's fifth bit is set (its 64 bits, after the 32
/// nibble bytes, are one mask register).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,f16c")]
unsafe fn with_fifth_bits(nibbles: __m512i, payload: *const u8) -> __m512i {
    let fifth: __mmask64 = payload.add(32).cast::<u64>().read_unaligned();
    _mm512_mask_add_epi8(nibbles, fifth, nibbles, _mm512_set1_epi8(16))
}

/// [`Q5_0`] with the nibbles split by one `vgf2p8affineqb` (a bit matrix per 64-bit lane:
/// the low nibble in the lower half, the high one moved down in the upper) instead of a
/// shift and a mask: one vector op fewer per row and chunk, where Q5_0 is bound by them.
/// Only on CPUs with GFNI ([`gfni`]).
pub(super) struct Q5_0Gfni;

impl Block32 for Q5_0Gfni {
    const FORMAT: QuantFormat = QuantFormat::Q5_0;
    const ZERO: f32 = 16.0;

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,f16c,gfni")]
    unsafe fn decode(payload: *const u8) -> __m512i {
        // Result bit b = parity(x & matrix byte 7 - b).
        const LOW: i64 = 0x0102_0408_0000_0000;
        const HIGH: i64 = 0x1020_4080_0000_0000;
        let both = _mm512_broadcast_i64x4(_mm256_loadu_si256(payload.cast()));
        let matrix = _mm512_set_epi64(HIGH, HIGH, HIGH, HIGH, LOW, LOW, LOW, LOW);
        with_fifth_bits(_mm512_gf2p8affine_epi64_epi8::<0>(both, matrix), payload)
    }
}

/// Turns the GFNI kernels off (tests compare both builds of the Q5_0 kernels).
static NO_GFNI: AtomicBool = AtomicBool::new(false);

/// Whether the Q5_0 kernels may use GFNI here.
pub(super) fn gfni() -> bool {
    !NO_GFNI.load(Ordering::Relaxed) && is_x86_feature_detected!("gfni")
}

#[cfg(test)]
pub(super) fn set_gfni_allowed(allowed: bool) {
    NO_GFNI.store(!allowed, Ordering::Relaxed);
}

/// The mask of a chunk group's blocks (two per chunk).
#[inline]
fn block_mask(chunks: usize) -> __mmask16 {
    if chunks == GROUP_CHUNKS {
        0xFFFF
    } else {
        (1 << (2 * chunks)) - 1
    }
}

/// Row `p`'s weight scales of chunk group `group` (lanes past its blocks zero).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,f16c")]
unsafe fn weight_scales(rows: *const u8, group: &ChunkGroup, p: usize, mask: __mmask16) -> __m512 {
    let halves = _mm512_maskz_loadu_epi16(u32::from(mask), rows.add(group.scales(p)).cast());
    _mm512_cvtph_ps(_mm512_castsi512_si256(halves))
}

/// Lane index vector `[a x 8, a + 1 x 8]` picking chunk `i`'s two block scales (`a = 2i`).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,f16c")]
pub(super) unsafe fn pair_index(i: usize) -> __m512i {
    let base = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
    _mm512_add_epi32(base, _mm512_set1_epi32(2 * i as i32))
}

/// The two kernels, compiled once for AVX-512 and once more with GFNI (for [`Q5_0Gfni`]):
/// the decode is inlined into them only where their features include its own.
macro_rules! block32_kernels {
    ($features:literal, $tile:ident, $group:ident) => {
        /// Row `p` of the row group at `rows` dotted with `R` activation rows from `start` (a tile
        /// of a prefill or verify).
        #[inline]
        #[target_feature(enable = $features)]
        pub(super) unsafe fn $tile<F: Block32, const R: usize>(
            rows: *const u8,
            p: usize,
            acts: &QuantizedRows,
            start: usize,
            out: &mut [f32],
        ) {
            let chunks = acts.k / CHUNK;
            let x = Rows::<R>::new(acts, start);
            let mut acc = [[_mm512_setzero_ps(); 2]; R];
            let mut zero_terms = [_mm512_setzero_ps(); R];
            let zero = _mm512_setzero_si512();
            for q in 0..chunks.div_ceil(GROUP_CHUNKS) {
                let group = ChunkGroup::new(F::FORMAT, chunks, q);
                let first = q * GROUP_CHUNKS;
                let mask = block_mask(group.chunks);
                let weight_scales = weight_scales(rows, &group, p, mask);
                let mut scales = [_mm512_setzero_ps(); R];
                for r in 0..R {
                    let x_scales = _mm512_maskz_loadu_ps(mask, x.scale[r].add(2 * first));
                    scales[r] = _mm512_mul_ps(weight_scales, x_scales);
                    let sums = _mm512_maskz_loadu_epi32(mask, x.sum32[r].add(2 * first));
                    zero_terms[r] =
                        _mm512_fmadd_ps(scales[r], _mm512_cvtepi32_ps(sums), zero_terms[r]);
                }
                // With one row, two chunks per step into two accumulators, so consecutive FMAs do not
                // wait on each other; with more rows, the rows give that independence and one
                // accumulator each leaves registers for them.
                for i in 0..group.chunks {
                    let slot = if R == 1 { i % 2 } else { 0 };
                    let payload = rows.add(group.payload(F::FORMAT, i, p));
                    prefetch(payload, payload_bytes(F::FORMAT));
                    let u = F::decode(payload);
                    let index = pair_index(i);
                    for r in 0..R {
                        let values = _mm512_loadu_si512(x.q[r].add((first + i) * CHUNK).cast());
                        let dot = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(zero, u, values));
                        let scale = _mm512_permutexvar_ps(index, scales[r]);
                        acc[r][slot] = _mm512_fmadd_ps(scale, dot, acc[r][slot]);
                    }
                }
            }
            let zero_point = _mm512_set1_ps(F::ZERO);
            for r in 0..R {
                let total = _mm512_add_ps(acc[r][0], acc[r][1]);
                out[r] = _mm512_reduce_add_ps(_mm512_fnmadd_ps(zero_point, zero_terms[r], total));
            }
        }

        /// The four rows of the row group at `rows` dotted with activation row `act` (a decode step):
        /// each activation chunk is loaded once for the four, the row group is read front to back
        /// (one stream, requested `simd::PREFETCH` bytes ahead), and the four sums are reduced together.
        #[inline]
        #[target_feature(enable = $features)]
        pub(super) unsafe fn $group<F: Block32>(
            rows: *const u8,
            acts: &QuantizedRows,
            act: usize,
            out: *mut f32,
        ) {
            const P: usize = GROUP_ROWS;
            let chunks = acts.k / CHUNK;
            let x = Rows::<1>::new(acts, act);
            let mut acc = [_mm512_setzero_ps(); P];
            let mut zero_terms = [_mm512_setzero_ps(); P];
            let zero = _mm512_setzero_si512();
            for q in 0..chunks.div_ceil(GROUP_CHUNKS) {
                let group = ChunkGroup::new(F::FORMAT, chunks, q);
                let first = q * GROUP_CHUNKS;
                let mask = block_mask(group.chunks);
                prefetch(rows.add(group.start), group.payloads);
                let x_scales = _mm512_maskz_loadu_ps(mask, x.scale[0].add(2 * first));
                let x_sums =
                    _mm512_cvtepi32_ps(_mm512_maskz_loadu_epi32(mask, x.sum32[0].add(2 * first)));
                let mut scales = [_mm512_setzero_ps(); P];
                for p in 0..P {
                    scales[p] = _mm512_mul_ps(weight_scales(rows, &group, p, mask), x_scales);
                    zero_terms[p] = _mm512_fmadd_ps(scales[p], x_sums, zero_terms[p]);
                }
                for i in 0..group.chunks {
                    let values = _mm512_loadu_si512(x.q[0].add((first + i) * CHUNK).cast());
                    let index = pair_index(i);
                    let payloads = rows.add(group.payload(F::FORMAT, i, 0));
                    prefetch(payloads, P * payload_bytes(F::FORMAT));
                    for p in 0..P {
                        let u = F::decode(payloads.add(p * payload_bytes(F::FORMAT)));
                        let dot = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(zero, u, values));
                        let scale = _mm512_permutexvar_ps(index, scales[p]);
                        acc[p] = _mm512_fmadd_ps(scale, dot, acc[p]);
                    }
                }
            }
            let zero_point = _mm512_set1_ps(F::ZERO);
            let t: [__m512; P] =
                std::array::from_fn(|p| _mm512_fnmadd_ps(zero_point, zero_terms[p], acc[p]));
            _mm_storeu_ps(out, reduce4(t));
        }
    };
}

block32_kernels!(
    "avx512f,avx512bw,avx512dq,avx512vnni,f16c",
    block32,
    block32_group
);
block32_kernels!(
    "avx512f,avx512bw,avx512dq,avx512vnni,f16c,gfni",
    block32_gfni,
    block32_group_gfni
);
