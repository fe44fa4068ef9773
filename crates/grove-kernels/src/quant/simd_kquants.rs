//! The AVX-512 VNNI kernels' K-quants, IQ4_XS and the grid formats (`simd_columns.rs` holds
//! the strips and the tiles of rows, `simd_blocks.rs` the 32-weight formats): a super-block's
//! sub-blocks scaled once for 16 weight rows, its mins (Q2_K, Q4_K, Q5_K) or zero point (Q3_K,
//! Q6_K, IQ4_XS, the grid formats) in integers.
// SAFETY (all of the module): as `simd_columns.rs`, whose `Format::unit` these implement.
#![allow(unsafe_code)]
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;

use super::columns::at;
use super::simd_columns::{
    byte_ints, byte_scales, codebook_table, dots, five_bit_groups, halves, nibble_groups,
    six_bit_groups, three_bit_groups, three_bit_indices, two_bit_groups, zero_start, Acts, Advance,
    Format,
};
use super::QuantFormat;

/// Q4_K; where `EXACT`, with the AMX tiles' rounding ([`with_mins`]).
pub(super) struct Q4K<const EXACT: bool>;
pub(super) struct Q5K;
/// Q6_K; where `EXACT`, with the AMX tiles' rounding, and where `BLOCK_ZERO`, its zero
/// point once per super-block (`simd_columns::Q6Zero::PerSuperBlock`; `impl Format for Q6K`).
pub(super) struct Q6K<const EXACT: bool, const BLOCK_ZERO: bool>;
/// Q3_K, with its zero point once per super-block (as Q6_K's `BLOCK_ZERO`; no AMX kernel
/// multiplies Q3_K, so none needs its rounding).
pub(super) struct Q3K;
/// Q2_K, its mins once per super-block.
pub(super) struct Q2K;
/// IQ4_XS's layout (`F`: IQ4_XS or a grid format, [`indexed`]; a grid format that scales
/// each 16 weights has Q6_K's 16 scales, IQ2's and IQ1's indices are 3 bits laid out as
/// Q3_K's weights), each weight an index into the format's 16 values, its zero point once per
/// super-block as Q4_K's mins.
pub(super) struct Indexed<const F: u8>;
pub(super) const IQ4_XS: u8 = 0;
pub(super) const IQ3_XXS: u8 = 1;
pub(super) const IQ3_S: u8 = 2;
pub(super) const IQ2_XXS: u8 = 3;
pub(super) const IQ2_XS: u8 = 4;
pub(super) const IQ2_S: u8 = 5;
pub(super) const IQ1_S: u8 = 6;
pub(super) const IQ1_M: u8 = 7;

/// The format of [`Indexed`]'s `F`.
pub(super) const fn indexed(f: u8) -> QuantFormat {
    match f {
        IQ4_XS => QuantFormat::Iq4Xs,
        IQ3_XXS => QuantFormat::Iq3Xxs,
        IQ3_S => QuantFormat::Iq3S,
        IQ2_XXS => QuantFormat::Iq2Xxs,
        IQ2_XS => QuantFormat::Iq2Xs,
        IQ2_S => QuantFormat::Iq2S,
        IQ1_S => QuantFormat::Iq1S,
        _ => QuantFormat::Iq1M,
    }
}

/// Two neighbouring sub-blocks' bytes of the 16 rows (16 at `p`, then 16), as `vpdpwssd`
/// multiplies them by two activation sums: lane `p` the 16-bit pair of row `p`'s two bytes
/// (Q4_K's mins, unsigned; Q6_K's scales, `SIGNED`).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,f16c,bmi2")]
pub(super) unsafe fn paired_bytes<const SIGNED: bool>(p: *const u8) -> __m512i {
    /// Word `2p` from word `p` (the first sub-block's), `2p + 1` from `16 + p`.
    static INTERLEAVE: [i16; 32] = {
        let mut index = [0i16; 32];
        let mut p = 0;
        while p < 16 {
            index[2 * p] = p as i16;
            index[2 * p + 1] = 16 + p as i16;
            p += 1;
        }
        index
    };
    let bytes = _mm256_loadu_si256(p.cast());
    let words = if SIGNED {
        _mm512_cvtepi8_epi16(bytes)
    } else {
        _mm512_cvtepu8_epi16(bytes)
    };
    #[cfg(not(miri))]
    let paired = _mm512_permutexvar_epi16(_mm512_loadu_si512(INTERLEAVE.as_ptr().cast()), words);
    // Miri has no `vpermw` (`scripts/miri_avx512.sh`): the same permutation, word by word.
    #[cfg(miri)]
    let paired = {
        let (mut from, mut to) = ([0i16; 32], [0i16; 32]);
        _mm512_storeu_si512(from.as_mut_ptr().cast(), words);
        for (w, &index) in to.iter_mut().zip(&INTERLEAVE) {
            *w = from[index as usize];
        }
        _mm512_loadu_si512(to.as_ptr().cast())
    };
    paired
}

