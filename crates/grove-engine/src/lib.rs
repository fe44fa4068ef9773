//! The decode loop: validate, prefill, rounds, sampling, stopping, incremental
//! detokenization and per-round statistics. There is exactly one loop; speculative methods
//! change what a round does, not the loop around it.

mod detokenizer;
mod generate;
mod sampler;
mod stop_strings;

pub use detokenizer::Detokenizer;
pub use generate::{GenerateOutput, GenerateRequest, GenerateStats, Generator, GeneratorOptions};
pub use sampler::{argmax, processed_distribution, Sampler};
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
