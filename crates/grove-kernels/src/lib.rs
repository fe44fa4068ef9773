//! The hot loops of inference on host memory, and the only crate of the workspace with
//! `unsafe` code (SIMD intrinsics, raw pointers into weight layouts, the compute threads'
//! shared task lists, file maps). Every other crate denies it.
//!
//! - [`quant`]: GGUF block formats kept quantized, their load-time layouts and products.
//! - [`dense`]: the streaming f32 product for few rows, and the dot kernels attention uses.
//! - [`attention`]: softmax attention over lists of visible key slots.
//! - [`activation`]: gated MLP activations.
//! - [`threads`]: the compute threads kept awake through a forward and its parallel sections.
//! - [`memory`]: read-only file maps and returning freed heap to the OS.
//!
//! Each SIMD path is chosen at run time from the CPU's features, with a portable reference
//! that tests compare it to.

pub mod activation;
pub mod attention;
pub mod dense;
pub mod memory;
pub mod quant;
pub mod threads;
