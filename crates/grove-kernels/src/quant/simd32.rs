//! The AVX-512 kernels of the 32-weight formats (Q8_0, Q5_0), reading the interleaved layout
//! (`interleave.rs`). Its chunks are lane-blocked, so within a chunk group (16 blocks) a row's
//! `vpdpbusd` sums accumulate as integers, one per chunk; the group then costs one load and
//! conversion of the weights' f16 scales, a multiply with the activations' block scales, one
//! conversion of the sums and one FMA per row. The zero point (128 or 16) enters the integer
//! sums at the start of each group, from the activations' lane sums.
// SAFETY (all of the module): the functions are compiled for the features `simd::available`
// checks and reached only after it did (the `_gfni` ones also for GFNI, reached only when
// `gfni()` found it); every pointer is inside a row group that
// `QMatrix::new` sized (`GROUP_ROWS * row_bytes`) or an activation row `QuantizedRows::new`
// sized.
#![allow(unsafe_code)]
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;
use std::sync::atomic::{AtomicBool, Ordering};

use super::interleave::{
    group_count, payload_bytes, payload_parts, ChunkGroup, GROUP_CHUNKS, GROUP_ROWS,
};
use super::x86::{prefetch, reduce4, Rows};
use super::{QuantFormat, QuantizedRows, CHUNK, LANES};

/// Row `p`'s payload of a chunk (in the chunk's four at `chunk`: `payload_parts`) decoded to
/// 64 unsigned bytes `u`, with `w = d * (u - 2^ZERO_SHIFT)`.
pub(super) trait Block32 {
    const FORMAT: QuantFormat;
    const ZERO_SHIFT: i32;
    unsafe fn decode(chunk: *const u8, p: usize) -> __m512i;
}

pub(super) struct Q8_0;
pub(super) struct Q5_0;

impl Block32 for Q8_0 {
    const FORMAT: QuantFormat = QuantFormat::Q8_0;
    const ZERO_SHIFT: i32 = 7;

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,f16c,bmi2")]
    unsafe fn decode(chunk: *const u8, p: usize) -> __m512i {
        // Stored as `q + 128` already.
        _mm512_loadu_si512(chunk.add(payload_parts(Self::FORMAT, p).0).cast())
    }
}

impl Block32 for Q5_0 {
    const FORMAT: QuantFormat = QuantFormat::Q5_0;
    const ZERO_SHIFT: i32 = 4;

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,f16c,bmi2")]
    unsafe fn decode(chunk: *const u8, p: usize) -> __m512i {
        // The 32 nibble bytes in both halves (a broadcast load), the upper half shifted by 4,
        // then the low nibbles: weights 0-31, then 32-63.
        let (at, bits_at) = payload_parts(Self::FORMAT, p);
        let both = _mm512_broadcast_i64x4(_mm256_loadu_si256(chunk.add(at).cast()));
        const HIGH: i64 = 0x0004_0004_0004_0004;
        let shifts = _mm512_set_epi64(HIGH, HIGH, HIGH, HIGH, 0, 0, 0, 0);
        let nibbles = _mm512_and_si512(_mm512_srlv_epi16(both, shifts), _mm512_set1_epi8(0x0F));
        with_fifth_bits(nibbles, chunk.add(bits_at))
    }
}

/// `nibbles` plus 16 where a Q5_0 payload's fifth bit is set (its 64 bits at `bits` are one
/// mask register).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,f16c,bmi2")]
unsafe fn with_fifth_bits(nibbles: __m512i, bits: *const u8) -> __m512i {
    let fifth: __mmask64 = bits.cast::<u64>().read_unaligned();
    _mm512_mask_add_epi8(nibbles, fifth, nibbles, _mm512_set1_epi8(16))
}

/// [`Q5_0`] with the nibbles split by one `vgf2p8affineqb` (a bit matrix per 64-bit lane:
/// the low nibble in the lower half, the high one moved down in the upper) instead of a
/// shift and a mask: one vector op fewer per row and chunk, where Q5_0 is bound by them.
/// Only on CPUs with GFNI ([`gfni`]).
pub(super) struct Q5_0Gfni;

