//! The column layout the AVX-512 kernels read every format in, made once at load: weight rows
//! in *strips* of [`STRIP`], each strip's weights arranged so that one 64-byte vector holds
//! the same four consecutive weights of all 16 rows.
//!
//! A product then needs no horizontal sum and no per-row bookkeeping: `vpdpbusd` of such a
//! vector with four activation bytes broadcast to every lane adds four products into each of
//! the 16 rows' sums, a block's scales are 16 lanes that multiply 16 sums in one instruction,
//! and a decoded weight vector serves every activation row of a tile. GGUF's row-major blocks
//! make a product of `R` rows pay one reduction and one scaling per (weight row, activation
//! row) pair and block; that bookkeeping, not the integer dots, was most of a verify's time.
//! (llama.cpp repacks into `block_q4_0x8`-style layouts for its AVX kernels with the same aim;
//! this layout is ours, for `vpdpbusd`'s 16 lanes.)
//!
//! A strip is a sequence of *units* (a pair of 32-weight blocks, or a K-quant super-block),
//! each the 16 rows' headers then their payloads. A *group* is 4 consecutive weights; a
//! group's vector holds row `p`'s 4 weights at bytes `4p..4p + 4` (unsigned: `u`, with
//! `weight = scale * (u - zero)` or, for Q4_K, `d * sc * u - dmin * m`). Per unit:
//!
//! ```text
//! Q8_0 (1088 B): scales (2 blocks x 16 rows f16) | per block: 8 group vectors of q + 128
//! Q5_0 (704 B):  scales (the same)               | per block: 4 nibble vectors (low nibbles
//!                groups 0-3, high nibbles groups 4-7), then 64 bytes of fifth bits as the
//!                kernel reads them ([`FifthBits`]): for AVX-512, 8 x 8 bytes (one bit per
//!                byte of group g's vector: a mask register); for AVX2, as Q5_1's
//! Q5_1 (768 B):  scales | mins (the same)        | per block: 4 nibble vectors as Q5_0's, then
//!                one vector of fifth bits (bit g of byte b: group g's byte b)
//! Q4_0 (576 B):  scales                          | per block: 4 nibble vectors
//! Q4_1 (640 B):  scales | mins (as Q5_1's)       | per block: 4 nibble vectors
//! Q4_K (2368 B): d (16 f16) | dmin (16 f16) | 8 x 16 scales | 8 x 16 mins (a byte each) |
//!                per sub-block of 32: 4 nibble vectors as Q5_0's
//! Q5_K (2880 B): Q4_K's header | per sub-block of 32: 4 nibble vectors and a vector of
//!                fifth bits, as a Q5_1 block's
//! Q6_K (3392 B): d (16 f16) | 32 bytes unused | 16 x 16 scales (i8) | per 32 weights: 4
//!                nibble vectors as above, 2 vectors of top bits (bits 2s, 2s + 1 of vector
//!                h's byte are group 4h + s's)
//! Q3_K (1856 B): Q6_K's header (its scales `sc - 32`) | per 32 weights: 2 vectors of 2-bit
//!                low parts and one of third bits, placed so that each group comes out with
//!                a mask, a shift shared with another group and one more operation
//!                ([`at::Q3_LOW`], [`at::Q3_HIGH`])
//! Q2_K (1344 B): d (16 f16) | dmin (16 f16) | 16 x 16 bytes of a scale (low nibble) and a
//!                min (high) | per 32 weights: 2 vectors of 2-bit weights as Q3_K's low parts
//! IQ4_NL (576 B): Q4_0's, the nibbles indices into `IQ4_VALUES`
//! IQ4_XS (2240 B): d (16 f16) | 32 bytes unused | 8 x 16 scales `sc - 32` (i8) | per
//!                sub-block of 32: 4 nibble vectors of indices
//! IQ3_XXS, IQ3_S (2240 B): IQ4_XS's, the scales `2 s + 1`, the indices into the format's
//!                16 values (`grids::Codebook`)
//! IQ2_XXS, IQ1_S (1728 B): IQ4_XS's header | per 32 weights: 3-bit indices into the format's
//!                6 values, laid out as Q3_K's weights
//! IQ2_XS, IQ2_S, IQ1_M (1856 B): Q3_K's, the scales `2 s + 1`, the weights 3-bit indices
//! ```
//!
//! Rows past `n` in the last strip are zeros (zero scales: zero outputs, never written out).
//! The K-quants' 12 packed bytes of scales and mins become 16 bytes (2.8% more bytes than GGUF
//! for Q4_K, 2.3% for Q5_K; the
//! kernels load a sub-block's 16 scales as one vector instead of unpacking 16 rows' bit
//! fields), and Q3_K's become 16 bytes with 32 aligning its payloads (5.5% more); the other
//! formats keep GGUF's size (Q6_K's unused 32 bytes align its payloads; Q2_K's bytes of a
//! scale and a min are GGUF's own) but IQ4_XS, whose 12 bits of scales a sub-block become a
//! byte a row and whose header is aligned (2.9% more). The grid formats, whose weights are
//! grid points of 4 or 8 (IQ3_XXS 3.06 bits a weight, IQ3_S 3.44, IQ2_XXS 2.06, IQ2_XS 2.31,
//! IQ2_S 2.56, IQ1_S 1.56, IQ1_M 1.75), keep an index a weight: 4 bits for IQ3's 16 values
//! (4.38 bits a weight with the header), 3 for IQ2's and IQ1's 6 (3.38, or 3.63 with scales
//! per 16): up to 2.2 times GGUF's bytes (IQ1_S).

