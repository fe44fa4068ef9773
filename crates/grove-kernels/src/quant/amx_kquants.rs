//! The AMX kernel's K-quants (`amx_columns.rs`): Q4_K and Q6_K spread their sub-block scales
//! into their weights as two planes of bytes, so that a super-block's sums stay in two `C`
//! tiles over four full-width products and are stored once: a tile's stores and the lanes'
//! scaling cost more than its products (docs/benchmarks.md, sessions 47 and 48).
// SAFETY (all of the module): as `amx_columns.rs`, whose kernel inlines every function here:
// pointers are inside the strips and activation rows `Share::new` checked, or the kernel's
// own buffers; every function is reached only from code compiled for AVX-512.
#![allow(unsafe_code)]
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;

use super::amx_columns::{Format, Spread, Sums, Tile};
use super::amx_tiles::{Tiles, ROW_BYTES};
use super::columns::{at, VECTOR};
use super::simd_columns::{byte_ints, halves, nibble_groups, six_bit_groups};
use super::simd_kquants::{dpwssd_broadcast, paired_bytes};
use super::QuantFormat;

pub(super) struct Q4K;
pub(super) struct Q6K;

/// Steps of 64 weights a super-block.
const STEPS: usize = 4;

/// A K-quant whose sub-block scales ride in its weights: step `step`'s 64 weights spread as
/// two planes of bytes, whose sums add up as `C0 + (C1 << SHIFT)`.
pub(super) trait KQuant {
    const FORMAT: QuantFormat;
    const SHIFT: u32;
    /// Whether the second plane is signed bytes (the first is unsigned).
    const SIGNED: bool;
    /// Whether the weights have mins (Q4_K's), whose term is taken once per super-block.
    const MINS: bool;
    /// [`Format::SHARED_ROWS`]: Q6_K's spread (16-bit products split into bytes) costs
    /// twice Q4_K's.
    const SHARED_ROWS: usize;
    unsafe fn spread(unit: *const u8, step: usize, out: &mut Spread);
}

/// A [`KQuant`] as the AMX kernel runs it: a super-block's four steps of full-width products
/// into two `C` tiles, stored after the last and scaled once.
pub(super) struct Planes<K>(std::marker::PhantomData<K>);

impl<K: KQuant> Format for Planes<K> {
    const FORMAT: QuantFormat = K::FORMAT;
    const STEPS: usize = STEPS;
    const K_BYTES: usize = ROW_BYTES;
    const SHARED_ROWS: usize = K::SHARED_ROWS;

    #[inline(always)]
    unsafe fn spread(unit: *const u8, step: usize, out: &mut Spread) {
        K::spread(unit, step, out);
    }

    fn offsets(i: usize, step: usize) -> [usize; 2] {
        [256 * i + 64 * step; 2]
    }

    #[inline(always)]
    unsafe fn products<T: Tiles, const R: usize, const C0: u8, const C1: u8>(
        tiles: &mut T,
        x: &Tile<R>,
        (_, spread): (*const u8, &Spread),
        offsets: [usize; 2],
        step: usize,
    ) {
        plane_products::<K, T, R, C0, C1>(tiles, x, spread, offsets[0], step);
    }

    fn stored(step: usize) -> bool {
        step + 1 == STEPS
    }

    #[inline(always)]
    unsafe fn scale<const R: usize>(
        _: &Tile<R>,
        sums: &Sums,
        (unit, _, step): (*const u8, usize, usize),
        block: &mut [__m512; R],
        _: &mut [__m512; R],
    ) {
        if step + 1 == STEPS {
            planes_scaled(sums, K::SHIFT, unit, block);
        }
    }

    #[inline(always)]
    unsafe fn end_unit<const R: usize>(
        x: &Tile<R>,
        unit: *const u8,
        i: usize,
        block: &[__m512; R],
        acc: &mut [__m512; R],
    ) {
        let mut block = *block;
        if K::MINS {
            subtract_mins(x, &mut block, unit, i);
        }
        finish_super_block(x, acc, &block, i);
    }
}

