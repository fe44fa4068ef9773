//! The building blocks a decoder is made of. The linear layer hides the weight format, so a
//! quantized model is the same model file with other weights.

use std::sync::Arc;

use candle_core::{Module, Tensor};

use grove_kernels::quant::{self, QMatrix};
use grove_kernels::{activation, norm, threads};

pub(crate) use crate::matrix::host_values;
use crate::matrix::quantized_matmuls;
pub use crate::matrix::{with_host_values, Matrix};
use crate::weights::Weights;
use crate::ModelError;

/// `y = x W^T + b` for `x: [rows, in]`.
#[derive(Debug, Clone)]
pub struct Linear {
    weight: Matrix,       // [out, in]
    bias: Option<Tensor>, // [out]
}

impl Linear {
    pub fn new(weight: Tensor, bias: Option<Tensor>) -> candle_core::Result<Self> {
        Ok(Self {
            weight: Matrix::dense(&weight)?,
            bias,
        })
    }

    pub fn from_matrix(weight: Matrix, bias: Option<Tensor>) -> Self {
        Self { weight, bias }
    }

    pub fn load(
        weights: &Weights,
        prefix: &str,
        in_dim: usize,
        out_dim: usize,
        bias: bool,
    ) -> Result<Self, ModelError> {
        let weight = weights.matrix(&format!("{prefix}.weight"), &[out_dim, in_dim])?;
        let bias = bias
            .then(|| weights.get(&format!("{prefix}.bias"), &[out_dim]))
            .transpose()?;
        Ok(Self { weight, bias })
    }

    pub fn weight(&self) -> &Matrix {
        &self.weight
    }

    /// Each of `linears` applied to the same host rows `x: [rows, in]`. When all are
    /// quantized, their products run as one parallel pass (q, k and v; gate and up), which
    /// saves thread hand-offs in decoding.
    pub fn forward_many_host(
        linears: &[&Linear],
        x: &[f32],
        rows: usize,
    ) -> candle_core::Result<Vec<Vec<f32>>> {
        let quantized: Option<Vec<&Arc<QMatrix>>> = linears
            .iter()
            .map(|linear| match &linear.weight {
                Matrix::Quantized(matrix) => Some(matrix),
                Matrix::Dense(_) => None,
            })
            .collect();
        let Some(matrices) = quantized else {
            return linears
                .iter()
                .map(|linear| linear.forward_host(x, rows))
                .collect();
        };
        quantized_matmuls(&matrices, x, rows)
            .into_iter()
            .zip(linears)
            .map(|(mut y, linear)| {
                linear.add_bias_host(&mut y)?;
                Ok(y)
            })
            .collect()
    }

    /// `x W^T + b` for host rows `x: [rows, in]`.
    pub fn forward_host(&self, x: &[f32], rows: usize) -> candle_core::Result<Vec<f32>> {
        let mut y = self.weight.matmul_host(x, rows)?;
        self.add_bias_host(&mut y)?;
        Ok(y)
    }

    fn add_bias_host(&self, y: &mut [f32]) -> candle_core::Result<()> {
        let Some(bias) = &self.bias else {
            return Ok(());
        };
        let add = |b: &[f32]| {
            in_row_groups(y, b.len(), |_, rows| {
                for row in rows.chunks_exact_mut(b.len()) {
                    for (v, b) in row.iter_mut().zip(b) {
                        *v += b;
                    }
                }
            })
        };
        with_host_values(bias, add)
    }
}

/// Rows of an elementwise pass per task where the rows are shared among the threads.
const GROUP_ROWS: usize = 8;

/// Values of an elementwise pass from which its rows are shared among the threads: a
/// prompt's q/k/v biases and rotations (a 16-row verify's: 24-32 thousand values) were
/// serial stretches of the forward.
const PARALLEL_MIN_VALUES: usize = 1 << 14;

/// `f(first, group)` for each group of [`GROUP_ROWS`] rows of `width` values of `values`
/// (`first` its first row's index), on the threads where there are many values.
pub(crate) fn in_row_groups(
    values: &mut [f32],
    width: usize,
    f: impl Fn(usize, &mut [f32]) + Sync,
) {
    let group = GROUP_ROWS * width.max(1);
    if values.len() < PARALLEL_MIN_VALUES {
        return values
            .chunks_mut(group)
            .enumerate()
            .for_each(|(j, rows)| f(j * GROUP_ROWS, rows));
    }
    threads::for_each_chunk_mut(&mut [values], group, |_, j, rows| f(j * GROUP_ROWS, rows));
}

impl Module for Linear {
    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        on_host_rows(x, self.weight.out_dim()?, |x, rows| {
            self.forward_host(x, rows)
        })
    }
}

/// `f(rows of x as host floats, number of rows)` as a tensor shaped like `x` with `out` values
/// per row.
fn on_host_rows(
    x: &Tensor,
    out: usize,
    f: impl FnOnce(&[f32], usize) -> candle_core::Result<Vec<f32>>,
) -> candle_core::Result<Tensor> {
    let mut shape = x.dims().to_vec();
    let Some(last) = shape.last_mut() else {
        candle_core::bail!("a linear layer's input needs at least one dimension");
    };
    let rows = x.elem_count() / (*last).max(1);
    *last = out;
    Tensor::from_vec(f(&host_values(x)?, rows)?, shape, x.device())
}

/// RMSNorm over the last dimension, computed in f32: `x / sqrt(mean(x^2) + eps) * w`.
#[derive(Debug, Clone)]
pub struct RmsNorm {
    weight: Tensor, // [dim]
    eps: f32,
}