/// Each row's `T` pairs of sub-block sums from `x.sums[r] + from` against the 16 rows'
/// `pairs`: the integer sums of a super-block's mins' (zero point's) term.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,f16c,bmi2")]
unsafe fn paired_sums<const R: usize, const T: usize>(
    pairs: &[__m512i; T],
    x: &Acts<R>,
    from: usize,
) -> [__m512i; R] {
    std::array::from_fn(|r| {
        let mut sums = _mm512_setzero_si512();
        for t in 0..T {
            sums = dpwssd_broadcast(sums, pairs[t], x.sums[r].add(from + 2 * t));
        }
        sums
    })
}

/// `sums` plus, in each lane, the lane's two 16-bit values of `pairs` times the two at `p`
/// (`vpdpwssd` with its operand broadcast from memory). Written out: LLVM turns the
/// intrinsic into `vpmaddwd` and `vpaddd` wherever the CPU model (here a plain x86-64 with
/// features enabled) is not known to have a fast `vpdpwssd`, two instructions for one.
#[cfg(not(miri))]
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,f16c,bmi2")]
pub(super) unsafe fn dpwssd_broadcast(sums: __m512i, pairs: __m512i, p: *const i16) -> __m512i {
    let mut sums = sums;
    std::arch::asm!(
        "vpdpwssd {sums}, {pairs}, dword ptr [{p}]{{1to16}}",
        sums = inout(zmm_reg) sums,
        pairs = in(zmm_reg) pairs,
        p = in(reg) p,
        options(pure, readonly, nostack, preserves_flags),
    );
    sums
}

/// [`dpwssd_broadcast`] where Miri runs the kernels, which runs no assembly and no
/// `vpdpwssd`: `vpmaddwd` and `vpaddd`, the same sums (a pair of products of 16-bit values
/// wraps only for two products of -2^15 by -2^15, which these operands never are).
#[cfg(miri)]
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,f16c,bmi2")]
pub(super) unsafe fn dpwssd_broadcast(sums: __m512i, pairs: __m512i, p: *const i16) -> __m512i {
    let both = _mm512_set1_epi32(p.cast::<i32>().read_unaligned());
    _mm512_add_epi32(sums, _mm512_madd_epi16(pairs, both))
}

impl<const EXACT: bool> Format for Q4K<EXACT> {
    const FORMAT: QuantFormat = QuantFormat::Q4K;
    const PACES: usize = 8;

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,f16c,bmi2")]
    unsafe fn unit<const R: usize, A: Advance>(
        unit: *const u8,
        i: usize,
        x: &Acts<R>,
        acc: &mut [__m512; R],
        stream: &mut A,
    ) {
        with_mins::<R, EXACT>(unit, i, x, acc, stream, |j| {
            nibble_groups(unit.add(at::q4k_quants(j)))
        });
    }
}

impl Format for Q5K {
    const FORMAT: QuantFormat = QuantFormat::Q5K;
    const PACES: usize = 8;

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,f16c,bmi2")]
    unsafe fn unit<const R: usize, A: Advance>(
        unit: *const u8,
        i: usize,
        x: &Acts<R>,
        acc: &mut [__m512; R],
        stream: &mut A,
    ) {
        with_mins::<R, false>(unit, i, x, acc, stream, |j| {
            five_bit_groups(unit.add(at::q5k_quants(j)))
        });
    }
}

