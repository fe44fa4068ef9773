//! Rotary position embedding in the HF/NeoX "rotate half" form: the first and second halves of
//! a head vector are the real and imaginary parts. Frequencies and angles are computed in f32,
//! as transformers does, so rotated vectors match the references to float rounding.

use crate::config::{DecoderConfig, RopeScaling};
use crate::layers::in_row_groups;

/// Inverse frequencies of one model, `[head_dim / 2]`.
#[derive(Debug, Clone)]
pub struct Rope {
    inv_freq: Vec<f32>,
}

impl Rope {
    pub fn new(config: &DecoderConfig) -> Self {
        Self::with_params(config.head_dim, config.rope_theta, &config.rope_scaling)
    }

    pub fn with_params(head_dim: usize, theta: f64, scaling: &RopeScaling) -> Self {
        let base: Vec<f64> = (0..head_dim / 2)
            .map(|i| 1.0 / theta.powf((2 * i) as f64 / head_dim as f64))
            .collect();
        if let RopeScaling::FrequencyFactors(factors) = scaling {
            assert_eq!(factors.len(), base.len(), "one factor per frequency");
        }
        let inv_freq = base
            .into_iter()
            .enumerate()
            .map(|(i, freq)| match *scaling {
                RopeScaling::None => freq,
                RopeScaling::Linear { factor } => freq / factor,
                RopeScaling::FrequencyFactors(ref factors) => freq / factors[i],
                RopeScaling::Llama3 {
                    factor,
                    low_freq_factor,
                    high_freq_factor,
                    original_max_position_embeddings: old_context,
                } => {
                    // Llama 3.1: long wavelengths are slowed by `factor`, short ones kept, and
                    // the band between is interpolated smoothly.
                    let wavelen = 2.0 * std::f64::consts::PI / freq;
                    let low_freq_wavelen = old_context / low_freq_factor;
                    let high_freq_wavelen = old_context / high_freq_factor;
                    if wavelen < high_freq_wavelen {
                        freq
                    } else if wavelen > low_freq_wavelen {
                        freq / factor
                    } else {
                        let smooth = (old_context / wavelen - low_freq_factor)
                            / (high_freq_factor - low_freq_factor);
                        (1.0 - smooth) * freq / factor + smooth * freq
                    }
                }
            } as f32)
            .collect();
        Self { inv_freq }
    }

    /// `(cos, sin)` tables for the given positions, each `[positions.len() * head_dim / 2]`.
    pub fn tables(&self, positions: &[usize]) -> (Vec<f32>, Vec<f32>) {
        let half = self.inv_freq.len();
        let mut cos = Vec::with_capacity(positions.len() * half);
        let mut sin = Vec::with_capacity(positions.len() * half);
        for &position in positions {
            for &freq in &self.inv_freq {
                let angle = position as f32 * freq;
                cos.push(angle.cos());
                sin.push(angle.sin());
            }
        }
        (cos, sin)
    }

    /// Rotates every head of every row in place. `rows` is `[num_rows, num_heads * head_dim]`;
    /// `cos`/`sin` come from [`Rope::tables`] for the same rows.
    pub fn rotate(&self, rows: &mut [f32], num_heads: usize, cos: &[f32], sin: &[f32]) {
        let half = self.inv_freq.len();
        let head_dim = 2 * half;
        let width = num_heads * head_dim;
        in_row_groups(rows, width, |first_row, group| {
            for (r, row) in group.chunks_exact_mut(width).enumerate() {
                let row_index = first_row + r;
                let cos = &cos[row_index * half..(row_index + 1) * half];
                let sin = &sin[row_index * half..(row_index + 1) * half];
                for head in row.chunks_exact_mut(head_dim) {
                    let (first, second) = head.split_at_mut(half);
                    for i in 0..half {
                        let (x1, x2) = (first[i], second[i]);
                        first[i] = x1 * cos[i] - x2 * sin[i];
                        second[i] = x2 * cos[i] + x1 * sin[i];
                    }
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rotation_preserves_norm_and_position_zero_is_identity() {
        let rope = Rope::with_params(8, 10_000.0, &RopeScaling::None);
        let original: Vec<f32> = (0..8).map(|i| i as f32 - 3.5).collect();
        let mut at_zero = original.clone();
        let (cos, sin) = rope.tables(&[0]);
        rope.rotate(&mut at_zero, 1, &cos, &sin);
        assert_eq!(at_zero, original);
        let mut at_seven = original.clone();
        let (cos, sin) = rope.tables(&[7]);
        rope.rotate(&mut at_seven, 1, &cos, &sin);
        let norm = |v: &[f32]| v.iter().map(|x| x * x).sum::<f32>();
        assert!((norm(&at_seven) - norm(&original)).abs() < 1e-3);
        assert_ne!(at_seven, original);
    }

    #[test]
    fn llama3_scaling_slows_only_long_wavelengths() {
        let scaling = RopeScaling::Llama3 {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 8192.0,
        };
        let plain = Rope::with_params(128, 500_000.0, &RopeScaling::None);
        let scaled = Rope::with_params(128, 500_000.0, &scaling);
        assert_eq!(plain.inv_freq[0], scaled.inv_freq[0]);
        let last = plain.inv_freq.len() - 1;
        assert!((plain.inv_freq[last] / 8.0 - scaled.inv_freq[last]).abs() < 1e-12);
    }
}