mod gguf;

use super::QuantFormat;
use gguf::{f16_bits, read_gguf, write_gguf};

/// Weight rows per strip: one 32-bit lane of a 512-bit vector each.
pub const STRIP: usize = 16;
/// Weights per group: the four bytes `vpdpbusd` sums into a lane.
const GROUP: usize = 4;
/// Bytes of one group's vector: `GROUP` weights of each of the `STRIP` rows.
pub const VECTOR: usize = STRIP * GROUP;

/// Weights per unit.
pub const fn unit_weights(format: QuantFormat) -> usize {
    // Two blocks of the 32-weight formats; a K-quant's (or IQ format's) super-block.
    if format.block_weights() == 32 {
        64
    } else {
        256
    }
}

/// Bytes of one unit of a strip.
pub const fn unit_bytes(format: QuantFormat) -> usize {
    match format {
        QuantFormat::Q8_0 => 1088,
        QuantFormat::Q5_0 => 704,
        QuantFormat::Q5_1 => 768,
        QuantFormat::Q4_0 | QuantFormat::Iq4Nl => 576,
        QuantFormat::Q4_1 => 640,
        QuantFormat::Q4K => 2368,
        QuantFormat::Q6K => 3392,
        QuantFormat::Q5K => 2880,
        QuantFormat::Q3K => 1856,
        QuantFormat::Q2K => 1344,
        QuantFormat::Iq4Xs | QuantFormat::Iq3Xxs | QuantFormat::Iq3S => 2240,
        QuantFormat::Iq2Xxs | QuantFormat::Iq1S => 1728,
        QuantFormat::Iq2Xs | QuantFormat::Iq2S | QuantFormat::Iq1M => 1856,
    }
}

/// Offsets inside a unit (see the module's table).
pub mod at {
    use super::QuantFormat;

