//! The AVX2 kernels' K-quants (Q2_K-Q6_K, IQ4_XS and the grid formats; `avx2_columns.rs`
//! holds the half strips, the tiles of rows and the 32-weight formats): each super-block in
//! integers up to its end, its sub-blocks widened by their small integer scales, then
//! converted and scaled once per row.
// SAFETY (all of the module): as `avx2_columns.rs`, whose `Format::unit` these implement.
#![allow(unsafe_code)]
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;

use super::avx2_columns::{
    codebook_values, dots, doubled, five_bit_group, halves, nibble_group, paired, paired_sums,
    weights, Format, HALF, HALF_VECTOR,
};
use super::columns::{at, VECTOR};
use super::simd_columns::Acts;
use super::simd_kquants::{indexed, IQ1_M, IQ2_S, IQ2_XS, IQ2_XXS, IQ3_XXS, IQ4_XS};
use super::QuantFormat;

pub(super) struct Q4K;
pub(super) struct Q5K;
pub(super) struct Q6K;
pub(super) struct Q3K;
pub(super) struct Q2K;
/// IQ4_XS's layout (`F`: `simd_kquants::IQ4_XS` or a grid format's, as the AVX-512 kernel's
/// `Indexed`), each weight an index into the format's 16 values.
pub(super) struct Indexed<const F: u8>;

impl Format for Q4K {
    const FORMAT: QuantFormat = QuantFormat::Q4K;
    // u < 16: 8 * 2 * 15 * 127 < 2^15.
    const ADD: usize = 8;
    const TILE: usize = 4;
    const DECODE_ONCE: bool = false;
    const GROUPS: usize = 64;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn group(unit: *const u8, half: usize, j: usize, g: usize) -> __m256i {
        nibble_group(unit.add(at::q4k_quants(j) + HALF_VECTOR * half), g)
    }

    /// See [`with_mins`] (`u < 16`: at most 8 * 2 * 8 * 15 * 127 * 63 and 8 * 63 * 32 * 127,
    /// far inside 32 bits).
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
        with_mins::<Self, R, D, { Self::ADD }>(unit, half, i, x, acc, decoded);
    }
}

impl Format for Q5K {
    const FORMAT: QuantFormat = QuantFormat::Q5K;
    // u < 32: 4 * 2 * 31 * 127 < 2^15.
    const ADD: usize = 4;
    const TILE: usize = 4;
    // Planes: a group decodes in five instructions, where it is used (decoding each half
    // strip once measured no faster).
    const DECODE_ONCE: bool = false;
    const GROUPS: usize = 64;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn group(unit: *const u8, half: usize, j: usize, g: usize) -> __m256i {
        five_bit_group(unit.add(at::q5k_quants(j)), half, g)
    }

    /// See [`with_mins`] (`u < 32`: at most 8 * 2 * 2 * 4 * 2 * 31 * 127 * 63 and 8 * 63 *
    /// 32 * 127, inside 32 bits).
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
        with_mins::<Self, R, D, { Self::ADD }>(unit, half, i, x, acc, decoded);
    }
}

/// A Q4_K or Q5_K super-block, in integers up to its end: each sub-block's 16-bit sums
/// widened by its 6-bit scales (`vpmaddwd`), the mins' term as two sub-blocks' mins against
/// their activation sums; then one conversion and scaling per row. `ADD` is `F::ADD`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn with_mins<F: Format, const R: usize, const D: bool, const ADD: usize>(
    unit: *const u8,
    half: usize,
    i: usize,
    x: &Acts<R>,
    acc: &mut [__m256; R],
    decoded: *const __m256i,
) {
    let mut sums = [_mm256_setzero_si256(); R];
    for j in 0..8 {
        let scales = doubled::<false>(unit.add(at::q4k_scales(j) + HALF * half));
        sums = dots::<R, 8, ADD, false>(sums, x, 256 * i + 32 * j, scales, |g| {
            weights::<F, D>(unit, half, decoded, j, g)
        });
    }
    let mins: [__m256i; 4] = std::array::from_fn(|t| {
        let at = |j: usize| unit.add(at::q4k_mins(j) + HALF * half);
        paired::<false>(at(2 * t), at(2 * t + 1))
    });
    let rows = 2 * HALF * half;
    let d = halves(unit.add(at::D + rows));
    let dmin = halves(unit.add(at::DMIN + rows));
    for r in 0..R {
        let x_scale = _mm256_set1_ps(*x.scale[r].add(i));
        let min_sums = _mm256_cvtepi32_ps(paired_sums(x, r, 8 * i, &mins));
        let scaled = _mm256_mul_ps(_mm256_cvtepi32_ps(sums[r]), d);
        let value = _mm256_fnmadd_ps(min_sums, dmin, scaled);
        acc[r] = _mm256_fmadd_ps(value, x_scale, acc[r]);
    }
}

