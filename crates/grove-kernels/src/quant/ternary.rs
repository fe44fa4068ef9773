//! The ternary types TQ1_0 and TQ2_0 (llama.cpp's for BitNet b1.58-style models, such as
//! TriLM and Llama3-8B-1.58: each weight -1, 0 or 1 times its 256-weight super-block's `d`),
//! rewritten at load as Q2_K blocks of the same values, so that Q2_K's kernels multiply them on
//! every CPU and no kernel of their own is needed.
//!
//! Q2_K's weight is `d sc q - dmin m` for a 2-bit `q` and 4-bit `sc` and `m` per 16 weights.
//! With every `sc` and `m` 1 and `dmin = d` it is `d q - d`, which is `d (q - 1)` exactly in
//! f32 (`q` is 0, 1 or 2, `d` an f16): a ternary weight stored as `q = t + 1`. TQ2_0's 2-bit
//! weights already lie where Q2_K's do (ggml-common.h's `block_tq2_0` and `block_q2_K`, and
//! their `dequantize_row_*` in ggml-quants.c), so its bytes are copied; TQ1_0's base-3 digits
//! (five a byte) are decoded as ggml decodes them. In memory the weights take Q2_K's 2.63 bits
//! where the files hold 1.69 (TQ1_0) and 2.06 (TQ2_0).

use rayon::prelude::*;

/// A ternary GGUF type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ternary {
    /// 1.69 bits a weight: 48 bytes of five base-3 digits, 4 bytes of four, an f16 `d`.
    Tq1_0,
    /// 2.06 bits a weight: 64 bytes of four 2-bit weights (each `t + 1`), an f16 `d`.
    Tq2_0,
}

/// Weights per block of either type, and of Q2_K.
pub const BLOCK_WEIGHTS: usize = 256;
/// Bytes of a Q2_K block: 16 bytes of scales and mins, 64 of weights, `d` and `dmin`.
const Q2K_BLOCK: usize = 84;

impl Ternary {
    pub const ALL: [Self; 2] = [Self::Tq1_0, Self::Tq2_0];

    /// The type of ggml's type id `id` (`enum ggml_type`), if ternary.
    pub fn from_ggml(id: u32) -> Option<Self> {
        match id {
            34 => Some(Self::Tq1_0),
            35 => Some(Self::Tq2_0),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Tq1_0 => "TQ1_0",
            Self::Tq2_0 => "TQ2_0",
        }
    }

    pub const fn block_bytes(self) -> usize {
        match self {
            Self::Tq1_0 => 54,
            Self::Tq2_0 => 66,
        }
    }

    /// `blocks` (whole blocks of this type) as Q2_K blocks of the same values, on the threads.
    pub fn as_q2k(self, blocks: &[u8]) -> Vec<u8> {
        let size = self.block_bytes();
        assert!(
            blocks.len().is_multiple_of(size),
            "{} data is not whole blocks",
            self.name()
        );
        let mut out = vec![0u8; blocks.len() / size * Q2K_BLOCK];
        out.par_chunks_exact_mut(Q2K_BLOCK)
            .zip(blocks.par_chunks_exact(size))
            .for_each(|(out, block)| {
                // Every 16 weights' scale 1 (low nibble) and min 1 (high nibble).
                out[..16].fill(0x11);
                match self {
                    Self::Tq2_0 => out[16..80].copy_from_slice(&block[..64]),
                    Self::Tq1_0 => write_q2k_weights(&tq1_0_digits(block), &mut out[16..80]),
                }
                // `d`, then `dmin = d`.
                out[80..82].copy_from_slice(&block[size - 2..]);
                out[82..84].copy_from_slice(&block[size - 2..]);
            });
        out
    }
}

/// Each byte's five base-3 digits, as ggml's `dequantize_row_tq1_0` reads them: digit `n` is
/// the top of `3 (3^n byte mod 256)` above 8 bits (a byte holds `ceil(256 v / 243)` for its
/// digits' value `v`, the first digit the most significant).
static DIGITS: [[u8; 5]; 256] = {
    let mut digits = [[0u8; 5]; 256];
    let mut byte = 0;
    while byte < 256 {
        let mut n = 0;
        let mut power = 1u16;
        while n < 5 {
            let shifted = (byte as u16 * power) % 256;
            digits[byte][n] = ((shifted * 3) >> 8) as u8;
            power *= 3;
            n += 1;
        }
        byte += 1;
    }
    digits
};

/// A TQ1_0 block's 256 weights as `t + 1` (0, 1 or 2), in ggml's order: five digits of each of
/// the first 32 bytes (weight `32 n + m` is byte `m`'s digit `n`), five of each of the next 16
/// (weight `160 + 16 n + m`), four of each of the last 4 (weight `240 + 4 n + m`).
fn tq1_0_digits(block: &[u8]) -> [u8; BLOCK_WEIGHTS] {
    let mut digits = [0u8; BLOCK_WEIGHTS];
    // (first byte, bytes, digits a byte, first weight)
    for (from, bytes, count, first) in [(0, 32, 5, 0), (32, 16, 5, 160), (48, 4, 4, 240)] {
        for m in 0..bytes {
            let byte = DIGITS[usize::from(block[from + m])];
            for n in 0..count {
                digits[first + bytes * n + m] = byte[n];
            }
        }
    }
    digits
}