    /// 32-weight formats: block `b`'s 16 f16 scales.
    pub const fn block_scales(b: usize) -> usize {
        32 * b
    }
    /// Q8_0: block `b`'s group vectors.
    pub const fn q8_block(b: usize) -> usize {
        64 + 512 * b
    }
    /// Q5_0: block `b`'s nibble vectors; its fifth bits follow at `+ 256`.
    pub const fn q5_block(b: usize) -> usize {
        64 + 320 * b
    }
    pub const Q5_BITS: usize = 256;
    /// Q5_1: block `b`'s 16 f16 mins.
    pub const fn block_mins(b: usize) -> usize {
        64 + 32 * b
    }
    /// Q5_1: block `b`'s payload, as Q5_0's.
    pub const fn q5_1_block(b: usize) -> usize {
        128 + 320 * b
    }
    /// Q4_0: block `b`'s nibble vectors.
    pub const fn q4_block(b: usize) -> usize {
        64 + 256 * b
    }
    /// Q4_1: block `b`'s nibble vectors (after the scales and Q5_1's [`block_mins`]).
    pub const fn q4_1_block(b: usize) -> usize {
        128 + 256 * b
    }
    /// K-quants: the 16 rows' `d` (f16); Q4_K's and Q5_K's `dmin` follow at 32.
    pub const D: usize = 0;
    pub const DMIN: usize = 32;
    /// Q4_K and Q5_K: sub-block `j`'s 16 scales, 16 mins.
    pub const fn q4k_scales(j: usize) -> usize {
        64 + 16 * j
    }
    pub const fn q4k_mins(j: usize) -> usize {
        192 + 16 * j
    }
    /// Q4_K: sub-block `j`'s 4 nibble vectors.
    pub const fn q4k_quants(j: usize) -> usize {
        320 + 256 * j
    }
    /// Q5_K: sub-block `j`'s 4 nibble vectors; its fifth bits follow at `+ Q5_BITS`.
    pub const fn q5k_quants(j: usize) -> usize {
        320 + 320 * j
    }
    /// Q6_K: sub-block `i`'s (16 weights) 16 scales.
    pub const fn q6k_scales(i: usize) -> usize {
        64 + 16 * i
    }
    /// Q6_K: weights `32j..32j + 32`: 4 nibble vectors, then 2 of top bits at `+ 256`.
    pub const fn q6k_quants(j: usize) -> usize {
        320 + 384 * j
    }
    pub const Q6_TOPS: usize = 256;
    /// Q3_K: weights `32j..32j + 32`: vectors of low parts at `+ 0` and `+ 64`, third bits at
    /// `+ Q3_HIGH_BITS`. Its scales are Q6_K's ([`q6k_scales`]).
    pub const fn q3k_quants(j: usize) -> usize {
        320 + 192 * j
    }
    pub const Q3_HIGH_BITS: usize = 128;
    /// Where group `g`'s 2 low bits lie: the vector (0 or 1) and the bit they start at. Groups
    /// 0 and 1 (2 and 3) of a sub-block at bits 0 and 2, groups 4 and 5 (6 and 7) of the
    /// next at bits 4 and 6: a 16-bit shift by 2 of a vector brings its second group of each
    /// sub-block to the first's bits (a byte's bits 6-7 take the next byte's 0-1: outside
    /// both sub-blocks' masks).
    pub const Q3_LOW: [(usize, u32); 8] = [
        (0, 0),
        (0, 2),
        (1, 0),
        (1, 2),
        (0, 4),
        (0, 6),
        (1, 4),
        (1, 6),
    ];
    /// The bit of group `g`'s third bit in its byte: groups 0-3 at 2, 3, 1, 0 and 4-7 at 6, 7,
    /// 5, 4, so that the vector as it is and shifted right by 1, left by 1 and left by 2 puts
    /// each group's at bit 2 (groups 0-3) or 6 (4-7), where its low bits' third bit goes.
    pub const Q3_HIGH: [u32; 8] = [2, 3, 1, 0, 6, 7, 5, 4];
    /// Q2_K: sub-block `i`'s (16 weights) 16 bytes of a scale and a min (after `D` and
    /// `DMIN`).
    pub const fn q2k_scales(i: usize) -> usize {
        64 + 16 * i
    }
    /// Q2_K: weights `32j..32j + 32`: 2 vectors laid out as Q3_K's low parts ([`Q3_LOW`]).
    pub const fn q2k_quants(j: usize) -> usize {
        320 + 128 * j
    }
    /// IQ4_XS: sub-block `j`'s 16 scales less 32 (i8, after `D` and 32 unused bytes); grids:
    /// `2 s + 1`.
    pub const fn iq4xs_scales(j: usize) -> usize {
        64 + 16 * j
    }
    /// IQ4_XS: sub-block `j`'s 4 nibble vectors of indices.
    pub const fn iq4xs_quants(j: usize) -> usize {
        192 + 256 * j
    }
    /// IQ4_XS and the grid formats: the 16 scales of piece `i`, 32 weights (IQ4_XS's place) or,
    /// where the format scales each 16, 16 weights (Q6_K's).
    pub const fn grid_scales(format: QuantFormat, i: usize) -> usize {
        if format.scales_16() {
            q6k_scales(i)
        } else {
            iq4xs_scales(i)
        }
    }
    /// The same: weights `32j..32j + 32`'s indices, 4 nibble vectors (IQ4_XS's place) or 3
    /// vectors laid out as Q3_K's weights ([`q3k_quants`] after 16 scales, the same 192 bytes
    /// a piece after 8).
    pub const fn grid_quants(format: QuantFormat, j: usize) -> usize {
        match (format.three_bit_indices(), format.scales_16()) {
            (false, _) => iq4xs_quants(j),
            (true, false) => 192 + 192 * j,
            (true, true) => q3k_quants(j),
        }
    }
}