/// A K-quant step's two planes (`B` tiles 4 and 5, spread) against its 64 activations from
/// `offset` in each row (`A` tile 2), added into `C` tiles `C0` and `C1` (the super-block's
/// pair): sums that start at its first step and are stored after its last. The first plane
/// is unsigned bytes (`tdpbsud`), the second signed (`tdpbssd`) where the format's `SIGNED`
/// says so.
#[inline(always)]
unsafe fn plane_products<K: KQuant, T: Tiles, const R: usize, const C0: u8, const C1: u8>(
    tiles: &mut T,
    x: &Tile<R>,
    spread: &Spread,
    offset: usize,
    step: usize,
) {
    if step == 0 {
        tiles.zero::<C0>();
        tiles.zero::<C1>();
    }
    tiles.load::<2>(x.q.add(offset), x.k);
    x.ask_ahead(offset);
    tiles.load::<4>(spread.plane(0), VECTOR);
    tiles.load::<5>(spread.plane(1), VECTOR);
    tiles.dot::<C0, 2, 4>();
    if K::SIGNED {
        tiles.dot_signed::<C1, 2, 5>();
    } else {
        tiles.dot::<C1, 2, 5>();
    }
}

/// A super-block's stored planes' sums added in integers, `C0 + (C1 << shift)`: its
/// sub-blocks' sums times their scales. Converted once and multiplied by `d` into `block`.
#[inline(always)]
unsafe fn planes_scaled<const R: usize>(
    sums: &Sums,
    shift: u32,
    unit: *const u8,
    block: &mut [__m512; R],
) {
    let d = halves(unit.add(at::D));
    let shift = _mm512_set1_epi32(shift as i32);
    for m in 0..R {
        let high = _mm512_sllv_epi32(sums.row(1, m), shift);
        let sum = _mm512_add_epi32(sums.row(0, m), high);
        block[m] = _mm512_mul_ps(_mm512_cvtepi32_ps(sum), d);
    }
}

/// Q4_K's sub-block scales go into its weights, so that a super-block's sums stay in the
/// tiles: a 6-bit scale is `16 h + l` (`h < 4`, `l < 16`), and a step's two sub-blocks (64
/// weights, one full-width product) are spread as two planes of bytes, `q * l` and `q * h`
/// (at most 225: unsigned bytes), whose products add up over the super-block's four steps in
/// two `C` tiles. Stored once, `16 C_h + C_l` is the super-block's integer sum of each
/// sub-block's sum times its scale, converted once and multiplied by `d`: the VNNI kernel's
/// bits (`with_mins`), with a quarter of the stores and scaling of a tile product a
/// sub-block.
impl KQuant for Q4K {
    const FORMAT: QuantFormat = QuantFormat::Q4K;
    const SHIFT: u32 = 4;
    const SIGNED: bool = false;
    const MINS: bool = true;
    const SHARED_ROWS: usize = 128;

    #[inline(always)]
    unsafe fn spread(unit: *const u8, pair: usize, out: &mut Spread) {
        for h in 0..2 {
            let j = 2 * pair + h;
            let scales = byte_ints::<false>(unit.add(at::q4k_scales(j)));
            // Lane `p` (row `p`'s four weights) is two 16-bit words: each gets the row's
            // factor, and a word's two bytes' products (at most 225) stay in their bytes.
            let words = |factor: __m512i| _mm512_or_si512(factor, _mm512_slli_epi32::<16>(factor));
            let low = words(_mm512_and_si512(scales, _mm512_set1_epi32(15)));
            let high = words(_mm512_srli_epi32::<4>(scales));
            let groups = nibble_groups(unit.add(at::q4k_quants(j)));
            out.put(0, 8 * h, groups.map(|g| _mm512_mullo_epi16(g, low)));
            out.put(1, 8 * h, groups.map(|g| _mm512_mullo_epi16(g, high)));
        }
    }
}

