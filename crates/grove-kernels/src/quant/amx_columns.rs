//! The AMX-INT8 kernel of the column layout (`columns.rs`): a strip of 16 weight rows against
//! up to 16 activation rows per tile product.
//!
//! The layout was made for this: a strip's group vector (the same four weights of 16 rows in
//! 64 bytes) is one row of an AMX `B` tile, so a block's 8 group vectors are a `B` tile of 8
//! rows as they lie in memory (Q8_0), or once their nibbles are spread to bytes (Q5_0, Q4_K,
//! Q6_K, into a 512-byte buffer). Up to 16 activation rows' bytes of the same block, read at the
//! activations' row stride, are the `A` tile, and one `tdpbsud` (signed activations, unsigned
//! weights) leaves the block's 16 x 16 integer sums in a `C` tile. Each block's sums are
//! stored and scaled in 16 lanes exactly as the AVX-512 VNNI kernel scales its own
//! (`simd_columns.rs`: the same integer sums, the same float operations in the same order), so
//! both kernels give the same bits and a row's outputs do not depend on which kernel, or
//! which tile, it went through. Two blocks are in flight at a time (tiles 0, 2, 4 and 1, 3, 5).
//!
//! The arithmetic is written once, over [`Tiles`]: on the CPU's tiles (compiled for AVX-512,
//! which every AMX CPU has) and on a model of them that tests run on any machine.
// SAFETY (all of the module): pointers are inside the strips and activation rows `Share::new`
// checked, or the kernel's own buffers; the hardware tiles run only where
// `cpu::Level::Amx` is allowed (`Kernel::Amx` reaches here only through `Kernel::runs_here`).
#![allow(unsafe_code)]
#![allow(clippy::needless_range_loop)]

#[cfg(test)]
use super::amx_tiles::Emulated;
use super::amx_tiles::{Config, Hardware, Tiles, ROWS, ROW_BYTES};
use super::columns::{self, at, STRIP, VECTOR};
use super::simd_columns::Share;
use super::{Kernel, QuantFormat, QuantizedRows};
use crate::threads::OutRows;

/// Fewer activation rows than this go through the VNNI kernel: a tile product of one row
/// wastes 15 of its 16. Not yet measured on an AMX machine (see docs/benchmarks.md): 4 is
/// where llama.cpp's AMX kernels take over from its AVX-512 ones.
pub const MIN_ROWS: usize = 4;

/// 16 activation rows x 16 weight rows of 32-bit values, a tile's rows as stored.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Block([[i32; STRIP]; ROWS]);

/// Two blocks' weights spread to bytes: `B` tiles' rows.
#[repr(C, align(64))]
struct Spread([[u8; 8 * VECTOR]; 2]);

/// One format's unit of a strip against a tile of activation rows.
trait Format {
    const FORMAT: QuantFormat;
    /// Group vectors per scaled block (a `B` tile's rows): 8, Q6_K's 16-weight blocks 4.
    const GROUPS: usize = 8;
    unsafe fn unit<T: Tiles>(
        tiles: &mut T,
        x: &Tile<'_>,
        work: &mut Work,
        unit: *const u8,
        i: usize,
    );
}

/// Per activation row of a tile, the 16 outputs of the strip being multiplied (or a
/// super-block's share of them).
type Acc = [[f32; STRIP]; ROWS];

/// A tile product's buffers, made once per tile of rows: the outputs so far, two blocks'
/// integer sums as the tiles store them, two blocks' weights spread to bytes.
struct Work {
    acc: Acc,
    sums: [Block; 2],
    spread: Spread,
}

/// The activation rows of one tile product.
struct Tile<'a> {
    acts: &'a QuantizedRows,
    /// The first row (of `acts`) and how many.
    first: usize,
    rows: usize,
}

impl Tile<'_> {
    /// `acts`' `per_row` values per row: row `m`'s value `index`.
    #[inline(always)]
    fn at<V: Copy>(&self, values: &[V], per_row: usize, m: usize, index: usize) -> V {
        values[(self.first + m) * per_row + index]
    }
}

