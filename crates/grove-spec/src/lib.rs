//! The speculative-decoding algorithms as pure logic over host data, so that they can be unit-
//! and property-tested without a model: per-depth top-K candidates with log-probabilities
//! (optionally merged from vocabulary shards) and the DDTree draft tree (build and walk).
// `unsafe` lives in grove-kernels only.
#![forbid(unsafe_code)]

mod candidates;
mod tree;

pub use candidates::{merge_shards, top_k_candidates, DepthCandidates, ShardCandidates};
pub use tree::DraftTree;
