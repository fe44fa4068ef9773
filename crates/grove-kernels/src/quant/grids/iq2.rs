//! IQ2_XXS, IQ2_XS and IQ2_S (llama.cpp's 2-bit "importance" quantizations: most tensors of
//! the IQ2_XXS, IQ2_XS, IQ2_S and IQ2_M files, some of IQ1's and IQ3_XXS's). Each 8 weights
//! of a super-block of 256 are a point of a grid of magnitudes 8, 25 and 43 with a sign
//! each; `w = d * (2 s + 1) / 8 * m`, the odd scale shared by 32 weights (IQ2_XXS) or 16.
//!
//! - IQ2_XXS (66 bytes): `d`, then per 32 weights two 32-bit words: four 8-bit grid indices;
//!   four 7-bit sign indices (each 8 weights' signs, the eighth making their count even:
//!   ggml's `ksigns_iq2xs`) and the 4-bit scale in the top 4 bits.
//! - IQ2_XS (74 bytes): `d`, 32 16-bit words (a 9-bit grid index, a 7-bit sign index above
//!   it), then per 32 weights a byte of two 4-bit scales (the low nibble the first 16's).
//! - IQ2_S (82 bytes): `d`, 32 low bytes of 10-bit grid indices, 32 bytes of signs (bit `i`
//!   of byte `b`: weight `8 b + i`), per 32 weights a byte of the indices' top 2 bits (bits
//!   `2 l`, `2 l + 1`: its point `l`'s), then IQ2_XS's scales.

use super::{decode_eights, even_signs, index, rank_of, sign_index, signs_of, Decoded, Grid};
use crate::quant::QuantFormat;

/// Magnitudes each way.
const RANKS: u8 = 3;

fn grid(format: QuantFormat) -> Grid {
    match format {
        QuantFormat::Iq2Xxs => Grid::Iq2Xxs,
        QuantFormat::Iq2Xs => Grid::Iq2Xs,
        _ => Grid::Iq2S,
    }
}

/// Sub-block `j`'s (32 weights) 4 grid points, 4 bytes of signs and 2 scales of 16 weights
/// in a block of `format`.
fn fields(format: QuantFormat, block: &[u8], j: usize) -> ([usize; 4], [u8; 4], [u8; 2]) {
    let word = |at: usize| u16::from_le_bytes([block[at], block[at + 1]]);
    match format {
        QuantFormat::Iq2Xxs => {
            let at = 2 + 8 * j;
            let high = u32::from_le_bytes(block[at + 4..at + 8].try_into().expect("4 bytes"));
            let points = std::array::from_fn(|l| usize::from(block[at + l]));
            let signs = std::array::from_fn(|l| even_signs((high >> (7 * l)) as u8 & 127));
            let scale = (high >> 28) as u8;
            (points, signs, [scale; 2])
        }
        QuantFormat::Iq2Xs => {
            let words: [u16; 4] = std::array::from_fn(|l| word(2 + 8 * j + 2 * l));
            let scales = block[66 + j];
            (
                words.map(|w| usize::from(w & 511)),
                words.map(|w| even_signs((w >> 9) as u8)),
                [scales & 0x0F, scales >> 4],
            )
        }
        QuantFormat::Iq2S => {
            let high = block[66 + j];
            let points = std::array::from_fn(|l| {
                usize::from(block[2 + 4 * j + l]) | usize::from((high >> (2 * l)) & 3) << 8
            });
            let signs = std::array::from_fn(|l| block[34 + 4 * j + l]);
            let scales = block[74 + j];
            (points, signs, [scales & 0x0F, scales >> 4])
        }
        _ => unreachable!("{} is not an IQ2 format", format.name()),
    }
}

/// A GGUF super-block of `format` (IQ2_XXS, IQ2_XS or IQ2_S) decoded.
pub(super) fn decode(format: QuantFormat, block: &[u8]) -> Decoded {
    let sub_blocks: [_; 8] = std::array::from_fn(|j| fields(format, block, j));
    decode_eights(
        u16::from_le_bytes([block[0], block[1]]),
        grid(format),
        |j| (sub_blocks[j].0, sub_blocks[j].2),
        |j, l, i, rank| index(rank, (sub_blocks[j].1[l] >> i) & 1 == 1, RANKS),
    )
}

/// [`decode`]'s inverse: `decoded` (from a block of `format`) as its GGUF bytes in the zeroed
/// `block`.
pub(super) fn encode(format: QuantFormat, decoded: &Decoded, block: &mut [u8]) {
    block[..2].copy_from_slice(&decoded.d.to_le_bytes());
    for j in 0..8 {
        let [first, second] = [0, 1].map(|h| (decoded.scales[2 * j + h] - 1) / 2);
        let sub = &decoded.indices[32 * j..32 * j + 32];
        let signs = signs_of(sub, |q| rank_of(q, RANKS).1);
        let points: [usize; 4] = std::array::from_fn(|l| {
            grid(format).point_of(sub[8 * l..8 * l + 8].iter().map(|&q| rank_of(q, RANKS).0))
        });
        match format {
            QuantFormat::Iq2Xxs => {
                let at = 2 + 8 * j;
                let mut high = u32::from(first) << 28;
                for (l, &s) in signs.iter().enumerate() {
                    block[at + l] = points[l] as u8;
                    high |= u32::from(sign_index(s)) << (7 * l);
                }
                block[at + 4..at + 8].copy_from_slice(&high.to_le_bytes());
            }
            QuantFormat::Iq2Xs => {
                for (l, &s) in signs.iter().enumerate() {
                    let word = points[l] as u16 | u16::from(sign_index(s)) << 9;
                    let at = 2 + 8 * j + 2 * l;
                    block[at..at + 2].copy_from_slice(&word.to_le_bytes());
                }
                block[66 + j] = first | second << 4;
            }
            QuantFormat::Iq2S => {
                for (l, &point) in points.iter().enumerate() {
                    block[2 + 4 * j + l] = point as u8;
                    block[66 + j] |= ((point >> 8) as u8) << (2 * l);
                }
                block[34 + 4 * j..38 + 4 * j].copy_from_slice(&signs);
                block[74 + j] = first | second << 4;
            }
            _ => unreachable!("{} is not an IQ2 format", format.name()),
        }
    }
}