/// 256 two-bit weights as Q2_K's 64 bytes (`out`): weight `128 h + 32 j + l` in bits `2 j` of
/// byte `32 h + l`.
fn write_q2k_weights(q: &[u8; BLOCK_WEIGHTS], out: &mut [u8]) {
    out.fill(0);
    for (w, &q) in q.iter().enumerate() {
        let (h, j, l) = (w / 128, w % 128 / 32, w % 32);
        out[32 * h + l] |= q << (2 * j);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::{Bytes, Layout, QMatrix, QuantFormat};
    use std::sync::Arc;

    /// TQ1_0's encoder as ggml's `quantize_row_tq1_0_ref` packs the digits: the first of a
    /// byte's digits the most significant, then the ceiling of `256 v / 243`.
    fn tq1_0_block(t: &[i8; BLOCK_WEIGHTS], d: u16) -> Vec<u8> {
        let pack = |digits: &mut dyn Iterator<Item = i8>, count: usize| {
            let v = digits.take(count).fold(0u16, |v, t| 3 * v + (t + 1) as u16);
            let v = v * 3u16.pow(5 - count as u32);
            ((v * 256).div_ceil(243)) as u8
        };
        let mut block = Vec::new();
        for (from, bytes, count) in [(0, 32, 5), (160, 16, 5), (240, 4, 4)] {
            for m in 0..bytes {
                let mut digits = (0..count).map(|n| t[from + bytes * n + m]);
                block.push(pack(&mut digits, count));
            }
        }
        block.extend_from_slice(&d.to_le_bytes());
        block
    }

    /// TQ2_0's layout, as ggml's `quantize_row_tq2_0_ref` writes it.
    fn tq2_0_block(t: &[i8; BLOCK_WEIGHTS], d: u16) -> Vec<u8> {
        let mut block = vec![0u8; 66];
        for (w, &t) in t.iter().enumerate() {
            let (h, n, m) = (w / 128, w % 128 / 32, w % 32);
            block[32 * h + m] |= ((t + 1) as u8) << (2 * n);
        }
        block[64..].copy_from_slice(&d.to_le_bytes());
        block
    }

    /// Ternary weights and `d`s, rows of 2 blocks, written in each type and read through Q2_K
    /// in GGUF's layout and in this CPU's: every value `t d`, bit for bit.
    #[test]
    fn ternary_blocks_read_as_their_values() {
        let (n, k) = (5, 2 * BLOCK_WEIGHTS);
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let weights: Vec<[i8; BLOCK_WEIGHTS]> = (0..n * k / BLOCK_WEIGHTS)
            .map(|_| std::array::from_fn(|_| (next() % 3) as i8 - 1))
            .collect();
        let ds: Vec<half::f16> = (0..weights.len())
            .map(|b| {
                half::f16::from_f32(0.001 + (next() % 1000) as f32 * 1e-4 * [1.0, -1.0][b % 2])
            })
            .collect();
        for ternary in Ternary::ALL {
            let file: Vec<u8> = weights
                .iter()
                .zip(&ds)
                .flat_map(|(t, d)| match ternary {
                    Ternary::Tq1_0 => tq1_0_block(t, d.to_bits()),
                    Ternary::Tq2_0 => tq2_0_block(t, d.to_bits()),
                })
                .collect();
            assert_eq!(file.len(), n * k / BLOCK_WEIGHTS * ternary.block_bytes());
            let q2k = Bytes::Owned(Arc::new(ternary.as_q2k(&file)));
            let gguf = QMatrix::with_layout(QuantFormat::Q2K, n, k, q2k.clone(), Layout::Gguf)
                .expect("Q2_K rows");
            let ours = QMatrix::new(QuantFormat::Q2K, n, k, q2k).expect("Q2_K rows");
            for values in [gguf.dequantize(), ours.dequantize()] {
                for (i, &value) in values.iter().enumerate() {
                    let (t, d) = (
                        weights[i / BLOCK_WEIGHTS][i % BLOCK_WEIGHTS],
                        ds[i / BLOCK_WEIGHTS],
                    );
                    assert_eq!(
                        value,
                        f32::from(t) * d.to_f32(),
                        "{} value {i}",
                        ternary.name()
                    );
                }
            }
        }
    }

    /// Every byte decodes to three-valued digits, as ggml's decoder reads any byte; a byte made
    /// from digits gives them back.
    #[test]
    fn every_tq1_0_byte_gives_digits() {
        for byte in 0..=255u8 {
            let block: Vec<u8> = std::iter::repeat_n(byte, 52).chain([0, 0x3c]).collect();
            assert!(tq1_0_digits(&block).iter().all(|&t| t <= 2));
        }
        let t: [i8; BLOCK_WEIGHTS] = std::array::from_fn(|w| (w * 7 % 3) as i8 - 1);
        let digits = tq1_0_digits(&tq1_0_block(&t, 0x3c00));
        assert!(digits.iter().zip(&t).all(|(&q, &t)| q as i8 == t + 1));
    }
}