/// Bytes of a strip of `k`-weight rows.
pub fn strip_bytes(format: QuantFormat, k: usize) -> usize {
    k / unit_weights(format) * unit_bytes(format)
}

/// Strips holding `n` rows.
pub fn strips(n: usize) -> usize {
    n.div_ceil(STRIP)
}

/// One row's unit, decoded: the unsigned values `u` and the header fields as stored.
#[derive(Clone, Copy)]
struct Unit {
    u: [u8; 256],
    /// f16 bits: the 32-weight formats' two blocks' scales (Q5_1: then their mins), Q2_K, Q4_K
    /// and Q5_K `d` and `dmin`, Q3_K and Q6_K `d`.
    d: [u16; 4],
    /// Q4_K/Q5_K: scales 0-7 and mins 0-7 (6 bits each); Q6_K: the 16 scales (i8 bits); Q3_K:
    /// the 16 scales less 32 (i8 bits); Q2_K: GGUF's 16 bytes of a scale and a min; IQ4_XS:
    /// the 8 scales less 32 (i8 bits); the grid formats: the 8 (16) scales `2 s + 1`.
    sc: [u8; 16],
}

impl Unit {
    const ZERO: Self = Self {
        u: [0; 256],
        d: [0; 4],
        sc: [0; 16],
    };
}

/// The byte of a nibble vector (row `p`, weight `i` of its group) for groups `t` and `t + 4`
/// of the 32 weights at `u`.
fn nibbles(u: &[u8], t: usize, i: usize) -> u8 {
    (u[GROUP * t + i] & 0x0F) | (u[GROUP * (t + 4) + i] & 0x0F) << 4
}

/// Writes the 32 weights at `rows[p][from..]` of the 16 rows as 4 nibble vectors at `out`.
fn write_nibbles(rows: &[Unit; STRIP], from: usize, out: &mut [u8]) {
    for t in 0..4 {
        for (p, row) in rows.iter().enumerate() {
            for i in 0..GROUP {
                out[VECTOR * t + GROUP * p + i] = nibbles(&row.u[from..], t, i);
            }
        }
    }
}

/// Reads 32 weights of row `p` (`u[from..from + 32]`, low 4 bits) from nibble vectors.
fn read_nibbles(vectors: &[u8], p: usize, u: &mut [u8]) {
    for t in 0..4 {
        for i in 0..GROUP {
            let byte = vectors[VECTOR * t + GROUP * p + i];
            u[GROUP * t + i] = byte & 0x0F;
            u[GROUP * (t + 4) + i] = byte >> 4;
        }
    }
}

/// How a payload of 32 five-bit weights keeps its fifth bits after the 4 nibble vectors: the
/// one part of the layout that depends on the kernel reading it. Q5_1 and Q5_K always keep
/// planes (the AVX2 and AVX-512 kernels read them, the AMX kernel has neither format); Q5_0
/// keeps what its kernel reads fastest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FifthBits {
    /// Each group's in 8 bytes, bit `4p + i` row `p`'s weight `i` of the group: a mask
    /// register for AVX-512 (a masked add) and AMX.
    Masks,
    /// One vector, bit `g` of byte `b` group `g`'s byte `b`: two instructions a group for
    /// AVX2 (a shift and a mask), where a mask costs it a broadcast, a shuffle, two masks and
    /// a compare (docs/benchmarks.md, session 29).
    Planes,
}

/// Writes 32 five-bit weights of the 16 rows (`rows[p].u[from..from + 32]`) as a block
/// payload: 4 nibble vectors, then the fifth bits as `bits` says.
fn write_five_bits(rows: &[Unit; STRIP], from: usize, bits: FifthBits, out: &mut [u8]) {
    write_nibbles(rows, from, out);
    if bits == FifthBits::Planes {
        for (byte, plane) in out[at::Q5_BITS..][..VECTOR].iter_mut().enumerate() {
            let u = &rows[byte / GROUP].u[from + byte % GROUP..];
            *plane = (0..8).fold(0, |plane, g| plane | (u[GROUP * g] >> 4) << g);
        }
        return;
    }
    for g in 0..8 {
        let mask = (0..VECTOR).fold(0u64, |mask, byte| {
            let u = rows[byte / GROUP].u[from + GROUP * g + byte % GROUP];
            mask | u64::from(u >> 4) << byte
        });
        out[at::Q5_BITS + 8 * g..][..8].copy_from_slice(&mask.to_le_bytes());
    }
}

