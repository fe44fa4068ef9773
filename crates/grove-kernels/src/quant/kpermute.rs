//! The layout the AVX-512 kernels read the K-quants (Q4_K, Q6_K) in, made once at load: each
//! super-block keeps its bytes and its header (scales, mins, `d`) where GGUF has them, with its
//! quants reordered so that every 32-bit lane of the kernel's vectors covers one sub-block.
//!
//! A super-block's 256 weights are four 64-byte vectors `v` of unsigned values (after the
//! kernel splits nibbles and adds high bits). In GGUF's order a vector's lanes straddle two or
//! four sub-blocks, and which ones changes from vector to vector, so every vector needed its
//! own gathered scales: a permute, and products widened to 16 bits (`vpmaddubsw`) to be
//! scaled per pair (`vpdpwssd`). Here lane `l` of every vector holds weights of one sub-block
//! only (Q6_K: sub-block `l`; Q4_K: sub-block `l mod 8`), so the four `vpdpbusd` of a
//! super-block add into one sum per lane, scaled once by one vector of the sub-blocks' scales.
//! The activations are quantized in the same order (`QuantizedRows::kq`, [`activation_order`]).
//!
//! Weight `at(format, v, l, b)` of a super-block is byte `b` of lane `l` of vector `v`:
//! - Q6_K (16 sub-blocks of 16): `16 l + 4 v + b`;
//! - Q4_K (8 sub-blocks of 32): `32 (l mod 8) + 4 (2 v + l div 8) + b`.
//!
//! Stored as (offsets within the super-block):
//! - Q4_K: bytes 16..144, two 64-byte halves `h`: byte `4 l + b` of half `h` holds vector
//!   `2 h`'s value in its low nibble and vector `2 h + 1`'s in its high nibble; and the eight
//!   6-bit scales, then the eight 6-bit mins, packed end to end in bytes 4..16 (little-endian
//!   bits: scale `j` at bit `6 j` of bytes 4..10, min `j` at bit `6 j` of bytes 10..16), so
//!   that one `pdep` spreads six bytes into eight (GGUF splits the last four of each into a
//!   nibble and two bits two bytes apart);
//! - Q6_K: bytes 0..128 the same for the low 4 bits of the 6-bit values, and bytes 128..192
//!   byte `4 l + b` holds the top 2 bits of vector `v`'s value in its bits `2 v, 2 v + 1`.

use super::scalar::{decode_chunk, q4k_scale_min};
use super::{QuantFormat, CHUNK};

/// Weights per super-block.
pub const SUPER: usize = 256;

/// The super-block index of the weight in byte `b` of lane `l` of vector `v`.
#[inline]
pub const fn at(format: QuantFormat, v: usize, l: usize, b: usize) -> usize {
    match format {
        QuantFormat::Q6K => 16 * l + 4 * v + b,
        _ => 32 * (l % 8) + 4 * (2 * v + l / 8) + b,
    }
}

/// The super-block's 256 unsigned values in GGUF's order (through the reference decoder).
fn gguf_values(format: QuantFormat, block: &[u8]) -> [u8; SUPER] {
    let mut values = [0u8; SUPER];
    for (c, out) in values.chunks_exact_mut(CHUNK).enumerate() {
        out.copy_from_slice(&decode_chunk(format, block, c).u);
    }
    values
}

/// Writes GGUF super-block `source` into `out` (same size) in the permuted layout.
pub fn permute_block(format: QuantFormat, source: &[u8], out: &mut [u8]) {
    let values = gguf_values(format, source);
    out.copy_from_slice(source);
    let quants = match format {
        QuantFormat::Q4K => 16,
        QuantFormat::Q6K => 0,
        _ => unreachable!("only K-quants are permuted"),
    };
    for half in 0..2 {
        for l in 0..16 {
            for b in 0..4 {
                let low = values[at(format, 2 * half, l, b)] & 0x0F;
                let high = values[at(format, 2 * half + 1, l, b)] & 0x0F;
                out[quants + 64 * half + 4 * l + b] = low | (high << 4);
            }
        }
    }
    if format == QuantFormat::Q6K {
        for l in 0..16 {
            for b in 0..4 {
                out[128 + 4 * l + b] = (0..4).fold(0u8, |bits, v| {
                    bits | ((values[at(format, v, l, b)] >> 4) << (2 * v))
                });
            }
        }
    } else {
        let (scales, mins): (Vec<u8>, Vec<u8>) =
            (0..8).map(|j| q4k_scale_min(&source[4..16], j)).unzip();
        out[4..10].copy_from_slice(&pack6(&scales));
        out[10..16].copy_from_slice(&pack6(&mins));
    }
}

