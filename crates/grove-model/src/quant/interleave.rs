//! The layout the AVX-512 kernels read the 32-weight formats (Q8_0, Q5_0) in, made once at
//! load: the same bytes per weight as GGUF, arranged for the kernels instead of for the file.
//!
//! GGUF stores a row as 34- or 22-byte blocks, each an f16 scale followed by its weights. A
//! decode step multiplies one activation row with four weight rows at a time, and in that
//! layout every 64-weight chunk costs two unaligned half loads and an insert (Q8_0), or a
//! broadcast, a shuffle and the high bits from two scattered words (Q5_0), and every 16
//! blocks a gather of their scales. Here four rows (a *row group*) are stored together, in
//! groups of [`GROUP_CHUNKS`] chunks:
//!
//! ```text
//! row group = chunk group 0 | chunk group 1 | ...
//! chunk group (c chunks, 2c blocks) =
//!     scales: row 0's 2c f16 | row 1's | row 2's | row 3's
//!     payload of chunk 0: row 0 | row 1 | row 2 | row 3, then chunk 1, ... chunk c - 1
//! ```
//!
//! A chunk's *payload* is its 64 weights as the kernel wants them:
//! - Q8_0: 64 bytes `q + 128` (the kernel's unsigned operand, no flip at run time);
//! - Q5_0: 32 bytes whose low nibbles are the low 4 bits of weights 0-31 and whose high
//!   nibbles those of weights 32-63, then 8 bytes whose bit `j` is weight `j`'s fifth bit (a
//!   mask register: one load).
//!
//! A row group is `4 * row_bytes` long (rows past `n` are zeros), so row group `g` starts at
//! `4 * g * row_bytes` and four rows are one forward stream for the prefetcher.

use super::{QuantFormat, CHUNK};

/// Rows stored together.
pub const GROUP_ROWS: usize = 4;
/// Chunks per chunk group: 16 blocks, one 512-bit vector of their f32 scales.
pub const GROUP_CHUNKS: usize = 8;

/// Bytes of one row's chunk payload.
pub const fn payload_bytes(format: QuantFormat) -> usize {
    match format {
        QuantFormat::Q8_0 => 64,
        QuantFormat::Q5_0 => 40,
        // Not interleaved.
        QuantFormat::Q4K | QuantFormat::Q6K => 0,
    }
}

/// Where the pieces of chunk group `q` sit in a row group of `chunks`-chunk rows: its offset
/// in the row group, its chunk count, and the offset of its payloads from its start.
#[derive(Debug, Clone, Copy)]
pub struct ChunkGroup {
    pub start: usize,
    pub chunks: usize,
    pub payloads: usize,
}

impl ChunkGroup {
    pub fn new(format: QuantFormat, chunks: usize, q: usize) -> Self {
        let chunk_bytes = 2 * format.block_bytes();
        let first = q * GROUP_CHUNKS;
        let count = GROUP_CHUNKS.min(chunks - first);
        Self {
            start: GROUP_ROWS * first * chunk_bytes,
            chunks: count,
            payloads: GROUP_ROWS * 2 * count * 2,
        }
    }

    /// Offset of row `p`'s `2 * chunks` f16 scales.
    pub fn scales(&self, p: usize) -> usize {
        self.start + p * 2 * self.chunks * 2
    }

    /// Offset of row `p`'s payload of chunk `i` (within the group).
    pub fn payload(&self, format: QuantFormat, i: usize, p: usize) -> usize {
        self.start + self.payloads + (i * GROUP_ROWS + p) * payload_bytes(format)
    }
}

/// Row groups needed for `n` rows.
pub fn row_groups(n: usize) -> usize {
    n.div_ceil(GROUP_ROWS)
}

