//! The AVX-512 VNNI kernels of the column layout (`columns.rs`): a strip of 16 weight rows
//! against a tile of `R` activation rows, 16 outputs per activation row.
//!
//! For each group of four weights the strip's vector (decoded once, for all `R` rows) meets
//! each activation row's four bytes broadcast to every lane: one `vpdpbusd` adds into 16
//! rows' integer sums. A block's (or sub-block's) sums are converted and scaled once for the
//! 16 rows, and nothing is reduced horizontally: the sums end in the lanes of the outputs.
//! With one activation row (a decode step) each block's dots alternate between two sums, so
//! consecutive `vpdpbusd`s do not wait on each other; with more, the rows give that.
//! The formats' units are in `simd_blocks.rs` (the 32-weight formats) and `simd_kquants.rs`.
//! The formats whose weights decode in a few instructions (Q8_0, Q5_0, Q4_0, IQ4_NL) take two
//! strips a pass in products of many rows, so each activation broadcast feeds two
//! `vpdpbusd`s: on a CPU that issues two a cycle against two vector loads (Zen 5), a
//! broadcast a `vpdpbusd` held those products to their loads' pace.
// SAFETY (all of the module): every function is compiled for the features
// `cpu::Level::Avx512` has, and reached only where that level is allowed (`Kernel::detect`);
// every pointer is inside a strip `QMatrix::new` sized (`columns::strip_bytes`) or an
// activation row `QuantizedRows::new` sized, which `Share::new` asserts.
#![allow(unsafe_code)]
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;

use super::columns::{self, at, STRIP, VECTOR};
use super::simd::Stream;
use super::simd_blocks::{Iq4Nl, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0};
use super::simd_kquants::{
    Indexed, IQ1_M, IQ1_S, IQ2_S, IQ2_XS, IQ2_XXS, IQ3_S, IQ3_XXS, IQ4_XS, Q2K, Q3K, Q4K, Q5K, Q6K,
};
use super::{Kernel, QuantFormat, QuantizedRows, ACT_ROWS_PER_BLOCK};
use crate::threads::OutRows;

/// Raw pointers into `R` activation rows, so the inner loops do no slicing.
pub(super) struct Acts<const R: usize> {
    pub q: [*const i8; R],
    /// One per block (32 or 256 values).
    pub scale: [*const f32; R],
    /// Q8_0, Q5_0, Q4_0, IQ4_NL (Q6_K): where a block's (16-weight sub-block's) sums start,
    /// minus the zero point times the activations' sum (`QuantizedRows::zero_q8`; never read
    /// by AVX2's Q8_0).
    pub zero: [*const i32; R],
    /// Q5_1, Q4_1: each block's scale times its values' sum (`QuantizedRows::scaled_sum32`).
    pub scaled_sums: [*const f32; R],
    /// Q4_K, Q5_K, IQ4_XS, the grid formats scaled per 32 (Q6_K, Q3_K, Q2_K, those per 16):
    /// each 32 (16) values' sum as 16 bits
    /// (`QuantizedRows::sum32_i16`), for the mins' (zero point's) term.
    pub sums: [*const i16; R],
}

