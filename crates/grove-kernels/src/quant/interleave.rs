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
//!     payloads of chunk 0 (rows 0-3), then chunk 1, ... chunk c - 1
//! ```
//!
//! Inside a chunk group the weights are *lane-blocked*: the kernel's `vpdpbusd` sums each
//! 32-bit lane's four products, and here every lane of every chunk holds weights of one block
//! only, the same block in that lane for the whole group. So a row's integer sums accumulate
//! across the group's chunks and are scaled once per group (one conversion and one FMA per 16
//! blocks), instead of once per chunk (a conversion, a permute of the two blocks' scales and
//! an FMA per 64 weights). With `c` chunks (`2c` blocks; `c` is 8 or, for the rest of a row,
//! a power of two), chunk `i`'s lane `l` holds weights `4 (m c + i) .. + 4` of block
//! `l mod 2c`, where `m = l div 2c` ([`lane_offset`]). The activations are quantized in the
//! same order (`QuantizedRows::lanes`).
//!
//! A row's *payload* of a chunk is its 64 weights, in that order, as the kernel wants them:
//! - Q8_0: 64 bytes `q + 128` (the kernel's unsigned operand, no flip at run time), the four
//!   rows' one after another;
//! - Q5_0: 32 bytes whose low nibbles are the low 4 bits of weights 0-31 and whose high
//!   nibbles those of weights 32-63, and 8 bytes whose bit `j` is weight `j`'s fifth bit (a
//!   mask register: one load); the four rows' nibbles first, then their fifth bits, so that
//!   in a 32-byte aligned row group no load straddles two cache lines (with the 40 bytes of a
//!   row together, three in eight of the nibble loads did).
//!
//! A row group is `4 * row_bytes` long (rows past `n` are zeros), so row group `g` starts at
//! `4 * g * row_bytes` and four rows are one forward stream for the prefetcher.

use super::{QuantFormat, CHUNK, LANES};

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
/// in the row group, its first chunk, its chunk count, and the offset of its payloads from its
/// start. Groups of [`GROUP_CHUNKS`] first, then the rest of the row in powers of two,
/// largest first (a lane-blocked group needs a power of two: [`lane_offset`]).
#[derive(Debug, Clone, Copy)]
pub struct ChunkGroup {
    pub start: usize,
    pub first: usize,
    pub chunks: usize,
    pub payloads: usize,
}

impl ChunkGroup {
    #[inline]
    pub fn new(format: QuantFormat, chunks: usize, q: usize) -> Self {
        let (first, count) = group_span(chunks, q);
        let chunk_bytes = 2 * format.block_bytes();
        Self {
            start: GROUP_ROWS * first * chunk_bytes,
            first,
            chunks: count,
            payloads: GROUP_ROWS * 2 * count * 2,
        }
    }

    /// Offset of row `p`'s `2 * chunks` f16 scales.
    #[inline]
    pub fn scales(&self, p: usize) -> usize {
        self.start + p * 2 * self.chunks * 2
    }

    /// Offset of the four rows' payloads of chunk `i` (within the group): `GROUP_ROWS *
    /// payload_bytes(format)` bytes, row `p`'s parts where [`encode_payload`] puts them.
    #[inline]
    pub fn chunk(&self, format: QuantFormat, i: usize) -> usize {
        self.start + self.payloads + i * GROUP_ROWS * payload_bytes(format)
    }
}

/// The first chunk and the chunk count of group `q` of a `chunks`-chunk row ([`ChunkGroup`]).
/// Bit arithmetic, inlined: the decode kernels ask once per group of every row group (as an
/// out-of-line iterator chain it was 1.7% of a Qwen2.5-0.5B decode's samples).
#[inline]
pub fn group_span(chunks: usize, q: usize) -> (usize, usize) {
    let full = chunks / GROUP_CHUNKS;
    if q < full {
        return (q * GROUP_CHUNKS, GROUP_CHUNKS);
    }
    // The rest's set bits, largest first: drop the `q - full` largest, take the next.
    let rest = chunks % GROUP_CHUNKS;
    let mut left = rest;
    for _ in full..q {
        left &= !highest_bit(left);
    }
    let count = highest_bit(left);
    debug_assert!(count > 0, "q < group_count(chunks)");
    (full * GROUP_CHUNKS + rest - left, count)
}

/// The highest set bit of `v` (0 for 0).
#[inline]
fn highest_bit(v: usize) -> usize {
    if v == 0 {
        0
    } else {
        1 << (usize::BITS - 1 - v.leading_zeros())
    }
}

