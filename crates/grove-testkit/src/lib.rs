//! Test support, kept out of the model crate's public surface: seeded random checkpoints that
//! tests load like real ones, and that `grove tiny-model` writes as fixtures.
// `unsafe` lives in grove-kernels only.
#![forbid(unsafe_code)]

pub mod gguf_writer;
pub mod random_checkpoint;

pub use random_checkpoint::{byte_level_tokenizer_json, RandomCheckpoint, RandomDrafter};
