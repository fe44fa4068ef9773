//! The AMX-INT8 kernel of the column layout (`columns.rs`): a strip of 16 weight rows against
//! up to 16 activation rows per tile product.
//!
//! The layout was made for this: a strip's group vector (the same four weights of 16 rows in
//! 64 bytes) is one row of an AMX `B` tile, so a block's 8 group vectors are a `B` tile of 8
//! rows as they lie in memory (Q8_0), or once their nibbles are spread to bytes (Q5_0, Q4_K,
//! Q6_K, into a buffer). Up to 16 activation rows' bytes of the same block, read at the
//! activations' row stride, are the `A` tile, and one `tdpbsud` (signed activations, unsigned
//! weights) leaves the block's 16 x 16 integer sums in a `C` tile. Each block's sums are
//! stored and scaled in 16 lanes exactly as the AVX-512 VNNI kernel scales its own
//! (`simd_columns.rs`: the same integer sums, the same float operations in the same order), so
//! both kernels give the same bits and a row's outputs do not depend on which kernel, or
//! which tile, it went through. Q4_K instead spreads its sub-block scales into its weights
//! (two planes of bytes), so that a super-block's sums stay in two `C` tiles over four
//! full-width products and are stored once (`impl Format for Q4K`): a tile's stores and the
//! lanes' scaling cost more than its products. A step is two blocks (tiles 0, 2, 4 and 1, 3,
//! 5), and the steps are pipelined: the tiles multiply a step ahead of the lanes that scale
//! its sums, and the weights are spread a step ahead of the tiles, because the tiles wait for
//! the lanes' stores to reach the cache before loading them and the lanes for the tiles'
//! stores.
//!
//! The arithmetic is written once, over [`Tiles`]: on the CPU's tiles and on a model of them
//! that tests run on any AVX-512 machine. What the tiles leave, the lanes finish in AVX-512
//! (every AMX CPU has it) with the VNNI kernel's own helpers: written as loops over arrays,
//! LLVM vectorized the scaling across activation rows, with gathers, and the work around the
//! tiles alone ran at a sixth of the VNNI kernel's whole product (docs/benchmarks.md).
// SAFETY (all of the module): pointers are inside the strips and activation rows `Share::new`
// checked, or the kernel's own buffers; every function is compiled for AVX-512 and reached
// only where it runs (the hardware tiles where `cpu::Level::Amx` is allowed: `Kernel::Amx`
// reaches here only through `Kernel::runs_here`; the model where `Level::Avx512` is).
#![allow(unsafe_code)]
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;

use super::amx_tiles::{Config, Hardware, Tiles, ROWS, ROW_BYTES};
use super::columns::{self, at, STRIP, VECTOR};
use super::simd::Stream;
use super::simd_columns::{
    byte_ints, byte_scales, dpwssd_broadcast, halves, nibble_groups, paired_bytes, six_bit_groups,
    Acts, Share,
};
use super::{Kernel, QuantFormat, QuantizedRows};
use crate::threads::OutRows;

/// Where `GROVE_KERNEL=amx` forces the tiles (or a test names the AMX kernel), fewer
/// activation rows than this go through the VNNI kernel: a tile product of one row wastes 15
/// of its 16. 4 is where llama.cpp's AMX kernels take over from its AVX-512 ones; otherwise a
/// trial on the machine decides (`amx_trial`).
pub const MIN_ROWS: usize = 4;

/// 16 activation rows x 16 weight rows of 32-bit values, a tile's rows as stored.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Block([[i32; STRIP]; ROWS]);

impl Block {
    /// Activation row `m`'s 16 sums.
    #[inline(always)]
    unsafe fn row(&self, m: usize) -> __m512i {
        _mm512_load_si512(self.0[m].as_ptr().cast())
    }
}