/// Reads row `p`'s 32 five-bit weights (into `u`) from a payload [`write_five_bits`] wrote.
fn read_five_bits(payload: &[u8], p: usize, bits: FifthBits, u: &mut [u8]) {
    read_nibbles(payload, p, u);
    if bits == FifthBits::Planes {
        for i in 0..GROUP {
            let plane = payload[at::Q5_BITS + GROUP * p + i];
            for g in 0..8 {
                u[GROUP * g + i] |= ((plane >> g) & 1) << 4;
            }
        }
        return;
    }
    for g in 0..8 {
        let at = at::Q5_BITS + 8 * g;
        let mask = u64::from_le_bytes(payload[at..at + 8].try_into().expect("8 bytes"));
        for i in 0..GROUP {
            u[GROUP * g + i] |= (((mask >> (GROUP * p + i)) & 1) as u8) << 4;
        }
    }
}

/// Writes 32 three-bit weights of the 16 rows (`rows[p].u[from..from + 32]`) as Q3_K's 3
/// vectors ([`at::Q3_LOW`], [`at::Q3_HIGH`]).
fn write_three_bits(rows: &[Unit; STRIP], from: usize, out: &mut [u8]) {
    write_crumbs(rows, from, out);
    out[at::Q3_HIGH_BITS..][..VECTOR].fill(0);
    for byte in 0..VECTOR {
        let (p, i) = (byte / GROUP, byte % GROUP);
        for g in 0..8 {
            let u = rows[p].u[from + GROUP * g + i];
            out[at::Q3_HIGH_BITS + byte] |= (u >> 2) << at::Q3_HIGH[g];
        }
    }
}

/// Writes the 2 low bits of 32 weights of the 16 rows as 2 vectors ([`at::Q3_LOW`]).
fn write_crumbs(rows: &[Unit; STRIP], from: usize, out: &mut [u8]) {
    out[..2 * VECTOR].fill(0);
    for byte in 0..VECTOR {
        let (p, i) = (byte / GROUP, byte % GROUP);
        for (g, &(vector, bit)) in at::Q3_LOW.iter().enumerate() {
            out[VECTOR * vector + byte] |= (rows[p].u[from + GROUP * g + i] & 3) << bit;
        }
    }
}

/// Reads row `p`'s 32 three-bit weights (into `u`) from vectors [`write_three_bits`] wrote.
fn read_three_bits(vectors: &[u8], p: usize, u: &mut [u8]) {
    read_crumbs(vectors, p, u);
    for g in 0..8 {
        for i in 0..GROUP {
            let high = (vectors[at::Q3_HIGH_BITS + GROUP * p + i] >> at::Q3_HIGH[g]) & 1;
            u[GROUP * g + i] |= high << 2;
        }
    }
}

/// Reads row `p`'s 32 weights' 2 low bits (into `u`) from vectors [`write_crumbs`] wrote.
fn read_crumbs(vectors: &[u8], p: usize, u: &mut [u8]) {
    for (g, &(vector, bit)) in at::Q3_LOW.iter().enumerate() {
        for i in 0..GROUP {
            u[GROUP * g + i] = (vectors[VECTOR * vector + GROUP * p + i] >> bit) & 3;
        }
    }
}

