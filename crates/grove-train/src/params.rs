//! Named trainable tensors under their HF checkpoint names, so that saving them is writing a
//! checkpoint the inference loaders read.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use candle_core::{DType, Device, Tensor, Var};
use rand::{Rng, SeedableRng};

use crate::TrainError;

/// Trainable parameters by name, in name order (so iteration is deterministic).
#[derive(Debug, Default)]
pub struct Params {
    vars: BTreeMap<String, Var>,
}

/// How a parameter starts.
#[derive(Debug, Clone, Copy)]
pub enum Init {
    /// N(0, std^2), seeded per parameter name.
    Normal(f64),
    Ones,
    Zeros,
}

impl Params {
    /// Adds `name` with `shape`, initialised from `seed` and the name (so adding parameters in
    /// another order gives the same values).
    pub fn add(
        &mut self,
        name: &str,
        shape: &[usize],
        init: Init,
        seed: u64,
    ) -> Result<(), TrainError> {
        let count: usize = shape.iter().product();
        let values: Vec<f32> = match init {
            Init::Ones => vec![1.0; count],
            Init::Zeros => vec![0.0; count],
            Init::Normal(std) => {
                let name_hash = name.bytes().fold(0xcbf29ce484222325u64, |h, b| {
                    (h ^ b as u64).wrapping_mul(0x100000001b3)
                });
                let mut rng = rand_chacha::ChaCha12Rng::seed_from_u64(seed ^ name_hash);
                (0..count)
                    .map(|_| {
                        // Box-Muller.
                        let u: f64 = rng.random_range(f64::EPSILON..1.0);
                        let v: f64 = rng.random();
                        (std * (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()) as f32
                    })
                    .collect()
            }
        };
        let tensor = Tensor::from_vec(values, shape, &Device::Cpu)?;
        self.vars
            .insert(name.to_owned(), Var::from_tensor(&tensor)?);
        Ok(())
    }

    pub fn get(&self, name: &str) -> &Var {
        self.vars
            .get(name)
            .unwrap_or_else(|| panic!("no parameter `{name}`"))
    }

    /// The parameter as a tensor that records gradients.
    pub fn t(&self, name: &str) -> Tensor {
        self.get(name).as_tensor().clone()
    }

    pub fn iter(&self) -> impl Iterator<Item = (&String, &Var)> {
        self.vars.iter()
    }

    pub fn len(&self) -> usize {
        self.vars.len()
    }

    pub fn is_empty(&self) -> bool {
        self.vars.is_empty()
    }

    /// Total number of scalars.
    pub fn num_scalars(&self) -> usize {
        self.vars.values().map(|v| v.elem_count()).sum()
    }

    /// Detached copies, for a frozen network (no gradient is recorded through them).
    pub fn frozen(&self) -> HashMap<String, Tensor> {
        self.vars
            .iter()
            .map(|(name, var)| (name.clone(), var.as_tensor().detach()))
            .collect()
    }

    /// Writes the parameters as safetensors in `dtype` (f32 for checkpoints, f16/bf16 for
    /// shipped weights).
    pub fn save(&self, path: &Path, dtype: DType) -> Result<(), TrainError> {
        self.save_with(path, dtype, Vec::new())
    }

    /// [`Params::save`] plus `extra` tensors stored as they are (a drafter's `d2t` ids).
    pub fn save_with(
        &self,
        path: &Path,
        dtype: DType,
        extra: Vec<(String, Tensor)>,
    ) -> Result<(), TrainError> {
        let mut tensors = self
            .vars
            .iter()
            .map(|(name, var)| Ok((name.clone(), var.as_tensor().to_dtype(dtype)?)))
            .collect::<Result<HashMap<_, _>, candle_core::Error>>()?;
        tensors.extend(extra);
        candle_core::safetensors::save(&tensors, path)?;
        Ok(())
    }

    /// Overwrites every parameter from a safetensors file holding all of them.
    pub fn load_values(&self, path: &Path) -> Result<(), TrainError> {
        let tensors = candle_core::safetensors::load(path, &Device::Cpu)?;
        for (name, var) in &self.vars {
            let tensor = tensors.get(name).ok_or_else(|| {
                TrainError::Checkpoint(format!("{} lacks `{name}`", path.display()))
            })?;
            var.set(&tensor.to_dtype(DType::F32)?)?;
        }
        Ok(())
    }
}