/// One step's weights spread to bytes: two `B` tiles' rows (Q6_K: two 16-weight sub-blocks,
/// the halves of one 8-row buffer; Q4_K: two planes of 16 rows).
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Spread([[u8; ROWS * VECTOR]; 2]);

impl Spread {
    /// Tile `b`'s 8 group vectors from row `first`.
    #[inline(always)]
    unsafe fn put(&mut self, b: usize, first: usize, groups: [__m512i; 8]) {
        for (g, vector) in groups.into_iter().enumerate() {
            let row = self.0[b].as_mut_ptr().add(VECTOR * (first + g));
            _mm512_store_si512(row.cast(), vector);
        }
    }
}

/// One format's part of a strip against a tile of `R` activation rows. A unit of the strip
/// is [`Format::STEPS`] steps; a step is two tile products (two blocks' integer sums), which
/// the lanes then scale into the rows' outputs.
trait Format {
    const FORMAT: QuantFormat;
    /// Group vectors per scaled block (a `B` tile's rows): 8, Q6_K's 16-weight blocks 4.
    const GROUPS: usize = 8;
    /// Steps per unit.
    const STEPS: usize;
    /// Bytes of a row of an `A` tile: the activations one tile product takes (a block's).
    const K_BYTES: usize = 4 * Self::GROUPS;
    /// Step `step` of `unit`'s weights spread to bytes, where the format needs it.
    #[inline(always)]
    unsafe fn spread(_unit: *const u8, _step: usize, _out: &mut Spread) {}
    /// The two `B` tiles of step `step` of `unit`, rows of 64 bytes (`spread` holds what
    /// [`Format::spread`] left for this step).
    unsafe fn weights(unit: *const u8, step: usize, spread: &Spread) -> [*const u8; 2];
    /// Where the two blocks' activation values start in each row, for unit `i`: a 32-weight
    /// format's two blocks.
    fn offsets(i: usize, _step: usize) -> [usize; 2] {
        [64 * i, 64 * i + 32]
    }
    /// Step `step`'s tile products into `out`: by default two blocks' sums, each product from
    /// zero and stored.
    #[inline(always)]
    unsafe fn products<T: Tiles, const R: usize>(
        tiles: &mut T,
        x: &Tile<R>,
        weights: [*const u8; 2],
        offsets: [usize; 2],
        _step: usize,
        out: &mut [Block; 2],
    ) {
        two_sums(tiles, x, weights, offsets, out);
    }
    /// The step's sums scaled into `block` (a K-quant's super-block, before its activation
    /// scale) or straight into `acc` (a 32-weight format's two blocks).
    #[inline(always)]
    unsafe fn scale<const R: usize>(
        x: &Tile<R>,
        sums: &[Block; 2],
        (unit, i, _): (*const u8, usize, usize),
        _block: &mut [__m512; R],
        acc: &mut [__m512; R],
    ) {
        two_blocks(x, sums, unit, i, acc);
    }
    /// After a unit's last step: `block` into `acc`.
    #[inline(always)]
    unsafe fn end_unit<const R: usize>(
        _x: &Tile<R>,
        _unit: *const u8,
        _i: usize,
        _block: &[__m512; R],
        _acc: &mut [__m512; R],
    ) {
    }
}

/// A tile product's buffers, two steps of each: the sums the tiles stored for the step the
/// lanes scale and for the next; the weights spread for the next step and the one after.
/// The tiles neither forward what they store to the lanes' loads nor load what the lanes
/// just stored without waiting for it to reach the cache, so each waits a step behind.
struct Work {
    sums: [[Block; 2]; 2],
    spread: [Spread; 2],
}

/// The `R` activation rows of one tile product.
struct Tile<const R: usize> {
    /// Row 0's quantized values, row `m`'s `m * k` bytes on: the `A` tiles' rows.
    q: *const u8,
    k: usize,
    /// The rows' scales, zero points and sums, as the VNNI kernel reads them.
    x: Acts<R>,
}