impl<const R: usize> Acts<R> {
    #[inline]
    pub fn new(acts: &QuantizedRows, format: QuantFormat, start: usize) -> Self {
        let k = acts.k;
        let row = |r: usize, per_row: usize| (start + r) * per_row;
        let (zero, per): (&[i32], usize) = match format {
            QuantFormat::Q8_0 | QuantFormat::Iq4Nl => (&acts.zero_q8, 32),
            QuantFormat::Q5_0 => (&acts.zero_q5, 32),
            QuantFormat::Q4_0 => (&acts.zero_q4, 32),
            QuantFormat::Q5_1 | QuantFormat::Q4_1 => (&[], 32),
            // The mins are added once per super-block (`sums`): these pointers are never read.
            QuantFormat::Q4K
            | QuantFormat::Q5K
            | QuantFormat::Iq4Xs
            | QuantFormat::Iq3Xxs
            | QuantFormat::Iq3S
            | QuantFormat::Iq2Xxs
            | QuantFormat::Iq2Xs
            | QuantFormat::Iq2S
            | QuantFormat::Iq1S
            | QuantFormat::Iq1M => (&[], 32),
            QuantFormat::Q6K => (&acts.zero_q6, 16),
            // Q3_K's zero point and Q2_K's mins come once per super-block (`sums`).
            QuantFormat::Q3K | QuantFormat::Q2K => (&[], 16),
        };
        Self {
            q: std::array::from_fn(|r| acts.q.as_ptr().wrapping_add(row(r, k))),
            scale: std::array::from_fn(|r| {
                acts.scale.as_ptr().wrapping_add(row(r, k / acts.block))
            }),
            zero: std::array::from_fn(|r| zero.as_ptr().wrapping_add(row(r, k / per))),
            scaled_sums: std::array::from_fn(|r| {
                (acts.scaled_sum32.as_ptr()).wrapping_add(row(r, k / 32))
            }),
            sums: std::array::from_fn(|r| match format {
                QuantFormat::Q6K | QuantFormat::Q3K | QuantFormat::Q2K => {
                    acts.sum16_i16.as_ptr().wrapping_add(row(r, k / 16))
                }
                _ if format.scales_16() => acts.sum16_i16.as_ptr().wrapping_add(row(r, k / 16)),
                _ => acts.sum32_i16.as_ptr().wrapping_add(row(r, k / 32)),
            }),
        }
    }
}

/// `G` groups (from activation offset `at`) into each row's integer sums, which start at
/// `start`; `u(g)` decodes group `g`'s weight vector.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,f16c,bmi2")]
pub(super) unsafe fn dots<const R: usize, const G: usize>(
    start: [__m512i; R],
    x: &Acts<R>,
    at: usize,
    u: impl Fn(usize) -> __m512i,
) -> [__m512i; R] {
    let [sums] = strips_dots::<R, 1, G>([start], x, at, |_, g| u(g));
    sums
}

/// [`dots`] for `S` strips at once, `u(s, g)` strip `s`'s weight vector: each row's four
/// activation bytes are broadcast once for the `S` strips. A `vpdpbusd` fed from memory
/// spends a load, and where two issue a cycle against two vector loads (Zen 5) their loads
/// set the pace (`cpu::two_vnni_a_cycle`); two strips halve them.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,f16c,bmi2")]
pub(super) unsafe fn strips_dots<const R: usize, const S: usize, const G: usize>(
    start: [[__m512i; R]; S],
    x: &Acts<R>,
    at: usize,
    u: impl Fn(usize, usize) -> __m512i,
) -> [[__m512i; R]; S] {
    let mut sums = start;
    let mut odd = [[_mm512_setzero_si512(); R]; S];
    for g in 0..G {
        let u: [__m512i; S] = std::array::from_fn(|s| u(s, g));
        for r in 0..R {
            let values = _mm512_set1_epi32(x.q[r].add(at + 4 * g).cast::<i32>().read_unaligned());
            for s in 0..S {
                if R * S <= 2 && g % 2 == 1 {
                    odd[s][r] = _mm512_dpbusd_epi32(odd[s][r], u[s], values);
                } else {
                    sums[s][r] = _mm512_dpbusd_epi32(sums[s][r], u[s], values);
                }
            }
        }
    }
    if R * S <= 2 {
        for s in 0..S {
            for r in 0..R {
                sums[s][r] = _mm512_add_epi32(sums[s][r], odd[s][r]);
            }
        }
    }
    sums
}

/// Each row's sums starting where block `index`'s zero point puts them.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,f16c,bmi2")]
pub(super) unsafe fn zero_start<const R: usize>(x: &Acts<R>, index: usize) -> [__m512i; R] {
    std::array::from_fn(|r| _mm512_set1_epi32(*x.zero[r].add(index)))
}

