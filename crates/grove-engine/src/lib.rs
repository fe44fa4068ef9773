//! The decode loop: validate, prefill, rounds (plain or DFlash speculative), sampling,
//! stopping, incremental detokenization and per-round statistics. There is exactly one loop
//! and one round function; speculation changes what a round verifies, not the loop around it.
// `unsafe` lives in grove-kernels only.
#![forbid(unsafe_code)]

mod detokenizer;
mod drafter;
mod emitter;
mod generate;
mod round;
mod sampler;
mod scheduler;
mod speculation;
mod stop_strings;

pub use detokenizer::Detokenizer;
pub use drafter::{DraftBlock, Drafter};
pub use generate::{
    DDTreeSpec, DFlashSpec, GenerateOutput, GenerateRequest, GenerateStats, Generator,
    GeneratorOptions, DEFAULT_PREFILL_CHUNK,
};
pub use round::StepTimings;
pub use sampler::{argmax, processed_distribution, Sampler};
pub use scheduler::{Engine, EngineEvent, EngineLimits, RequestId};
pub use speculation::{SpecAlgorithm, SpeculationOverride, SpeculationSettings};
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
