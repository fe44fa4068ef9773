//! Vocabulary shared by every grove crate: ids, sampling parameters, stop conditions and the
//! validation errors that name the offending field and its limit. No tensors live here.
// `unsafe` lives in grove-kernels only.
#![forbid(unsafe_code)]

mod sampling;
mod stop;
mod validation;

pub use sampling::{SamplingDefaults, SamplingParams, GREEDY_TEMPERATURE_EPSILON};
pub use stop::{FinishReason, StopCondition};
pub use validation::{Naming, ValidationError};

/// A token id in the model's vocabulary.
pub type TokenId = u32;

/// Identifies one sequence (request) inside the engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SeqId(pub u64);