/// Chunk groups of a `chunks`-chunk row.
#[inline]
pub fn group_count(chunks: usize) -> usize {
    chunks / GROUP_CHUNKS + (chunks % GROUP_CHUNKS).count_ones() as usize
}

/// Where weights `4 d .. 4 d + 4` of block `b` of a `chunks`-chunk group sit in the group's
/// chunks laid end to end (chunk `i` at `64 i`): chunk `d mod chunks`, lane
/// `b + 2 chunks (d div chunks)`.
pub fn lane_offset(chunks: usize, b: usize, d: usize) -> usize {
    debug_assert!(chunks.is_power_of_two() && chunks <= GROUP_CHUNKS && b < 2 * chunks && d < 8);
    let (m, i) = (d >> chunks.trailing_zeros(), d & (chunks - 1));
    CHUNK * i + 4 * (b + 2 * chunks * m)
}

/// Activation rows `q` (`[rows, k]`) in the lane-blocked order the kernels read them in, and
/// the sum of each 32-bit lane's values over each chunk group (`[rows, groups, 16]`: a lane's
/// share of the zero point's term).
pub fn lane_blocked(q: &[i8], k: usize) -> (Vec<i8>, Vec<i32>) {
    let chunks = k / CHUNK;
    let groups = group_count(chunks);
    let mut lanes = vec![0i8; q.len()];
    let mut lane_sums = vec![0i32; q.len() / k * groups * LANES];
    let rows = lanes
        .chunks_exact_mut(k)
        .zip(lane_sums.chunks_exact_mut(groups * LANES));
    for (q, (lanes, sums)) in q.chunks_exact(k).zip(rows) {
        for (g, sums) in sums.chunks_exact_mut(LANES).enumerate() {
            let (first, count) = group_span(chunks, g);
            let q = &q[first * CHUNK..(first + count) * CHUNK];
            let lanes = &mut lanes[first * CHUNK..(first + count) * CHUNK];
            for (b, block) in q.chunks_exact(32).enumerate() {
                for (d, word) in block.chunks_exact(4).enumerate() {
                    let at = lane_offset(count, b, d);
                    lanes[at..at + 4].copy_from_slice(word);
                    sums[at % CHUNK / 4] += word.iter().map(|&v| i32::from(v)).sum::<i32>();
                }
            }
        }
    }
    (lanes, lane_sums)
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
    let size = format.block_bytes();
    let chunk_bytes = GROUP_ROWS * payload_bytes(format);
    for p in 0..GROUP_ROWS {
        let j = g * GROUP_ROWS + p;
        if j >= n {
            break;
        }
        let row = &source[j * row_bytes..(j + 1) * row_bytes];
        for q in 0..group_count(chunks) {
            let group = ChunkGroup::new(format, chunks, q);
            let blocks = &row[2 * group.first * size..2 * (group.first + group.chunks) * size];
            let mut chunks = [0u8; CHUNK * GROUP_CHUNKS];
            for (b, block) in blocks.chunks_exact(size).enumerate() {
                let at = group.scales(p) + 2 * b;
                out[at..at + 2].copy_from_slice(&block[..2]);
                for (d, word) in block_values(format, block).chunks_exact(4).enumerate() {
                    let at = lane_offset(group.chunks, b, d);
                    chunks[at..at + 4].copy_from_slice(word);
                }
            }
            for (i, chunk) in chunks.chunks_exact(CHUNK).take(group.chunks).enumerate() {
                let at = group.chunk(format, i);
                let chunk = chunk.try_into().expect("a chunk");
                encode_payload(format, chunk, &mut out[at..at + chunk_bytes], p);
            }
        }
    }
}

/// Rebuilds GGUF row `p` of the row group `group` into `row` (`row_bytes` bytes).
pub fn gguf_row(format: QuantFormat, k: usize, group: &[u8], p: usize, row: &mut [u8]) {
    let chunks = k / CHUNK;
    let size = format.block_bytes();
    for q in 0..group_count(chunks) {
        let chunk_group = ChunkGroup::new(format, chunks, q);
        let mut chunks = [0u8; CHUNK * GROUP_CHUNKS];
        for i in 0..chunk_group.chunks {
            let at = chunk_group.chunk(format, i);
            let chunk = &group[at..at + GROUP_ROWS * payload_bytes(format)];
            let chunk = decode_payload(format, chunk, p);
            chunks[CHUNK * i..CHUNK * (i + 1)].copy_from_slice(&chunk);
        }
        let first = 2 * chunk_group.first * size;
        let blocks = &mut row[first..first + 2 * chunk_group.chunks * size];
        for (b, block) in blocks.chunks_exact_mut(size).enumerate() {
            let at = chunk_group.scales(p) + 2 * b;
            block[..2].copy_from_slice(&group[at..at + 2]);
            let mut values = [0u8; 32];
            for (d, word) in values.chunks_exact_mut(4).enumerate() {
                let at = lane_offset(chunk_group.chunks, b, d);
                word.copy_from_slice(&chunks[at..at + 4]);
            }
            write_block_values(format, &values, block);
        }
    }
}