/// Eight 6-bit values end to end in six bytes (value `j` at bit `6 j`, little-endian).
fn pack6(values: &[u8]) -> [u8; 6] {
    let bits =
        (values.iter().enumerate()).fold(0u64, |bits, (j, &v)| bits | (u64::from(v) << (6 * j)));
    bits.to_le_bytes()[..6].try_into().expect("six bytes")
}

/// The inverse of [`pack6`].
fn unpack6(bytes: &[u8]) -> [u8; 8] {
    let mut word = [0u8; 8];
    word[..6].copy_from_slice(bytes);
    let bits = u64::from_le_bytes(word);
    std::array::from_fn(|j| ((bits >> (6 * j)) & 63) as u8)
}

/// The inverse of [`permute_block`]: GGUF's super-block from a permuted one.
pub fn gguf_block(format: QuantFormat, block: &[u8], out: &mut [u8]) {
    let mut values = [0u8; SUPER];
    let quants = if format == QuantFormat::Q4K { 16 } else { 0 };
    for half in 0..2 {
        for l in 0..16 {
            for b in 0..4 {
                let byte = block[quants + 64 * half + 4 * l + b];
                values[at(format, 2 * half, l, b)] = byte & 0x0F;
                values[at(format, 2 * half + 1, l, b)] = byte >> 4;
            }
        }
    }
    if format == QuantFormat::Q6K {
        for l in 0..16 {
            for b in 0..4 {
                let bits = block[128 + 4 * l + b];
                for v in 0..4 {
                    values[at(format, v, l, b)] |= ((bits >> (2 * v)) & 3) << 4;
                }
            }
        }
    }
    out.copy_from_slice(block);
    write_gguf_values(format, &values, out);
    if format == QuantFormat::Q4K {
        let (scales, mins) = (unpack6(&block[4..10]), unpack6(&block[10..16]));
        let packed = &mut out[4..16];
        // GGUF's packing (`q4k_scale_min` reads it): sub-blocks 0-3 in the low 6 bits of
        // bytes 0-3 (scales) and 4-7 (mins); sub-blocks 4-7 in the nibbles of bytes 8-11 and
        // the top 2 bits of bytes 0-7.
        for j in 0..4 {
            packed[j] = scales[j] | ((scales[j + 4] >> 4) << 6);
            packed[j + 4] = mins[j] | ((mins[j + 4] >> 4) << 6);
            packed[j + 8] = (scales[j + 4] & 0x0F) | ((mins[j + 4] & 0x0F) << 4);
        }
    }
}

/// GGUF's quant bytes of a super-block from its 256 values (the header left as it is): the
/// inverse of the reference decoder.
fn write_gguf_values(format: QuantFormat, values: &[u8; SUPER], block: &mut [u8]) {
    match format {
        QuantFormat::Q4K => {
            // Chunk `j`: byte `i` of quants `32 j..` holds values `64 j + i` and `64 j + 32 + i`.
            for j in 0..4 {
                for i in 0..32 {
                    block[16 + 32 * j + i] = values[64 * j + i] | (values[64 * j + 32 + i] << 4);
                }
            }
        }
        QuantFormat::Q6K => {
            block[..192].fill(0);
            // Chunk `4 half + 2 part .. `: low bits in nibble `part` of bytes `64 half + l`
            // (`l < 64`), top bits at `4 part (+2 for l >= 32)` of byte `128 + 32 half + l % 32`.
            for within in 0..4 {
                let (half, part) = (within / 2, within % 2);
                for l in 0..64 {
                    let value = values[64 * within + l];
                    block[64 * half + l] |= (value & 0x0F) << (4 * part);
                    let shift = 4 * part + 2 * (l / 32);
                    block[128 + 32 * half + l % 32] |= (value >> 4) << shift;
                }
            }
        }
        _ => unreachable!("only K-quants are permuted"),
    }
}

/// Activation rows `q` (whole 256-value blocks) in `format`'s permuted order: value
/// `64 v + 4 l + b` of a block is its value [`at`]`(format, v, l, b)`. Four values move
/// together (`at` keeps a lane's four consecutive); every decode step's K-quant products
/// reorder their input once.
pub fn activation_order(format: QuantFormat, q: &[i8]) -> Vec<i8> {
    let words: [usize; 64] = std::array::from_fn(|i| at(format, i / 16, i % 16, 0) / 4);
    let mut out = vec![0i8; q.len()];
    for (block, out) in q.chunks_exact(SUPER).zip(out.chunks_exact_mut(SUPER)) {
        let block: &[i8; SUPER] = block.try_into().expect("a whole block");
        for (out, &from) in out.chunks_exact_mut(4).zip(&words) {
            out.copy_from_slice(&block[4 * from..4 * from + 4]);
        }
    }
    out
}