/// 16 f16 at `p` as f32.
#[cfg(not(miri))]
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,f16c,bmi2")]
pub(super) unsafe fn halves(p: *const u8) -> __m512 {
    _mm512_cvtph_ps(_mm256_loadu_si256(p.cast()))
}

/// [`halves`] where Miri runs the kernels (`scripts/miri_avx512.sh`), which has no 512-bit
/// `vcvtph2ps`: the same conversion, one value at a time.
#[cfg(miri)]
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,f16c,bmi2")]
pub(super) unsafe fn halves(p: *const u8) -> __m512 {
    let values: [f32; 16] = std::array::from_fn(|i| {
        half::f16::from_bits(p.add(2 * i).cast::<u16>().read_unaligned()).to_f32()
    });
    _mm512_loadu_ps(values.as_ptr())
}

/// 16 bytes at `p` (unsigned, or signed where `SIGNED`) as 32-bit integers: the 16 rows'
/// scales of a sub-block.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,f16c,bmi2")]
pub(super) unsafe fn byte_ints<const SIGNED: bool>(p: *const u8) -> __m512i {
    let bytes = _mm_loadu_si128(p.cast());
    if SIGNED {
        _mm512_cvtepi8_epi32(bytes)
    } else {
        _mm512_cvtepu8_epi32(bytes)
    }
}

/// Unsigned [`byte_ints`] as f32 times `d`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,f16c,bmi2")]
pub(super) unsafe fn byte_scales(p: *const u8, d: __m512) -> __m512 {
    _mm512_mul_ps(_mm512_cvtepi32_ps(byte_ints::<false>(p)), d)
}

/// IQ4_NL's and IQ4_XS's 16 values plus 128 (`scalar::iq4_u`) in each 128-bit lane:
/// `vpshufb` of it by a vector of indices gives their values as unsigned bytes, the zero point
/// 128 taken back as Q8_0's.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,f16c,bmi2")]
pub(super) unsafe fn iq4_table() -> __m512i {
    codebook_table(&super::grids::IQ4)
}

/// [`iq4_table`] for any format of 4-bit indices (the grid formats too).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,f16c,bmi2")]
pub(super) unsafe fn codebook_table(codebook: &super::grids::Codebook) -> __m512i {
    let values: [u8; 16] = std::array::from_fn(|q| super::scalar::codebook_u(codebook, q as u8));
    _mm512_broadcast_i32x4(_mm_loadu_si128(values.as_ptr().cast()))
}

/// The 8 groups of 32 weights in 4 nibble vectors at `p` (low nibbles groups 0-3, high 4-7).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,f16c,bmi2")]
pub(super) unsafe fn nibble_groups(p: *const u8) -> [__m512i; 8] {
    let mask = _mm512_set1_epi8(0x0F);
    let v: [__m512i; 4] = std::array::from_fn(|t| _mm512_loadu_si512(p.add(VECTOR * t).cast()));
    std::array::from_fn(|g| {
        if g < 4 {
            _mm512_and_si512(v[g], mask)
        } else {
            _mm512_and_si512(_mm512_srli_epi16::<4>(v[g - 4]), mask)
        }
    })
}

/// The 8 groups of 32 five-bit weights at `quants` (a Q5_1 block, a Q5_K sub-block): 4 nibble
/// vectors, then one vector of fifth bits as planes (bit `g` of a byte is group `g`'s). Each
/// group's bits move to bit 4 and join its nibbles (`a | (b & 0x10)`: one `vpternlogd`); a
/// 16-bit shift of at most 4 places moves no other byte's bit there.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,f16c,bmi2")]
pub(super) unsafe fn five_bit_groups(quants: *const u8) -> [__m512i; 8] {
    let low = nibble_groups(quants);
    let planes = _mm512_loadu_si512(quants.add(at::Q5_BITS).cast());
    let bit = _mm512_set1_epi8(0x10);
    std::array::from_fn(|g| {
        let moved = match g {
            0 => _mm512_slli_epi16::<4>(planes),
            1 => _mm512_slli_epi16::<3>(planes),
            2 => _mm512_slli_epi16::<2>(planes),
            3 => _mm512_slli_epi16::<1>(planes),
            4 => planes,
            5 => _mm512_srli_epi16::<1>(planes),
            6 => _mm512_srli_epi16::<2>(planes),
            _ => _mm512_srli_epi16::<3>(planes),
        };
        _mm512_ternarylogic_epi32::<0xF8>(low[g], moved, bit)
    })
}