/// Two blocks' integer sums into `out` (each tile row's first `x.rows` rows): blocks whose
/// weights are `B` tiles at `weights` (rows of 64 bytes) and whose activation values start at
/// `offsets` in each row.
#[inline(always)]
unsafe fn sums<T: Tiles>(
    tiles: &mut T,
    x: &Tile<'_>,
    weights: [*const u8; 2],
    offsets: [usize; 2],
    out: &mut [Block; 2],
) {
    let k = x.acts.k;
    let q = x.acts.q.as_ptr().add(x.first * k).cast::<u8>();
    tiles.zero::<0>();
    tiles.zero::<1>();
    tiles.load::<2>(q.add(offsets[0]), k);
    tiles.load::<4>(weights[0], VECTOR);
    tiles.load::<3>(q.add(offsets[1]), k);
    tiles.load::<5>(weights[1], VECTOR);
    tiles.dot::<0, 2, 4>();
    tiles.dot::<1, 3, 5>();
    tiles.store::<0>(out[0].0.as_mut_ptr().cast(), ROW_BYTES);
    tiles.store::<1>(out[1].0.as_mut_ptr().cast(), ROW_BYTES);
}

/// 16 f16 at `p` as f32.
#[inline(always)]
unsafe fn halves(p: *const u8) -> [f32; STRIP] {
    std::array::from_fn(|n| {
        half::f16::from_bits(u16::from_le_bytes([*p.add(2 * n), *p.add(2 * n + 1)])).to_f32()
    })
}

/// 16 bytes at `p` (signed where `SIGNED`) as f32 times `d`, as the VNNI kernel's
/// `byte_scales`.
#[inline(always)]
unsafe fn byte_scales<const SIGNED: bool>(p: *const u8, d: &[f32; STRIP]) -> [f32; STRIP] {
    std::array::from_fn(|n| {
        let byte = *p.add(n);
        let value = if SIGNED {
            f32::from(byte as i8)
        } else {
            f32::from(byte)
        };
        value * d[n]
    })
}

/// The 8 group vectors of 32 weights from 4 nibble vectors at `p` (low nibbles groups 0-3,
/// high 4-7), into `out`.
#[inline(always)]
unsafe fn spread_nibbles(p: *const u8, out: &mut [u8; 8 * VECTOR]) {
    let nibbles = std::slice::from_raw_parts(p, 4 * VECTOR);
    let (low, high) = out.split_at_mut(4 * VECTOR);
    for ((l, h), &byte) in low.iter_mut().zip(high.iter_mut()).zip(nibbles) {
        *l = byte & 0x0F;
        *h = byte >> 4;
    }
}

/// A 32-weight block's sums (`sums`, starting at each row's zero point `zero`) scaled into
/// the rows' outputs by the 16 rows' f16 scales at `scales` and each row's activation scale
/// of block `block`: the VNNI kernel's `scale_block`.
#[inline(always)]
unsafe fn scale_block(
    x: &Tile<'_>,
    acc: &mut Acc,
    sums: &Block,
    zero: &[i32],
    scales: *const u8,
    block: usize,
) {
    let d = halves(scales);
    let per_row = x.acts.k / 32;
    for m in 0..x.rows {
        let start = x.at(zero, per_row, m, block);
        let scale = x.at(&x.acts.scale, per_row, m, block);
        for n in 0..STRIP {
            let sum = start.wrapping_add(sums.0[m][n]) as f32;
            acc[m][n] = sum.mul_add(d[n] * scale, acc[m][n]);
        }
    }
}

/// A 32-weight format's unit `i` (two blocks, their weights `B` tiles at `weights`) into the
/// outputs, its sums starting at `zero`.
#[inline(always)]
unsafe fn two_blocks<T: Tiles>(
    tiles: &mut T,
    x: &Tile<'_>,
    work: &mut Work,
    unit: *const u8,
    i: usize,
    weights: [*const u8; 2],
    zero: &[i32],
) {
    sums(tiles, x, weights, [64 * i, 64 * i + 32], &mut work.sums);
    for b in 0..2 {
        let scales = unit.add(at::block_scales(b));
        scale_block(x, &mut work.acc, &work.sums[b], zero, scales, 2 * i + b);
    }
}

struct Q8_0;
struct Q5_0;
struct Q4K;
struct Q6K;

impl Format for Q8_0 {
    const FORMAT: QuantFormat = QuantFormat::Q8_0;

