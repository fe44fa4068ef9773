//! The AMX-INT8 kernel of the column layout (`columns.rs`): a strip of 16 weight rows against
//! up to 16 activation rows per tile product.
//!
//! The layout was made for this: a strip's group vector (the same four weights of 16 rows in
//! 64 bytes) is one row of an AMX `B` tile, so a block's 8 group vectors are a `B` tile of 8
//! rows as they lie in memory (Q8_0), or once their nibbles are spread to bytes (Q5_0, into a
//! buffer). Up to 16 activation rows' bytes of the same block, read at the
//! activations' row stride, are the `A` tile, and one `tdpbsud` (signed activations, unsigned
//! weights) leaves the block's 16 x 16 integer sums in a `C` tile. Each block's sums are
//! stored and scaled in 16 lanes exactly as the AVX-512 VNNI kernel scales its own
//! (`simd_columns.rs`: the same integer sums, the same float operations in the same order), so
//! both kernels give the same bits and a row's outputs do not depend on which kernel, or
//! which tile, it went through. The K-quants instead spread their sub-block scales into
//! their weights (two planes of bytes each), so that a super-block's sums stay in two `C`
//! tiles over four full-width products and are stored once
//! (`amx_kquants.rs`): a tile's stores and the lanes' scaling cost more than its products. A
//! step is two blocks (tiles 2, 4 and 3, 5 into 0 and 1, or 6 and 7) or a K-quant's 64
//! weights, and the steps are pipelined: the tiles multiply a step ahead of their stores,
//! into two pairs of `C` tiles in turn, and two steps ahead of the lanes that scale the
//! stored sums, and the weights are spread two steps ahead of the tiles, because the tiles
//! wait for a product to finish before storing its sums and for the lanes' stores to reach
//! the cache before loading them, and the lanes for the tiles' stores. A spread is
//! vector stores, which the tiles wait behind rather than overlap, so a product of many rows
//! spreads each step once, in its first tile, for all its tiles (`Format::SHARED_ROWS`).
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
use std::cell::RefCell;
use std::mem::MaybeUninit;

use super::amx_kquants::{Planes, Q4K, Q6K};
use super::amx_tiles::{Config, Hardware, Tiles, ROWS, ROW_BYTES};
use super::columns::{self, at, STRIP, VECTOR};
use super::rows::{Side, SIDE_ROWS};
use super::simd::Stream;
use super::simd_columns::{halves, nibble_groups, Share};
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

/// A tile's bytes.
const TILE_BYTES: usize = ROWS * VECTOR;

/// One step's weights spread to bytes (in [`Work`]): two `B` tiles' rows side by side (Q5_0:
/// two blocks of 8 rows; Q4_K and Q6_K: two planes of 16 rows).
pub(super) struct Spread(*mut u8);

impl Spread {
    /// Tile `b`'s 8 group vectors from row `first`.
    #[inline(always)]
    pub(super) unsafe fn put(&mut self, b: usize, first: usize, groups: [__m512i; 8]) {
        for (g, vector) in groups.into_iter().enumerate() {
            self.put_row(b, first + g, vector);
        }
    }

    /// Tile `b`'s row `row`.
    #[inline(always)]
    pub(super) unsafe fn put_row(&mut self, b: usize, row: usize, vector: __m512i) {
        _mm512_store_si512(self.plane(b).cast_mut().add(VECTOR * row).cast(), vector);
    }

    /// Tile `b`'s rows.
    pub(super) fn plane(&self, b: usize) -> *const u8 {
        self.0.wrapping_add(b * TILE_BYTES)
    }
}

/// One step's two stored `C` tiles (in [`Work`]): two blocks' sums, or a super-block's
/// planes'.
pub(super) struct Sums(*mut Block);

impl Sums {
    /// Where tile `i` is stored.
    pub(super) fn at(&self, i: usize) -> *mut u8 {
        self.0.wrapping_add(i).cast()
    }

    /// Tile `i`'s sums of activation row `m`.
    #[inline(always)]
    pub(super) unsafe fn row(&self, i: usize, m: usize) -> __m512i {
        (*self.0.add(i)).row(m)
    }
}