/// The 8 groups of 32 six-bit weights at `quants` (a Q6_K sub-block pair): 4 nibble vectors,
/// then two vectors of top bits, group `g`'s in bits 2 (g mod 4) of vector g / 4. Each
/// group's bits move to bits 4-5 and join its nibbles (`a | (b & 0x30)`: one `vpternlogd`).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,f16c,bmi2")]
pub(super) unsafe fn six_bit_groups(quants: *const u8) -> [__m512i; 8] {
    let low = nibble_groups(quants);
    let tops: [__m512i; 2] =
        std::array::from_fn(|h| _mm512_loadu_si512(quants.add(at::Q6_TOPS + VECTOR * h).cast()));
    let mask = _mm512_set1_epi8(0x30);
    std::array::from_fn(|g| {
        let t = tops[g / 4];
        let moved = match g % 4 {
            0 => _mm512_slli_epi16::<4>(t),
            1 => _mm512_slli_epi16::<2>(t),
            2 => t,
            _ => _mm512_srli_epi16::<2>(t),
        };
        _mm512_ternarylogic_epi32::<0xF8>(low[g], moved, mask)
    })
}

/// The 8 groups of 32 three-bit weights at `quants` (a Q3_K piece: `at::Q3_LOW`,
/// `at::Q3_HIGH`): groups 0-3 as `q`, groups 4-7 (the piece's second sub-block) as `16 q`
/// (below 128), each a mask of its low bits' vector, as it is or shifted right by 2, joined
/// to its third bit (`a | (b & m)`: one `vpternlogd`) from the third bits' vector as it is or
/// shifted by one or two places (a 16-bit shift: the bits it moves across bytes fall outside
/// the masks).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,f16c,bmi2")]
pub(super) unsafe fn three_bit_groups(quants: *const u8) -> [__m512i; 8] {
    let low = two_bit_groups(quants);
    let high = _mm512_loadu_si512(quants.add(at::Q3_HIGH_BITS).cast());
    let highs = [
        high,
        _mm512_srli_epi16::<1>(high),
        _mm512_slli_epi16::<1>(high),
        _mm512_slli_epi16::<2>(high),
    ];
    std::array::from_fn(|g| {
        let high_mask = _mm512_set1_epi8(if g < 4 { 0x04 } else { 0x40 });
        _mm512_ternarylogic_epi32::<0xF8>(low[g], highs[g % 4], high_mask)
    })
}

/// [`three_bit_groups`] with groups 4-7 as `q` too (each byte `16 q`, so a 16-bit shift right
/// by 4 takes nothing across bytes): indices for `vpshufb` (the grid formats' 3-bit indices).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,f16c,bmi2")]
pub(super) unsafe fn three_bit_indices(quants: *const u8) -> [__m512i; 8] {
    let groups = three_bit_groups(quants);
    std::array::from_fn(|g| {
        if g < 4 {
            groups[g]
        } else {
            _mm512_srli_epi16::<4>(groups[g])
        }
    })
}

/// The 8 groups of 32 two-bit weights at `quants` (Q2_K's, Q3_K's low parts: `at::Q3_LOW`):
/// groups 0-3 as `q`, groups 4-7 as `16 q`, each a mask of a vector as it is or shifted right
/// by 2 (a 16-bit shift: the bits it moves across bytes fall outside the masks).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,f16c,bmi2")]
pub(super) unsafe fn two_bit_groups(quants: *const u8) -> [__m512i; 8] {
    let low: [__m512i; 2] =
        std::array::from_fn(|v| _mm512_loadu_si512(quants.add(VECTOR * v).cast()));
    let lows = [
        low[0],
        _mm512_srli_epi16::<2>(low[0]),
        low[1],
        _mm512_srli_epi16::<2>(low[1]),
    ];
    std::array::from_fn(|g| {
        let mask = _mm512_set1_epi8(if g < 4 { 0x03 } else { 0x30 });
        _mm512_and_si512(lows[g % 4], mask)
    })
}

