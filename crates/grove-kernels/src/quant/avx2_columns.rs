//! The AVX2 kernels of the column layout (`columns.rs`), for CPUs without AVX-512 VNNI (AMD
//! Zen 3 and older, Intel client cores): the same strips as `simd_columns.rs`, read half a
//! vector at a time.
//!
//! A 256-bit register holds half of a group's vector: the same four weights of eight rows. Its
//! product with an activation row's four bytes broadcast is `vpmaddubsw` (unsigned weights
//! times signed activations, adjacent pairs summed to 16 bits) then `vpmaddwd` (the pairs
//! summed to 32 bits: one lane per weight row), so as in the VNNI kernel a block's sums end in
//! the lanes of eight outputs and nothing is reduced horizontally. Where the weights are small
//! the 16-bit pair sums of several groups are added before widening (`ADD` groups: no sum can
//! reach the 16-bit limit, see [`Format::ADD`]). The K-quants widen by their sub-blocks' small
//! integer scales instead of ones, so a super-block stays in integers and is converted and
//! scaled once per row, not once per sub-block and row.
//!
//! A strip is passed a half (8 rows) at a time, every tile of activation rows against one half
//! before the next, so the strip is read from memory once and from L1 or L2 after. Where a
//! group's decode costs several products (Q5_0's fifth bits, Q6_K's top bits) a product of
//! more rows than a tile decodes each half strip once into a buffer the tiles read. The
//! weights are requested ahead at the pace the passes read them ([`Stream`]).
//!
//! Q8_0's weights fill a byte, so `u * x` pairs could pass the 16-bit limit: they are taken as
//! signed `q = u - 128` and multiplied as `|q| * (x signed like q)` (`vpsignb`), each pair at
//! most 2 * 128 * 127, and their sums start at zero rather than at the zero point's term.
// SAFETY (all of the module): every function is compiled for AVX2, FMA and F16C, which
// `cpu::Level::Avx2` has, and reached only where that level is allowed (`Kernel::detect`);
// every pointer is inside a strip `QMatrix::new` sized or an activation row
// `QuantizedRows::new` sized, which `Share::new` asserts.
#![allow(unsafe_code)]
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;

use super::avx2_kquants::{Indexed, Q2K, Q3K, Q4K, Q5K, Q6K};
use super::columns::{at, STRIP, VECTOR};
use super::simd::Stream;
use super::simd_columns::{Acts, Share};
use super::simd_kquants::{IQ1_M, IQ1_S, IQ2_S, IQ2_XS, IQ2_XXS, IQ3_S, IQ3_XXS, IQ4_XS};
use super::{columns, grids, Kernel, QuantFormat, QuantizedRows};
use crate::threads::OutRows;

/// Rows of a strip in one pass: the 32-bit lanes of a 256-bit vector.
pub(super) const HALF: usize = STRIP / 2;
/// Bytes of half a group's vector.
pub(super) const HALF_VECTOR: usize = VECTOR / 2;

/// The activation rows' four bytes at `at` broadcast to every lane.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn broadcast<const R: usize>(x: &Acts<R>, r: usize, at: usize) -> __m256i {
    _mm256_set1_epi32(x.q[r].add(at).cast::<i32>().read_unaligned())
}

/// `G` groups (from activation offset `at`) into each row's integer sums, which start at
/// `start`; `u(g)` gives group `g`'s half vector (unsigned weights, or with `SIGNED` signed
/// ones, multiplied as `|q| * sign(x, q)`). Every `ADD` groups' 16-bit sums are widened once,
/// by `vpmaddwd` with `widen`: ones, or a lane's scale twice (the scale applied in integers).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn dots<const R: usize, const G: usize, const ADD: usize, const SIGNED: bool>(
    start: [__m256i; R],
    x: &Acts<R>,
    at: usize,
    widen: __m256i,
    u: impl Fn(usize) -> __m256i,
) -> [__m256i; R] {
    let mut sums = start;
    for chunk in 0..G / ADD {
        let mut pairs = [_mm256_setzero_si256(); R];
        for g in ADD * chunk..ADD * (chunk + 1) {
            let u = u(g);
            let weights = if SIGNED { _mm256_abs_epi8(u) } else { u };
            for r in 0..R {
                let mut values = broadcast(x, r, at + 4 * g);
                if SIGNED {
                    values = _mm256_sign_epi8(values, u);
                }
                let products = _mm256_maddubs_epi16(weights, values);
                pairs[r] = if ADD == 1 {
                    products
                } else {
                    _mm256_add_epi16(pairs[r], products)
                };
            }
        }
        for r in 0..R {
            sums[r] = _mm256_add_epi32(sums[r], _mm256_madd_epi16(pairs[r], widen));
        }
    }
    sums
}

