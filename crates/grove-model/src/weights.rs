//! Safetensors checkpoints: one `model.safetensors` or shards listed in
//! `model.safetensors.index.json`, memory-mapped, every tensor converted to f32 on load (f32 is
//! where candle's CPU matmul is fast; bf16 is widened element by element and runs 5x slower).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use candle_core::safetensors::MmapedSafetensors;
use candle_core::{DType, Device, Tensor};

use crate::gguf::GgufFile;
use crate::matrix::Matrix;
use crate::ModelError;
use grove_kernels::quant::MatrixUse;

pub const SINGLE_FILE: &str = "model.safetensors";
pub const INDEX_FILE: &str = "model.safetensors.index.json";

/// Where tensors come from.
enum Source {
    Safetensors(MmapedSafetensors),
    Gguf(GgufFile),
}

/// The tensors of one checkpoint: a safetensors directory or a GGUF file.
pub struct Weights {
    tensors: Source,
    directory: PathBuf,
    device: Device,
    /// Float matrices for products are quantized to Q8_0 on load ([`Weights::with_q8_0_products`]).
    q8_0_products: bool,
}

impl std::fmt::Debug for Weights {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Weights")
            .field("directory", &self.directory)
            .finish()
    }
}

impl Weights {
    pub fn open(directory: &Path, device: &Device) -> Result<Self, ModelError> {
        let files = shard_files(directory)?;
        let tensors = grove_kernels::memory::map_safetensors(&files).map_err(|error| {
            ModelError::Weights {
                path: directory.to_owned(),
                message: error.to_string(),
            }
        })?;
        Ok(Self {
            tensors: Source::Safetensors(tensors),
            directory: directory.to_owned(),
            device: device.clone(),
            q8_0_products: false,
        })
    }

    /// Float matrices used in products load as Q8_0 (on a CPU, where the width is a multiple
    /// of the kernels' chunk): for a drafter, whose outputs only steer what is verified, half
    /// a bf16 matrix's bytes and the int8 kernels instead of float multiply-adds.
    pub fn with_q8_0_products(mut self) -> Self {
        self.q8_0_products = true;
        self
    }

    /// The tensors of a GGUF file, under their HF names.
    pub fn gguf(file: GgufFile, path: &Path, device: &Device) -> Self {
        Self {
            tensors: Source::Gguf(file),
            directory: path.to_owned(),
            device: device.clone(),
            q8_0_products: false,
        }
    }

    pub fn contains(&self, name: &str) -> bool {
        match &self.tensors {
            Source::Safetensors(tensors) => tensors.get(name).is_ok(),
            Source::Gguf(file) => file.contains(name),
        }
    }

    /// Loads the matrix `name` (`[out, in]`), kept quantized where the file's format has a
    /// kernel on this device, else as f32.
    pub fn matrix(&self, name: &str, shape: &[usize]) -> Result<Matrix, ModelError> {
        self.matrix_for(name, shape, MatrixUse::Products)
    }

    /// [`Weights::matrix`] for a table whose rows are only looked up (an embedding that is
    /// not also the LM head): a quantized one stays in the file's layout, so only the rows
    /// looked up become resident.
    pub fn lookup_matrix(&self, name: &str, shape: &[usize]) -> Result<Matrix, ModelError> {
        self.matrix_for(name, shape, MatrixUse::Lookups)
    }

