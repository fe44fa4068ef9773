//! Training in Rust on candle's autograd: a small Qwen3 target (`grove train-target`) and a
//! DFlash drafter for it (`grove train-drafter`), written in the formats the inference loaders
//! read (HF checkpoint; z-lab drafter).
// `unsafe` lives in grove-kernels only.
#![forbid(unsafe_code)]

pub mod checkpoint;
pub mod data;
pub mod drafter_net;
pub mod drafter_task;
pub mod feature_task;
pub mod features;
pub mod net;
pub mod optim;
pub mod params;
pub mod target_task;
pub mod trainer;

#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    #[error(transparent)]
    Candle(#[from] candle_core::Error),
    #[error(transparent)]
    Model(#[from] grove_model::ModelError),
    #[error("checkpoint: {0}")]
    Checkpoint(String),
    #[error("data: {0}")]
    Data(String),
    #[error("{path}: {source}")]
    Io {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
}