/// 8 bytes at `p` (unsigned, or signed where `SIGNED`), each twice in its lane as 16 bits:
/// eight rows' scales for `vpmaddwd`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn doubled<const SIGNED: bool>(p: *const u8) -> __m256i {
    let bytes = _mm_loadl_epi64(p.cast());
    let ints = if SIGNED {
        _mm256_and_si256(_mm256_cvtepi8_epi32(bytes), _mm256_set1_epi32(0xFFFF))
    } else {
        _mm256_cvtepu8_epi32(bytes)
    };
    _mm256_or_si256(ints, _mm256_slli_epi32::<16>(ints))
}

/// 8 bytes at `a` and 8 at `b` (unsigned, or signed where `SIGNED`), lane `p` holding `a[p]`
/// then `b[p]` as 16 bits: two sub-blocks' scales or mins of eight rows for `vpmaddwd`
/// against the two sub-blocks' activation sums.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn paired<const SIGNED: bool>(a: *const u8, b: *const u8) -> __m256i {
    let bytes = _mm_unpacklo_epi8(_mm_loadl_epi64(a.cast()), _mm_loadl_epi64(b.cast()));
    if SIGNED {
        _mm256_cvtepi8_epi16(bytes)
    } else {
        _mm256_cvtepu8_epi16(bytes)
    }
}

/// Row `r`'s sum of its activations' sub-blocks `index` and `index + 1` against `pairs[t]`
/// (from [`paired`]) for `t < T`: sub-blocks `index + 2t`, `index + 2t + 1`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn paired_sums<const R: usize, const T: usize>(
    x: &Acts<R>,
    r: usize,
    index: usize,
    pairs: &[__m256i; T],
) -> __m256i {
    let mut sum = _mm256_setzero_si256();
    for t in 0..T {
        let both = x.sums[r].add(index + 2 * t).cast::<i32>().read_unaligned();
        sum = _mm256_add_epi32(sum, _mm256_madd_epi16(pairs[t], _mm256_set1_epi32(both)));
    }
    sum
}

/// Sixteen-bit ones: `vpmaddwd` by them only widens.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn ones() -> __m256i {
    _mm256_set1_epi16(1)
}

/// Each row's sums starting where block `index`'s zero point puts them.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn zero_start<const R: usize>(x: &Acts<R>, index: usize) -> [__m256i; R] {
    std::array::from_fn(|r| _mm256_set1_epi32(*x.zero[r].add(index)))
}

/// 8 f16 at `p` as f32.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn halves(p: *const u8) -> __m256 {
    _mm256_cvtph_ps(_mm_loadu_si128(p.cast()))
}

/// Group `g` of the 8 groups of 32 weights in 4 nibble vectors at `p` (low nibbles groups
/// 0-3, high 4-7). Each group is loaded where it is used: sixteen registers cannot hold all
/// eight beside a tile's sums.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn nibble_group(p: *const u8, g: usize) -> __m256i {
    let mask = _mm256_set1_epi8(0x0F);
    let v = _mm256_loadu_si256(p.add(VECTOR * (g % 4)).cast());
    if g < 4 {
        _mm256_and_si256(v, mask)
    } else {
        _mm256_and_si256(_mm256_srli_epi16::<4>(v), mask)
    }
}