    fn matrix_for(
        &self,
        name: &str,
        shape: &[usize],
        purpose: MatrixUse,
    ) -> Result<Matrix, ModelError> {
        if let (Source::Gguf(file), true) = (&self.tensors, self.device.is_cpu()) {
            if let Some(matrix) = file.quantized(name, purpose)? {
                let (n, k) = matrix.dims();
                if [n, k] != shape {
                    return Err(ModelError::Weights {
                        path: self.directory.clone(),
                        message: format!(
                            "tensor `{name}` has shape {:?}, expected {shape:?}",
                            [n, k]
                        ),
                    });
                }
                return Ok(Matrix::Quantized(std::sync::Arc::new(matrix)));
            }
        }
        let q8_0 = self.q8_0_products
            && purpose == MatrixUse::Products
            && self.device.is_cpu()
            && shape.len() == 2
            && shape[1].is_multiple_of(grove_kernels::quant::CHUNK);
        if q8_0 {
            let values: Vec<f32> = self.get(name, shape)?.flatten_all()?.to_vec1()?;
            let matrix = grove_kernels::quant::QMatrix::quantize_q8_0(&values, shape[0], shape[1])
                .map_err(|message| ModelError::Weights {
                    path: self.directory.clone(),
                    message: format!("tensor `{name}`: {message}"),
                })?;
            return Ok(Matrix::Quantized(std::sync::Arc::new(matrix)));
        }
        // Bfloat16 checkpoints' matrices stay bfloat16, F16 ones f16 (`Matrix::dense`).
        let matrix = Matrix::dense(&self.get_as_stored(name, shape)?)?;
        if let Source::Gguf(file) = &self.tensors {
            // The strips are a copy: the file's pages need not stay resident beside them.
            file.release(name);
        }
        Ok(matrix)
    }

    /// Loads `name` as f32 and checks its shape.
    pub fn get(&self, name: &str, shape: &[usize]) -> Result<Tensor, ModelError> {
        self.get_as_stored(name, shape)?
            .to_dtype(DType::F32)
            .map_err(|e| ModelError::Weights {
                path: self.directory.clone(),
                message: format!("tensor `{name}`: {e}"),
            })
    }

    /// Loads `name` in its file's type (GGUF tensors without a kernel: f32, but F16 and BF16
    /// in their own) and checks its shape.
    fn get_as_stored(&self, name: &str, shape: &[usize]) -> Result<Tensor, ModelError> {
        let error = |message: String| ModelError::Weights {
            path: self.directory.clone(),
            message,
        };
        if !self.contains(name) {
            return Err(error(format!("missing tensor `{name}`")));
        }
        let tensor = match &self.tensors {
            Source::Safetensors(tensors) => tensors
                .load(name, &self.device)
                .map_err(|e| error(format!("tensor `{name}`: {e}")))?,
            Source::Gguf(file) => file.tensor_as_stored(name, &self.device)?,
        };
        if tensor.dims() != shape {
            return Err(error(format!(
                "tensor `{name}` has shape {:?}, expected {shape:?}",
                tensor.dims()
            )));
        }
        Ok(tensor)
    }
}

/// The safetensors files of a checkpoint directory.
fn shard_files(directory: &Path) -> Result<Vec<PathBuf>, ModelError> {
    let single = directory.join(SINGLE_FILE);
    if single.is_file() {
        return Ok(vec![single]);
    }
    let index_path = directory.join(INDEX_FILE);
    if !index_path.is_file() {
        return Err(ModelError::MissingFile {
            path: single,
            what: "weights (or a sharded model.safetensors.index.json)",
        });
    }
    let text = std::fs::read_to_string(&index_path).map_err(|source| ModelError::Io {
        path: index_path.clone(),
        source,
    })?;
    let index: serde_json::Value = serde_json::from_str(&text).map_err(|e| ModelError::Config {
        path: index_path.clone(),
        message: e.to_string(),
    })?;
    let map = index
        .get("weight_map")
        .and_then(|m| m.as_object())
        .ok_or_else(|| ModelError::Config {
            path: index_path.clone(),
            message: "missing object `weight_map`".into(),
        })?;
    let names: BTreeSet<&str> = map.values().filter_map(|v| v.as_str()).collect();
    names
        .into_iter()
        .map(|name| {
            let path = directory.join(name);
            if path.is_file() {
                Ok(path)
            } else {
                Err(ModelError::MissingFile {
                    path,
                    what: "weight shard listed in model.safetensors.index.json",
                })
            }
        })
        .collect()
}