/// One step's two spread `B` tiles, aligned for the lanes' stores: an element of the
/// buffer a product's tiles share ([`Format::SHARED_ROWS`]).
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct StepBytes([u8; 2 * TILE_BYTES]);

thread_local! {
    /// The shared spread weights of the product this thread runs (`Work::shared`), kept
    /// between products so that their pages are not faulted in again.
    static SHARED: RefCell<Vec<StepBytes>> = const { RefCell::new(Vec::new()) };
}

/// One format's part of a strip against a tile of `R` activation rows. A unit of the strip
/// is [`Format::STEPS`] steps; a step is two tile products (two blocks' integer sums, or a
/// K-quant's two planes'), which the lanes then scale into the rows' outputs.
pub(super) trait Format {
    const FORMAT: QuantFormat;
    /// Steps per unit.
    const STEPS: usize;
    /// From this many activation rows, a product's first tile spreads every step of the
    /// share's strips into one buffer (`Work::shared`), which the other tiles read instead of
    /// spreading them again: a spread is vector stores, which the tiles' work waits behind
    /// rather than overlaps. The buffer lies in L2, not L1, so it pays only where spreading
    /// costs more than loading from L2 (docs/benchmarks.md, session 50). Never for weights
    /// the tiles load where they lie (Q8_0).
    const SHARED_ROWS: usize = usize::MAX;
    /// Bytes of a row of an `A` tile: the activations one tile product takes (a block's).
    const K_BYTES: usize = 32;
    /// Whether a 32-weight format's `B` tiles hold its weights as signed bytes (`tdpbssd`),
    /// centred where they are spread, so that its sums need no zero point: else they are
    /// unsigned (`tdpbsud`), as they lie, and its sums start at the zero point.
    const SIGNED: bool = false;
    /// Step `step` of `unit`'s weights spread to bytes, where the format needs it.
    #[inline(always)]
    unsafe fn spread(_unit: *const u8, _step: usize, _out: &mut Spread) {}
    /// Where the step's activation values start in each row, for unit `i`: a 32-weight
    /// format's two blocks.
    fn offsets(i: usize, _step: usize) -> [usize; 2] {
        [64 * i, 64 * i + 32]
    }
    /// Step `step` of `unit`'s tile products into `C` tiles `C0` and `C1`, from its weights
    /// in the unit or where [`Format::spread`] left them (`spread`).
    unsafe fn products<T: Tiles, const R: usize, const C0: u8, const C1: u8>(
        tiles: &mut T,
        x: &Tile<R>,
        weights: (*const u8, &Spread),
        offsets: [usize; 2],
        step: usize,
    );
    /// Whether step `step`'s sums are stored and scaled (a 32-weight format's every step, a
    /// K-quant's last of its super-block).
    fn stored(_step: usize) -> bool {
        true
    }
    /// The step's sums scaled into `block` (a K-quant's super-block, before its activation
    /// scale) or straight into `acc` (a 32-weight format's two blocks).
    #[inline(always)]
    unsafe fn scale<const R: usize>(
        x: &Tile<R>,
        sums: &Sums,
        (unit, i, _): (*const u8, usize, usize),
        _block: &mut [__m512; R],
        acc: &mut [__m512; R],
    ) {
        two_blocks(x, (sums, Self::SIGNED), unit, i, acc);
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
/// From [`Format::SHARED_ROWS`] rows, every step of the share's strips has its own spread
/// weights (`shared`), which the first tile writes and every tile reads.
struct Work {
    /// The task's [`Buffers`].
    buffers: *mut Buffers,
    /// The share's steps, strip after strip (null: each tile spreads into `spread`).
    shared: *mut StepBytes,
    /// The share's steps before the current strip's.
    first_step: usize,
    /// Whether the current tile spreads its weights (always, without `shared`).
    spreading: bool,
}

/// A [`Work`]'s buffers of two steps of stored tiles and spread weights, on the stack of the
/// product's task and left uninitialized: zeroed, their 8 KB were a `memset` call for every
/// 32 weight rows. Every byte read is written first: the tiles store the `C` rows the lanes
/// read, and a step's weights are spread before its tiles load them.
#[repr(C, align(64))]
struct Buffers {
    sums: [[Block; 2]; 2],
    spread: [[[u8; TILE_BYTES]; 2]; 2],
}

impl Work {
    /// Work on `buffers` (left as they are).
    fn new(buffers: &mut MaybeUninit<Buffers>) -> Self {
        Self {
            buffers: buffers.as_mut_ptr(),
            shared: std::ptr::null_mut(),
            first_step: 0,
            spreading: true,
        }
    }

    /// Step `t`'s buffer of stored tiles.
    unsafe fn sums(&mut self, t: usize) -> Sums {
        // Raw places throughout: no reference to bytes not yet written.
        Sums((&raw mut (*self.buffers).sums[t % 2]).cast())
    }

    /// Step `t`'s spread weights (of the current strip).
    unsafe fn spread(&mut self, t: usize) -> Spread {
        if self.shared.is_null() {
            Spread((&raw mut (*self.buffers).spread[t % 2]).cast())
        } else {
            Spread(self.shared.wrapping_add(self.first_step + t).cast())
        }
    }
}

/// The `R` activation rows of one tile product.
pub(super) struct Tile<'a, const R: usize> {
    /// Row 0's quantized values, row `m`'s `m * k` bytes on: the `A` tiles' rows.
    pub(super) q: *const u8,
    pub(super) k: usize,
    /// The rows' scales, zero points and sums, the VNNI kernel's, side by side.
    pub(super) side: Sides<'a>,
}

/// A tile's rows' per-block values in the product's [`Side`]: rows `start..start + R`, in
/// one of its groups.
pub(super) struct Sides<'a> {
    side: &'a Side,
    start: usize,
    /// Blocks (super-blocks) a row.
    blocks: usize,
    /// Pairs of 32-value sums a row.
    pairs: usize,
}