impl Block32 for Q5_0Gfni {
    const FORMAT: QuantFormat = QuantFormat::Q5_0;
    const ZERO_SHIFT: i32 = 4;

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,f16c,bmi2,gfni")]
    unsafe fn decode(chunk: *const u8, p: usize) -> __m512i {
        // Result bit b = parity(x & matrix byte 7 - b).
        const LOW: i64 = 0x0102_0408_0000_0000;
        const HIGH: i64 = 0x1020_4080_0000_0000;
        let (at, bits_at) = payload_parts(Self::FORMAT, p);
        let both = _mm512_broadcast_i64x4(_mm256_loadu_si256(chunk.add(at).cast()));
        let matrix = _mm512_set_epi64(HIGH, HIGH, HIGH, HIGH, LOW, LOW, LOW, LOW);
        let nibbles = _mm512_gf2p8affine_epi64_epi8::<0>(both, matrix);
        with_fifth_bits(nibbles, chunk.add(bits_at))
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
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,f16c,bmi2")]
unsafe fn weight_scales(rows: *const u8, group: &ChunkGroup, p: usize, mask: __mmask16) -> __m512 {
    let halves = _mm512_maskz_loadu_epi16(u32::from(mask), rows.add(group.scales(p)).cast());
    _mm512_cvtph_ps(_mm512_castsi512_si256(halves))
}

/// Per-block values of a group of `chunks` chunks (lanes past its blocks zero) where the
/// lane-blocked layout has the blocks: lane `l` gets block `l mod 2 chunks`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,f16c,bmi2")]
unsafe fn spread(blocks: __m512, chunks: usize) -> __m512 {
    if chunks == GROUP_CHUNKS {
        return blocks;
    }
    let lanes = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    let index = _mm512_and_si512(lanes, _mm512_set1_epi32(2 * chunks as i32 - 1));
    _mm512_permutexvar_ps(index, blocks)
}

/// Where a row's integer sums start in a chunk group: minus the zero point times the sum of
/// each lane's activations (`lane_sums`), so that they end as sums of `(u - zero) * x`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,f16c,bmi2")]
unsafe fn zero_point_start(lane_sums: *const i32, shift: i32) -> __m512i {
    let sums = _mm512_loadu_si512(lane_sums.cast());
    _mm512_sub_epi32(
        _mm512_setzero_si512(),
        _mm512_sll_epi32(sums, _mm_cvtsi32_si128(shift)),
    )
}

/// The two kernels, compiled once for AVX-512 and once more with GFNI (for [`Q5_0Gfni`]):
/// the decode is inlined into them only where their features include its own.
macro_rules! block32_kernels {
    ($features:literal, $tile:ident, $group:ident, $groups:ident) => {
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
            let mut acc = [_mm512_setzero_ps(); R];
            // Chunk `i` of a group into each row's integer sums.
            let add = |group: &ChunkGroup, i: usize, sums: &mut [__m512i; R]| {
                let chunk = rows.add(group.chunk(F::FORMAT, i));
                // The four rows run one after another over the row group: the first asks for
                // all of it.
                if p == 0 {
                    prefetch(chunk, GROUP_ROWS * payload_bytes(F::FORMAT));
                }
                let u = F::decode(chunk, p);
                for r in 0..R {
                    let values = x.lanes[r].add((group.first + i) * CHUNK);
                    sums[r] = _mm512_dpbusd_epi32(sums[r], u, _mm512_loadu_si512(values.cast()));
                }
            };
            for q in 0..group_count(chunks) {
                let group = ChunkGroup::new(F::FORMAT, chunks, q);
                let mut sums: [__m512i; R] = std::array::from_fn(|r| {
                    zero_point_start(x.lane_sums[r].add(q * LANES), F::ZERO_SHIFT)
                });
                // With one row, odd chunks go to other sums, so consecutive `vpdpbusd`s do not
                // wait on each other; with more rows, the rows give that independence.
                let mut odd = [_mm512_setzero_si512(); R];
                for i in (0..group.chunks).step_by(2) {
                    add(&group, i, &mut sums);
                    if i + 1 < group.chunks {
                        add(&group, i + 1, if R == 1 { &mut odd } else { &mut sums });
                    }
                }
                let mask = block_mask(group.chunks);
                let weight_scales = weight_scales(rows, &group, p, mask);
                for r in 0..R {
                    let x_scales = _mm512_maskz_loadu_ps(mask, x.scale[r].add(2 * group.first));
                    let scales = spread(_mm512_mul_ps(weight_scales, x_scales), group.chunks);
                    let total = _mm512_cvtepi32_ps(_mm512_add_epi32(sums[r], odd[r]));
                    acc[r] = _mm512_fmadd_ps(scales, total, acc[r]);
                }
            }
            for r in 0..R {
                out[r] = _mm512_reduce_add_ps(acc[r]);
            }
        }

        /// The four rows of the row group at `rows` dotted with activation row `act` (a decode step):
        /// each activation chunk is loaded once for the four, the row group is read front to back
        /// (one stream, requested `x86::PREFETCH` bytes ahead), and the four sums are reduced together.
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
            // Chunk `i` of a group into the four rows' integer sums.
            let add = |group: &ChunkGroup, i: usize, sums: &mut [__m512i; P]| {
                let values = _mm512_loadu_si512(x.lanes[0].add((group.first + i) * CHUNK).cast());
                let chunk = rows.add(group.chunk(F::FORMAT, i));
                prefetch(chunk, P * payload_bytes(F::FORMAT));
                for p in 0..P {
                    let u = F::decode(chunk, p);
                    sums[p] = _mm512_dpbusd_epi32(sums[p], u, values);
                }
            };
            for q in 0..group_count(chunks) {
                let group = ChunkGroup::new(F::FORMAT, chunks, q);
                prefetch(rows.add(group.start), group.payloads);
                // Odd chunks into other sums: Q8_0's `vpdpbusd`s would otherwise wait on each
                // other.
                let start = zero_point_start(x.lane_sums[0].add(q * LANES), F::ZERO_SHIFT);
                let (mut even, mut odd) = ([start; P], [_mm512_setzero_si512(); P]);
                for i in (0..group.chunks).step_by(2) {
                    add(&group, i, &mut even);
                    if i + 1 < group.chunks {
                        add(&group, i + 1, &mut odd);
                    }
                }
                let mask = block_mask(group.chunks);
                let x_scales = _mm512_maskz_loadu_ps(mask, x.scale[0].add(2 * group.first));
                for p in 0..P {
                    let scales = _mm512_mul_ps(weight_scales(rows, &group, p, mask), x_scales);
                    let total = _mm512_cvtepi32_ps(_mm512_add_epi32(even[p], odd[p]));
                    acc[p] = _mm512_fmadd_ps(spread(scales, group.chunks), total, acc[p]);
                }
            }
            _mm_storeu_ps(out, reduce4(acc));
        }

        /// [`$group`] for `count` row groups of `group_bytes` laid end to end at `groups`,
        /// four outputs each.
        #[target_feature(enable = $features)]
        pub(super) unsafe fn $groups<F: Block32>(
            groups: *const u8,
            group_bytes: usize,
            count: usize,
            acts: &QuantizedRows,
            act: usize,
            out: *mut f32,
        ) {
            for g in 0..count {
                $group::<F>(
                    groups.add(g * group_bytes),
                    acts,
                    act,
                    out.add(g * GROUP_ROWS),
                );
            }
        }
    };
}

block32_kernels!(
    "avx512f,avx512bw,avx512dq,avx512vnni,f16c,bmi2",
    block32,
    block32_group,
    block32_groups
);
block32_kernels!(
    "avx512f,avx512bw,avx512dq,avx512vnni,f16c,bmi2,gfni",
    block32_gfni,
    block32_group_gfni,
    block32_groups_gfni
);