/// Writes one unit of a strip (`out`, [`unit_bytes`]) from the 16 rows' decoded units, Q5_0's
/// fifth bits as `q5_0`.
fn write_unit(format: QuantFormat, q5_0: FifthBits, rows: &[Unit; STRIP], out: &mut [u8]) {
    let halves = |out: &mut [u8], at: usize, value: &dyn Fn(&Unit) -> u16| {
        for (p, row) in rows.iter().enumerate() {
            out[at + 2 * p..at + 2 * p + 2].copy_from_slice(&value(row).to_le_bytes());
        }
    };
    match format {
        QuantFormat::Q8_0
        | QuantFormat::Q5_0
        | QuantFormat::Q5_1
        | QuantFormat::Q4_0
        | QuantFormat::Q4_1
        | QuantFormat::Iq4Nl => {
            for b in 0..2 {
                halves(out, at::block_scales(b), &|row| row.d[b]);
                match format {
                    QuantFormat::Q8_0 => {
                        let vectors = &mut out[at::q8_block(b)..];
                        for g in 0..8 {
                            for (p, row) in rows.iter().enumerate() {
                                let from = 32 * b + GROUP * g;
                                vectors[VECTOR * g + GROUP * p..][..GROUP]
                                    .copy_from_slice(&row.u[from..from + GROUP]);
                            }
                        }
                    }
                    QuantFormat::Q5_0 => {
                        write_five_bits(rows, 32 * b, q5_0, &mut out[at::q5_block(b)..])
                    }
                    QuantFormat::Q5_1 => {
                        halves(out, at::block_mins(b), &|row| row.d[2 + b]);
                        let out = &mut out[at::q5_1_block(b)..];
                        write_five_bits(rows, 32 * b, FifthBits::Planes, out);
                    }
                    QuantFormat::Q4_1 => {
                        halves(out, at::block_mins(b), &|row| row.d[2 + b]);
                        write_nibbles(rows, 32 * b, &mut out[at::q4_1_block(b)..]);
                    }
                    _ => write_nibbles(rows, 32 * b, &mut out[at::q4_block(b)..]),
                }
            }
        }
        QuantFormat::Q4K | QuantFormat::Q5K => {
            halves(out, at::D, &|row| row.d[0]);
            halves(out, at::DMIN, &|row| row.d[1]);
            for j in 0..8 {
                for (p, row) in rows.iter().enumerate() {
                    out[at::q4k_scales(j) + p] = row.sc[j];
                    out[at::q4k_mins(j) + p] = row.sc[8 + j];
                }
                if format == QuantFormat::Q5K {
                    let out = &mut out[at::q5k_quants(j)..];
                    write_five_bits(rows, 32 * j, FifthBits::Planes, out);
                } else {
                    write_nibbles(rows, 32 * j, &mut out[at::q4k_quants(j)..]);
                }
            }
        }
        QuantFormat::Iq4Xs
        | QuantFormat::Iq3Xxs
        | QuantFormat::Iq3S
        | QuantFormat::Iq2Xxs
        | QuantFormat::Iq2Xs
        | QuantFormat::Iq2S
        | QuantFormat::Iq1S
        | QuantFormat::Iq1M => {
            halves(out, at::D, &|row| row.d[0]);
            let pieces = if format.scales_16() { 16 } else { 8 };
            for i in 0..pieces {
                for (p, row) in rows.iter().enumerate() {
                    out[at::grid_scales(format, i) + p] = row.sc[i];
                }
            }
            for j in 0..8 {
                let out = &mut out[at::grid_quants(format, j)..];
                if format.three_bit_indices() {
                    write_three_bits(rows, 32 * j, out);
                } else {
                    write_nibbles(rows, 32 * j, out);
                }
            }
        }
        QuantFormat::Q2K | QuantFormat::Q3K | QuantFormat::Q6K => {
            halves(out, at::D, &|row| row.d[0]);
            for i in 0..16 {
                for (p, row) in rows.iter().enumerate() {
                    out[at::q6k_scales(i) + p] = row.sc[i];
                }
            }
            if format == QuantFormat::Q2K {
                halves(out, at::DMIN, &|row| row.d[1]);
                for j in 0..8 {
                    write_crumbs(rows, 32 * j, &mut out[at::q2k_quants(j)..]);
                }
                return;
            }
            if format == QuantFormat::Q3K {
                for j in 0..8 {
                    write_three_bits(rows, 32 * j, &mut out[at::q3k_quants(j)..]);
                }
                return;
            }
            for j in 0..8 {
                let quants = &mut out[at::q6k_quants(j)..];
                write_nibbles(rows, 32 * j, quants);
                for (h, tops) in quants[at::Q6_TOPS..][..2 * VECTOR]
                    .chunks_exact_mut(VECTOR)
                    .enumerate()
                {
                    for (byte, top) in tops.iter_mut().enumerate() {
                        let (p, i) = (byte / GROUP, byte % GROUP);
                        *top = (0..4).fold(0, |top, s| {
                            let u = rows[p].u[32 * j + GROUP * (4 * h + s) + i];
                            top | (u >> 4) << (2 * s)
                        });
                    }
                }
            }
        }
    }
}

