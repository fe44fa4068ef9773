//! A weight matrix in whichever form its file gave it: f32, or a GGUF block format kept
//! quantized. Below both the loader (`weights.rs`) and the layers that multiply by it.

use std::sync::Arc;

use candle_core::{DType, Storage, Tensor};
use grove_kernels::quant::{self, QMatrix};
use grove_kernels::strips::DenseStrips;

/// A weight matrix `[out, in]`: f32 in column strips (safetensors, or GGUF types without a
/// kernel), or a GGUF block format kept quantized (`quant`).
#[derive(Debug, Clone)]
pub enum Matrix {
    Dense(Arc<DenseStrips>),
    Quantized(Arc<QMatrix>),
}

impl Matrix {
    /// The matrix `weight` (`[out, in]`), copied into column strips (`grove_kernels::strips`:
    /// one kernel for any number of rows, so a verify's rows get a decode step's bits). A
    /// bfloat16 or f16 tensor stays so (exactly its f32 values, from half the bytes); any
    /// other type becomes f32.
    pub fn dense(weight: &Tensor) -> candle_core::Result<Self> {
        let (n, k) = weight.dims2()?;
        let strips = match weight.dtype() {
            DType::BF16 => {
                let halves = weight.flatten_all()?.to_vec1::<half::bf16>()?;
                DenseStrips::new_bf16(&halves, n, k)
            }
            DType::F16 => {
                let halves = weight.flatten_all()?.to_vec1::<half::f16>()?;
                DenseStrips::new_f16(&halves, n, k)
            }
            _ => with_host_values(weight, |values| DenseStrips::new(values, n, k))?,
        };
        Ok(Self::Dense(Arc::new(strips)))
    }

    /// The number of outputs (rows of the weight).
    pub(crate) fn out_dim(&self) -> candle_core::Result<usize> {
        match self {
            Self::Dense(matrix) => Ok(matrix.dims().0),
            Self::Quantized(matrix) => Ok(matrix.dims().0),
        }
    }

    /// `x W^T` as `[rows, out]` for host rows `x: [rows, in]`.
    pub(crate) fn matmul_host(&self, x: &[f32], rows: usize) -> candle_core::Result<Vec<f32>> {
        match self {
            Self::Quantized(matrix) => Ok(matrix.matmul(x, rows)),
            Self::Dense(matrix) => Ok(matrix.matmul(x, rows)),
        }
    }

    /// Rows `ids` as f32 `[ids, in]` (an embedding lookup).
    pub fn rows(&self, ids: &[u32]) -> candle_core::Result<Tensor> {
        let (n, k) = match self {
            Self::Dense(matrix) => matrix.dims(),
            Self::Quantized(matrix) => matrix.dims(),
        };
        let mut out = vec![0f32; ids.len() * k];
        for (&id, row) in ids.iter().zip(out.chunks_exact_mut(k)) {
            if id as usize >= n {
                candle_core::bail!("row {id} out of range for {n} rows");
            }
            match self {
                Self::Dense(matrix) => matrix.row(id as usize, row),
                Self::Quantized(matrix) => matrix.dequantize_row(id as usize, row),
            }
        }
        Tensor::from_vec(out, (ids.len(), k), &candle_core::Device::Cpu)
    }
}

/// `x W^T` for each of `matrices`, in one parallel pass (`quant::matmul_many`).
pub(crate) fn quantized_matmuls(
    matrices: &[&Arc<QMatrix>],
    x: &[f32],
    rows: usize,
) -> Vec<Vec<f32>> {
    let matrices: Vec<&QMatrix> = matrices.iter().map(|m| m.as_ref()).collect();
    quant::matmul_many(&matrices, x, rows)
}

/// `f` of `t`'s values as host floats: read in place for a contiguous f32 tensor on the CPU
/// (weights, biases and norm scales, without a copy per call), else from a copy.
pub fn with_host_values<R>(t: &Tensor, f: impl FnOnce(&[f32]) -> R) -> candle_core::Result<R> {
    if t.dtype() == DType::F32 && t.is_contiguous() && t.device().is_cpu() {
        let (storage, layout) = t.storage_and_layout();
        if let Storage::Cpu(cpu) = &*storage {
            let start = layout.start_offset();
            return Ok(f(&cpu.as_slice::<f32>()?[start..start + t.elem_count()]));
        }
    }
    Ok(f(&host_values(t)?))
}

/// `t` as host f32 values (a copy).
pub(crate) fn host_values(t: &Tensor) -> candle_core::Result<Vec<f32>> {
    t.flatten_all()?.to_dtype(DType::F32)?.to_vec1()
}