impl Format for Q6K {
    const FORMAT: QuantFormat = QuantFormat::Q6K;
    // u < 64: 2 * 2 * 63 * 127 < 2^15.
    const ADD: usize = 2;
    const TILE: usize = 6;
    const DECODE_ONCE: bool = true;
    const GROUPS: usize = 64;

    /// Group `g` of weights `32j..32j + 32`: its two top bits (bits 2 (g mod 4) of its tops
    /// vector) moved to bits 4-5, joined to its low nibble.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn group(unit: *const u8, half: usize, j: usize, g: usize) -> __m256i {
        let quants = unit.add(at::q6k_quants(j) + HALF_VECTOR * half);
        let t = _mm256_loadu_si256(quants.add(at::Q6_TOPS + VECTOR * (g / 4)).cast());
        let moved = match g % 4 {
            0 => _mm256_slli_epi16::<4>(t),
            1 => _mm256_slli_epi16::<2>(t),
            2 => t,
            _ => _mm256_srli_epi16::<2>(t),
        };
        let tops = _mm256_and_si256(moved, _mm256_set1_epi8(0x30));
        _mm256_or_si256(nibble_group(quants, g), tops)
    }

    /// In integers up to the super-block as Q4_K's: each 16-weight sub-block's sums widened
    /// by its signed scale, the zero point (32) as two sub-blocks' scales against their
    /// activation sums (at most 32 chunks x 2 x 2 x 2 x 63 x 127 x 128, and 32 x 16 x 128 x
    /// 16 x 127: inside 32 bits).
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
        signed_sub_blocks::<Self, R, D, { Self::ADD }, 5>(unit, half, i, x, acc, decoded);
    }
}

impl Format for Q3K {
    const FORMAT: QuantFormat = QuantFormat::Q3K;
    // u < 8: 4 * 2 * 7 * 127 < 2^15 (a sub-block's four groups).
    const ADD: usize = 4;
    const TILE: usize = 6;
    const DECODE_ONCE: bool = true;
    const GROUPS: usize = 64;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn group(unit: *const u8, half: usize, j: usize, g: usize) -> __m256i {
        three_bit_group(unit.add(at::q3k_quants(j) + HALF_VECTOR * half), g)
    }

    /// Q6_K's integers with the zero point 4 (at most 16 sub-blocks x 32 x 16 x 7 x 127 and
    /// 16 x 32 x 16 x 127 x 4: inside 32 bits).
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
        signed_sub_blocks::<Self, R, D, { Self::ADD }, 2>(unit, half, i, x, acc, decoded);
    }
}

/// A unit of 16-weight sub-blocks with signed scales (Q6_K's header) and the zero point
/// `2^ZERO_SHIFT` (`ADD` is `F::ADD`), in integers up to the super-block: each sub-block's
/// sums widened by its scale, the zero point as two sub-blocks' scales against their
/// activation sums, converted once and scaled by `d` and the row's activation scale.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn signed_sub_blocks<
    F: Format,
    const R: usize,
    const D: bool,
    const ADD: usize,
    const ZERO_SHIFT: i32,
>(
    unit: *const u8,
    half: usize,
    i: usize,
    x: &Acts<R>,
    acc: &mut [__m256; R],
    decoded: *const __m256i,
) {
    let scale_at = |sub: usize| unit.add(at::q6k_scales(sub) + HALF * half);
    let mut sums = [_mm256_setzero_si256(); R];
    for j in 0..8 {
        for sub_half in 0..2 {
            let sub = 2 * j + sub_half;
            let (scales, at) = (doubled::<true>(scale_at(sub)), 256 * i + 16 * sub);
            sums = dots::<R, 4, ADD, false>(sums, x, at, scales, |g| {
                weights::<F, D>(unit, half, decoded, j, 4 * sub_half + g)
            });
        }
    }
    let pairs: [__m256i; 8] =
        std::array::from_fn(|t| paired::<true>(scale_at(2 * t), scale_at(2 * t + 1)));
    let d = halves(unit.add(at::D + 2 * HALF * half));
    for r in 0..R {
        let zero = _mm256_slli_epi32::<ZERO_SHIFT>(paired_sums(x, r, 16 * i, &pairs));
        let value = _mm256_cvtepi32_ps(_mm256_sub_epi32(sums[r], zero));
        let scale = _mm256_mul_ps(d, _mm256_set1_ps(*x.scale[r].add(i)));
        acc[r] = _mm256_fmadd_ps(value, scale, acc[r]);
    }
}