/// Two blocks' integer sums into `out` (each tile row's first `R` rows): blocks whose
/// weights are `B` tiles at `weights` (rows of 64 bytes) and whose activation values start at
/// `offsets` in each row.
#[inline(always)]
unsafe fn two_sums<T: Tiles, const R: usize>(
    tiles: &mut T,
    x: &Tile<R>,
    weights: [*const u8; 2],
    offsets: [usize; 2],
    out: &mut [Block; 2],
) {
    tiles.zero::<0>();
    tiles.zero::<1>();
    tiles.load::<2>(x.q.add(offsets[0]), x.k);
    tiles.load::<4>(weights[0], VECTOR);
    tiles.load::<3>(x.q.add(offsets[1]), x.k);
    tiles.load::<5>(weights[1], VECTOR);
    tiles.dot::<0, 2, 4>();
    tiles.dot::<1, 3, 5>();
    tiles.store::<0>(out[0].0.as_mut_ptr().cast(), ROW_BYTES);
    tiles.store::<1>(out[1].0.as_mut_ptr().cast(), ROW_BYTES);
}

/// A 32-weight block's sums (`sums`, starting at each row's zero point) scaled into the
/// rows' outputs by the 16 rows' f16 scales at `scales` and each row's activation scale of
/// block `block`: the VNNI kernel's `scale_block`.
#[inline(always)]
unsafe fn scale_block<const R: usize>(
    x: &Tile<R>,
    acc: &mut [__m512; R],
    sums: &Block,
    scales: *const u8,
    block: usize,
) {
    let d = halves(scales);
    for m in 0..R {
        let start = _mm512_set1_epi32(*x.x.zero[m].add(block));
        let scale = _mm512_mul_ps(d, _mm512_set1_ps(*x.x.scale[m].add(block)));
        let sum = _mm512_cvtepi32_ps(_mm512_add_epi32(start, sums.row(m)));
        acc[m] = _mm512_fmadd_ps(sum, scale, acc[m]);
    }
}

/// A 32-weight format's two blocks of unit `i` into the outputs.
#[inline(always)]
unsafe fn two_blocks<const R: usize>(
    x: &Tile<R>,
    sums: &[Block; 2],
    unit: *const u8,
    i: usize,
    acc: &mut [__m512; R],
) {
    for b in 0..2 {
        let scales = unit.add(at::block_scales(b));
        scale_block(x, acc, &sums[b], scales, 2 * i + b);
    }
}

struct Q8_0;
struct Q5_0;
struct Q4K;
struct Q6K;

impl Format for Q8_0 {
    const FORMAT: QuantFormat = QuantFormat::Q8_0;
    const STEPS: usize = 1;

    #[inline(always)]
    unsafe fn weights(unit: *const u8, _: usize, _: &Spread) -> [*const u8; 2] {
        [0, 1].map(|b| unit.add(at::q8_block(b)))
    }
}

impl Format for Q5_0 {
    const FORMAT: QuantFormat = QuantFormat::Q5_0;
    const STEPS: usize = 1;

    #[inline(always)]
    unsafe fn spread(unit: *const u8, _: usize, out: &mut Spread) {
        let sixteen = _mm512_set1_epi8(16);
        for b in 0..2 {
            let quants = unit.add(at::q5_block(b));
            let low = nibble_groups(quants);
            let bits = quants.add(at::Q5_BITS).cast::<u64>();
            // The fifth bit of every byte is one bit of a mask register, as the VNNI kernel
            // reads it.
            let mut groups = low;
            for g in 0..8 {
                let fifth: __mmask64 = bits.add(g).read_unaligned();
                groups[g] = _mm512_mask_add_epi8(low[g], fifth, low[g], sixteen);
            }
            out.put(b, 0, groups);
        }
    }

    #[inline(always)]
    unsafe fn weights(_: *const u8, _: usize, spread: &Spread) -> [*const u8; 2] {
        [0, 1].map(|b| spread.0[b].as_ptr())
    }
}

