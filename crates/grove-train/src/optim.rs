//! AdamW with decoupled weight decay, a linear-warmup + cosine learning-rate schedule, and
//! gradient accumulation. Our own (thirty lines) rather than candle-nn's, because a checkpoint
//! must carry the moments to resume exactly.

use std::collections::HashMap;
use std::path::Path;

use candle_core::backprop::GradStore;
use candle_core::{Device, Tensor};

use crate::params::Params;
use crate::TrainError;

#[derive(Debug, Clone, Copy, serde::Serialize, serde::Deserialize)]
pub struct AdamWConfig {
    pub lr: f64,
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub weight_decay: f64,
    pub warmup_steps: usize,
    pub total_steps: usize,
    /// The schedule ends at `lr * min_lr_ratio`.
    pub min_lr_ratio: f64,
}

impl AdamWConfig {
    /// Linear warmup to `lr`, then cosine decay to `lr * min_lr_ratio` at `total_steps`.
    pub fn lr_at(&self, step: usize) -> f64 {
        if step < self.warmup_steps {
            return self.lr * (step + 1) as f64 / self.warmup_steps as f64;
        }
        let span = self.total_steps.saturating_sub(self.warmup_steps).max(1);
        let progress = ((step - self.warmup_steps) as f64 / span as f64).min(1.0);
        let floor = self.lr * self.min_lr_ratio;
        floor + (self.lr - floor) * 0.5 * (1.0 + (std::f64::consts::PI * progress).cos())
    }
}

/// First and second moments per parameter, and the step count.
#[derive(Debug)]
pub struct AdamW {
    pub config: AdamWConfig,
    pub step: usize,
    moments: HashMap<String, (Tensor, Tensor)>,
}

impl AdamW {
    pub fn new(config: AdamWConfig, params: &Params) -> Result<Self, TrainError> {
        let moments = params
            .iter()
            .map(|(name, var)| {
                let zeros = var.as_tensor().zeros_like()?;
                Ok((name.clone(), (zeros.clone(), zeros)))
            })
            .collect::<Result<_, candle_core::Error>>()?;
        Ok(Self {
            config,
            step: 0,
            moments,
        })
    }

    /// One update from `grads` (already averaged over accumulated micro-batches). Norms
    /// (1-D parameters) get no weight decay.
    pub fn apply(
        &mut self,
        params: &Params,
        grads: &HashMap<String, Tensor>,
    ) -> Result<(), TrainError> {
        let c = self.config;
        let lr = c.lr_at(self.step);
        self.step += 1;
        let t = self.step as i32;
        let (correction1, correction2) = (1.0 - c.beta1.powi(t), 1.0 - c.beta2.powi(t));
        for (name, var) in params.iter() {
            let Some(grad) = grads.get(name) else {
                continue;
            };
            let (m, v) = self
                .moments
                .get_mut(name)
                .expect("moments for every parameter");
            *m = ((&*m * c.beta1)? + (grad * (1.0 - c.beta1))?)?;
            *v = ((&*v * c.beta2)? + (grad.sqr()? * (1.0 - c.beta2))?)?;
            let update = ((&*m / correction1)? / ((&*v / correction2)?.sqrt()? + c.eps)?)?;
            let current = var.as_tensor().detach();
            let decay = if current.rank() > 1 {
                c.weight_decay
            } else {
                0.0
            };
            let next = ((&current * (1.0 - lr * decay))? - (update * lr)?)?;
            var.set(&next)?;
        }
        Ok(())
    }

    /// Writes the moments as safetensors (`m.{name}`, `v.{name}`).
    pub fn save(&self, path: &Path) -> Result<(), TrainError> {
        let mut tensors = HashMap::new();
        for (name, (m, v)) in &self.moments {
            tensors.insert(format!("m.{name}"), m.clone());
            tensors.insert(format!("v.{name}"), v.clone());
        }
        candle_core::safetensors::save(&tensors, path)?;
        Ok(())
    }

    pub fn load(&mut self, path: &Path, step: usize) -> Result<(), TrainError> {
        let tensors = candle_core::safetensors::load(path, &Device::Cpu)?;
        for (name, (m, v)) in self.moments.iter_mut() {
            let get = |key: String| {
                tensors.get(&key).cloned().ok_or_else(|| {
                    TrainError::Checkpoint(format!("{} lacks `{key}`", path.display()))
                })
            };
            *m = get(format!("m.{name}"))?;
            *v = get(format!("v.{name}"))?;
        }
        self.step = step;
        Ok(())
    }
}

/// Sums gradients of successive micro-batches; `mean` divides by their count.
#[derive(Debug, Default)]
pub struct GradAccumulator {
    sums: HashMap<String, Tensor>,
    count: usize,
}

impl GradAccumulator {
    pub fn add(&mut self, params: &Params, grads: &GradStore) -> Result<(), TrainError> {
        for (name, var) in params.iter() {
            if let Some(grad) = grads.get(var.as_tensor()) {
                let grad = grad.detach();
                let sum = match self.sums.remove(name) {
                    Some(sum) => (sum + grad)?,
                    None => grad,
                };
                self.sums.insert(name.clone(), sum);
            }
        }
        self.count += 1;
        Ok(())
    }

    /// The mean gradient, clipped to global L2 norm `max_norm`; returns it and the pre-clip norm.
    pub fn finish(self, max_norm: f64) -> Result<(HashMap<String, Tensor>, f64), TrainError> {
        let count = self.count.max(1) as f64;
        let mut grads = HashMap::new();
        let mut squared = 0.0f64;
        for (name, sum) in self.sums {
            let grad = (sum / count)?;
            squared += grad.sqr()?.sum_all()?.to_scalar::<f32>()? as f64;
            grads.insert(name, grad);
        }
        let norm = squared.sqrt();
        if norm > max_norm {
            let scale = max_norm / norm;
            for grad in grads.values_mut() {
                *grad = (&*grad * scale)?;
            }
        }
        Ok((grads, norm))
    }
}