    #[inline(always)]
    unsafe fn unit<T: Tiles>(
        tiles: &mut T,
        x: &Tile<'_>,
        work: &mut Work,
        unit: *const u8,
        i: usize,
    ) {
        let weights = [0, 1].map(|b| unit.add(at::q8_block(b)));
        two_blocks(tiles, x, work, unit, i, weights, &x.acts.zero_q8);
    }
}

impl Format for Q5_0 {
    const FORMAT: QuantFormat = QuantFormat::Q5_0;

    #[inline(always)]
    unsafe fn unit<T: Tiles>(
        tiles: &mut T,
        x: &Tile<'_>,
        work: &mut Work,
        unit: *const u8,
        i: usize,
    ) {
        for b in 0..2 {
            let quants = unit.add(at::q5_block(b));
            let out = &mut work.spread.0[b];
            spread_nibbles(quants, out);
            // Group g's fifth bits: bit `byte` of its mask word.
            for g in 0..8 {
                let mask = quants
                    .add(at::Q5_BITS + 8 * g)
                    .cast::<u64>()
                    .read_unaligned();
                for byte in 0..VECTOR {
                    out[VECTOR * g + byte] |= (((mask >> byte) & 1) as u8) << 4;
                }
            }
        }
        let weights = [0, 1].map(|b| work.spread.0[b].as_ptr());
        two_blocks(tiles, x, work, unit, i, weights, &x.acts.zero_q5);
    }
}

impl Format for Q4K {
    const FORMAT: QuantFormat = QuantFormat::Q4K;

    #[inline(always)]
    unsafe fn unit<T: Tiles>(
        tiles: &mut T,
        x: &Tile<'_>,
        work: &mut Work,
        unit: *const u8,
        i: usize,
    ) {
        let d = halves(unit.add(at::D));
        // The super-block's scaled sums, before its activation scale.
        let mut block: Acc = [[0.0; STRIP]; ROWS];
        let Work { acc, sums, spread } = work;
        for pair in 0..4 {
            let j = [2 * pair, 2 * pair + 1];
            for h in 0..2 {
                spread_nibbles(unit.add(at::q4k_quants(j[h])), &mut spread.0[h]);
            }
            let weights = [0, 1].map(|h| spread.0[h].as_ptr());
            self::sums(tiles, x, weights, j.map(|j| 256 * i + 32 * j), sums);
            for h in 0..2 {
                let scales = byte_scales::<false>(unit.add(at::q4k_scales(j[h])), &d);
                for m in 0..x.rows {
                    for n in 0..STRIP {
                        let sum = sums[h].0[m][n] as f32;
                        block[m][n] = sum.mul_add(scales[n], block[m][n]);
                    }
                }
            }
        }
        let dmin = halves(unit.add(at::DMIN));
        let mins = |j: usize, n: usize| i32::from(*unit.add(at::q4k_mins(j) + n));
        subtract_mins(x, &mut block, i, mins, &dmin);
        finish_super_block(x, acc, &block, i);
    }
}

/// A Q4_K super-block's mins' term taken from `block`, in integers once per super-block as
/// the VNNI kernel's (`paired_sums`): per activation row and weight row `n`, the 8 sub-blocks'
/// activation sums times `min(sub, n)`, then times `dmin[n]`.
#[inline(always)]
fn subtract_mins(
    x: &Tile<'_>,
    block: &mut Acc,
    i: usize,
    min: impl Fn(usize, usize) -> i32,
    dmin: &[f32; STRIP],
) {
    let per_row = x.acts.k / 32;
    for m in 0..x.rows {
        for n in 0..STRIP {
            let total: i32 = (0..8)
                .map(|sub| {
                    min(sub, n) * i32::from(x.at(&x.acts.sum32_i16, per_row, m, 8 * i + sub))
                })
                .sum();
            block[m][n] = (-(total as f32)).mul_add(dmin[n], block[m][n]);
        }
    }
}

/// A K-quant super-block's scaled sums into the outputs, times each row's activation scale
/// of super-block `i`.
#[inline(always)]
fn finish_super_block(x: &Tile<'_>, acc: &mut Acc, block: &Acc, i: usize) {
    for m in 0..x.rows {
        let scale = x.at(&x.acts.scale, x.acts.k / 256, m, i);
        for n in 0..STRIP {
            acc[m][n] = block[m][n].mul_add(scale, acc[m][n]);
        }
    }
}

