//! Portable decoders and dot products: the reference for the SIMD kernels and the fallback on
//! CPUs without AVX2. Block layouts follow ggml's `block_q8_0`, `block_q5_0`, `block_q5_1`,
//! `block_q4_0`, `block_q4_1`, `block_q2_K`, `block_q3_K`, `block_q4_K`, `block_q5_K`, `block_q6_K`,
//! `block_iq4_nl`, `block_iq4_xs` and the grid formats' `block_iq3_xxs` ... `block_iq1_m`
//! (little-endian; decoded in `grids.rs`).

use half::f16;

use super::{grids, DecodedChunk, QuantFormat, QuantizedRows, CHUNK, LANE, LANES};

pub(super) fn f16_at(bytes: &[u8], at: usize) -> f32 {
    f16::from_bits(u16::from_le_bytes([bytes[at], bytes[at + 1]])).to_f32()
}

/// Q4_K's 6-bit scale and min of sub-block `j` (0..8) from its 12 packed bytes.
pub(super) fn q4k_scale_min(scales: &[u8], j: usize) -> (u8, u8) {
    if j < 4 {
        (scales[j] & 63, scales[j + 4] & 63)
    } else {
        (
            (scales[j + 4] & 0x0F) | ((scales[j - 4] >> 6) << 4),
            (scales[j + 4] >> 4) | ((scales[j] >> 6) << 4),
        )
    }
}

/// Q3_K's 16 sub-block scales (6 bits, before their offset of 32) from its 12 packed bytes:
/// scale `i`'s low 4 bits are a nibble of byte `i mod 8` (the low one for `i < 8`), its high
/// 2 bits bits `2 (i / 4)` of byte `8 + i mod 4`.
pub(super) fn q3k_scales(packed: &[u8]) -> [u8; 16] {
    std::array::from_fn(|i| {
        let low = if i < 8 {
            packed[i] & 0x0F
        } else {
            packed[i - 8] >> 4
        };
        let high = (packed[8 + i % 4] >> (2 * (i / 4))) & 3;
        low | high << 4
    })
}

/// The 2 bits of weight `w` (0..256) of a Q2_K or Q3_K super-block whose 64 bytes of 2-bit
/// values are `crumbs`: in each 128-weight half `h`, byte `l` of the half's 32 holds weight
/// `32 j + l`'s at bits `2 j`.
pub(super) fn k_crumb(crumbs: &[u8], w: usize) -> u8 {
    let (h, j, l) = (w / 128, w % 128 / 32, w % 32);
    (crumbs[32 * h + l] >> (2 * j)) & 3
}

/// Q3_K's weight `w` (0..256) of a super-block as `q < 8` (`weight = d * s * (q - 4)`): its
/// 2 low bits ([`k_crumb`] of the 64 bytes after the 32 of third bits), and its third, bit
/// `4 h + j` of byte `l` of those 32 (set: add 4).
pub(super) fn q3k_value(block: &[u8], w: usize) -> u8 {
    let (h, j, l) = (w / 128, w % 128 / 32, w % 32);
    let high = (block[l] >> (4 * h + j)) & 1;
    k_crumb(&block[32..96], w) | high << 2
}

/// IQ4_NL's and IQ4_XS's value of index `q` (< 16) as `u = value + 128`, unsigned (the
/// offset, 128 times the scale, takes the 128 back).
pub(super) fn iq4_u(q: u8) -> u8 {
    codebook_u(&grids::IQ4, q)
}

/// Value `q` (< 16) of `codebook` as `u = value + 128`.
pub(super) fn codebook_u(codebook: &grids::Codebook, q: u8) -> u8 {
    (i16::from(codebook.values[usize::from(q)]) + 128) as u8
}

/// IQ4_XS's scale of sub-block `j` (0..8, 32 weights) less 32: its low 4 bits a nibble of
/// byte `4 + j / 2` (the low one for even `j`), its high 2 bits bits `2 j` of the 16-bit
/// word at byte 2.
pub(super) fn iq4xs_scale(block: &[u8], j: usize) -> i8 {
    let low = (block[4 + j / 2] >> (4 * (j % 2))) & 0x0F;
    let high = (u16::from_le_bytes([block[2], block[3]]) >> (2 * j)) & 3;
    (low | (high as u8) << 4) as i8 - 32
}