impl Sides<'_> {
    /// The tile's rows' scales of block (super-block) `b`, row `m`'s at `m`.
    #[inline(always)]
    pub(super) unsafe fn scales(&self, b: usize) -> *const f32 {
        self.side
            .scale
            .as_ptr()
            .add(Side::at(self.blocks, self.start, b))
    }

    /// The tile's rows' Q8_0 zero points of 32-weight block `b`, row `m`'s at `m`.
    #[inline(always)]
    unsafe fn zeros(&self, b: usize) -> *const i32 {
        self.side
            .zero_q8
            .as_ptr()
            .add(Side::at(self.blocks, self.start, b))
    }

    /// The tile's rows' sums of 32 values `2p` and `2p + 1`, row `m`'s pair at `2m` (a
    /// 32-bit word, the first sum in its low half).
    #[inline(always)]
    pub(super) unsafe fn pairs(&self, p: usize) -> *const i16 {
        let at = Side::at(self.pairs, self.start, p);
        self.side.pairs.as_ptr().add(at).cast()
    }
}

/// A tile's activation values past this many bytes do not stay in L1 between steps: the
/// weights streaming through it evict them (a down projection's 16 rows of 8960 values are
/// 140 KB).
const A_IN_L1: usize = 32 << 10;

/// How far ahead of a step's activation values each row's are asked for.
const A_AHEAD: usize = 2 * ROW_BYTES;

impl<const R: usize> Tile<'_, R> {
    /// Each row's activation values two steps after `offset` asked for into L1, where the
    /// rows are too long to stay there: the `A` tiles' loads otherwise wait for L2, a line a
    /// row (the weights' requests run ahead; the activations' 16 rows are 16 streams, more
    /// than the hardware follows). The K-quants' steps only: Q8_0's products of 512 rows
    /// lost 12% with the requests (docs/benchmarks.md, session 51).
    #[inline(always)]
    pub(super) unsafe fn ask_ahead(&self, offset: usize) {
        if self.k * R > A_IN_L1 {
            for m in 0..R {
                let line = self.q.wrapping_add(m * self.k + offset + A_AHEAD);
                _mm_prefetch::<_MM_HINT_T0>(line.cast());
            }
        }
    }
}