/// Group `g` of the 32 three-bit weights at `quants` (a half strip of a Q3_K piece): its low
/// bits (`at::Q3_LOW`) shifted to bits 0-1 and its third bit (`at::Q3_HIGH`) to bit 2 (16-bit
/// shifts: the bits they move across bytes fall outside the masks).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn three_bit_group(quants: *const u8, g: usize) -> __m256i {
    let high = _mm256_loadu_si256(quants.add(at::Q3_HIGH_BITS).cast());
    let high = match at::Q3_HIGH[g] {
        0 => _mm256_slli_epi16::<2>(high),
        1 => _mm256_slli_epi16::<1>(high),
        2 => high,
        3 => _mm256_srli_epi16::<1>(high),
        4 => _mm256_srli_epi16::<2>(high),
        5 => _mm256_srli_epi16::<3>(high),
        6 => _mm256_srli_epi16::<4>(high),
        _ => _mm256_srli_epi16::<5>(high),
    };
    _mm256_or_si256(
        crumb_group(quants, g),
        _mm256_and_si256(high, _mm256_set1_epi8(4)),
    )
}

/// Group `g`'s 2 low bits of the 32 weights at `quants` (Q2_K's, Q3_K's: `at::Q3_LOW`) moved
/// to bits 0-1 (a 16-bit shift: the bits it moves across bytes fall outside the mask).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn crumb_group(quants: *const u8, g: usize) -> __m256i {
    let (vector, bit) = at::Q3_LOW[g];
    let low = _mm256_loadu_si256(quants.add(VECTOR * vector).cast());
    let low = match bit {
        0 => low,
        2 => _mm256_srli_epi16::<2>(low),
        4 => _mm256_srli_epi16::<4>(low),
        _ => _mm256_srli_epi16::<6>(low),
    };
    _mm256_and_si256(low, _mm256_set1_epi8(3))
}

impl Format for Q2K {
    const FORMAT: QuantFormat = QuantFormat::Q2K;
    // u < 4: 4 * 2 * 3 * 127 < 2^15 (a sub-block's four groups).
    const ADD: usize = 4;
    const TILE: usize = 6;
    const DECODE_ONCE: bool = true;
    const GROUPS: usize = 64;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn group(unit: *const u8, half: usize, j: usize, g: usize) -> __m256i {
        crumb_group(unit.add(at::q2k_quants(j) + HALF_VECTOR * half), g)
    }

    /// In integers up to the super-block as Q4_K's: each 16-weight sub-block's sums widened
    /// by its 4-bit scale (a byte's low nibble), the mins' term as two sub-blocks' 4-bit mins
    /// (the high nibbles) against their activation sums (at most 16 x 15 x 16 x 3 x 127 and
    /// 16 x 15 x 16 x 127: inside 32 bits).
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
        let bytes_at = |sub: usize| unit.add(at::q2k_scales(sub) + HALF * half);
        let low_nibbles = _mm256_set1_epi16(0x0F);
        let mut sums = [_mm256_setzero_si256(); R];
        for j in 0..8 {
            for sub_half in 0..2 {
                let sub = 2 * j + sub_half;
                let scales = _mm256_and_si256(doubled::<false>(bytes_at(sub)), low_nibbles);
                let at = 256 * i + 16 * sub;
                sums = dots::<R, 4, { Self::ADD }, false>(sums, x, at, scales, |g| {
                    weights::<Self, D>(unit, half, decoded, j, 4 * sub_half + g)
                });
            }
        }
        let mins: [__m256i; 8] = std::array::from_fn(|t| {
            _mm256_srli_epi16::<4>(paired::<false>(bytes_at(2 * t), bytes_at(2 * t + 1)))
        });
        let rows = 2 * HALF * half;
        let d = halves(unit.add(at::D + rows));
        let dmin = halves(unit.add(at::DMIN + rows));
        for r in 0..R {
            let x_scale = _mm256_set1_ps(*x.scale[r].add(i));
            let min_sums = _mm256_cvtepi32_ps(paired_sums(x, r, 16 * i, &mins));
            let scaled = _mm256_mul_ps(_mm256_cvtepi32_ps(sums[r]), d);
            let value = _mm256_fnmadd_ps(min_sums, dmin, scaled);
            acc[r] = _mm256_fmadd_ps(value, x_scale, acc[r]);
        }
    }
}