/// Decodes chunk `c` (weights `64c .. 64c + 64`) of a row.
pub(super) fn decode_chunk(format: QuantFormat, row: &[u8], c: usize) -> DecodedChunk {
    let mut chunk = DecodedChunk {
        u: [0; CHUNK],
        scale: [0.0; LANES],
        offset: [0.0; LANES],
    };
    match format {
        QuantFormat::Q8_0
        | QuantFormat::Q5_0
        | QuantFormat::Q5_1
        | QuantFormat::Q4_0
        | QuantFormat::Q4_1
        | QuantFormat::Iq4Nl => {
            // Two 32-weight blocks per chunk.
            let block_bytes = format.block_bytes();
            for half in 0..2 {
                let block = &row[(2 * c + half) * block_bytes..(2 * c + half + 1) * block_bytes];
                let d = f16_at(block, 0);
                let offset = decode_block(format, block, &mut chunk.u[32 * half..32 * half + 32]);
                for lane in 8 * half..8 * half + 8 {
                    chunk.scale[lane] = d;
                    chunk.offset[lane] = offset;
                }
            }
        }
        QuantFormat::Q4K | QuantFormat::Q5K => {
            let size = format.block_bytes();
            let block = &row[(c / 4) * size..(c / 4 + 1) * size];
            let (d, dmin) = (f16_at(block, 0), f16_at(block, 2));
            let j = c % 4;
            // Q5_K: 32 bytes of fifth bits (bit s of byte i: weight i of sub-block s) before
            // the nibbles.
            let nibbles = if format == QuantFormat::Q5K { 48 } else { 16 };
            let quants = &block[nibbles + 32 * j..nibbles + 32 * j + 32];
            for (i, &q) in quants.iter().enumerate() {
                chunk.u[i] = q & 0x0F;
                chunk.u[i + 32] = q >> 4;
                if format == QuantFormat::Q5K {
                    let fifth = block[16 + i] >> (2 * j);
                    chunk.u[i] |= (fifth & 1) << 4;
                    chunk.u[i + 32] |= (fifth & 2) << 3;
                }
            }
            for half in 0..2 {
                let (scale, min) = q4k_scale_min(&block[4..16], 2 * j + half);
                for lane in 8 * half..8 * half + 8 {
                    chunk.scale[lane] = d * f32::from(scale);
                    chunk.offset[lane] = dmin * f32::from(min);
                }
            }
        }
        QuantFormat::Q3K => {
            let block = &row[(c / 4) * 110..(c / 4 + 1) * 110];
            let within = c % 4;
            for (i, u) in chunk.u.iter_mut().enumerate() {
                *u = q3k_value(block, 64 * within + i);
            }
            let (d, scales) = (f16_at(block, 108), q3k_scales(&block[96..108]));
            for lane in 0..LANES {
                let scale = d * (f32::from(scales[4 * within + lane / 4]) - 32.0);
                chunk.scale[lane] = scale;
                chunk.offset[lane] = 4.0 * scale;
            }
        }
        QuantFormat::Q2K => {
            let block = &row[(c / 4) * 84..(c / 4 + 1) * 84];
            let within = c % 4;
            for (i, u) in chunk.u.iter_mut().enumerate() {
                *u = k_crumb(&block[16..80], 64 * within + i);
            }
            let (d, dmin) = (f16_at(block, 80), f16_at(block, 82));
            for lane in 0..LANES {
                // Sub-block `w / 16`: its scale in the low nibble, its min in the high.
                let packed = block[4 * within + lane / 4];
                chunk.scale[lane] = d * f32::from(packed & 0x0F);
                chunk.offset[lane] = dmin * f32::from(packed >> 4);
            }
        }
        QuantFormat::Iq4Xs => {
            let block = &row[(c / 4) * 136..(c / 4 + 1) * 136];
            let d = f16_at(block, 0);
            for half in 0..2 {
                // Sub-block `j`'s 16 bytes: weight `l`'s index in byte `l`'s low nibble,
                // weight `l + 16`'s in its high one.
                let j = 2 * (c % 4) + half;
                let u = &mut chunk.u[32 * half..32 * half + 32];
                for (l, &q) in block[8 + 16 * j..8 + 16 * j + 16].iter().enumerate() {
                    (u[l], u[l + 16]) = (iq4_u(q & 0x0F), iq4_u(q >> 4));
                }
                let scale = d * f32::from(iq4xs_scale(block, j));
                for lane in 8 * half..8 * half + 8 {
                    chunk.scale[lane] = scale;
                    chunk.offset[lane] = 128.0 * scale;
                }
            }
        }
        QuantFormat::Iq3Xxs
        | QuantFormat::Iq3S
        | QuantFormat::Iq2Xxs
        | QuantFormat::Iq2Xs
        | QuantFormat::Iq2S
        | QuantFormat::Iq1S
        | QuantFormat::Iq1M => {
            let size = format.block_bytes();
            let decoded = grids::decode(format, &row[(c / 4) * size..(c / 4 + 1) * size]);
            let codebook = format.codebook().expect("a grid format has values");
            let d = f16::from_bits(decoded.d).to_f32() * codebook.d_factor;
            let first = 64 * (c % 4);
            for (u, &q) in chunk.u.iter_mut().zip(&decoded.indices[first..first + 64]) {
                *u = codebook_u(codebook, q);
            }
            for lane in 0..LANES {
                // A lane's 4 weights lie in one 16-weight piece.
                let scale = d * f32::from(decoded.scales[4 * (c % 4) + lane / 4]);
                chunk.scale[lane] = scale;
                chunk.offset[lane] = 128.0 * scale;
            }
        }
        QuantFormat::Q6K => {
            let block = &row[(c / 4) * 210..(c / 4 + 1) * 210];
            let within = c % 4;
            let (half, part) = (within / 2, within % 2);
            let low = &block[64 * half..64 * half + 64];
            let high = &block[128 + 32 * half..128 + 32 * half + 32];
            let d = f16_at(block, 208);
            for l in 0..32 {
                let (a, b) = if part == 0 {
                    (low[l] & 0x0F, low[l + 32] & 0x0F)
                } else {
                    (low[l] >> 4, low[l + 32] >> 4)
                };
                let shift = 4 * part;
                chunk.u[l] = a | (((high[l] >> shift) & 3) << 4);
                chunk.u[l + 32] = b | (((high[l] >> (shift + 2)) & 3) << 4);
            }
            for lane in 0..LANES {
                let scale = d * f32::from(block[192 + 4 * within + lane / 4] as i8);
                chunk.scale[lane] = scale;
                chunk.offset[lane] = 32.0 * scale;
            }
        }
    }
    chunk
}