/// A GGUF block's 32 weights as the kernels' unsigned values: `q + 128` (Q8_0), or the 5-bit
/// values (Q5_0: `qh` bit `j` is weight `j`'s fifth bit; `qs[j % 16]` holds its low bits, in
/// the low nibble for `j < 16`).
fn block_values(format: QuantFormat, block: &[u8]) -> [u8; 32] {
    match format {
        QuantFormat::Q8_0 => std::array::from_fn(|j| block[2 + j] ^ 0x80),
        QuantFormat::Q5_0 => {
            let qh = u32::from_le_bytes(block[2..6].try_into().expect("4 bytes"));
            std::array::from_fn(|j| {
                let low = (block[6 + j % 16] >> (4 * (j / 16))) & 0x0F;
                low | ((((qh >> j) & 1) as u8) << 4)
            })
        }
        QuantFormat::Q4K | QuantFormat::Q6K => unreachable!("K-quants are not interleaved"),
    }
}

/// The inverse of [`block_values`] (the scale bytes left as they are).
fn write_block_values(format: QuantFormat, values: &[u8; 32], block: &mut [u8]) {
    match format {
        QuantFormat::Q8_0 => {
            for (q, &u) in block[2..34].iter_mut().zip(values) {
                *q = u ^ 0x80;
            }
        }
        QuantFormat::Q5_0 => {
            let qh = (0..32).fold(0u32, |bits, j| bits | (u32::from(values[j] >> 4) << j));
            block[2..6].copy_from_slice(&qh.to_le_bytes());
            for j in 0..16 {
                block[6 + j] = (values[j] & 0x0F) | ((values[j + 16] & 0x0F) << 4);
            }
        }
        QuantFormat::Q4K | QuantFormat::Q6K => unreachable!("K-quants are not interleaved"),
    }
}

/// Where row `p`'s parts of a chunk's payloads are: its bytes (all of its Q8_0 payload, or
/// its Q5_0 nibbles), and for Q5_0 its 8 bytes of fifth bits.
pub const fn payload_parts(format: QuantFormat, p: usize) -> (usize, usize) {
    match format {
        QuantFormat::Q8_0 => (CHUNK * p, 0),
        QuantFormat::Q5_0 => (32 * p, 32 * GROUP_ROWS + 8 * p),
        // Not interleaved.
        QuantFormat::Q4K | QuantFormat::Q6K => (0, 0),
    }
}

/// A row's 64 unsigned values of a chunk written as row `p`'s parts of the chunk's four
/// payloads `out`.
fn encode_payload(format: QuantFormat, values: &[u8; CHUNK], out: &mut [u8], p: usize) {
    let (at, bits_at) = payload_parts(format, p);
    match format {
        QuantFormat::Q8_0 => out[at..at + CHUNK].copy_from_slice(values),
        QuantFormat::Q5_0 => {
            for j in 0..32 {
                out[at + j] = (values[j] & 0x0F) | ((values[j + 32] & 0x0F) << 4);
            }
            let bits = (0..CHUNK).fold(0u64, |bits, j| bits | (u64::from(values[j] >> 4) << j));
            out[bits_at..bits_at + 8].copy_from_slice(&bits.to_le_bytes());
        }
        QuantFormat::Q4K | QuantFormat::Q6K => unreachable!("K-quants are not interleaved"),
    }
}

/// The inverse of [`encode_payload`]: row `p`'s values from a chunk's four payloads.
fn decode_payload(format: QuantFormat, payloads: &[u8], p: usize) -> [u8; CHUNK] {
    let (at, bits_at) = payload_parts(format, p);
    match format {
        QuantFormat::Q8_0 => payloads[at..at + CHUNK].try_into().expect("64 bytes"),
        QuantFormat::Q5_0 => {
            let bits =
                u64::from_le_bytes(payloads[bits_at..bits_at + 8].try_into().expect("8 bytes"));
            std::array::from_fn(|j| {
                let low = (payloads[at + j % 32] >> (4 * (j / 32))) & 0x0F;
                low | ((((bits >> j) & 1) as u8) << 4)
            })
        }
        QuantFormat::Q4K | QuantFormat::Q6K => unreachable!("K-quants are not interleaved"),
    }
}