impl<const F: u8> Format for Indexed<F> {
    const FORMAT: QuantFormat = indexed(F);
    // Signed values as IQ4_NL's (`avx2_columns::iq4_values`), each pair's products below
    // 2^15 added in 16 bits for as many groups as stay below: IQ4's (at most 2 * 127 * 127)
    // one at a time, IQ3_XXS's (62: 2 * 62 * 127 < 2^14) and IQ2's (43) two, IQ3_S's (15)
    // and IQ1's (9) eight, or the four of a sub-block of 16.
    const ADD: usize = match F {
        IQ4_XS => 1,
        IQ3_XXS | IQ2_XXS | IQ2_XS | IQ2_S => 2,
        IQ1_M => 4,
        _ => 8,
    };
    const TILE: usize = 6;
    // A lookup beside the mask: decoding each half strip once measured a tenth faster.
    const DECODE_ONCE: bool = true;
    const GROUPS: usize = 64;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn group(unit: *const u8, half: usize, j: usize, g: usize) -> __m256i {
        let codebook = Self::FORMAT.codebook().expect("indices into values");
        let quants = unit.add(at::grid_quants(Self::FORMAT, j) + HALF_VECTOR * half);
        let indices = match Self::FORMAT.three_bit_indices() {
            true => three_bit_group(quants, g),
            false => nibble_group(quants, g),
        };
        codebook_values(codebook, indices)
    }

    /// In integers up to the super-block: each group's pairs widened by its sub-block's
    /// signed scale (a lane's 4 products a group: at most 8 sub-blocks x 8 groups x 4 x 127 x
    /// 127 x 32 < 2^31), converted once and scaled by `d` and the row's activation scale. No
    /// zero point: the values are signed. A format scaled each 16 weights widens each half
    /// of a sub-block's groups by its own scale.
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
        let mut sums = [_mm256_setzero_si256(); R];
        for j in 0..8 {
            if Self::FORMAT.scales_16() {
                for piece in 0..2 {
                    let sub = 2 * j + piece;
                    let at_scales = at::grid_scales(Self::FORMAT, sub) + HALF * half;
                    let scales = doubled::<true>(unit.add(at_scales));
                    let group = |g| weights::<Self, D>(unit, half, decoded, j, 4 * piece + g);
                    let at = 256 * i + 16 * sub;
                    sums = match Self::ADD {
                        2 => dots::<R, 4, 2, true>(sums, x, at, scales, group),
                        _ => dots::<R, 4, 4, true>(sums, x, at, scales, group),
                    };
                }
                continue;
            }
            let at_scales = at::grid_scales(Self::FORMAT, j) + HALF * half;
            let scales = doubled::<true>(unit.add(at_scales));
            let group = |g| weights::<Self, D>(unit, half, decoded, j, g);
            let at = 256 * i + 32 * j;
            // `Self::ADD` as a const argument (a generic `Self` cannot be one).
            sums = match Self::ADD {
                1 => dots::<R, 8, 1, true>(sums, x, at, scales, group),
                2 => dots::<R, 8, 2, true>(sums, x, at, scales, group),
                _ => dots::<R, 8, 8, true>(sums, x, at, scales, group),
            };
        }
        let mut d = halves(unit.add(at::D + 2 * HALF * half));
        let codebook = Self::FORMAT.codebook().expect("indices into values");
        if codebook.d_factor != 1.0 {
            d = _mm256_mul_ps(d, _mm256_set1_ps(codebook.d_factor));
        }
        for r in 0..R {
            let scale = _mm256_mul_ps(d, _mm256_set1_ps(*x.scale[r].add(i)));
            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums[r]), scale, acc[r]);
        }
    }
}