/// A Q4_K or Q5_K super-block, `groups(j)` its sub-block `j`'s weights. The mins' term once
/// per super-block, in integers: each row's eight 32-value sums (16 bits, two to a broadcast
/// word) against the 16 rows' 6-bit mins, four `vpdpwssd`s (at most 8 * 63 * 32 * 127 < 2^24:
/// exact as f32), then one conversion and one multiply-add by `dmin`, before the activation
/// scale.
///
/// Where `EXACT` (Q4_K in a process whose AMX tiles multiply Q4_K), the sub-blocks' 6-bit
/// scales are applied without `d`, in f32 but
/// exactly: each sub-block's sum times its scale is below 32 * 15 * 128 * 63 < 2^22, so each
/// half super-block's four add up exactly (below 2^24), and the two halves' sum is the
/// super-block's integer sum rounded once, as a conversion would round it. Then one multiply
/// by `d`. So the AMX kernel, which adds the sub-blocks' scaled sums in its tiles' integers
/// and converts once (`amx_kquants.rs`), gives the same bits.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,f16c,bmi2")]
unsafe fn with_mins<const R: usize, const EXACT: bool>(
    unit: *const u8,
    i: usize,
    x: &Acts<R>,
    acc: &mut [__m512; R],
    stream: &mut impl Advance,
    groups: impl Fn(usize) -> [__m512i; 8],
) {
    let d = halves(unit.add(at::D));
    // The super-block's scaled sums, before its activation scale: where `EXACT`, each half's.
    let mut halves_of = [[_mm512_setzero_ps(); R]; 2];
    for j in 0..8 {
        stream.advance();
        let scales = if EXACT {
            _mm512_cvtepi32_ps(byte_ints::<false>(unit.add(at::q4k_scales(j))))
        } else {
            byte_scales(unit.add(at::q4k_scales(j)), d)
        };
        let u = groups(j);
        let zero = [_mm512_setzero_si512(); R];
        let sums = dots::<R, 8>(zero, x, 256 * i + 32 * j, |g| u[g]);
        let half = &mut halves_of[if EXACT { j / 4 } else { 0 }];
        for r in 0..R {
            half[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums[r]), scales, half[r]);
        }
    }
    let mut block = halves_of[0];
    if EXACT {
        for r in 0..R {
            block[r] = _mm512_mul_ps(_mm512_add_ps(halves_of[0][r], halves_of[1][r]), d);
        }
    }
    let mins: [__m512i; 4] =
        std::array::from_fn(|t| paired_bytes::<false>(unit.add(at::q4k_mins(2 * t))));
    let dmin = halves(unit.add(at::DMIN));
    minus_mins_into(&mins, x, i, 8 * i, dmin, block, acc);
}

/// Super-block `i`'s `block` less its mins' term (each row's `2 T` activation sums from
/// `x.sums[r] + from` against the 16 rows' `mins` in pairs, times `dmin`), times each row's
/// activation scale, added into `acc`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,f16c,bmi2")]
unsafe fn minus_mins_into<const R: usize, const T: usize>(
    mins: &[__m512i; T],
    x: &Acts<R>,
    i: usize,
    from: usize,
    dmin: __m512,
    block: [__m512; R],
    acc: &mut [__m512; R],
) {
    let min_sums = paired_sums::<R, T>(mins, x, from);
    for r in 0..R {
        let block = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(min_sums[r]), dmin, block[r]);
        acc[r] = _mm512_fmadd_ps(block, _mm512_set1_ps(*x.scale[r].add(i)), acc[r]);
    }
}

/// `block` less super-block `i`'s zero-point term (Q6_K's, Q3_K's): each row's sixteen
/// 16-value sums against the 16 rows' signed scales of the unit's 16 sub-blocks, in
/// integers, converted once and times `zero_d` (the zero point times `d`).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,f16c,bmi2")]
unsafe fn subtract_zero_point<const R: usize>(
    unit: *const u8,
    i: usize,
    x: &Acts<R>,
    zero_d: __m512,
    block: &mut [__m512; R],
) {
    let scales: [__m512i; 8] =
        std::array::from_fn(|t| paired_bytes::<true>(unit.add(at::q6k_scales(2 * t))));
    let zero_sums = paired_sums::<R, 8>(&scales, x, 16 * i);
    for r in 0..R {
        block[r] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(zero_sums[r]), zero_d, block[r]);
    }
}

