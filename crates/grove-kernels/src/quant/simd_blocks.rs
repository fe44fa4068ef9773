//! The AVX-512 VNNI kernels' 32-weight formats (Q8_0, Q5_0, Q5_1, Q4_0, Q4_1, IQ4_NL;
//! `simd_columns.rs` holds the strips and the tiles of rows): a unit's two blocks, each
//! scaled once for 16 weight rows, two strips a pass where the format is `PAIRED`.
// SAFETY (all of the module): as `simd_columns.rs`, whose `Format::units` these implement.
#![allow(unsafe_code)]
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;

use super::columns::{at, VECTOR};
use super::simd_columns::{
    dots, five_bit_groups, halves, iq4_table, nibble_groups, strips_dots, zero_start, Acts,
    Advance, Format,
};
use super::QuantFormat;

pub(super) struct Q8_0;
pub(super) struct Q5_0;
pub(super) struct Q5_1;
pub(super) struct Q4_1;
pub(super) struct Q4_0;
pub(super) struct Iq4Nl;

/// A 32-weight block's sums scaled into `acc`: by each strip's 16 rows' scales at
/// `scales[s]` and each row's activation scale of block `b`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,f16c,bmi2")]
unsafe fn scale_block<const R: usize, const S: usize>(
    sums: [[__m512i; R]; S],
    scales: [*const u8; S],
    x: &Acts<R>,
    b: usize,
    acc: &mut [[__m512; R]; S],
) {
    let rows: [__m512; R] = std::array::from_fn(|r| _mm512_set1_ps(*x.scale[r].add(b)));
    for s in 0..S {
        let d = halves(scales[s]);
        for r in 0..R {
            let scale = _mm512_mul_ps(d, rows[r]);
            acc[s][r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums[s][r]), scale, acc[s][r]);
        }
    }
}

/// The two 32-weight blocks of `S` strips' units stored as `q + zero` (Q8_0, Q5_0, Q4_0):
/// block `b`'s sums start at the activations' sum times `-zero` ([`zero_start`], one
/// broadcast for the strips), and `decoder(s, b)` gives strip `s`'s group `g` weight vector
/// where [`strips_dots`] asks for it.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,f16c,bmi2")]
unsafe fn zero_point_blocks<const R: usize, const S: usize, D: Fn(usize) -> __m512i>(
    units: [*const u8; S],
    i: usize,
    x: &Acts<R>,
    acc: &mut [[__m512; R]; S],
    stream: &mut impl Advance,
    decoder: impl Fn(usize, usize) -> D,
) {
    for b in 0..2 {
        stream.advance();
        let block = 2 * i + b;
        let start = zero_start::<R>(x, block);
        let decoders: [D; S] = std::array::from_fn(|s| decoder(s, b));
        let sums = strips_dots::<R, S, 8>([start; S], x, 32 * block, |s, g| decoders[s](g));
        let scales = units.map(|unit| unit.add(at::block_scales(b)));
        scale_block(sums, scales, x, block, acc);
    }
}

impl Format for Q8_0 {
    const FORMAT: QuantFormat = QuantFormat::Q8_0;
    const PACES: usize = 2;
    const PAIRED: bool = true;

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,f16c,bmi2")]
    unsafe fn units<const R: usize, const S: usize, A: Advance>(
        units: [*const u8; S],
        i: usize,
        x: &Acts<R>,
        acc: &mut [[__m512; R]; S],
        stream: &mut A,
    ) {
        // Stored as q + 128.
        zero_point_blocks(units, i, x, acc, stream, |s, b| {
            let vectors = units[s].add(at::q8_block(b));
            move |g| _mm512_loadu_si512(vectors.add(VECTOR * g).cast())
        });
    }
}

