//! The building blocks a decoder is made of. The linear layer hides the weight format, so a
//! quantized model is the same model file with other weights.

use std::sync::Arc;

use candle_core::{DType, Module, Storage, Tensor};

use crate::activation;
use crate::kernels::{matmul_transposed, MAX_STREAMING_ROWS};
use crate::quant::{self, QMatrix};

use crate::weights::Weights;
use crate::ModelError;

/// A weight matrix `[out, in]`: f32 (safetensors, or GGUF types without a kernel), or a GGUF
/// block format kept quantized (`quant`).
#[derive(Debug, Clone)]
pub enum Matrix {
    Dense(Tensor),
    Quantized(Arc<QMatrix>),
}

impl Matrix {
    /// `x W^T` for `x: [rows, in]`.
    fn matmul_transposed(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        match self {
            Self::Dense(weight) => x.matmul(&weight.t()?),
            Self::Quantized(matrix) => {
                let mut outputs = quantized_matmuls(&[matrix], x)?;
                Ok(outputs.pop().expect("one matrix, one output"))
            }
        }
    }

    /// Rows `ids` as f32 `[ids, in]` (an embedding lookup).
    pub fn rows(&self, ids: &[u32]) -> candle_core::Result<Tensor> {
        match self {
            Self::Dense(weight) => {
                let ids = Tensor::from_vec(ids.to_vec(), ids.len(), weight.device())?;
                weight.index_select(&ids, 0)
            }
            Self::Quantized(matrix) => {
                let (n, k) = matrix.dims();
                let mut out = vec![0f32; ids.len() * k];
                for (&id, row) in ids.iter().zip(out.chunks_exact_mut(k)) {
                    if id as usize >= n {
                        candle_core::bail!("row {id} out of range for {n} rows");
                    }
                    matrix.dequantize_row(id as usize, row);
                }
                Tensor::from_vec(out, (ids.len(), k), &candle_core::Device::Cpu)
            }
        }
    }
}

/// `x W^T` for each of `matrices`, in one parallel pass (`quant::matmul_many`).
fn quantized_matmuls(matrices: &[&Arc<QMatrix>], x: &Tensor) -> candle_core::Result<Vec<Tensor>> {
    let Some(first) = matrices.first() else {
        return Ok(Vec::new());
    };
    let k = first.dims().1;
    let rows = x.elem_count() / k;
    let input = x.flatten_all()?.to_dtype(DType::F32)?.to_vec1::<f32>()?;
    let matrices: Vec<&QMatrix> = matrices.iter().map(|m| m.as_ref()).collect();
    quant::matmul_many(&matrices, &input, rows)
        .into_iter()
        .zip(&matrices)
        .map(|(output, matrix)| Tensor::from_vec(output, (rows, matrix.dims().0), x.device()))
        .collect()
}

/// `y = x W^T + b` for `x: [rows, in]`.
#[derive(Debug, Clone)]
pub struct Linear {
    weight: Matrix,       // [out, in]
    bias: Option<Tensor>, // [out]
}

impl Linear {
    pub fn new(weight: Tensor, bias: Option<Tensor>) -> Self {
        Self {
            weight: Matrix::Dense(weight),
            bias,
        }
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

    /// Each of `linears` applied to the same `x`. When all are quantized, their products run
    /// as one parallel pass (q, k and v; gate and up), which saves thread hand-offs in decoding.
    pub fn forward_many(linears: &[&Linear], x: &Tensor) -> candle_core::Result<Vec<Tensor>> {
        let quantized: Option<Vec<&Arc<QMatrix>>> = linears
            .iter()
            .map(|linear| match &linear.weight {
                Matrix::Quantized(matrix) => Some(matrix),
                Matrix::Dense(_) => None,
            })
            .collect();
        let Some(matrices) = quantized else {
            return linears.iter().map(|linear| linear.forward(x)).collect();
        };
        quantized_matmuls(&matrices, x)?
            .into_iter()
            .zip(linears)
            .map(|(y, linear)| linear.add_bias(y))
            .collect()
    }

    fn add_bias(&self, y: Tensor) -> candle_core::Result<Tensor> {
        match &self.bias {
            Some(bias) => y.broadcast_add(bias),
            None => Ok(y),
        }
    }
}

impl Linear {
    /// `x W^T` through the streaming kernel when `x` has few rows and everything is host f32.
    fn streaming_forward(&self, x: &Tensor) -> candle_core::Result<Option<Tensor>> {
        let &[rows, k] = x.dims() else {
            return Ok(None);
        };
        let Matrix::Dense(weight) = &self.weight else {
            return Ok(None);
        };
        let &[n, weight_k] = weight.dims() else {
            return Ok(None);
        };
        let eligible = rows <= MAX_STREAMING_ROWS
            && k == weight_k
            && x.dtype() == DType::F32
            && weight.dtype() == DType::F32
            && weight.is_contiguous()
            && x.device().is_cpu();
        if !eligible {
            return Ok(None);
        }
        let input = x.flatten_all()?.to_vec1::<f32>()?;
        let (storage, layout) = weight.storage_and_layout();
        let Storage::Cpu(cpu) = &*storage else {
            return Ok(None);
        };
        let start = layout.start_offset();
        let weight = &cpu.as_slice::<f32>()?[start..start + n * k];
        let output = matmul_transposed(&input, rows, weight, n, k);
        Ok(Some(Tensor::from_vec(output, (rows, n), x.device())?))
    }
}

impl Module for Linear {
    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let y = match self.streaming_forward(x)? {
            Some(y) => y,
            None => self.weight.matmul_transposed(x)?,
        };
        self.add_bias(y)
    }
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

impl Module for RmsNorm {
    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        candle_nn::ops::rms_norm(x, &self.weight, self.eps)
    }
}

pub use crate::activation::Activation;

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

impl Module for Mlp {
    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let [gate, up] = <[Tensor; 2]>::try_from(Linear::forward_many(&[&self.gate, &self.up], x)?)
            .expect("two linears, two outputs");
        let hidden = if gate.device().is_cpu() && gate.dtype() == DType::F32 {
            let shape = gate.shape().clone();
            let gate = gate.flatten_all()?.to_vec1::<f32>()?;
            let up = up.flatten_all()?.to_vec1::<f32>()?;
            Tensor::from_vec(
                activation::gated(self.activation, &gate, &up),
                shape,
                x.device(),
            )?
        } else {
            let gate = match self.activation {
                Activation::Silu => candle_nn::ops::silu(&gate)?,
                Activation::GeluTanh => gate.gelu()?,
            };
            (gate * up)?
        };
        self.down.forward(&hidden)
    }
}