/// Group `g` of the 32 five-bit weights at `quants` (4 nibble vectors, then the fifth bits as
/// planes: a Q5_0 or Q5_1 block, a Q5_K sub-block), half `half`: group `g`'s fifth bits are
/// bit `g` of each byte, moved to bit 4 (a 16-bit shift moves no other byte's bit there: at
/// most 4 places).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn five_bit_group(quants: *const u8, half: usize, g: usize) -> __m256i {
    let planes = _mm256_loadu_si256(quants.add(at::Q5_BITS + HALF_VECTOR * half).cast());
    let moved = match g {
        0 => _mm256_slli_epi16::<4>(planes),
        1 => _mm256_slli_epi16::<3>(planes),
        2 => _mm256_slli_epi16::<2>(planes),
        3 => _mm256_slli_epi16::<1>(planes),
        4 => planes,
        5 => _mm256_srli_epi16::<1>(planes),
        6 => _mm256_srli_epi16::<2>(planes),
        _ => _mm256_srli_epi16::<3>(planes),
    };
    let fifth = _mm256_and_si256(moved, _mm256_set1_epi8(16));
    _mm256_or_si256(nibble_group(quants.add(HALF_VECTOR * half), g), fifth)
}

/// One format's unit (`columns::unit_bytes`) of half a strip (its rows `8h..8h + 8`, the
/// unit's vectors already offset to that half) against `R` activation rows, added into the
/// rows' 8 outputs. The unit's weights are [`Format::GROUPS`] half vectors, each decoded
/// where it is used or (`D`) loaded from `decoded`, where [`Format::group`] put them once for
/// every tile of rows.
pub(super) trait Format {
    const FORMAT: QuantFormat;
    /// Groups whose 16-bit pair sums may be added before widening: with weights below `w`
    /// and activations of at most 127 a pair is below `2 w 127`, and `ADD` of them must stay
    /// under 2^15.
    const ADD: usize;
    /// The most activation rows a pass takes: what the registers hold beside a row's sums.
    const TILE: usize;
    /// Whether a product of more rows than one tile decodes each half strip once for all of
    /// them (where a group's decode costs more than loading it again: measured).
    const DECODE_ONCE: bool;
    /// Half vectors of weights in a unit: `GROUPS / 8` parts (blocks or 32-weight pieces) of
    /// 8 groups.
    const GROUPS: usize;
    /// Group `g` of part `part` of the unit's half `half`, decoded: the weights as `u` (Q8_0:
    /// signed). `g` is a constant where it is called, so the decode is straight-line code.
    unsafe fn group(unit: *const u8, half: usize, part: usize, g: usize) -> __m256i;
    unsafe fn unit<const R: usize, const D: bool>(
        unit: *const u8,
        half: usize,
        i: usize,
        x: &Acts<R>,
        acc: &mut [__m256; R],
        decoded: *const __m256i,
    );
}

/// Group `g` of part `part` of a unit: decoded here, or (`D`) where [`Format::group`] left it.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn weights<F: Format, const D: bool>(
    unit: *const u8,
    half: usize,
    decoded: *const __m256i,
    part: usize,
    g: usize,
) -> __m256i {
    if D {
        _mm256_load_si256(decoded.add(8 * part + g))
    } else {
        F::group(unit, half, part, g)
    }
}

struct Q8_0;
struct Q5_0;
struct Q5_1;
struct Q4_1;
struct Q4_0;
struct Iq4Nl;

/// The two 32-weight blocks of a Q8_0 or Q5_0 unit: `sums(b, block)` gives block `b`'s
/// integer sums (`block` counts from the row's start), scaled into `acc` by the 8 rows' scales
/// and each row's activation scale of the block.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn block_pair<const R: usize>(
    unit: *const u8,
    half: usize,
    i: usize,
    x: &Acts<R>,
    acc: &mut [__m256; R],
    sums: impl Fn(usize, usize) -> [__m256i; R],
) {
    for b in 0..2 {
        let block = 2 * i + b;
        let sums = sums(b, block);
        let d = halves(unit.add(at::block_scales(b) + 2 * HALF * half));
        for r in 0..R {
            let scale = _mm256_mul_ps(d, _mm256_set1_ps(*x.scale[r].add(block)));
            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums[r]), scale, acc[r]);
        }
    }
}