/// One format's unit (`columns::unit_bytes`) of a strip against `R` activation rows, added
/// into the rows' 16 outputs.
pub(super) trait Format {
    const FORMAT: QuantFormat;
    /// How many times `unit` advances the stream: once per block, or per Q4_K/Q6_K 32
    /// weights, so the requests for the weights ahead come between the multiplies.
    const PACES: usize;
    /// Whether a pass takes two strips ([`Format::units`]): the formats whose weights
    /// decode in few instructions, where the activations' broadcasts are what a pass saves.
    const PAIRED: bool = false;

    /// A format implements this or [`Format::units`].
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,f16c,bmi2")]
    unsafe fn unit<const R: usize, A: Advance>(
        unit: *const u8,
        i: usize,
        x: &Acts<R>,
        acc: &mut [__m512; R],
        stream: &mut A,
    ) {
        Self::units::<R, 1, A>([unit], i, x, std::array::from_mut(acc), stream);
    }

    /// `S` strips' units (`units[s]`), each added into its rows' outputs `acc[s]`: two
    /// strips only where `PAIRED`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,f16c,bmi2")]
    unsafe fn units<const R: usize, const S: usize, A: Advance>(
        units: [*const u8; S],
        i: usize,
        x: &Acts<R>,
        acc: &mut [[__m512; R]; S],
        stream: &mut A,
    ) {
        assert!(S == 1, "{} takes one strip a pass", Self::FORMAT.name());
        Self::unit::<R, A>(units[0], i, x, &mut acc[0], stream);
    }
}

/// What a pass requests ahead of its multiplies: one stream ([`Stream`]), or one per strip
/// ([`Pair`]).
pub(super) trait Advance {
    unsafe fn advance(&mut self);
}

impl Advance for Stream {
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,f16c,bmi2")]
    unsafe fn advance(&mut self) {
        Stream::advance(self);
    }
}

/// A two-strip pass's streams, advanced together: each strip's weights, at the same offset.
struct Pair([Stream; 2]);

impl Advance for Pair {
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,f16c,bmi2")]
    unsafe fn advance(&mut self) {
        self.0[0].advance();
        self.0[1].advance();
    }
}

/// A product's share: `count` strips laid end to end at `strips` (the last with `last` rows)
/// against activation rows `first..` of `acts`, row `first + r`'s outputs at
/// `out + r * stride` (strip `s`'s at `+ 16 s`), lent to the share (`OutRows`).
pub(super) struct Share<'a> {
    pub strips: *const u8,
    pub count: usize,
    pub last: usize,
    pub acts: &'a QuantizedRows,
    pub first: usize,
    pub out: *mut f32,
    pub stride: usize,
}

/// Strips `s..s + S` of the share against its activation rows `start..start + R` (`x`).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,f16c,bmi2")]
unsafe fn pass<F: Format, const R: usize, const S: usize, A: Advance>(
    share: &Share<'_>,
    x: &Acts<R>,
    s: usize,
    start: usize,
    stream: &mut A,
) {
    let units = share.acts.k / columns::unit_weights(F::FORMAT);
    let unit_bytes = columns::unit_bytes(F::FORMAT);
    let strips: [*const u8; S] =
        std::array::from_fn(|t| share.strips.add((s + t) * units * unit_bytes));
    let mut acc = [[_mm512_setzero_ps(); R]; S];
    for i in 0..units {
        let at = strips.map(|strip| strip.add(i * unit_bytes));
        F::units::<R, S, A>(at, i, x, &mut acc, stream);
    }
    for t in 0..S {
        let rows = if s + t + 1 == share.count {
            share.last
        } else {
            STRIP
        };
        let mask = ((1u32 << rows) - 1) as __mmask16;
        let out = share.out.add(start * share.stride + STRIP * (s + t));
        for r in 0..R {
            _mm512_mask_storeu_ps(out.add(r * share.stride), mask, acc[t][r]);
        }
    }
}