impl<const EXACT: bool, const BLOCK_ZERO: bool> Format for Q6K<EXACT, BLOCK_ZERO> {
    const FORMAT: QuantFormat = QuantFormat::Q6K;
    const PACES: usize = 8;

    /// Each 16-weight sub-block's sums start at the weights' zero point (32) times the
    /// activations' sum ([`zero_start`]), so they are the centred weights' (`q - 32`) sums
    /// (below 16 * 32 * 127 < 2^24: exact as f32). Each is converted and multiplied by its
    /// scale times `d` into the super-block's f32 sum.
    ///
    /// Where `BLOCK_ZERO`, the sums start at zero instead (below 16 * 63 * 127 < 2^24) and
    /// the zero point comes once per super-block, in integers as Q4_K's mins: each row's
    /// sixteen 16-value sums against the 16 rows' signed scales, eight `vpdpwssd`s (at most
    /// 16 * 128 * 16 * 127 < 2^24: exact as f32), times `32 d`.
    ///
    /// Where `EXACT` (a process whose AMX tiles multiply Q6_K), the sums times their signed
    /// scales (below 2^23) add up in integers over the super-block, converted once and
    /// multiplied by `d`: the tiles' bits (`amx_kquants`, `impl KQuant for Q6K`), and
    /// llama.cpp's order. A pair of sub-blocks is scaled and added in f32, exactly (below
    /// 2^24), then converted back: fewer operations than an integer multiply a sub-block,
    /// yet a tenth slower than the plain arithmetic (docs/benchmarks.md, session 48).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,f16c,bmi2")]
    unsafe fn unit<const R: usize, A: Advance>(
        unit: *const u8,
        i: usize,
        x: &Acts<R>,
        acc: &mut [__m512; R],
        stream: &mut A,
    ) {
        // A pair's sums from zero would pass 2^24: not exact.
        const { assert!(!(EXACT && BLOCK_ZERO)) };
        let d = halves(unit.add(at::D));
        let mut ints = [_mm512_setzero_si512(); R];
        let mut block = [_mm512_setzero_ps(); R];
        for j in 0..8 {
            stream.advance();
            let u = six_bit_groups(unit.add(at::q6k_quants(j)));
            let mut pair = [_mm512_setzero_ps(); R];
            for half in 0..2 {
                // Sub-block 2j + half: 16 weights.
                let sub = 2 * j + half;
                let scales = _mm512_cvtepi32_ps(byte_ints::<true>(unit.add(at::q6k_scales(sub))));
                let scales = if EXACT {
                    scales
                } else {
                    _mm512_mul_ps(scales, d)
                };
                let start = if BLOCK_ZERO {
                    [_mm512_setzero_si512(); R]
                } else {
                    zero_start::<R>(x, 16 * i + sub)
                };
                let sums = dots::<R, 4>(start, x, 256 * i + 16 * sub, |g| u[4 * half + g]);
                let into = if EXACT { &mut pair } else { &mut block };
                for r in 0..R {
                    into[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums[r]), scales, into[r]);
                }
            }
            if EXACT {
                for r in 0..R {
                    ints[r] = _mm512_add_epi32(ints[r], _mm512_cvtps_epi32(pair[r]));
                }
            }
        }
        if EXACT {
            for r in 0..R {
                block[r] = _mm512_mul_ps(_mm512_cvtepi32_ps(ints[r]), d);
            }
        }
        if BLOCK_ZERO {
            // The zero point 32 with `d`: a power of two, exact.
            let d32 = _mm512_mul_ps(d, _mm512_set1_ps(32.0));
            subtract_zero_point::<R>(unit, i, x, d32, &mut block);
        }
        for r in 0..R {
            acc[r] = _mm512_fmadd_ps(block[r], _mm512_set1_ps(*x.scale[r].add(i)), acc[r]);
        }
    }
}