/// Row `p`'s unit from a strip's unit (the inverse of [`write_unit`] for one row).
fn read_unit(format: QuantFormat, q5_0: FifthBits, unit: &[u8], p: usize) -> Unit {
    let mut row = Unit::ZERO;
    let half = |at: usize| f16_bits(unit, at + 2 * p);
    match format {
        QuantFormat::Q8_0
        | QuantFormat::Q5_0
        | QuantFormat::Q5_1
        | QuantFormat::Q4_0
        | QuantFormat::Q4_1
        | QuantFormat::Iq4Nl => {
            for b in 0..2 {
                row.d[b] = half(at::block_scales(b));
                let u = &mut row.u[32 * b..32 * b + 32];
                match format {
                    QuantFormat::Q8_0 => {
                        for g in 0..8 {
                            let at = at::q8_block(b) + VECTOR * g + GROUP * p;
                            u[GROUP * g..GROUP * g + GROUP].copy_from_slice(&unit[at..at + GROUP]);
                        }
                    }
                    QuantFormat::Q5_0 => read_five_bits(&unit[at::q5_block(b)..], p, q5_0, u),
                    QuantFormat::Q5_1 => {
                        row.d[2 + b] = half(at::block_mins(b));
                        let payload = &unit[at::q5_1_block(b)..];
                        read_five_bits(payload, p, FifthBits::Planes, u);
                    }
                    QuantFormat::Q4_1 => {
                        row.d[2 + b] = half(at::block_mins(b));
                        read_nibbles(&unit[at::q4_1_block(b)..], p, u);
                    }
                    _ => read_nibbles(&unit[at::q4_block(b)..], p, u),
                }
            }
        }
        QuantFormat::Q4K | QuantFormat::Q5K => {
            row.d[..2].copy_from_slice(&[half(at::D), half(at::DMIN)]);
            for j in 0..8 {
                row.sc[j] = unit[at::q4k_scales(j) + p];
                row.sc[8 + j] = unit[at::q4k_mins(j) + p];
                let u = &mut row.u[32 * j..32 * j + 32];
                if format == QuantFormat::Q5K {
                    let payload = &unit[at::q5k_quants(j)..];
                    read_five_bits(payload, p, FifthBits::Planes, u);
                } else {
                    read_nibbles(&unit[at::q4k_quants(j)..], p, u);
                }
            }
        }
        QuantFormat::Iq4Xs
        | QuantFormat::Iq3Xxs
        | QuantFormat::Iq3S
        | QuantFormat::Iq2Xxs
        | QuantFormat::Iq2Xs
        | QuantFormat::Iq2S
        | QuantFormat::Iq1S
        | QuantFormat::Iq1M => {
            row.d[0] = half(at::D);
            let pieces = if format.scales_16() { 16 } else { 8 };
            for i in 0..pieces {
                row.sc[i] = unit[at::grid_scales(format, i) + p];
            }
            for j in 0..8 {
                let (quants, u) = (
                    &unit[at::grid_quants(format, j)..],
                    &mut row.u[32 * j..][..32],
                );
                if format.three_bit_indices() {
                    read_three_bits(quants, p, u);
                } else {
                    read_nibbles(quants, p, u);
                }
            }
        }
        QuantFormat::Q2K | QuantFormat::Q3K | QuantFormat::Q6K => {
            row.d[0] = half(at::D);
            for i in 0..16 {
                row.sc[i] = unit[at::q6k_scales(i) + p];
            }
            if format == QuantFormat::Q2K {
                row.d[1] = half(at::DMIN);
                for j in 0..8 {
                    let u = &mut row.u[32 * j..32 * j + 32];
                    read_crumbs(&unit[at::q2k_quants(j)..], p, u);
                }
                return row;
            }
            if format == QuantFormat::Q3K {
                for j in 0..8 {
                    let u = &mut row.u[32 * j..32 * j + 32];
                    read_three_bits(&unit[at::q3k_quants(j)..], p, u);
                }
                return row;
            }
            for j in 0..8 {
                let quants = &unit[at::q6k_quants(j)..];
                let u = &mut row.u[32 * j..32 * j + 32];
                read_nibbles(quants, p, u);
                for (g, value) in u.chunks_exact_mut(GROUP).enumerate() {
                    let tops = &quants[at::Q6_TOPS + VECTOR * (g / 4) + GROUP * p..];
                    for (i, value) in value.iter_mut().enumerate() {
                        *value |= ((tops[i] >> (2 * (g % 4))) & 3) << 4;
                    }
                }
            }
        }
    }
    row
}

