//! Vocabulary shared by every grove crate: ids, sampling parameters, stop conditions and the
//! validation errors that name the offending field and its limit. No tensors live here.
// `unsafe` lives in grove-kernels only.
#![forbid(unsafe_code)]

mod sampling;
mod stop;

pub use sampling::{SamplingParams, GREEDY_TEMPERATURE_EPSILON};
pub use stop::{FinishReason, StopCondition};

/// A token id in the model's vocabulary.
pub type TokenId = u32;

/// Identifies one sequence (request) inside the engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SeqId(pub u64);

/// Bad input, rejected at the edge. Every variant names the field and the limit it broke.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ValidationError {
    #[error("`{field}` must be {limit}, got {value}")]
    OutOfRange {
        field: &'static str,
        limit: &'static str,
        value: String,
    },
    #[error("`{field}` must not be empty")]
    Empty { field: &'static str },
    #[error(
        "prompt of {prompt_tokens} tokens plus `max_new_tokens` {max_new_tokens} exceeds the model's context of {context} tokens"
    )]
    ContextOverflow {
        prompt_tokens: usize,
        max_new_tokens: usize,
        context: usize,
    },
    #[error("token id {id} in `{field}` is outside the vocabulary of {vocab_size} tokens")]
    TokenOutOfVocab {
        field: &'static str,
        id: u64,
        vocab_size: usize,
    },
}
