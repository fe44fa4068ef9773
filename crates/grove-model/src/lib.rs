//! Tensors and networks: checkpoint loading, tokenizers and chat templates, and the target
//! decoder over a caller-owned paged KV pool. See `forward.rs` for the contract every caller
//! (plain decoding, DFlash, DDTree) uses. The arithmetic underneath is `grove-kernels`.
// `unsafe` lives in grove-kernels only.
#![forbid(unsafe_code)]

mod attention;
pub mod config;
mod decoder;
pub mod dflash;
pub mod drafter_manifest;
pub mod forward;
pub mod gguf;
mod gguf_header;
mod gguf_shards;
mod gguf_tokenizer;
pub mod layer_stack;
pub mod layers;
pub mod matrix;
mod rope;
pub mod sentencepiece;
mod template_json;
mod token_bytes;
pub mod tokenizer;
pub mod weights;

use std::path::PathBuf;

pub use config::{DecoderConfig, Family, RopeScaling};
pub use decoder::Decoder;
pub use dflash::{DFlashConfig, DFlashDrafter, DraftOutput};
pub use forward::{ForwardBatch, ForwardOutput, LogitRows, Segment, Visibility};
pub use rope::Rope;
pub use tokenizer::{reserved_template_variable, ChatMessage, TextTokenizer};

use grove_kv::{KvDtype, KvStore};

/// A network that runs the forward contract. The model holds weights only.
pub trait Model: Send + Sync {
    fn config(&self) -> &DecoderConfig;

    /// A KV store shaped for this model with `num_slots` slots.
    fn new_kv_store(&self, num_slots: usize) -> KvStore;

    /// How [`Model::new_kv_store`]'s stores keep their rows.
    fn kv_dtype(&self) -> KvDtype;

    /// Token embeddings, `[tokens, hidden]` (the DFlash drafter borrows the target's).
    fn embed(&self, tokens: &[u32]) -> Result<candle_core::Tensor, ModelError>;

    /// The LM head applied to already-normed hidden states: `[rows, hidden] -> [rows, vocab]`
    /// (the DFlash drafter borrows the target's).
    fn project_logits(
        &self,
        hidden: &candle_core::Tensor,
    ) -> Result<candle_core::Tensor, ModelError>;

    /// Rows `ids` of the LM head as f32 `[ids, hidden]` (a drafter's reduced head is gathered
    /// from its target's).
    fn head_rows(&self, ids: &[u32]) -> Result<candle_core::Tensor, ModelError>;

    /// Rows `ids` of the LM head kept in its block format, where the head is quantized: the
    /// same values as [`Model::head_rows`], in a fraction of the bytes a product reads.
    fn quantized_head_rows(
        &self,
        _ids: &[u32],
    ) -> Result<Option<grove_kernels::quant::QMatrix>, ModelError> {
        Ok(None)
    }

    /// Runs every row of `batch`, writing their K/V into `kv`.
    fn forward(&self, batch: &ForwardBatch, kv: &mut KvStore) -> Result<ForwardOutput, ModelError>;
}

#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("missing {what}: {path} does not exist")]
    MissingFile { path: PathBuf, what: &'static str },
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("invalid config {path}: {message}")]
    Config { path: PathBuf, message: String },
    #[error("invalid weights in {path}: {message}")]
    Weights { path: PathBuf, message: String },
    #[error("tokenizer {path}: {message}")]
    Tokenizer { path: PathBuf, message: String },
    #[error("chat template: {0}")]
    Template(String),
    #[error("drafter {path} does not fit the target: {message}")]
    IncompatibleDrafter { path: PathBuf, message: String },
    #[error("invalid forward batch: {0}")]
    InvalidBatch(String),
    #[error(transparent)]
    Kv(#[from] grove_kv::KvError),
    #[error(transparent)]
    Candle(#[from] candle_core::Error),
}