impl Format for Q3K {
    const FORMAT: QuantFormat = QuantFormat::Q3K;
    const PACES: usize = 8;

    /// Q6_K's arithmetic with its zero point once per super-block ([`sub_blocks_of_16`]),
    /// then the zero point (4): each row's sixteen 16-value sums against the 16 rows' signed
    /// scales, eight `vpdpwssd`s (at most 16 * 32 * 16 * 127 < 2^24: exact as f32), times
    /// `4 d`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,f16c,bmi2")]
    unsafe fn unit<const R: usize, A: Advance>(
        unit: *const u8,
        i: usize,
        x: &Acts<R>,
        acc: &mut [__m512; R],
        stream: &mut A,
    ) {
        let d = halves(unit.add(at::D));
        let mut block = sub_blocks_of_16(
            i,
            x,
            stream,
            d,
            |j| three_bit_groups(unit.add(at::q3k_quants(j))),
            |sub| byte_ints::<true>(unit.add(at::q6k_scales(sub))),
        );
        subtract_zero_point::<R>(
            unit,
            i,
            x,
            _mm512_mul_ps(d, _mm512_set1_ps(4.0)),
            &mut block,
        );
        for r in 0..R {
            acc[r] = _mm512_fmadd_ps(block[r], _mm512_set1_ps(*x.scale[r].add(i)), acc[r]);
        }
    }
}

impl Format for Q2K {
    const FORMAT: QuantFormat = QuantFormat::Q2K;
    const PACES: usize = 8;

    /// The sub-blocks' sums by their 4-bit scales ([`sub_blocks_of_16`]), then the mins once
    /// per super-block as Q4_K's: each row's sixteen 16-value sums against the 16 rows'
    /// 4-bit mins, eight `vpdpwssd`s (at most 16 * 15 * 16 * 127 < 2^24: exact as f32), times
    /// `dmin`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,f16c,bmi2")]
    unsafe fn unit<const R: usize, A: Advance>(
        unit: *const u8,
        i: usize,
        x: &Acts<R>,
        acc: &mut [__m512; R],
        stream: &mut A,
    ) {
        let low_nibbles = _mm512_set1_epi32(0x0F);
        let block = sub_blocks_of_16(
            i,
            x,
            stream,
            halves(unit.add(at::D)),
            |j| two_bit_groups(unit.add(at::q2k_quants(j))),
            |sub| {
                _mm512_and_si512(
                    byte_ints::<false>(unit.add(at::q2k_scales(sub))),
                    low_nibbles,
                )
            },
        );
        // Each byte's high nibble, in the 16-bit words that pair two sub-blocks' bytes.
        let mins: [__m512i; 8] = std::array::from_fn(|t| {
            _mm512_srli_epi16::<4>(paired_bytes::<false>(unit.add(at::q2k_scales(2 * t))))
        });
        let dmin = halves(unit.add(at::DMIN));
        minus_mins_into(&mins, x, i, 16 * i, dmin, block, acc);
    }
}

/// Super-block `i` of a K-quant of 16-weight sub-blocks whose 32-weight pieces decode as two
/// sub-blocks' groups (`groups(j)`: the first's as `q`, the second's as `16 q`, as
/// [`two_bit_groups`] and [`three_bit_groups`] give them), before its zero point or mins and
/// the activation scale: each sub-block's sums from zero (below 16 * 16 * 7 * 127 < 2^24:
/// exact as f32) converted and multiplied by its integer scales (`scales(sub)`) times `d`,
/// the second sub-block of each piece by `d / 16` (a power of two: the same products).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,f16c,bmi2")]
unsafe fn sub_blocks_of_16<const R: usize>(
    i: usize,
    x: &Acts<R>,
    stream: &mut impl Advance,
    d: __m512,
    groups: impl Fn(usize) -> [__m512i; 8],
    scales: impl Fn(usize) -> __m512i,
) -> [__m512; R] {
    let d_16 = _mm512_mul_ps(d, _mm512_set1_ps(1.0 / 16.0));
    let mut block = [_mm512_setzero_ps(); R];
    for j in 0..8 {
        stream.advance();
        let u = groups(j);
        for half in 0..2 {
            let sub = 2 * j + half;
            let scale = _mm512_mul_ps(
                _mm512_cvtepi32_ps(scales(sub)),
                if half == 0 { d } else { d_16 },
            );
            let zero = [_mm512_setzero_si512(); R];
            let sums = dots::<R, 4>(zero, x, 256 * i + 16 * sub, |g| u[4 * half + g]);
            for r in 0..R {
                block[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums[r]), scale, block[r]);
            }
        }
    }
    block
}