/// Two blocks' integer sums into `out` (each tile row's first `R` rows): blocks whose
/// weights are `B` tiles at `weights` (rows of 64 bytes) and whose activation values start at
/// `offsets` in each row.
#[inline(always)]
unsafe fn two_sums<F: Format, T: Tiles, const R: usize, const C0: u8, const C1: u8>(
    tiles: &mut T,
    x: &Tile<R>,
    weights: [*const u8; 2],
    offsets: [usize; 2],
) {
    tiles.zero::<C0>();
    tiles.zero::<C1>();
    tiles.load::<2>(x.q.add(offsets[0]), x.k);
    tiles.load::<4>(weights[0], VECTOR);
    tiles.load::<3>(x.q.add(offsets[1]), x.k);
    tiles.load::<5>(weights[1], VECTOR);
    if F::SIGNED {
        tiles.dot_signed::<C0, 2, 4>();
        tiles.dot_signed::<C1, 3, 5>();
    } else {
        tiles.dot::<C0, 2, 4>();
        tiles.dot::<C1, 3, 5>();
    }
}

/// A 32-weight block's sums (tile `b` of `sums`; unless the weights were `signed`, they
/// start at each row's zero point) scaled into the rows' outputs by the 16 rows' f16 scales
/// at `scales` and each row's activation scale of block `block`: the VNNI kernel's
/// `scale_block`, on the same integer sums.
#[inline(always)]
unsafe fn scale_block<const R: usize>(
    x: &Tile<R>,
    acc: &mut [__m512; R],
    (sums, b, signed): (&Sums, usize, bool),
    scales: *const u8,
    block: usize,
) {
    let d = halves(scales);
    let (zeros, row_scales) = (x.side.zeros(block), x.side.scales(block));
    for m in 0..R {
        let sum = if signed {
            sums.row(b, m)
        } else {
            _mm512_add_epi32(_mm512_set1_epi32(*zeros.add(m)), sums.row(b, m))
        };
        let scale = _mm512_mul_ps(d, _mm512_set1_ps(*row_scales.add(m)));
        acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), scale, acc[m]);
    }
}

/// A 32-weight format's two blocks of unit `i` into the outputs (`signed`: its
/// [`Format::SIGNED`]).
#[inline(always)]
unsafe fn two_blocks<const R: usize>(
    x: &Tile<R>,
    (sums, signed): (&Sums, bool),
    unit: *const u8,
    i: usize,
    acc: &mut [__m512; R],
) {
    for b in 0..2 {
        let scales = unit.add(at::block_scales(b));
        scale_block(x, acc, (sums, b, signed), scales, 2 * i + b);
    }
}

struct Q8_0;
struct Q5_0;

impl Format for Q8_0 {
    const FORMAT: QuantFormat = QuantFormat::Q8_0;
    const STEPS: usize = 1;

    #[inline(always)]
    unsafe fn products<T: Tiles, const R: usize, const C0: u8, const C1: u8>(
        tiles: &mut T,
        x: &Tile<R>,
        (unit, _): (*const u8, &Spread),
        offsets: [usize; 2],
        _: usize,
    ) {
        let weights = [0, 1].map(|b| unit.add(at::q8_block(b)));
        two_sums::<Self, T, R, C0, C1>(tiles, x, weights, offsets);
    }
}

impl Format for Q5_0 {
    const FORMAT: QuantFormat = QuantFormat::Q5_0;
    const STEPS: usize = 1;
    const SHARED_ROWS: usize = 32;
    const SIGNED: bool = true;

    /// The weights centred, `q - 16` (the VNNI kernel's zero point), as signed bytes: a
    /// nibble where its fifth bit is set, the nibble less 16 where it is not. The sums of
    /// `tdpbssd` are then the VNNI kernel's integer sums (which start at the zero point)
    /// with no zero point to add: one integer add fewer per row and block in the lanes.
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
                groups[g] = _mm512_mask_sub_epi8(low[g], !fifth, low[g], sixteen);
            }
            out.put(b, 0, groups);
        }
    }

    #[inline(always)]
    unsafe fn products<T: Tiles, const R: usize, const C0: u8, const C1: u8>(
        tiles: &mut T,
        x: &Tile<R>,
        (_, spread): (*const u8, &Spread),
        offsets: [usize; 2],
        _: usize,
    ) {
        let weights = [0, 1].map(|b| spread.plane(b));
        two_sums::<Self, T, R, C0, C1>(tiles, x, weights, offsets);
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
    let weights = (unit, &work.spread(t));
    let offsets = F::offsets(i, s);
    if (t / F::STEPS).is_multiple_of(2) {
        F::products::<T, R, 0, 1>(tiles, x, weights, offsets, s);
    } else {
        F::products::<T, R, 6, 7>(tiles, x, weights, offsets, s);
    }
}

