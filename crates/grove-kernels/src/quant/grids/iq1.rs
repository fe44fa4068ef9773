//! IQ1_S and IQ1_M (llama.cpp's 1-bit "importance" quantizations: most tensors of the IQ1_S
//! and IQ1_M files). Each 8 weights of a super-block of 256 are a point of a grid of -1, 0
//! and 1, shifted by an eighth either way: `w = d * (2 s + 1) * (g + delta)`, `delta` shared
//! by 32 weights (IQ1_S) or 8 (IQ1_M), the odd scale by 32 (IQ1_S) or 16. As eighths of `d`,
//! each weight is `8 g + 1` or `8 g - 1`: one of 6 values (`super::IQ1`).
//!
//! - IQ1_S (50 bytes): `d`, 32 low bytes of 11-bit grid indices, then per 32 weights a
//!   16-bit word: the 4 indices' top 3 bits (bits `3 l..3 l + 3`: point `l`'s), the 3-bit
//!   scale at bit 12, `delta`'s sign at bit 15 (set: negative).
//! - IQ1_M (56 bytes): 32 low bytes of 11-bit grid indices, then per 32 weights 2 bytes of
//!   two nibbles (a point's top 3 bits and, at bit 3, its `delta`'s sign: the low nibble
//!   point `2 b`'s), then four 16-bit words of 3-bit scales (word `j / 2` at bit `6 (j % 2)`
//!   the first 16 weights' of sub-block `j`, at `+ 3` the second 16's) whose top 4 bits hold
//!   `d`'s f16 bits, the first word's its lowest.

use super::{decode_eights, Decoded, Grid};
use crate::quant::QuantFormat;

/// The index of digit `digit` (`g + 1`) shifted by `delta` (negative where set).
fn index(digit: u8, negative: bool) -> u8 {
    2 * digit + u8::from(!negative)
}

/// Sub-block `j`'s (32 weights) 4 grid points, their shifts' signs and 2 scales of 16
/// weights in a block of `format`.
fn fields(format: QuantFormat, block: &[u8], j: usize) -> ([usize; 4], [bool; 4], [u8; 2]) {
    match format {
        QuantFormat::Iq1S => {
            let high = u16::from_le_bytes([block[34 + 2 * j], block[35 + 2 * j]]);
            let points = std::array::from_fn(|l| {
                usize::from(block[2 + 4 * j + l]) | usize::from((high >> (3 * l)) & 7) << 8
            });
            let scale = ((high >> 12) & 7) as u8;
            (points, [high & 0x8000 != 0; 4], [scale; 2])
        }
        QuantFormat::Iq1M => {
            let nibble = |l: usize| block[32 + 2 * j + l / 2] >> (4 * (l % 2));
            let points = std::array::from_fn(|l| {
                usize::from(block[4 * j + l]) | usize::from(nibble(l) & 7) << 8
            });
            let word = u16::from_le_bytes([block[48 + 2 * (j / 2)], block[49 + 2 * (j / 2)]]);
            let scales = [0, 3].map(|at| ((word >> (6 * (j % 2) + at)) & 7) as u8);
            (points, std::array::from_fn(|l| nibble(l) & 8 != 0), scales)
        }
        _ => unreachable!("{} is not an IQ1 format", format.name()),
    }
}

/// IQ1_M's `d` (f16 bits) from the top nibbles of its four words of scales.
fn iq1m_d(block: &[u8]) -> u16 {
    (0..4).fold(0, |d, k| {
        let word = u16::from_le_bytes([block[48 + 2 * k], block[49 + 2 * k]]);
        d | (word >> 12) << (4 * k)
    })
}

/// A GGUF super-block of `format` (IQ1_S or IQ1_M) decoded.
pub(super) fn decode(format: QuantFormat, block: &[u8]) -> Decoded {
    let d = match format {
        QuantFormat::Iq1M => iq1m_d(block),
        _ => u16::from_le_bytes([block[0], block[1]]),
    };
    let sub_blocks: [_; 8] = std::array::from_fn(|j| fields(format, block, j));
    decode_eights(
        d,
        Grid::Iq1S,
        |j| (sub_blocks[j].0, sub_blocks[j].2),
        |j, l, _, digit| index(digit, sub_blocks[j].1[l]),
    )
}

/// [`decode`]'s inverse: `decoded` (from a block of `format`) as its GGUF bytes in the zeroed
/// `block`.
pub(super) fn encode(format: QuantFormat, decoded: &Decoded, block: &mut [u8]) {
    for j in 0..8 {
        let [first, second] = [0, 1].map(|h| u16::from((decoded.scales[2 * j + h] - 1) / 2));
        let sub = &decoded.indices[32 * j..32 * j + 32];
        let points: [usize; 4] = std::array::from_fn(|l| {
            Grid::Iq1S.point_of(sub[8 * l..8 * l + 8].iter().map(|&q| q / 2))
        });
        let negative: [bool; 4] = std::array::from_fn(|l| sub[8 * l].is_multiple_of(2));
        match format {
            QuantFormat::Iq1S => {
                let mut high = first << 12 | u16::from(negative[0]) << 15;
                for (l, &point) in points.iter().enumerate() {
                    block[2 + 4 * j + l] = point as u8;
                    high |= ((point >> 8) as u16) << (3 * l);
                }
                block[34 + 2 * j..36 + 2 * j].copy_from_slice(&high.to_le_bytes());
            }
            QuantFormat::Iq1M => {
                for (l, &point) in points.iter().enumerate() {
                    block[4 * j + l] = point as u8;
                    let nibble = (point >> 8) as u8 | u8::from(negative[l]) << 3;
                    block[32 + 2 * j + l / 2] |= nibble << (4 * (l % 2));
                }
                let at = 48 + 2 * (j / 2);
                let word = u16::from_le_bytes([block[at], block[at + 1]])
                    | (first | second << 3) << (6 * (j % 2));
                block[at..at + 2].copy_from_slice(&word.to_le_bytes());
            }
            _ => unreachable!("{} is not an IQ1 format", format.name()),
        }
    }
    match format {
        QuantFormat::Iq1M => {
            for k in 0..4 {
                let at = 48 + 2 * k;
                let word = u16::from_le_bytes([block[at], block[at + 1]])
                    | ((decoded.d >> (4 * k)) & 0x0F) << 12;
                block[at..at + 2].copy_from_slice(&word.to_le_bytes());
            }
        }
        _ => block[..2].copy_from_slice(&decoded.d.to_le_bytes()),
    }
}