impl<const F: u8> Format for Indexed<F> {
    const FORMAT: QuantFormat = indexed(F);
    const PACES: usize = 8;

    /// Q4_K's arithmetic (`with_mins`): each sub-block's indices looked up as their values
    /// plus 128 (unsigned, below 2^8), their sums (below 32 * 241 * 127 < 2^24: exact as f32)
    /// times the signed scale times `d` (IQ3_XXS: `d / 4`, IQ2 and IQ1: `d / 8`, exact). The
    /// 128 comes once per super-block as Q4_K's mins: each row's eight 32-value sums against
    /// the 16 rows' signed scales (at most 32 in magnitude), four `vpdpwssd`s (at most
    /// 8 * 32 * 32 * 127 < 2^24), times `128 d` (exact). A format scaled each 16 weights does
    /// the same with its sixteen 16-value sums (eight `vpdpwssd`s, at most 16 * 31 * 16 * 127).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,f16c,bmi2")]
    unsafe fn unit<const R: usize, A: Advance>(
        unit: *const u8,
        i: usize,
        x: &Acts<R>,
        acc: &mut [__m512; R],
        stream: &mut A,
    ) {
        let codebook = Self::FORMAT.codebook().expect("indices into values");
        let table = codebook_table(codebook);
        let mut d = halves(unit.add(at::D));
        if codebook.d_factor != 1.0 {
            d = _mm512_mul_ps(d, _mm512_set1_ps(codebook.d_factor));
        }
        let zero_d = _mm512_mul_ps(d, _mm512_set1_ps(128.0));
        let format = Self::FORMAT;
        let mut block = [_mm512_setzero_ps(); R];
        // Weights `32 j..32 j + 32`'s 8 groups of indices.
        let groups = |j: usize| {
            let quants = unit.add(at::grid_quants(format, j));
            if format.three_bit_indices() {
                three_bit_indices(quants)
            } else {
                nibble_groups(quants)
            }
        };
        if format.scales_16() {
            for j in 0..8 {
                stream.advance();
                let u = groups(j);
                for half in 0..2 {
                    let sub = 2 * j + half;
                    let signed = byte_ints::<true>(unit.add(at::grid_scales(format, sub)));
                    let scales = _mm512_mul_ps(_mm512_cvtepi32_ps(signed), d);
                    let zero = [_mm512_setzero_si512(); R];
                    let sums = dots::<R, 4>(zero, x, 256 * i + 16 * sub, |g| {
                        _mm512_shuffle_epi8(table, u[4 * half + g])
                    });
                    for r in 0..R {
                        block[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums[r]), scales, block[r]);
                    }
                }
            }
            let scales: [__m512i; 8] = std::array::from_fn(|t| {
                paired_bytes::<true>(unit.add(at::grid_scales(format, 2 * t)))
            });
            minus_mins_into(&scales, x, i, 16 * i, zero_d, block, acc);
            return;
        }
        for j in 0..8 {
            stream.advance();
            let signed = byte_ints::<true>(unit.add(at::grid_scales(format, j)));
            let scales = _mm512_mul_ps(_mm512_cvtepi32_ps(signed), d);
            let u = groups(j);
            let zero = [_mm512_setzero_si512(); R];
            let sums = dots::<R, 8>(zero, x, 256 * i + 32 * j, |g| {
                _mm512_shuffle_epi8(table, u[g])
            });
            for r in 0..R {
                block[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums[r]), scales, block[r]);
            }
        }
        let scales: [__m512i; 4] =
            std::array::from_fn(|t| paired_bytes::<true>(unit.add(at::grid_scales(format, 2 * t))));
        minus_mins_into(&scales, x, i, 8 * i, zero_d, block, acc);
    }
}