/// Step `t`'s sums stored, where the format scales them after it: from `C` tiles 0 and 1
/// for even units, 6 and 7 for odd ones.
#[inline(always)]
unsafe fn store<F: Format, T: Tiles>(tiles: &mut T, work: &mut Work, t: usize) {
    if !F::stored(t % F::STEPS) {
        return;
    }
    let out = work.sums(t);
    if (t / F::STEPS).is_multiple_of(2) {
        tiles.store::<0>(out.at(0), ROW_BYTES);
        tiles.store::<1>(out.at(1), ROW_BYTES);
    } else {
        tiles.store::<6>(out.at(0), ROW_BYTES);
        tiles.store::<7>(out.at(1), ROW_BYTES);
    }
}

/// Step `t`'s weights spread, unless the current tile reads what the first spread.
#[inline(always)]
unsafe fn spread<F: Format>(work: &mut Work, strip: *const u8, t: usize) {
    let (unit, _, s) = at_step::<F>(strip, t);
    if work.spreading {
        F::spread(unit, s, &mut work.spread(t));
    }
}

/// One strip against a tile's rows, its steps pipelined: while the tiles multiply step `t +
/// 1`, step `t`'s sums are stored (the tiles wait for a product to finish before storing
/// its sums, so the next step's products are issued first, into the other pair of `C`
/// tiles), step `t + 2`'s weights are spread, and the lanes scale step `t - 1`'s sums, so
/// that neither the tiles' stores nor the lanes' stores are waited for.
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
        store::<F, T>(tiles, work, t);
        if t + 2 < steps {
            spread::<F>(work, strip, t + 2);
        }
        if t > 0 {
            lanes::<F, R>(x, work, strip, t - 1, (&mut block, &mut acc));
        }
    }
    lanes::<F, R>(x, work, strip, steps - 1, (&mut block, &mut acc));
    acc
}