/// A 32-weight block's values into `u`; returns its offset (`weight = d * u - offset`).
pub(super) fn decode_block(format: QuantFormat, block: &[u8], u: &mut [u8]) -> f32 {
    let d = f16_at(block, 0);
    let nibbles = |u: &mut [u8], quants: &[u8]| {
        for (j, &q) in quants.iter().enumerate() {
            (u[j], u[j + 16]) = (q & 0x0F, q >> 4);
        }
    };
    let fifth_bits = |u: &mut [u8], high: &[u8]| {
        let high = u32::from_le_bytes([high[0], high[1], high[2], high[3]]);
        for (j, value) in u.iter_mut().enumerate() {
            *value |= (((high >> j) & 1) as u8) << 4;
        }
    };
    match format {
        QuantFormat::Q8_0 => {
            for (value, &q) in u.iter_mut().zip(&block[2..34]) {
                *value = (q as i8 as i16 + 128) as u8;
            }
            128.0 * d
        }
        QuantFormat::Q5_0 => {
            nibbles(u, &block[6..22]);
            fifth_bits(u, &block[2..6]);
            16.0 * d
        }
        QuantFormat::Q5_1 => {
            nibbles(u, &block[8..24]);
            fifth_bits(u, &block[4..8]);
            -f16_at(block, 2)
        }
        QuantFormat::Q4_0 => {
            nibbles(u, &block[2..18]);
            8.0 * d
        }
        QuantFormat::Q4_1 => {
            nibbles(u, &block[4..20]);
            -f16_at(block, 2)
        }
        QuantFormat::Iq4Nl => {
            nibbles(u, &block[2..18]);
            for value in u.iter_mut() {
                *value = iq4_u(*value);
            }
            128.0 * d
        }
        _ => unreachable!("{} has no 32-weight blocks", format.name()),
    }
}

pub(super) fn dequantize_row(format: QuantFormat, row: &[u8], out: &mut [f32]) {
    for (c, values) in out.chunks_exact_mut(CHUNK).enumerate() {
        let chunk = decode_chunk(format, row, c);
        for (i, value) in values.iter_mut().enumerate() {
            *value = chunk.scale[i / LANE] * f32::from(chunk.u[i]) - chunk.offset[i / LANE];
        }
    }
}

/// The dot of a weight row with activation row `r`: the SIMD kernels' result in plain
/// arithmetic (`sum dx * (s * dot4(u, q) - m * sum4(q))`).
pub(super) fn dot(format: QuantFormat, row: &[u8], acts: &QuantizedRows, r: usize) -> f32 {
    let (q, scales) = (acts.q(r), acts.scale(r));
    let mut total = 0f32;
    for c in 0..q.len() / CHUNK {
        let chunk = decode_chunk(format, row, c);
        for lane in 0..LANES {
            let at = c * CHUNK + lane * LANE;
            let values = &q[at..at + LANE];
            let u = &chunk.u[lane * LANE..lane * LANE + LANE];
            let dot4: i32 = u
                .iter()
                .zip(values)
                .map(|(&u, &v)| i32::from(u) * i32::from(v))
                .sum();
            let sum4: i32 = values.iter().map(|&v| i32::from(v)).sum();
            let dx = scales[at / acts.block];
            total += dx * (chunk.scale[lane] * dot4 as f32 - chunk.offset[lane] * sum4 as f32);
        }
    }
    total
}