/// Every strip of the share against activation rows `first..first + R`, a pass each: their
/// activations' places found once for all of the strips.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,f16c,bmi2")]
unsafe fn strips_of<F: Format, const R: usize>(
    share: &Share<'_>,
    first: usize,
    stream: &mut Stream,
) {
    let x = Acts::<R>::new(share.acts, F::FORMAT, share.first + first);
    for s in 0..share.count {
        pass::<F, R, 1, Stream>(share, &x, s, first, stream);
    }
}

/// [`strips_of`] two strips a pass (a share of an odd count takes its last alone). The first
/// block's passes (`next` none) ask for each strip's weights ahead ([`Pair`]); the blocks after
/// it, the next share's into L2 (`next`), as [`tiles`]' do.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,f16c,bmi2")]
unsafe fn pairs_of<F: Format, const R: usize>(
    share: &Share<'_>,
    first: usize,
    mut next: Option<&mut Stream>,
) {
    let x = Acts::<R>::new(share.acts, F::FORMAT, share.first + first);
    let strip_len =
        share.acts.k / columns::unit_weights(F::FORMAT) * columns::unit_bytes(F::FORMAT);
    let step = columns::unit_bytes(F::FORMAT).div_ceil(F::PACES);
    for s in (0..share.count).step_by(2) {
        let at = |t: usize| Stream::new(share.strips.add((s + t) * strip_len), strip_len, step, R);
        match (next.as_deref_mut(), s + 1 < share.count) {
            (Some(next), true) => pass::<F, R, 2, Stream>(share, &x, s, first, next),
            (Some(next), false) => pass::<F, R, 1, Stream>(share, &x, s, first, next),
            (None, true) => {
                let mut pair = Pair([at(0), at(1)]);
                pass::<F, R, 2, Pair>(share, &x, s, first, &mut pair);
            }
            (None, false) => pass::<F, R, 1, Stream>(share, &x, s, first, &mut at(0)),
        }
    }
}

const _: () = assert!(
    PAIRED_FROM >= 9 && PAIRED_ROWS == 6,
    "paired_tiles' row counts"
);

/// Activation rows `0..rows` of the share against its strips, in blocks of at most
/// [`ACT_ROWS_PER_BLOCK`] rows, each block one tile of its row count (1 to 8: a verify of 5
/// rows passed as tiles of 4 and 1, and a one-row tile multiplies at half the pace of a
/// four-row one, so 5 rows cost 4 and 1 more than 4). A strip at a time, while it is in L1;
/// the weights ahead are requested at the pace of the tile's passes ([`Stream`]). The blocks
/// after the first find the share's weights in cache, and ask for the next share's into L2
/// instead, each for its part, so memory keeps streaming while they multiply.
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,f16c,bmi2")]
unsafe fn tiles<F: Format>(share: &Share<'_>, rows: usize) {
    if F::PAIRED && rows >= PAIRED_FROM {
        return paired_tiles::<F>(share, rows);
    }
    let units = share.acts.k / columns::unit_weights(F::FORMAT);
    let unit_bytes = columns::unit_bytes(F::FORMAT);
    let len = share.count * units * unit_bytes;
    let blocks = rows.div_ceil(ACT_ROWS_PER_BLOCK);
    for block in 0..blocks {
        // Blocks as even as they come (9 rows: 5 and 4, not 8 and a slow 1).
        let first = block * rows / blocks;
        let block_rows = (block + 1) * rows / blocks - first;
        let mut stream = if block == 0 {
            Stream::new(share.strips, len, unit_bytes.div_ceil(F::PACES), block_rows)
        } else {
            // Past the share's end: the next share's weights, which this thread multiplies
            // next unless the other threads took them.
            let part = len.div_ceil(blocks - 1);
            let from = share.strips.wrapping_add(len + (block - 1) * part);
            let advances = share.count * units * F::PACES;
            Stream::into_l2(from, part, part.div_ceil(advances))
        };
        let stream = &mut stream;
        match block_rows {
            8 => strips_of::<F, 8>(share, first, stream),
            7 => strips_of::<F, 7>(share, first, stream),
            6 => strips_of::<F, 6>(share, first, stream),
            5 => strips_of::<F, 5>(share, first, stream),
            4 => strips_of::<F, 4>(share, first, stream),
            3 => strips_of::<F, 3>(share, first, stream),
            2 => strips_of::<F, 2>(share, first, stream),
            _ => strips_of::<F, 1>(share, first, stream),
        }
    }
}