/// Step `t`'s stored sums scaled into the rows' outputs (`acc`), through `block` where the
/// format scales a unit's steps together.
#[inline(always)]
unsafe fn lanes<F: Format, const R: usize>(
    x: &Tile<R>,
    work: &mut Work,
    strip: *const u8,
    t: usize,
    (block, acc): (&mut [__m512; R], &mut [__m512; R]),
) {
    let (unit, i, s) = at_step::<F>(strip, t);
    F::scale(x, &work.sums(t), (unit, i, s), block, acc);
    if s + 1 == F::STEPS {
        F::end_unit(x, unit, i, block, acc);
        *block = [_mm512_setzero_ps(); R];
    }
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
        .shape(5, bytes / 4, ROW_BYTES)
        .shape(6, R, ROW_BYTES)
        .shape(7, R, ROW_BYTES);
    tiles.configure(&config);
    let acts = share.acts;
    debug_assert!((share.first + start) % SIDE_ROWS + R <= SIDE_ROWS);
    let x = Tile::<R> {
        q: acts.q.as_ptr().add((share.first + start) * acts.k).cast(),
        k: acts.k,
        side: Sides {
            side: acts.side(),
            start: share.first + start,
            blocks: acts.k / acts.block,
            pairs: acts.k / 64,
        },
    };
    let units = acts.k / columns::unit_weights(F::FORMAT);
    let unit_bytes = columns::unit_bytes(F::FORMAT);
    let out = share.out.add(start * share.stride);
    for s in 0..share.count {
        work.first_step = s * units * F::STEPS;
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

/// The row counts of the tiles `rows` rows pass in: 16 at a time, then what is left in one
/// tile. A tile's weights cost the same whatever its rows (the K-quants' spread, the loads),
/// so 15 rows in one tile cost about what 16 do, where tiles of 8, 4, 2 and 1 cost four
/// times the weights' work (docs/benchmarks.md, session 53).
fn tile_sizes(rows: usize) -> impl Iterator<Item = usize> {
    let mut left = rows;
    std::iter::from_fn(move || {
        let size = left.min(ROWS);
        left -= size;
        (size > 0).then_some(size)
    })
}

/// The share's strips against its activation rows, in tiles of 16 rows, then one for what
/// is left ([`tile_sizes`]): each tile's row count a constant, so its rows' sums stay in
/// registers. The weights ahead are asked for at a step's pace, as the VNNI kernel asks
/// ([`Stream`]): on an AMX CPU, reading from memory, that made a 16-row product 1.3-1.4x
/// faster (docs/benchmarks.md, session 46).
#[inline(always)]
unsafe fn run<F: Format, T: Tiles>(tiles: &mut T, share: &Share<'_>, rows: usize) {
    let mut buffers = MaybeUninit::uninit();
    let mut work = Work::new(&mut buffers);
    let units = share.acts.k / columns::unit_weights(F::FORMAT);
    let len = share.count * units * columns::unit_bytes(F::FORMAT);
    let steps = share.count * units * F::STEPS;
    let tiles_of = tile_sizes(rows).count();
    if rows >= F::SHARED_ROWS {
        work.shared = shared_steps(steps);
    }
    let mut start = 0;
    for (n, size) in tile_sizes(rows).enumerate() {
        work.spreading = work.shared.is_null() || n == 0;
        // The first tile reads the share's weights from memory, a step's bytes ahead at a
        // step; the others find them in cache and ask for the next share's into L2, as the
        // VNNI kernel's blocks of rows do.
        let mut stream = if n == 0 {
            Stream::new(share.strips, len, len.div_ceil(steps), rows)
        } else {
            let part = len.div_ceil(tiles_of - 1);
            let from = share.strips.wrapping_add(len + (n - 1) * part);
            Stream::into_l2(from, part, part.div_ceil(steps))
        };
        let at = (start, &mut stream);
        match size {
            16 => tile::<F, T, 16>(tiles, share, &mut work, at),
            15 => tile::<F, T, 15>(tiles, share, &mut work, at),
            14 => tile::<F, T, 14>(tiles, share, &mut work, at),
            13 => tile::<F, T, 13>(tiles, share, &mut work, at),
            12 => tile::<F, T, 12>(tiles, share, &mut work, at),
            11 => tile::<F, T, 11>(tiles, share, &mut work, at),
            10 => tile::<F, T, 10>(tiles, share, &mut work, at),
            9 => tile::<F, T, 9>(tiles, share, &mut work, at),
            8 => tile::<F, T, 8>(tiles, share, &mut work, at),
            7 => tile::<F, T, 7>(tiles, share, &mut work, at),
            6 => tile::<F, T, 6>(tiles, share, &mut work, at),
            5 => tile::<F, T, 5>(tiles, share, &mut work, at),
            4 => tile::<F, T, 4>(tiles, share, &mut work, at),
            3 => tile::<F, T, 3>(tiles, share, &mut work, at),
            2 => tile::<F, T, 2>(tiles, share, &mut work, at),
            _ => tile::<F, T, 1>(tiles, share, &mut work, at),
        }
        start += size;
    }
    tiles.release();
}

/// This thread's buffer of at least `steps` steps' spread weights ([`SHARED`]), valid until
/// its next call on this thread.
fn shared_steps(steps: usize) -> *mut StepBytes {
    SHARED.with_borrow_mut(|buffer| {
        if buffer.len() < steps {
            buffer.resize(steps, StepBytes([0; 2 * TILE_BYTES]));
        }
        buffer.as_mut_ptr()
    })
}

/// [`run`] for the share's format.
#[inline(always)]
unsafe fn run_format<T: Tiles>(tiles: &mut T, format: QuantFormat, share: &Share<'_>, rows: usize) {
    match format {
        QuantFormat::Q8_0 => run::<Q8_0, T>(tiles, share, rows),
        QuantFormat::Q5_0 => run::<Q5_0, T>(tiles, share, rows),
        QuantFormat::Q4K => run::<Planes<Q4K>, T>(tiles, share, rows),
        QuantFormat::Q6K => run::<Planes<Q6K>, T>(tiles, share, rows),
        // The formats `has_amx_kernel` does not name.
        _ => {
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