/// A Q4_K super-block's mins' term taken from `block`, in integers once per super-block as
/// the VNNI kernel's (`with_mins`): per activation row, its 8 sub-blocks' sums (16 bits, two
/// to a broadcast word) against the 16 rows' 6-bit mins in four `vpdpwssd`s, then one
/// conversion and one multiply-add by `dmin`.
#[inline(always)]
unsafe fn subtract_mins<const R: usize>(
    x: &Tile<R>,
    block: &mut [__m512; R],
    unit: *const u8,
    i: usize,
) {
    let mins: [__m512i; 4] =
        std::array::from_fn(|t| paired_bytes::<false>(unit.add(at::q4k_mins(2 * t))));
    let dmin = halves(unit.add(at::DMIN));
    let pairs: [*const i16; 4] = std::array::from_fn(|t| x.side.pairs(4 * i + t));
    for m in 0..R {
        let mut sums = _mm512_setzero_si512();
        for t in 0..4 {
            sums = dpwssd_broadcast(sums, mins[t], pairs[t].add(2 * m));
        }
        block[m] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(sums), dmin, block[m]);
    }
}

/// A K-quant super-block's scaled sums into the outputs, times each row's activation scale
/// of super-block `i`.
#[inline(always)]
unsafe fn finish_super_block<const R: usize>(
    x: &Tile<R>,
    acc: &mut [__m512; R],
    block: &[__m512; R],
    i: usize,
) {
    let scales = x.side.scales(i);
    for m in 0..R {
        let scale = _mm512_set1_ps(*scales.add(m));
        acc[m] = _mm512_fmadd_ps(block[m], scale, acc[m]);
    }
}

/// Q6_K's signed sub-block scales go into its weights as Q4_K's do (`impl KQuant for Q4K`):
/// a step is four 16-weight sub-blocks (64 weights, one full-width product a plane). Each
/// centred weight `w = q - 32` times its sub-block's scale `s` is a 16-bit product `s w`
/// (`|s w| <= 128 * 32`, one `vpmullw` per vector for the even weights and one for the odd),
/// and its two bytes are the two planes: the low byte unsigned, the high byte signed (at
/// most 16 in size). Over a super-block's four steps their products add up in two `C`
/// tiles, and `C0 + 256 C1` is the super-block's integer sum of each sub-block's sum times
/// its scale, converted once and multiplied by `d`: the VNNI kernel's bits (`simd_columns`).
/// The centred weights need no zero point.
impl KQuant for Q6K {
    const FORMAT: QuantFormat = QuantFormat::Q6K;
    const SHIFT: u32 = 8;
    const SIGNED: bool = true;
    const MINS: bool = false;
    const SHARED_ROWS: usize = 32;

    #[inline(always)]
    unsafe fn spread(unit: *const u8, quad: usize, out: &mut Spread) {
        let centre = _mm512_set1_epi8(32);
        let odd_bytes: __mmask64 = 0xAAAA_AAAA_AAAA_AAAA;
        for pair in 0..2 {
            let j = 2 * quad + pair;
            let groups = six_bit_groups(unit.add(at::q6k_quants(j)));
            for half in 0..2 {
                // The sub-block's 16 scales, each in both 16-bit words of its row's lane.
                let scales = byte_ints::<true>(unit.add(at::q6k_scales(2 * j + half)));
                let low_word = _mm512_and_si512(scales, _mm512_set1_epi32(0xFFFF));
                let scales = _mm512_or_si512(low_word, _mm512_slli_epi32::<16>(scales));
                for g in 4 * half..4 * half + 4 {
                    let w = _mm512_sub_epi8(groups[g], centre);
                    // Each word's even and odd byte, sign-extended, times the scale.
                    let even = _mm512_srai_epi16::<8>(_mm512_slli_epi16::<8>(w));
                    let even = _mm512_mullo_epi16(even, scales);
                    let odd = _mm512_mullo_epi16(_mm512_srai_epi16::<8>(w), scales);
                    let low = _mm512_mask_blend_epi8(odd_bytes, even, _mm512_slli_epi16::<8>(odd));
                    let high = _mm512_mask_blend_epi8(odd_bytes, _mm512_srli_epi16::<8>(even), odd);
                    out.put_row(0, 8 * pair + g, low);
                    out.put_row(1, 8 * pair + g, high);
                }
            }
        }
    }
}