impl RmsNorm {
    pub fn load(weights: &Weights, name: &str, dim: usize, eps: f64) -> Result<Self, ModelError> {
        Self::load_with_offset(weights, name, dim, eps, 0.0)
    }

    /// A norm that scales by `offset + w` (Gemma's `1 + w`), folded into the weight once.
    pub fn load_with_offset(
        weights: &Weights,
        name: &str,
        dim: usize,
        eps: f64,
        offset: f32,
    ) -> Result<Self, ModelError> {
        let mut weight = weights.get(&format!("{name}.weight"), &[dim])?;
        if offset != 0.0 {
            weight = (weight + f64::from(offset))?;
        }
        Ok(Self {
            weight,
            eps: eps as f32,
        })
    }
}

impl RmsNorm {
    /// The norm of each `dim`-value row of host values `x`, in place; the same arithmetic
    /// in the same order as candle's `rms_norm` (a sequential sum of squares, then
    /// `x / rms * w`), so the bits equal its.
    pub fn forward_host(&self, x: &mut [f32]) -> candle_core::Result<()> {
        with_host_values(&self.weight, |weight| norm::rms_norm(x, weight, self.eps))
    }

    /// `hidden += branch` (where there is a branch), then the norm of each row of `hidden`
    /// as new rows, with the bits of [`RmsNorm::forward_host`] on a copy of the sum.
    pub fn add_and_norm(
        &self,
        hidden: &mut [f32],
        branch: Option<&[f32]>,
    ) -> candle_core::Result<Vec<f32>> {
        with_host_values(&self.weight, |weight| {
            norm::add_and_rms_norm(hidden, branch, weight, self.eps)
        })
    }
}

impl Module for RmsNorm {
    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        candle_nn::ops::rms_norm(x, &self.weight, self.eps)
    }
}

pub use grove_kernels::activation::Activation;

/// Gated feed-forward: `down(act(gate(x)) * up(x))` (SwiGLU, or GeGLU for Gemma).
#[derive(Debug, Clone)]
pub struct Mlp {
    gate: Linear,
    up: Linear,
    down: Linear,
    activation: Activation,
}

impl Mlp {
    pub fn load(
        weights: &Weights,
        prefix: &str,
        hidden: usize,
        intermediate: usize,
        bias: bool,
    ) -> Result<Self, ModelError> {
        Self::load_with_activation(
            weights,
            prefix,
            hidden,
            intermediate,
            bias,
            Activation::Silu,
        )
    }

    pub fn load_with_activation(
        weights: &Weights,
        prefix: &str,
        hidden: usize,
        intermediate: usize,
        bias: bool,
        activation: Activation,
    ) -> Result<Self, ModelError> {
        Ok(Self {
            activation,
            gate: Linear::load(
                weights,
                &format!("{prefix}.gate_proj"),
                hidden,
                intermediate,
                bias,
            )?,
            up: Linear::load(
                weights,
                &format!("{prefix}.up_proj"),
                hidden,
                intermediate,
                bias,
            )?,
            down: Linear::load(
                weights,
                &format!("{prefix}.down_proj"),
                intermediate,
                hidden,
                bias,
            )?,
        })
    }
}

impl Mlp {
    /// `down(act(gate(x)) * up(x))` for host rows `x: [rows, hidden]`.
    pub fn forward_host(&self, x: &[f32], rows: usize) -> candle_core::Result<Vec<f32>> {
        let gated = match (&self.gate, &self.up) {
            // Quantized without biases: the products and the activation in one pass.
            (
                Linear {
                    weight: Matrix::Quantized(gate),
                    bias: None,
                },
                Linear {
                    weight: Matrix::Quantized(up),
                    bias: None,
                },
            ) if gate.dims() == up.dims() => {
                let activation = self.activation;
                quant::matmul_gated(gate, up, x, rows, |gate, up, out| {
                    activation::gated_rows(activation, gate, up, out)
                })
            }
            _ => {
                let [gate, up] = <[Vec<f32>; 2]>::try_from(Linear::forward_many_host(
                    &[&self.gate, &self.up],
                    x,
                    rows,
                )?)
                .expect("two linears, two outputs");
                activation::gated(self.activation, &gate, &up)
            }
        };
        self.down.forward_host(&gated, rows)
    }
}

#[cfg(test)]
mod tests {
    use candle_core::{Device, Module, Tensor};

    use super::RmsNorm;

    /// The host norm of any number of rows (summed side by side in groups, one by one, or in
    /// parallel) gives candle's `rms_norm` bits, row for row.
    #[test]
    fn host_norm_of_any_rows_equals_candles() {
        let dim = 96;
        let weight: Vec<f32> = (0..dim).map(|i| 0.5 + (i as f32 * 0.37).sin()).collect();
        let norm = RmsNorm {
            weight: Tensor::from_vec(weight, dim, &Device::Cpu).unwrap(),
            eps: 1e-6,
        };
        for rows in [1, 7, 8, 16, 19, 40] {
            let x: Vec<f32> = (0..rows * dim)
                .map(|i| (i as f32 * 0.731).sin() * (1.0 + (i % 13) as f32))
                .collect();
            let mut ours = x.clone();
            norm.forward_host(&mut ours).unwrap();
            let input = Tensor::from_vec(x, (rows, dim), &Device::Cpu).unwrap();
            let candle: Vec<f32> = norm
                .forward(&input)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1()
                .unwrap();
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&ours), bits(&candle), "{rows} rows");
        }
    }
}