/// A unit of two 32-weight blocks of format `F` (`ADD` is `F::ADD`; `SIGNED` as in [`dots`]),
/// each block's sums starting at zero or (`ZERO_POINT`) at its zero point's term.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn two_blocks<
    F: Format,
    const R: usize,
    const D: bool,
    const ADD: usize,
    const SIGNED: bool,
    const ZERO_POINT: bool,
>(
    unit: *const u8,
    half: usize,
    i: usize,
    x: &Acts<R>,
    acc: &mut [__m256; R],
    decoded: *const __m256i,
) {
    block_pair(unit, half, i, x, acc, |b, block| {
        let start = if ZERO_POINT {
            zero_start::<R>(x, block)
        } else {
            [_mm256_setzero_si256(); R]
        };
        dots::<R, 8, ADD, SIGNED>(start, x, 32 * block, ones(), |g| {
            weights::<F, D>(unit, half, decoded, b, g)
        })
    });
}

impl Format for Q8_0 {
    const FORMAT: QuantFormat = QuantFormat::Q8_0;
    // Signed, `|q| <= 128`: one group's pairs, 2 * 128 * 127, is all 16 bits hold.
    const ADD: usize = 1;
    // No 16-bit pair sums to hold (`ADD` 1), so 6 rows' sums and outputs fit the registers
    // (measured faster than 4 from 8 rows up; 8 rows spill).
    const TILE: usize = 6;
    const DECODE_ONCE: bool = false;
    const GROUPS: usize = 16;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn group(unit: *const u8, half: usize, b: usize, g: usize) -> __m256i {
        let vector = unit.add(at::q8_block(b) + HALF_VECTOR * half + VECTOR * g);
        // Stored as q + 128: the sign bit flipped back.
        _mm256_xor_si256(_mm256_loadu_si256(vector.cast()), _mm256_set1_epi8(-128))
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn unit<const R: usize, const D: bool>(
        unit: *const u8,
        half: usize,
        i: usize,
        x: &Acts<R>,
        acc: &mut [__m256; R],
        decoded: *const __m256i,
    ) {
        two_blocks::<Self, R, D, { Self::ADD }, true, false>(unit, half, i, x, acc, decoded);
    }
}

impl Format for Q5_0 {
    const FORMAT: QuantFormat = QuantFormat::Q5_0;
    // u < 32: 4 * 2 * 31 * 127 < 2^15.
    const ADD: usize = 4;
    const TILE: usize = 4;
    const DECODE_ONCE: bool = true;
    const GROUPS: usize = 16;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn group(unit: *const u8, half: usize, b: usize, g: usize) -> __m256i {
        five_bit_group(unit.add(at::q5_block(b)), half, g)
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn unit<const R: usize, const D: bool>(
        unit: *const u8,
        half: usize,
        i: usize,
        x: &Acts<R>,
        acc: &mut [__m256; R],
        decoded: *const __m256i,
    ) {
        two_blocks::<Self, R, D, { Self::ADD }, false, true>(unit, half, i, x, acc, decoded);
    }
}

impl Format for Q5_1 {
    const FORMAT: QuantFormat = QuantFormat::Q5_1;
    // u < 32: 4 * 2 * 31 * 127 < 2^15.
    const ADD: usize = 4;
    const TILE: usize = 4;
    // As Q5_K's.
    const DECODE_ONCE: bool = false;
    const GROUPS: usize = 16;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn group(unit: *const u8, half: usize, b: usize, g: usize) -> __m256i {
        five_bit_group(unit.add(at::q5_1_block(b)), half, g)
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn unit<const R: usize, const D: bool>(
        unit: *const u8,
        half: usize,
        i: usize,
        x: &Acts<R>,
        acc: &mut [__m256; R],
        decoded: *const __m256i,
    ) {
        with_block_mins::<Self, R, D, { Self::ADD }>(unit, half, i, x, acc, decoded);
    }
}

impl Format for Q4_1 {
    const FORMAT: QuantFormat = QuantFormat::Q4_1;
    // u < 16: 8 * 2 * 15 * 127 < 2^15.
    const ADD: usize = 8;
    const TILE: usize = 4;
    const DECODE_ONCE: bool = false;
    const GROUPS: usize = 16;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn group(unit: *const u8, half: usize, b: usize, g: usize) -> __m256i {
        nibble_group(unit.add(at::q4_1_block(b) + HALF_VECTOR * half), g)
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn unit<const R: usize, const D: bool>(
        unit: *const u8,
        half: usize,
        i: usize,
        x: &Acts<R>,
        acc: &mut [__m256; R],
        decoded: *const __m256i,
    ) {
        with_block_mins::<Self, R, D, { Self::ADD }>(unit, half, i, x, acc, decoded);
    }
}

/// A Q5_1 or Q4_1 unit (`ADD` is `F::ADD`): the sums from zero, then each block's min times
/// the activations' scaled sum.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn with_block_mins<F: Format, const R: usize, const D: bool, const ADD: usize>(
    unit: *const u8,
    half: usize,
    i: usize,
    x: &Acts<R>,
    acc: &mut [__m256; R],
    decoded: *const __m256i,
) {
    two_blocks::<F, R, D, ADD, false, false>(unit, half, i, x, acc, decoded);
    for b in 0..2 {
        let min = halves(unit.add(at::block_mins(b) + 2 * HALF * half));
        for r in 0..R {
            let sum = _mm256_set1_ps(*x.scaled_sums[r].add(2 * i + b));
            acc[r] = _mm256_fmadd_ps(min, sum, acc[r]);
        }
    }
}

impl Format for Q4_0 {
    const FORMAT: QuantFormat = QuantFormat::Q4_0;
    // u < 16: 8 * 2 * 15 * 127 < 2^15.
    const ADD: usize = 8;
    const TILE: usize = 4;
    const DECODE_ONCE: bool = false;
    const GROUPS: usize = 16;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn group(unit: *const u8, half: usize, b: usize, g: usize) -> __m256i {
        nibble_group(unit.add(at::q4_block(b) + HALF_VECTOR * half), g)
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn unit<const R: usize, const D: bool>(
        unit: *const u8,
        half: usize,
        i: usize,
        x: &Acts<R>,
        acc: &mut [__m256; R],
        decoded: *const __m256i,
    ) {
        two_blocks::<Self, R, D, { Self::ADD }, false, true>(unit, half, i, x, acc, decoded);
    }
}

/// IQ4_NL's and IQ4_XS's 16 values (signed) in each 128-bit lane: `vpshufb` of it by a half
/// vector of indices gives their values.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn iq4_values(indices: __m256i) -> __m256i {
    codebook_values(&grids::IQ4, indices)
}

/// [`iq4_values`] for any format of 4-bit indices (IQ3_XXS and IQ3_S too).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn codebook_values(codebook: &grids::Codebook, indices: __m256i) -> __m256i {
    let values = codebook.values.as_ptr();
    let table = _mm256_broadcastsi128_si256(_mm_loadu_si128(values.cast()));
    _mm256_shuffle_epi8(table, indices)
}

impl Format for Iq4Nl {
    const FORMAT: QuantFormat = QuantFormat::Iq4Nl;
    // Signed values, `|q| <= 127`, multiplied as Q8_0's: one group's pairs at most
    // 2 * 127 * 127 < 2^15.
    const ADD: usize = 1;
    const TILE: usize = 6;
    // A lookup beside the mask: decoding each half strip once measured a tenth faster.
    const DECODE_ONCE: bool = true;
    const GROUPS: usize = 16;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn group(unit: *const u8, half: usize, b: usize, g: usize) -> __m256i {
        iq4_values(nibble_group(
            unit.add(at::q4_block(b) + HALF_VECTOR * half),
            g,
        ))
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn unit<const R: usize, const D: bool>(
        unit: *const u8,
        half: usize,
        i: usize,
        x: &Acts<R>,
        acc: &mut [__m256; R],
        decoded: *const __m256i,
    ) {
        two_blocks::<Self, R, D, { Self::ADD }, true, false>(unit, half, i, x, acc, decoded);
    }
}

/// Where half `half` of strip `s` goes: its first unit, its rows' outputs (`written` of them
/// at `out`, activation row `r`'s at `+ r * stride`).
struct HalfStrip {
    strip: *const u8,
    half: usize,
    out: *mut f32,
    written: usize,
}

impl HalfStrip {
    unsafe fn new<F: Format>(share: &Share<'_>, s: usize, half: usize) -> Self {
        let units = share.acts.k / columns::unit_weights(F::FORMAT);
        let rows = if s + 1 == share.count {
            share.last
        } else {
            STRIP
        };
        Self {
            strip: share.strips.add(s * units * columns::unit_bytes(F::FORMAT)),
            half,
            // Past the outputs for a last strip without a second half (`written` 0: never
            // written through), so not `add`, whose result must stay inside.
            out: share.out.wrapping_add(STRIP * s + HALF * half),
            written: rows.saturating_sub(HALF * half).min(HALF),
        }
    }