/// The fewest rows a `PAIRED` format's product takes two strips a pass for: fewer rows
/// broadcast fewer activations for each weight vector loaded, and one row (a decode step)
/// streams its weights from memory.
const PAIRED_FROM: usize = 9;

/// The most rows a pass over two strips takes: two sums a row, their f32 totals, the
/// weights and the broadcast fill the 32 vector registers.
const PAIRED_ROWS: usize = 6;

/// [`tiles`] two strips a pass (a share of an odd count takes its last alone), in blocks of
/// at most [`PAIRED_ROWS`] rows. The first block's passes ask for each strip's weights
/// ahead ([`Pair`]); the blocks after it, the next share's into L2, as [`tiles`]' do.
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,f16c,bmi2")]
unsafe fn paired_tiles<F: Format>(share: &Share<'_>, rows: usize) {
    let units = share.acts.k / columns::unit_weights(F::FORMAT);
    let len = share.count * units * columns::unit_bytes(F::FORMAT);
    let blocks = rows.div_ceil(PAIRED_ROWS);
    for block in 0..blocks {
        let first = block * rows / blocks;
        let block_rows = (block + 1) * rows / blocks - first;
        let mut next = (block > 0).then(|| {
            let part = len.div_ceil(blocks - 1);
            let from = share.strips.wrapping_add(len + (block - 1) * part);
            let advances = share.count.div_ceil(2) * units * F::PACES;
            Stream::into_l2(from, part, part.div_ceil(advances))
        });
        // At least PAIRED_FROM rows in blocks of at most PAIRED_ROWS as even as they come:
        // every block has 4 to 6 rows (9 rows: 4 and 5; more: over 3.6 a block), and no other
        // count is compiled.
        match block_rows {
            6 => pairs_of::<F, 6>(share, first, next.as_mut()),
            5 => pairs_of::<F, 5>(share, first, next.as_mut()),
            4 => pairs_of::<F, 4>(share, first, next.as_mut()),
            _ => unreachable!("a paired block of {block_rows} rows"),
        }
    }
}

impl<'a> Share<'a> {
    /// The share of `dot_strips` (either kernel's), its sizes checked: `bytes` holds whole
    /// strips of `outputs` rows, `acts` rows `first..first + out.rows()` exist and were
    /// quantized for `format` on `kernel`, and `out`'s rows are `outputs` wide.
    pub fn new(
        kernel: Kernel,
        format: QuantFormat,
        bytes: &[u8],
        outputs: usize,
        acts: &'a QuantizedRows,
        first: usize,
        mut out: OutRows<'a>,
    ) -> Self {
        let count = columns::strips(outputs);
        let rows = out.rows();
        assert_eq!(bytes.len(), count * columns::strip_bytes(format, acts.k));
        assert!(rows > 0 && outputs > 0 && (first + rows) * acts.k <= acts.q.len());
        assert_eq!(out.width(), outputs, "outputs");
        assert!(
            acts.serves(kernel)
                && acts.block == format.activation_block()
                && acts.ready_for(format),
            "activations not quantized for {}",
            format.name()
        );
        Self {
            strips: bytes.as_ptr(),
            count,
            last: outputs - (count - 1) * STRIP,
            acts,
            first,
            stride: out.stride(),
            out: out.as_mut_ptr(),
        }
    }
}

