//! GGUF's blocks of every format as the column layout's units (`Unit`): a row's unit decoded
//! from its blocks, and written back.

use super::{unit_weights, Unit};
use crate::quant::{grids, scalar, QuantFormat};

pub(super) fn f16_bits(bytes: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([bytes[at], bytes[at + 1]])
}

/// Unit `i` of a GGUF row, decoded (IQ4_NL's, IQ4_XS's and the grid formats' `u` the indices,
/// not the values).
pub(super) fn read_gguf(format: QuantFormat, row: &[u8], i: usize) -> Unit {
    let size = unit_weights(format) / format.block_weights() * format.block_bytes();
    let bytes = &row[i * size..(i + 1) * size];
    let mut unit = Unit::ZERO;
    match format {
        QuantFormat::Q8_0
        | QuantFormat::Q5_0
        | QuantFormat::Q5_1
        | QuantFormat::Q4_0
        | QuantFormat::Q4_1
        | QuantFormat::Iq4Nl => {
            // IQ4_NL's bytes are Q4_0's, its nibbles indices.
            let bytes_as = match format {
                QuantFormat::Iq4Nl => QuantFormat::Q4_0,
                _ => format,
            };
            for (b, block) in bytes.chunks_exact(format.block_bytes()).enumerate() {
                unit.d[b] = f16_bits(block, 0);
                if matches!(format, QuantFormat::Q5_1 | QuantFormat::Q4_1) {
                    unit.d[2 + b] = f16_bits(block, 2);
                }
                scalar::decode_block(bytes_as, block, &mut unit.u[32 * b..32 * b + 32]);
            }
        }
        QuantFormat::Iq4Xs => {
            unit.d[0] = f16_bits(bytes, 0);
            for j in 0..8 {
                unit.sc[j] = scalar::iq4xs_scale(bytes, j) as u8;
                let u = &mut unit.u[32 * j..32 * j + 32];
                for (l, &q) in bytes[8 + 16 * j..8 + 16 * j + 16].iter().enumerate() {
                    (u[l], u[l + 16]) = (q & 0x0F, q >> 4);
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
            let decoded = grids::decode(format, bytes);
            unit.d[0] = decoded.d;
            // A format scaled per 32 weights keeps one of each pair.
            unit.sc = match format.scales_16() {
                true => decoded.scales,
                false => std::array::from_fn(|j| if j < 8 { decoded.scales[2 * j] } else { 0 }),
            };
            unit.u = decoded.indices;
        }
        QuantFormat::Q4K | QuantFormat::Q5K => {
            unit.d[..2].copy_from_slice(&[f16_bits(bytes, 0), f16_bits(bytes, 2)]);
            for j in 0..8 {
                let (scale, min) = scalar::q4k_scale_min(&bytes[4..16], j);
                (unit.sc[j], unit.sc[8 + j]) = (scale, min);
            }
            let five = format == QuantFormat::Q5K;
            let nibbles = if five { 48 } else { 16 };
            for c in 0..4 {
                for (i, &q) in bytes[nibbles + 32 * c..][..32].iter().enumerate() {
                    unit.u[64 * c + i] = q & 0x0F;
                    unit.u[64 * c + 32 + i] = q >> 4;
                }
            }
            if five {
                // Bit s of byte i: weight i of sub-block s.
                for (i, &bits) in bytes[16..48].iter().enumerate() {
                    for s in 0..8 {
                        unit.u[32 * s + i] |= ((bits >> s) & 1) << 4;
                    }
                }
            }
        }
        QuantFormat::Q2K => {
            unit.d[..2].copy_from_slice(&[f16_bits(bytes, 80), f16_bits(bytes, 82)]);
            unit.sc.copy_from_slice(&bytes[..16]);
            for (w, u) in unit.u.iter_mut().enumerate() {
                *u = scalar::k_crumb(&bytes[16..80], w);
            }
        }
        QuantFormat::Q3K => {
            unit.d[0] = f16_bits(bytes, 108);
            let scales = scalar::q3k_scales(&bytes[96..108]);
            unit.sc = scales.map(|sc| (sc as i8 - 32) as u8);
            for (w, u) in unit.u.iter_mut().enumerate() {
                *u = scalar::q3k_value(bytes, w);
            }
        }
        QuantFormat::Q6K => {
            unit.d[0] = f16_bits(bytes, 208);
            unit.sc.copy_from_slice(&bytes[192..208]);
            for h in 0..2 {
                let (low, top) = (&bytes[64 * h..], &bytes[128 + 32 * h..]);
                for l in 0..32 {
                    let w = 128 * h + l;
                    unit.u[w] = (low[l] & 0x0F) | (top[l] & 3) << 4;
                    unit.u[w + 32] = (low[l + 32] & 0x0F) | ((top[l] >> 2) & 3) << 4;
                    unit.u[w + 64] = (low[l] >> 4) | ((top[l] >> 4) & 3) << 4;
                    unit.u[w + 96] = (low[l + 32] >> 4) | ((top[l] >> 6) & 3) << 4;
                }
            }
        }
    }
    unit
}

/// The inverse of [`read_gguf`]: unit `i` of a GGUF row written from `unit`.
pub(super) fn write_gguf(format: QuantFormat, unit: &Unit, row: &mut [u8], i: usize) {
    let size = unit_weights(format) / format.block_weights() * format.block_bytes();
    let bytes = &mut row[i * size..(i + 1) * size];
    match format {
        QuantFormat::Q8_0
        | QuantFormat::Q5_0
        | QuantFormat::Q5_1
        | QuantFormat::Q4_0
        | QuantFormat::Q4_1
        | QuantFormat::Iq4Nl => {
            for (b, block) in bytes.chunks_exact_mut(format.block_bytes()).enumerate() {
                block[..2].copy_from_slice(&unit.d[b].to_le_bytes());
                write_gguf_block(format, &unit.u[32 * b..32 * b + 32], unit.d[2 + b], block);
            }
        }
        QuantFormat::Iq4Xs => {
            bytes[..2].copy_from_slice(&unit.d[0].to_le_bytes());
            bytes[2..8].fill(0);
            let mut high = 0u16;
            for j in 0..8 {
                let scale = (unit.sc[j] as i8 + 32) as u8;
                bytes[4 + j / 2] |= (scale & 0x0F) << (4 * (j % 2));
                high |= u16::from(scale >> 4) << (2 * j);
                let u = &unit.u[32 * j..32 * j + 32];
                for l in 0..16 {
                    bytes[8 + 16 * j + l] = (u[l] & 0x0F) | (u[l + 16] & 0x0F) << 4;
                }
            }
            bytes[2..4].copy_from_slice(&high.to_le_bytes());
        }
        QuantFormat::Iq3Xxs
        | QuantFormat::Iq3S
        | QuantFormat::Iq2Xxs
        | QuantFormat::Iq2Xs
        | QuantFormat::Iq2S
        | QuantFormat::Iq1S
        | QuantFormat::Iq1M => {
            let decoded = grids::Decoded {
                d: unit.d[0],
                scales: match format.scales_16() {
                    true => unit.sc,
                    false => std::array::from_fn(|i| unit.sc[i / 2]),
                },
                indices: unit.u,
            };
            grids::encode(format, &decoded, bytes);
        }
        QuantFormat::Q4K | QuantFormat::Q5K => {
            bytes[..2].copy_from_slice(&unit.d[0].to_le_bytes());
            bytes[2..4].copy_from_slice(&unit.d[1].to_le_bytes());
            let (scales, mins) = unit.sc.split_at(8);
            let packed = &mut bytes[4..16];
            for j in 0..4 {
                packed[j] = scales[j] | (scales[j + 4] >> 4) << 6;
                packed[j + 4] = mins[j] | (mins[j + 4] >> 4) << 6;
                packed[j + 8] = (scales[j + 4] & 0x0F) | (mins[j + 4] & 0x0F) << 4;
            }
            let five = format == QuantFormat::Q5K;
            let nibbles = if five { 48 } else { 16 };
            for c in 0..4 {
                for i in 0..32 {
                    let (low, high) = (unit.u[64 * c + i], unit.u[64 * c + 32 + i]);
                    bytes[nibbles + 32 * c + i] = (low & 0x0F) | (high & 0x0F) << 4;
                }
            }
            if five {
                for i in 0..32 {
                    bytes[16 + i] = (0..8).fold(0, |bits, s| bits | (unit.u[32 * s + i] >> 4) << s);
                }
            }
        }
        QuantFormat::Q2K => {
            bytes[80..82].copy_from_slice(&unit.d[0].to_le_bytes());
            bytes[82..84].copy_from_slice(&unit.d[1].to_le_bytes());
            bytes[..16].copy_from_slice(&unit.sc);
            write_gguf_crumbs(&unit.u, &mut bytes[16..80]);
        }
        QuantFormat::Q3K => {
            bytes[108..110].copy_from_slice(&unit.d[0].to_le_bytes());
            let scales = unit.sc.map(|sc| (sc as i8 + 32) as u8);
            let packed = &mut bytes[96..108];
            packed.fill(0);
            for (i, &sc) in scales.iter().enumerate() {
                packed[i % 8] |= (sc & 0x0F) << (4 * (i / 8));
                packed[8 + i % 4] |= (sc >> 4) << (2 * (i / 4));
            }
            bytes[..32].fill(0);
            for (w, &u) in unit.u.iter().enumerate() {
                let (h, j, l) = (w / 128, w % 128 / 32, w % 32);
                bytes[l] |= (u >> 2) << (4 * h + j);
            }
            write_gguf_crumbs(&unit.u, &mut bytes[32..96]);
        }
        QuantFormat::Q6K => {
            bytes[208..210].copy_from_slice(&unit.d[0].to_le_bytes());
            bytes[192..208].copy_from_slice(&unit.sc);
            for h in 0..2 {
                for l in 0..32 {
                    let w = 128 * h + l;
                    let u = [w, w + 32, w + 64, w + 96].map(|w| unit.u[w]);
                    bytes[64 * h + l] = (u[0] & 0x0F) | (u[2] & 0x0F) << 4;
                    bytes[64 * h + l + 32] = (u[1] & 0x0F) | (u[3] & 0x0F) << 4;
                    bytes[128 + 32 * h + l] = (0..4).fold(0, |top, s| top | (u[s] >> 4) << (2 * s));
                }
            }
        }
    }
}

/// The 2 low bits of a K-quant super-block's 256 values `u` as GGUF's 64 bytes of them
/// (`scalar::k_crumb`).
fn write_gguf_crumbs(u: &[u8; 256], crumbs: &mut [u8]) {
    crumbs.fill(0);
    for (w, &u) in u.iter().enumerate() {
        let (h, j, l) = (w / 128, w % 128 / 32, w % 32);
        crumbs[32 * h + l] |= (u & 3) << (2 * j);
    }
}

/// A 32-weight block's values `u` (and Q5_1's or Q4_1's min, f16 bits) as GGUF's bytes after
/// the scale.
fn write_gguf_block(format: QuantFormat, u: &[u8], min: u16, block: &mut [u8]) {
    let (high, nibbles) = match format {
        QuantFormat::Q8_0 => {
            for (q, &u) in block[2..].iter_mut().zip(u) {
                *q = u ^ 0x80;
            }
            return;
        }
        QuantFormat::Q5_0 => (Some(2), 6),
        QuantFormat::Q5_1 => {
            block[2..4].copy_from_slice(&min.to_le_bytes());
            (Some(4), 8)
        }
        QuantFormat::Q4_1 => {
            block[2..4].copy_from_slice(&min.to_le_bytes());
            (None, 4)
        }
        _ => (None, 2),
    };
    if let Some(at) = high {
        let bits = (0..32).fold(0u32, |h, j| h | u32::from(u[j] >> 4) << j);
        block[at..at + 4].copy_from_slice(&bits.to_le_bytes());
    }
    for j in 0..16 {
        block[nibbles + j] = (u[j] & 0x0F) | (u[j + 16] & 0x0F) << 4;
    }
}