    /// Activation rows `start..start + acc.len()`'s outputs.
    unsafe fn write(&self, share: &Share<'_>, start: usize, acc: &[__m256]) {
        for (r, sums) in acc.iter().enumerate() {
            let mut lanes = [0f32; HALF];
            _mm256_storeu_ps(lanes.as_mut_ptr(), *sums);
            let to = self.out.add((start + r) * share.stride);
            std::ptr::copy_nonoverlapping(lanes.as_ptr(), to, self.written);
        }
    }
}

/// A half strip against the share's activation rows `start..start + R`, each group decoded
/// where it is used, or (`D`) read from `decoded` (the half strip's units one after another);
/// every unit advances `stream`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn pass<F: Format, const R: usize, const D: bool>(
    share: &Share<'_>,
    place: &HalfStrip,
    start: usize,
    stream: &mut Stream,
    decoded: *const __m256i,
) {
    let x = Acts::<R>::new(share.acts, F::FORMAT, share.first + start);
    let units = share.acts.k / columns::unit_weights(F::FORMAT);
    let unit_bytes = columns::unit_bytes(F::FORMAT);
    let mut acc = [_mm256_setzero_ps(); R];
    for i in 0..units {
        let unit = place.strip.add(i * unit_bytes);
        stream.advance();
        let decoded = decoded.wrapping_add(i * F::GROUPS);
        F::unit::<R, D>(unit, place.half, i, &x, &mut acc, decoded);
    }
    place.write(share, start, &acc);
}

/// Every tile of `rows` activation rows against a half strip.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn passes<F: Format, const D: bool>(
    share: &Share<'_>,
    place: &HalfStrip,
    rows: usize,
    stream: &mut Stream,
    decoded: *const __m256i,
) {
    for (start, size) in tile_sizes::<F>(rows) {
        match size {
            6 => pass::<F, 6, D>(share, place, start, stream, decoded),
            5 => pass::<F, 5, D>(share, place, start, stream, decoded),
            4 => pass::<F, 4, D>(share, place, start, stream, decoded),
            3 => pass::<F, 3, D>(share, place, start, stream, decoded),
            2 => pass::<F, 2, D>(share, place, start, stream, decoded),
            _ => pass::<F, 1, D>(share, place, start, stream, decoded),
        }
    }
}

/// The tile sizes `rows` activation rows pass in: `F::TILE` (6 or 4) at a time, the rest in
/// one tile (3 rows went as 2 and 1, the one-row pass at about half the pace; splitting a
/// whole tile and one row more into two even tiles was not faster: docs/benchmarks.md,
/// session 40).
fn tile_sizes<F: Format>(rows: usize) -> impl Iterator<Item = (usize, usize)> {
    let mut done = 0;
    std::iter::from_fn(move || {
        let size = (rows - done).min(F::TILE);
        (size > 0).then(|| {
            done += size;
            (done - size, size)
        })
    })
}

/// Activation rows `0..rows` of the share against its strips, a half strip at a time (it stays
/// in L1 or L2 for every tile of rows). With more rows than one tile the half strip is decoded
/// once into a buffer for all of them (a Q5_0 group's decode costs several of its products).
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tiles<F: Format>(share: &Share<'_>, rows: usize) {
    let units = share.acts.k / columns::unit_weights(F::FORMAT);
    let unit_bytes = columns::unit_bytes(F::FORMAT);
    let once = F::DECODE_ONCE && rows > F::TILE;
    let mut decoded = vec![_mm256_setzero_si256(); if once { units * F::GROUPS } else { 0 }];
    let unit_passes = 2 * (tile_sizes::<F>(rows).count() + usize::from(once));
    let len = share.count * units * unit_bytes;
    let mut stream = Stream::new(share.strips, len, unit_bytes.div_ceil(unit_passes), rows);
    for s in 0..share.count {
        for half in 0..2 {
            let place = HalfStrip::new::<F>(share, s, half);
            if place.written == 0 {
                break;
            }
            if !once {
                passes::<F, false>(share, &place, rows, &mut stream, std::ptr::null());
                continue;
            }
            for (i, unit_groups) in decoded.chunks_exact_mut(F::GROUPS).enumerate() {
                let unit = place.strip.add(i * unit_bytes);
                stream.advance();
                for part in 0..F::GROUPS / 8 {
                    for g in 0..8 {
                        unit_groups[8 * part + g] = F::group(unit, half, part, g);
                    }
                }
            }
            passes::<F, true>(share, &place, rows, &mut stream, decoded.as_ptr());
        }
    }
}

/// Row `r` of `out` = weight rows `j < outputs` of the strips in `bytes` dotted with
/// activation row `first + r`, for every row `out` lends: `simd_columns::dot_strips` in AVX2.
pub(super) fn dot_strips(
    format: QuantFormat,
    bytes: &[u8],
    outputs: usize,
    acts: &QuantizedRows,
    first: usize,
    out: OutRows<'_>,
) {
    let rows = out.rows();
    let share = Share::new(Kernel::Avx2, format, bytes, outputs, acts, first, out);
    // SAFETY: the caller (Kernel::detect) checked the features; `Share::new` checked that
    // `bytes` holds whole strips of `k`-weight rows, that rows `first..first + rows` exist in
    // `acts`, quantized for `format`, and that `out` lends `rows` rows of `outputs` columns;
    // every store writes only the strip's rows that exist.
    unsafe {
        match format {
            QuantFormat::Q8_0 => tiles::<Q8_0>(&share, rows),
            QuantFormat::Q5_0 => tiles::<Q5_0>(&share, rows),
            QuantFormat::Q5_1 => tiles::<Q5_1>(&share, rows),
            QuantFormat::Q4_1 => tiles::<Q4_1>(&share, rows),
            QuantFormat::Q4_0 => tiles::<Q4_0>(&share, rows),
            QuantFormat::Q4K => tiles::<Q4K>(&share, rows),
            QuantFormat::Q6K => tiles::<Q6K>(&share, rows),
            QuantFormat::Q5K => tiles::<Q5K>(&share, rows),
            QuantFormat::Q3K => tiles::<Q3K>(&share, rows),
            QuantFormat::Q2K => tiles::<Q2K>(&share, rows),
            QuantFormat::Iq4Nl => tiles::<Iq4Nl>(&share, rows),
            QuantFormat::Iq4Xs => tiles::<Indexed<IQ4_XS>>(&share, rows),
            QuantFormat::Iq3Xxs => tiles::<Indexed<IQ3_XXS>>(&share, rows),
            QuantFormat::Iq3S => tiles::<Indexed<IQ3_S>>(&share, rows),
            QuantFormat::Iq2Xxs => tiles::<Indexed<IQ2_XXS>>(&share, rows),
            QuantFormat::Iq2Xs => tiles::<Indexed<IQ2_XS>>(&share, rows),
            QuantFormat::Iq2S => tiles::<Indexed<IQ2_S>>(&share, rows),
            QuantFormat::Iq1S => tiles::<Indexed<IQ1_S>>(&share, rows),
            QuantFormat::Iq1M => tiles::<Indexed<IQ1_M>>(&share, rows),
        }
    }
}