impl Format for Q6K {
    const FORMAT: QuantFormat = QuantFormat::Q6K;
    const GROUPS: usize = 4;

    #[inline(always)]
    unsafe fn unit<T: Tiles>(
        tiles: &mut T,
        x: &Tile<'_>,
        work: &mut Work,
        unit: *const u8,
        i: usize,
    ) {
        let d = halves(unit.add(at::D));
        let mut block: Acc = [[0.0; STRIP]; ROWS];
        let Work { acc, sums, spread } = work;
        for j in 0..8 {
            let quants = unit.add(at::q6k_quants(j));
            let out = &mut spread.0[0];
            spread_nibbles(quants, out);
            // Group g's top two bits: bits 2 (g mod 4) of its byte in tops vector g / 4.
            let tops = std::slice::from_raw_parts(quants.add(at::Q6_TOPS), 2 * VECTOR);
            for g in 0..8 {
                let shift = 2 * (g % 4);
                for byte in 0..VECTOR {
                    out[VECTOR * g + byte] |= ((tops[VECTOR * (g / 4) + byte] >> shift) & 3) << 4;
                }
            }
            // Sub-blocks 2j and 2j + 1 (16 weights): groups 0-3 and 4-7.
            let weights = [out.as_ptr(), out.as_ptr().add(4 * VECTOR)];
            let subs = [2 * j, 2 * j + 1];
            self::sums(tiles, x, weights, subs.map(|sub| 256 * i + 16 * sub), sums);
            for h in 0..2 {
                let scales = byte_scales::<true>(unit.add(at::q6k_scales(subs[h])), &d);
                for m in 0..x.rows {
                    // The zero point (32) times the sub-block's activation sum, in integers
                    // as the VNNI kernel starts its sums.
                    let zero = x.at(&x.acts.zero_q6, x.acts.k / 16, m, 16 * i + subs[h]);
                    for n in 0..STRIP {
                        let sum = (sums[h].0[m][n] + zero) as f32;
                        block[m][n] = sum.mul_add(scales[n], block[m][n]);
                    }
                }
            }
        }
        finish_super_block(x, acc, &block, i);
    }
}

/// The share's strips against its activation rows, in tiles of up to 16 rows.
#[inline(always)]
unsafe fn run<F: Format, T: Tiles>(tiles: &mut T, share: &Share<'_>, rows: usize) {
    let units = share.acts.k / columns::unit_weights(F::FORMAT);
    let unit_bytes = columns::unit_bytes(F::FORMAT);
    for start in (0..rows).step_by(ROWS) {
        let tile_rows = ROWS.min(rows - start);
        let bytes = 4 * F::GROUPS;
        let config = Config::new()
            .shape(0, tile_rows, ROW_BYTES)
            .shape(1, tile_rows, ROW_BYTES)
            .shape(2, tile_rows, bytes)
            .shape(3, tile_rows, bytes)
            .shape(4, F::GROUPS, ROW_BYTES)
            .shape(5, F::GROUPS, ROW_BYTES);
        tiles.configure(&config);
        let x = Tile {
            acts: share.acts,
            first: share.first + start,
            rows: tile_rows,
        };
        let out = share.out.add(start * share.stride);
        let mut work = Work {
            acc: [[0.0; STRIP]; ROWS],
            sums: [Block([[0; STRIP]; ROWS]); 2],
            spread: Spread([[0; 8 * VECTOR]; 2]),
        };
        for s in 0..share.count {
            let strip = share.strips.add(s * units * unit_bytes);
            work.acc = [[0.0; STRIP]; ROWS];
            for i in 0..units {
                F::unit(tiles, &x, &mut work, strip.add(i * unit_bytes), i);
            }
            let width = if s + 1 == share.count {
                share.last
            } else {
                STRIP
            };
            for m in 0..tile_rows {
                let to = out.add(m * share.stride + STRIP * s);
                std::ptr::copy_nonoverlapping(work.acc[m].as_ptr(), to, width);
            }
        }
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

/// [`dot_strips`] of a share's `rows` on the tiles' model, on any CPU (tests).
#[cfg(test)]
pub(super) fn emulated(format: QuantFormat, share: &Share<'_>, rows: usize) {
    // SAFETY: the model's tiles run anywhere; `Share::new` checked the pointers' bounds.
    unsafe { run_format(&mut Emulated::new(), format, share, rows) }
}