/// Writes strip `s` (rows `16 s..`) of the `[n, k]` GGUF matrix `source` into `out`
/// ([`strip_bytes`]), Q5_0's fifth bits as `q5_0`; rows past `n` become zeros.
pub fn write_strip(
    format: QuantFormat,
    q5_0: FifthBits,
    n: usize,
    k: usize,
    source: &[u8],
    s: usize,
    out: &mut [u8],
) {
    let row_bytes = format.row_bytes(k).expect("whole chunks");
    let unit_size = unit_bytes(format);
    for (i, out) in out.chunks_exact_mut(unit_size).enumerate() {
        let rows: [Unit; STRIP] = std::array::from_fn(|p| {
            let j = STRIP * s + p;
            if j < n {
                read_gguf(format, &source[j * row_bytes..(j + 1) * row_bytes], i)
            } else {
                Unit::ZERO
            }
        });
        write_unit(format, q5_0, &rows, out);
    }
}

/// Row `p` of the strip `strip` (Q5_0's fifth bits as `q5_0`) as GGUF blocks, into `row`
/// (`format.row_bytes(k)` bytes).
pub fn gguf_row(format: QuantFormat, q5_0: FifthBits, strip: &[u8], p: usize, row: &mut [u8]) {
    for (i, unit) in strip.chunks_exact(unit_bytes(format)).enumerate() {
        write_gguf(format, &read_unit(format, q5_0, unit, p), row, i);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_are_as_large_as_their_offsets_say() {
        assert_eq!(at::q8_block(2), unit_bytes(QuantFormat::Q8_0));
        assert_eq!(at::q5_block(2), unit_bytes(QuantFormat::Q5_0));
        assert_eq!(at::q4k_quants(8), unit_bytes(QuantFormat::Q4K));
        assert_eq!(at::q6k_quants(8), unit_bytes(QuantFormat::Q6K));
        assert_eq!(at::q3k_quants(8), unit_bytes(QuantFormat::Q3K));
        assert_eq!(at::q3k_quants(0), at::q6k_quants(0));
        assert_eq!(at::q2k_quants(8), unit_bytes(QuantFormat::Q2K));
        assert_eq!(at::q2k_scales(16), at::q2k_quants(0));
        // Q2_K's scales where the shared writer puts Q6_K's.
        assert_eq!(at::q2k_scales(3), at::q6k_scales(3));
        assert_eq!(at::q5k_quants(8), unit_bytes(QuantFormat::Q5K));
        assert_eq!(at::q5_1_block(2), unit_bytes(QuantFormat::Q5_1));
        assert_eq!(at::q4_block(2), unit_bytes(QuantFormat::Q4_0));
        assert_eq!(at::q4_1_block(2), unit_bytes(QuantFormat::Q4_1));
        assert_eq!(at::block_mins(2), at::q4_1_block(0));
        assert_eq!(at::block_mins(2), at::q5_1_block(0));
        assert_eq!(at::q5_block(1) - at::q5_block(0), at::Q5_BITS + 64);
        assert_eq!(at::q6k_scales(16), at::q6k_quants(0));
        assert_eq!(at::q4k_mins(8), at::q4k_quants(0));
        assert_eq!(at::iq4xs_scales(8), at::iq4xs_quants(0));
        assert_eq!(at::iq4xs_quants(8), unit_bytes(QuantFormat::Iq4Xs));
        // Each grid format's scales end where its indices start, which end with the unit.
        for format in QuantFormat::ALL.into_iter().filter(|f| f.is_grid()) {
            let pieces = if format.scales_16() { 16 } else { 8 };
            assert_eq!(at::grid_scales(format, pieces), at::grid_quants(format, 0));
            assert_eq!(
                at::grid_quants(format, 8),
                unit_bytes(format),
                "{}",
                format.name()
            );
        }
        // Every group vector starts on a cache line where the unit does.
        for format in QuantFormat::ALL {
            assert_eq!(unit_bytes(format) % 64, 0, "{}", format.name());
        }
    }
}
