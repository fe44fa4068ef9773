//! The decode loop: validate, prefill, rounds (plain or DFlash speculative), sampling,
//! stopping, incremental detokenization and per-round statistics. There is exactly one loop
//! and one round function; speculation changes what a round verifies, not the loop around it.
//!
//! Ownership: an [`Engine`] owns a round runner (`runner.rs`: model, tokenizer, drafter and
//! the stages of a step), the KV pools and its sequences (`sequence.rs`); it schedules
//! (`scheduler.rs`). [`Generator`] is the one-shot facade that builds an engine per call.
//! `speculation.rs` is a leaf: what a round drafts, as one concept.
// `unsafe` lives in grove-kernels only.
#![forbid(unsafe_code)]

mod budget;
mod detokenizer;
mod drafter;
mod emitter;
mod generate;
mod logprobs;
mod penalties;
mod request;
mod runner;
mod sampler;
mod scheduler;
mod sequence;
mod speculation;
mod stop_strings;
pub mod structured;

pub use budget::{AutoBudgetReport, BudgetTracePoint, CostCell};
pub use detokenizer::Detokenizer;
pub use drafter::{DraftBlock, Drafter};
pub use generate::Generator;
pub use grove_spec::{LookupConfig, NgramCorpus};
pub use logprobs::{TokenLogprob, MAX_TOP_LOGPROBS};
pub use penalties::{LogitAdjustments, MAX_LOGIT_BIAS, MAX_PENALTY};
pub use request::{
    GenerateOutput, GenerateRequest, GenerateStats, GeneratorOptions, DEFAULT_PREFILL_CHUNK,
};
pub use runner::StepTimings;
pub use sampler::{argmax, processed_distribution, Sampler};
pub use scheduler::{Engine, EngineEvent, EngineLimits, RequestId, DEFAULT_NGRAM_CORPUS};
pub use speculation::{
    Budget, DDTreeSpec, DFlashSpec, SpecAlgorithm, SpeculationOverride, SpeculationSettings,
    DEFAULT_AUTO_MAX_BUDGET,
};
pub use stop_strings::{StopScan, StopStrings};

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Validation(#[from] grove_core::ValidationError),
    #[error(transparent)]
    Model(#[from] grove_model::ModelError),
    #[error(transparent)]
    Kv(#[from] grove_kv::KvError),
}
