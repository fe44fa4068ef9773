//! A weight matrix in whichever form its file gave it: f32, or a GGUF block format kept
//! quantized. Below both the loader (`weights.rs`) and the layers that multiply by it.

use std::sync::Arc;

use candle_core::{DType, Storage, Tensor};
use grove_kernels::dense::{matmul_transposed, MAX_STREAMING_ROWS};
use grove_kernels::quant::{self, QMatrix};

/// A weight matrix `[out, in]`: f32 (safetensors, or GGUF types without a kernel), or a GGUF
/// block format kept quantized (`quant`).
#[derive(Debug, Clone)]
pub enum Matrix {
    Dense(Tensor),
    Quantized(Arc<QMatrix>),
}

impl Matrix {
    /// The number of outputs (rows of the weight).
    pub(crate) fn out_dim(&self) -> candle_core::Result<usize> {
        match self {
            Self::Dense(weight) => Ok(weight.dims2()?.0),
            Self::Quantized(matrix) => Ok(matrix.dims().0),
        }
    }

    /// `x W^T` as `[rows, out]` for host rows `x: [rows, in]`.
    pub(crate) fn matmul_host(&self, x: &[f32], rows: usize) -> candle_core::Result<Vec<f32>> {
        match self {
            Self::Quantized(matrix) => Ok(matrix.matmul(x, rows)),
            Self::Dense(weight) => {
                let (n, k) = weight.dims2()?;
                if rows <= MAX_STREAMING_ROWS {
                    return with_host_values(weight, |w| matmul_transposed(x, rows, w, n, k));
                }
                // Many rows: candle's blocked gemm.
                let x = Tensor::from_slice(x, (rows, k), weight.device())?;
                host_values(&x.matmul(&weight.t()?)?)
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