/// A K-quant super-block's sub-block sums scaled by the 16 rows' sub-block `scales`.
#[inline(always)]
unsafe fn scale_sub_block<const R: usize>(
    block: &mut [__m512; R],
    sums: &Block,
    scales: __m512,
    zero: &[i32; R],
) {
    for m in 0..R {
        let sum = _mm512_cvtepi32_ps(_mm512_add_epi32(_mm512_set1_epi32(zero[m]), sums.row(m)));
        block[m] = _mm512_fmadd_ps(sum, scales, block[m]);
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
impl Format for Q4K {
    const FORMAT: QuantFormat = QuantFormat::Q4K;
    /// Pairs of 32-weight sub-blocks.
    const STEPS: usize = 4;
    const K_BYTES: usize = ROW_BYTES;

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

    #[inline(always)]
    unsafe fn weights(_: *const u8, _: usize, spread: &Spread) -> [*const u8; 2] {
        [0, 1].map(|plane| spread.0[plane].as_ptr())
    }

    fn offsets(i: usize, pair: usize) -> [usize; 2] {
        [256 * i + 64 * pair; 2]
    }

    /// Both planes against the step's 64 activations, into sums that start at the
    /// super-block's first step and are stored after its last.
    #[inline(always)]
    unsafe fn products<T: Tiles, const R: usize>(
        tiles: &mut T,
        x: &Tile<R>,
        weights: [*const u8; 2],
        offsets: [usize; 2],
        pair: usize,
        out: &mut [Block; 2],
    ) {
        if pair == 0 {
            tiles.zero::<0>();
            tiles.zero::<1>();
        }
        tiles.load::<2>(x.q.add(offsets[0]), x.k);
        tiles.load::<4>(weights[0], VECTOR);
        tiles.load::<5>(weights[1], VECTOR);
        tiles.dot::<0, 2, 4>();
        tiles.dot::<1, 2, 5>();
        if pair + 1 == Self::STEPS {
            tiles.store::<0>(out[0].0.as_mut_ptr().cast(), ROW_BYTES);
            tiles.store::<1>(out[1].0.as_mut_ptr().cast(), ROW_BYTES);
        }
    }

    #[inline(always)]
    unsafe fn scale<const R: usize>(
        _: &Tile<R>,
        sums: &[Block; 2],
        (unit, _, pair): (*const u8, usize, usize),
        block: &mut [__m512; R],
        _: &mut [__m512; R],
    ) {
        if pair + 1 == Self::STEPS {
            let d = halves(unit.add(at::D));
            for m in 0..R {
                let high = _mm512_slli_epi32::<4>(sums[1].row(m));
                let sum = _mm512_add_epi32(sums[0].row(m), high);
                block[m] = _mm512_mul_ps(_mm512_cvtepi32_ps(sum), d);
            }
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
        subtract_mins(x, &mut block, unit, i);
        finish_super_block(x, acc, &block, i);
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
    let mins: [__m512i; 4] = std::array::from_fn(|t| paired_bytes(unit.add(at::q4k_mins(2 * t))));
    let dmin = halves(unit.add(at::DMIN));
    for m in 0..R {
        let mut sums = _mm512_setzero_si512();
        for t in 0..4 {
            sums = dpwssd_broadcast(sums, mins[t], x.x.sums[m].add(8 * i + 2 * t));
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
    for m in 0..R {
        let scale = _mm512_set1_ps(*x.x.scale[m].add(i));
        acc[m] = _mm512_fmadd_ps(block[m], scale, acc[m]);
    }
}

impl Format for Q6K {
    const FORMAT: QuantFormat = QuantFormat::Q6K;
    const GROUPS: usize = 4;
    /// Pairs of 16-weight sub-blocks.
    const STEPS: usize = 8;

    #[inline(always)]
    unsafe fn spread(unit: *const u8, j: usize, out: &mut Spread) {
        out.put(0, 0, six_bit_groups(unit.add(at::q6k_quants(j))));
    }

    #[inline(always)]
    unsafe fn weights(_: *const u8, _: usize, spread: &Spread) -> [*const u8; 2] {
        // Sub-blocks 2j and 2j + 1 (16 weights): groups 0-3 and 4-7.
        let out = spread.0[0].as_ptr();
        [out, out.add(4 * VECTOR)]
    }

    fn offsets(i: usize, j: usize) -> [usize; 2] {
        [0, 1].map(|h| 256 * i + 16 * (2 * j + h))
    }

    #[inline(always)]
    unsafe fn scale<const R: usize>(
        x: &Tile<R>,
        sums: &[Block; 2],
        (unit, i, j): (*const u8, usize, usize),
        block: &mut [__m512; R],
        _: &mut [__m512; R],
    ) {
        let d = halves(unit.add(at::D));
        for h in 0..2 {
            let sub = 2 * j + h;
            let scales = byte_scales::<true>(unit.add(at::q6k_scales(sub)), d);
            // The zero point (32) times the sub-block's activation sum, in integers as the
            // VNNI kernel starts its sums.
            let zero: [i32; R] = std::array::from_fn(|m| *x.x.zero[m].add(16 * i + sub));
            scale_sub_block(block, &sums[h], scales, &zero);
        }
    }

    #[inline(always)]
    unsafe fn end_unit<const R: usize>(
        x: &Tile<R>,
        _: *const u8,
        i: usize,
        block: &[__m512; R],
        acc: &mut [__m512; R],
    ) {
        finish_super_block(x, acc, block, i);
    }
}

/// Step `t` of a strip: its unit, the unit's index and the step within the unit.
#[inline(always)]
unsafe fn at_step<F: Format>(strip: *const u8, t: usize) -> (*const u8, usize, usize) {
    let unit_bytes = columns::unit_bytes(F::FORMAT);
    (
        strip.add(t / F::STEPS * unit_bytes),
        t / F::STEPS,
        t % F::STEPS,
    )
}

/// Step `t`'s tile products, from the weights its [`Format::spread`] left.
#[inline(always)]
unsafe fn issue<F: Format, T: Tiles, const R: usize>(
    tiles: &mut T,
    x: &Tile<R>,
    work: &mut Work,
    strip: *const u8,
    t: usize,
) {
    let (unit, i, s) = at_step::<F>(strip, t);
    let weights = F::weights(unit, s, &work.spread[t % 2]);
    F::products(
        tiles,
        x,
        weights,
        F::offsets(i, s),
        s,
        &mut work.sums[t % 2],
    );
}

/// Step `t`'s weights spread.
#[inline(always)]
unsafe fn spread<F: Format>(work: &mut Work, strip: *const u8, t: usize) {
    let (unit, _, s) = at_step::<F>(strip, t);
    F::spread(unit, s, &mut work.spread[t % 2]);
}

/// One strip against a tile's rows, its steps pipelined: while the lanes scale step `t`'s
/// sums, the tiles have already multiplied step `t + 1` and its weights for step `t + 2` are
/// spread, so neither the tiles' stores nor the lanes' stores are waited for.
#[inline(always)]
unsafe fn strip<F: Format, T: Tiles, const R: usize>(
    tiles: &mut T,
    x: &Tile<R>,
    work: &mut Work,
    (strip, units): (*const u8, usize),
    stream: &mut Stream,
) -> [__m512; R] {
    let steps = units * F::STEPS;
    spread::<F>(work, strip, 0);
    issue::<F, T, R>(tiles, x, work, strip, 0);
    if steps > 1 {
        spread::<F>(work, strip, 1);
    }
    let mut acc = [_mm512_setzero_ps(); R];
    let mut block = [_mm512_setzero_ps(); R];
    for t in 0..steps {
        stream.advance();
        if t + 1 < steps {
            issue::<F, T, R>(tiles, x, work, strip, t + 1);
        }
        if t + 2 < steps {
            spread::<F>(work, strip, t + 2);
        }
        let (unit, i, s) = at_step::<F>(strip, t);
        F::scale(x, &work.sums[t % 2], (unit, i, s), &mut block, &mut acc);
        if s + 1 == F::STEPS {
            F::end_unit(x, unit, i, &block, &mut acc);
            block = [_mm512_setzero_ps(); R];
        }
    }
    acc
}

/// The share's strips against activation rows `start..start + R`: one tile product.
#[inline(always)]
unsafe fn tile<F: Format, T: Tiles, const R: usize>(
    tiles: &mut T,
    share: &Share<'_>,
    work: &mut Work,
    (start, stream): (usize, &mut Stream),
) {
    let bytes = F::K_BYTES;
    let config = Config::new()
        .shape(0, R, ROW_BYTES)
        .shape(1, R, ROW_BYTES)
        .shape(2, R, bytes)
        .shape(3, R, bytes)
        .shape(4, bytes / 4, ROW_BYTES)
        .shape(5, bytes / 4, ROW_BYTES);
    tiles.configure(&config);
    let acts = share.acts;
    let x = Tile::<R> {
        q: acts.q.as_ptr().add((share.first + start) * acts.k).cast(),
        k: acts.k,
        x: Acts::new(acts, F::FORMAT, share.first + start),
    };
    let units = acts.k / columns::unit_weights(F::FORMAT);
    let unit_bytes = columns::unit_bytes(F::FORMAT);
    let out = share.out.add(start * share.stride);
    for s in 0..share.count {
        let at = (share.strips.add(s * units * unit_bytes), units);
        let acc = strip::<F, T, R>(tiles, &x, work, at, stream);
        let width = if s + 1 == share.count {
            share.last
        } else {
            STRIP
        };
        let mask = ((1u32 << width) - 1) as __mmask16;
        for m in 0..R {
            _mm512_mask_storeu_ps(out.add(m * share.stride + STRIP * s), mask, acc[m]);
        }
    }
}

/// The row counts of the tiles `rows` rows pass in: 16 at a time, then 8, 4, 2 and 1.
fn tile_sizes(rows: usize) -> impl Iterator<Item = usize> {
    let mut left = rows;
    std::iter::from_fn(move || {
        let size = match left {
            0 => return None,
            16.. => 16,
            8.. => 8,
            4.. => 4,
            2.. => 2,
            _ => 1,
        };
        left -= size;
        Some(size)
    })
}

/// The share's strips against its activation rows, in tiles of 16 rows, then one of 8, 4, 2
/// and 1 for what is left: each tile's row count a constant, so its rows' sums stay in
/// registers. The weights ahead are asked for at a step's pace, as the VNNI kernel asks
/// ([`Stream`]): on an AMX CPU, reading from memory, that made a 16-row product 1.3-1.4x
/// faster (docs/benchmarks.md, session 46).
#[inline(always)]
unsafe fn run<F: Format, T: Tiles>(tiles: &mut T, share: &Share<'_>, rows: usize) {
    let mut work = Work {
        sums: [[Block([[0; STRIP]; ROWS]); 2]; 2],
        spread: [Spread([[0; ROWS * VECTOR]; 2]); 2],
    };
    let units = share.acts.k / columns::unit_weights(F::FORMAT);
    let len = share.count * units * columns::unit_bytes(F::FORMAT);
    let steps = share.count * units * F::STEPS;
    let tiles_of = tile_sizes(rows).count();
    let mut start = 0;
    for (n, size) in tile_sizes(rows).enumerate() {
        // The first tile reads the share's weights from memory, a step's bytes ahead at a
        // step; the others find them in cache and ask for the next share's into L2, as the
        // VNNI kernel's blocks of rows do.
        let mut stream = if n == 0 {
            Stream::new(share.strips, len, len.div_ceil(steps))
        } else {
            let part = len.div_ceil(tiles_of - 1);
            let from = share.strips.wrapping_add(len + (n - 1) * part);
            Stream::into_l2(from, part, part.div_ceil(steps))
        };
        let at = (start, &mut stream);
        match size {
            16 => tile::<F, T, 16>(tiles, share, &mut work, at),
            8 => tile::<F, T, 8>(tiles, share, &mut work, at),
            4 => tile::<F, T, 4>(tiles, share, &mut work, at),
            2 => tile::<F, T, 2>(tiles, share, &mut work, at),
            _ => tile::<F, T, 1>(tiles, share, &mut work, at),
        }
        start += size;
    }
    tiles.release();
}

/// [`run`] for the share's format.
#[inline(always)]
unsafe fn run_format<T: Tiles>(tiles: &mut T, format: QuantFormat, share: &Share<'_>, rows: usize) {
    match format {
        QuantFormat::Q8_0 => run::<Q8_0, T>(tiles, share, rows),
        QuantFormat::Q5_0 => run::<Q5_0, T>(tiles, share, rows),
        QuantFormat::Q4K => run::<Q4K, T>(tiles, share, rows),
        QuantFormat::Q6K => run::<Q6K, T>(tiles, share, rows),
        QuantFormat::Q5_1 | QuantFormat::Q4_0 | QuantFormat::Q5K => {
            unreachable!(
                "{} goes to the AVX-512 VNNI kernel (Kernel::for_format)",
                format.name()
            )
        }
    }
}

/// [`run_format`] on this CPU's tiles, its lane arithmetic compiled for AVX-512.
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,f16c,bmi2,fma")]
unsafe fn on_hardware(format: QuantFormat, share: &Share<'_>, rows: usize) {
    run_format(&mut Hardware, format, share, rows);
}

/// Row `r` of `out` = weight rows `j < outputs` of the strips in `bytes` dotted with
/// activation row `first + r`, for every row `out` lends: `simd_columns::dot_strips` on AMX
/// tiles. The activations are the VNNI kernel's (`Kernel::activations`).
pub(super) fn dot_strips(
    format: QuantFormat,
    bytes: &[u8],
    outputs: usize,
    acts: &QuantizedRows,
    first: usize,
    out: OutRows<'_>,
) {
    let rows = out.rows();
    let kernel = Kernel::Amx.activations();
    let share = Share::new(kernel, format, bytes, outputs, acts, first, out);
    // SAFETY: Kernel::Amx runs only where the CPU has AMX and AVX-512 (and Linux granted the
    // tiles); `Share::new` checked the strips, rows and outputs every pointer stays in.
    unsafe { on_hardware(format, &share, rows) }
}

/// [`run_format`] on tiles other than the CPU's, its lane arithmetic compiled for AVX-512.
#[cfg(test)]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,f16c,bmi2,fma")]
unsafe fn on_other_tiles<T: Tiles>(
    tiles: &mut T,
    format: QuantFormat,
    share: &Share<'_>,
    rows: usize,
) {
    run_format(tiles, format, share, rows);
}

/// [`dot_strips`] of a share's `rows` on tiles other than the CPU's (tests): the model
/// (`amx_tiles::Emulated`) or none at all ([`super::amx_tiles::Absent`]), on any CPU with AVX-512.
#[cfg(test)]
pub(super) fn on_tiles<T: Tiles>(
    tiles: &mut T,
    format: QuantFormat,
    share: &Share<'_>,
    rows: usize,
) {
    assert!(
        Kernel::Avx512Vnni.runs_here(),
        "the AMX kernel's lanes are AVX-512's"
    );
    // SAFETY: these tiles run anywhere and the lanes where AVX-512 runs (asserted);
    // `Share::new` checked the pointers' bounds.
    unsafe { on_other_tiles(tiles, format, share, rows) }
}