/// Writes row group `g` of the GGUF rows `source` (`n` rows of `row_bytes`) into `out`
/// (`GROUP_ROWS * row_bytes` bytes, zeros: fresh memory, so rows past `n` stay zero without
/// writing every byte twice).
pub fn interleave_group(format: QuantFormat, k: usize, source: &[u8], g: usize, out: &mut [u8]) {
    let row_bytes = format.row_bytes(k).expect("checked by QMatrix::new");
    let n = source.len() / row_bytes;
    let chunks = k / CHUNK;
    let payload = payload_bytes(format);
    for p in 0..GROUP_ROWS {
        let j = g * GROUP_ROWS + p;
        if j >= n {
            break;
        }
        let row = &source[j * row_bytes..(j + 1) * row_bytes];
        for c in 0..chunks {
            let group = ChunkGroup::new(format, chunks, c / GROUP_CHUNKS);
            let i = c % GROUP_CHUNKS;
            let blocks = [0, 1].map(|b| {
                let size = format.block_bytes();
                &row[(2 * c + b) * size..(2 * c + b + 1) * size]
            });
            for (b, block) in blocks.iter().enumerate() {
                let at = group.scales(p) + 2 * (2 * i + b);
                out[at..at + 2].copy_from_slice(&block[..2]);
            }
            let at = group.payload(format, i, p);
            encode_payload(format, blocks, &mut out[at..at + payload]);
        }
    }
}

/// Rebuilds GGUF row `p` of the row group `group` into `row` (`row_bytes` bytes).
pub fn gguf_row(format: QuantFormat, k: usize, group: &[u8], p: usize, row: &mut [u8]) {
    let chunks = k / CHUNK;
    let size = format.block_bytes();
    for c in 0..chunks {
        let chunk_group = ChunkGroup::new(format, chunks, c / GROUP_CHUNKS);
        let i = c % GROUP_CHUNKS;
        let at = chunk_group.payload(format, i, p);
        let payload = &group[at..at + payload_bytes(format)];
        let (first, second) = row[2 * c * size..(2 * c + 2) * size].split_at_mut(size);
        let mut blocks = [first, second];
        for (b, block) in blocks.iter_mut().enumerate() {
            let at = chunk_group.scales(p) + 2 * (2 * i + b);
            block[..2].copy_from_slice(&group[at..at + 2]);
        }
        decode_payload(format, payload, blocks);
    }
}

/// The 5-bit values of a Q5_0 block (`qh` bit `j` is weight `j`'s fifth bit; `qs[j % 16]`
/// holds its low bits, in the low nibble for `j < 16`).
fn q5_values(block: &[u8]) -> [u8; 32] {
    let qh = u32::from_le_bytes(block[2..6].try_into().expect("4 bytes"));
    std::array::from_fn(|j| {
        let low = (block[6 + j % 16] >> (4 * (j / 16))) & 0x0F;
        low | ((((qh >> j) & 1) as u8) << 4)
    })
}

fn encode_payload(format: QuantFormat, blocks: [&[u8]; 2], out: &mut [u8]) {
    match format {
        QuantFormat::Q8_0 => {
            for (b, block) in blocks.iter().enumerate() {
                for (o, &q) in out[32 * b..32 * (b + 1)].iter_mut().zip(&block[2..34]) {
                    *o = q ^ 0x80;
                }
            }
        }
        QuantFormat::Q5_0 => {
            let [low, high] = blocks.map(q5_values);
            for j in 0..32 {
                out[j] = (low[j] & 0x0F) | ((high[j] & 0x0F) << 4);
            }
            let bits = |values: &[u8; 32]| {
                (0..32).fold(0u32, |bits, j| bits | (u32::from(values[j] >> 4) << j))
            };
            out[32..36].copy_from_slice(&bits(&low).to_le_bytes());
            out[36..40].copy_from_slice(&bits(&high).to_le_bytes());
        }
        QuantFormat::Q4K | QuantFormat::Q6K => unreachable!("K-quants are not interleaved"),
    }
}

fn decode_payload(format: QuantFormat, payload: &[u8], mut blocks: [&mut [u8]; 2]) {
    match format {
        QuantFormat::Q8_0 => {
            for (b, block) in blocks.iter_mut().enumerate() {
                for (q, &u) in block[2..34].iter_mut().zip(&payload[32 * b..32 * (b + 1)]) {
                    *q = u ^ 0x80;
                }
            }
        }
        QuantFormat::Q5_0 => {
            for (b, block) in blocks.iter_mut().enumerate() {
                let bits = &payload[32 + 4 * b..36 + 4 * b];
                block[2..6].copy_from_slice(bits);
                for j in 0..16 {
                    let value = |w: usize| (payload[w] >> (4 * b)) & 0x0F;
                    block[6 + j] = value(j) | (value(j + 16) << 4);
                }
            }
        }
        QuantFormat::Q4K | QuantFormat::Q6K => unreachable!("K-quants are not interleaved"),
    }
}