impl Format for Q5_0 {
    const FORMAT: QuantFormat = QuantFormat::Q5_0;
    const PACES: usize = 2;
    const PAIRED: bool = true;

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,f16c,bmi2")]
    unsafe fn units<const R: usize, const S: usize, A: Advance>(
        units: [*const u8; S],
        i: usize,
        x: &Acts<R>,
        acc: &mut [[__m512; R]; S],
        stream: &mut A,
    ) {
        let sixteen = _mm512_set1_epi8(16);
        zero_point_blocks(units, i, x, acc, stream, |s, b| {
            let quants = units[s].add(at::q5_block(b));
            let low = nibble_groups(quants);
            let bits = quants.add(at::Q5_BITS).cast::<u64>();
            move |g| {
                // The fifth bit of every byte is one bit of a mask register.
                let fifth: __mmask64 = bits.add(g).read_unaligned();
                _mm512_mask_add_epi8(low[g], fifth, low[g], sixteen)
            }
        });
    }
}

impl Format for Q5_1 {
    const FORMAT: QuantFormat = QuantFormat::Q5_1;
    const PACES: usize = 2;

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,f16c,bmi2")]
    unsafe fn unit<const R: usize, A: Advance>(
        unit: *const u8,
        i: usize,
        x: &Acts<R>,
        acc: &mut [__m512; R],
        stream: &mut A,
    ) {
        with_block_mins(unit, i, x, acc, stream, |b| {
            five_bit_groups(unit.add(at::q5_1_block(b)))
        });
    }
}

impl Format for Q4_1 {
    const FORMAT: QuantFormat = QuantFormat::Q4_1;
    const PACES: usize = 2;

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,f16c,bmi2")]
    unsafe fn unit<const R: usize, A: Advance>(
        unit: *const u8,
        i: usize,
        x: &Acts<R>,
        acc: &mut [__m512; R],
        stream: &mut A,
    ) {
        with_block_mins(unit, i, x, acc, stream, |b| {
            nibble_groups(unit.add(at::q4_1_block(b)))
        });
    }
}

/// The two 32-weight blocks of a Q5_1 or Q4_1 unit, `groups(b)` block `b`'s weights: the
/// sums from zero, then each block's 16 mins times the activations' scaled sum.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,f16c,bmi2")]
unsafe fn with_block_mins<const R: usize>(
    unit: *const u8,
    i: usize,
    x: &Acts<R>,
    acc: &mut [__m512; R],
    stream: &mut impl Advance,
    groups: impl Fn(usize) -> [__m512i; 8],
) {
    for b in 0..2 {
        stream.advance();
        let block = 2 * i + b;
        let u = groups(b);
        let zero = [_mm512_setzero_si512(); R];
        let sums = dots::<R, 8>(zero, x, 32 * block, |g| u[g]);
        let scales = [unit.add(at::block_scales(b))];
        scale_block([sums], scales, x, block, std::array::from_mut(acc));
        let mins = halves(unit.add(at::block_mins(b)));
        for r in 0..R {
            let sum = _mm512_set1_ps(*x.scaled_sums[r].add(block));
            acc[r] = _mm512_fmadd_ps(mins, sum, acc[r]);
        }
    }
}

impl Format for Q4_0 {
    const FORMAT: QuantFormat = QuantFormat::Q4_0;
    const PACES: usize = 2;
    const PAIRED: bool = true;

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,f16c,bmi2")]
    unsafe fn units<const R: usize, const S: usize, A: Advance>(
        units: [*const u8; S],
        i: usize,
        x: &Acts<R>,
        acc: &mut [[__m512; R]; S],
        stream: &mut A,
    ) {
        // Stored as q + 8.
        zero_point_blocks(units, i, x, acc, stream, |s, b| {
            let u = nibble_groups(units[s].add(at::q4_block(b)));
            move |g| u[g]
        });
    }
}

impl Format for Iq4Nl {
    const FORMAT: QuantFormat = QuantFormat::Iq4Nl;
    const PACES: usize = 2;
    const PAIRED: bool = true;

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,f16c,bmi2")]
    unsafe fn units<const R: usize, const S: usize, A: Advance>(
        units: [*const u8; S],
        i: usize,
        x: &Acts<R>,
        acc: &mut [[__m512; R]; S],
        stream: &mut A,
    ) {
        // Q4_0's nibbles, each an index looked up as its value + 128: Q8_0's zero point.
        let table = iq4_table();
        zero_point_blocks(units, i, x, acc, stream, |s, b| {
            let u = nibble_groups(units[s].add(at::q4_block(b)));
            move |g| _mm512_shuffle_epi8(table, u[g])
        });
    }
}