/// Where the VNNI kernel adds Q6_K's zero point (32) when it need not round as the AMX tiles
/// do: the two give the same products but for f32 rounding, and each is the faster on some
/// CPUs (docs/benchmarks.md, sessions 33 and 54).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Q6Zero {
    /// Where each 16-weight sub-block's sums start (`QuantizedRows::zero_q6`): a broadcast
    /// load per sub-block and activation row, no multiply. Faster where one `vpdpbusd` issues
    /// a cycle (Zen 4), whose ports the other form's `vpdpwssd`s would take.
    AtStart,
    /// Once per super-block: eight `vpdpwssd`s per super-block and activation row. Faster
    /// where two `vpdpbusd`s issue a cycle against two vector loads (Zen 5), so that every
    /// load beside them costs a `vpdpbusd`'s slot.
    PerSuperBlock,
}

impl Q6Zero {
    /// The form's name in reports.
    pub fn name(self) -> &'static str {
        match self {
            Self::AtStart => "sub-block start",
            Self::PerSuperBlock => "per super-block",
        }
    }

    /// This CPU's form.
    pub fn here() -> Self {
        if crate::cpu::two_vnni_a_cycle() {
            Self::PerSuperBlock
        } else {
            Self::AtStart
        }
    }
}

/// Row `r` of `out` = weight rows `j < outputs` of the strips in `bytes` dotted with
/// activation row `first + r`, for every row `out` lends. Where `exact`, Q4_K's and Q6_K's
/// sums round as the AMX tiles' do, for a process whose tiles multiply them (their rows'
/// outputs are then the same bits on either kernel); otherwise in the fastest arithmetic.
pub(super) fn dot_strips(
    format: QuantFormat,
    bytes: &[u8],
    outputs: usize,
    acts: &QuantizedRows,
    first: usize,
    out: OutRows<'_>,
    exact: bool,
) {
    dot_strips_with(
        format,
        bytes,
        outputs,
        acts,
        first,
        out,
        exact,
        Q6Zero::here(),
    );
}

/// [`dot_strips`] with Q6_K's zero point added where `q6_zero` says (unless `exact`).
#[allow(clippy::too_many_arguments)]
pub(super) fn dot_strips_with(
    format: QuantFormat,
    bytes: &[u8],
    outputs: usize,
    acts: &QuantizedRows,
    first: usize,
    out: OutRows<'_>,
    exact: bool,
    q6_zero: Q6Zero,
) {
    let rows = out.rows();
    let share = Share::new(Kernel::Avx512Vnni, format, bytes, outputs, acts, first, out);
    // SAFETY: the caller (Kernel::detect) checked the features; `Share::new` checked that
    // `bytes` holds whole strips of `k`-weight rows, that rows `first..first + rows` exist in
    // `acts`, quantized for `format`, and that `out` lends `rows` rows of `outputs` columns;
    // every store is masked to those columns.
    unsafe {
        match format {
            QuantFormat::Q8_0 => tiles::<Q8_0>(&share, rows),
            QuantFormat::Q5_0 => tiles::<Q5_0>(&share, rows),
            QuantFormat::Q5_1 => tiles::<Q5_1>(&share, rows),
            QuantFormat::Q4_1 => tiles::<Q4_1>(&share, rows),
            QuantFormat::Q4_0 => tiles::<Q4_0>(&share, rows),
            QuantFormat::Q4K if exact => tiles::<Q4K<true>>(&share, rows),
            QuantFormat::Q4K => tiles::<Q4K<false>>(&share, rows),
            QuantFormat::Q5K => tiles::<Q5K>(&share, rows),
            QuantFormat::Q6K if exact => tiles::<Q6K<true, false>>(&share, rows),
            QuantFormat::Q6K if q6_zero == Q6Zero::PerSuperBlock => {
                tiles::<Q6K<false, true>>(&share, rows)
            }
            QuantFormat::Q6K => tiles::<Q6K<false, false>>(&share, rows),
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
