//! The speculative-decoding algorithms as pure logic over host data, so that they can be unit-
//! and property-tested without a model. One round's stages as types: per-depth top-K
//! candidates with log-probabilities (optionally merged from vocabulary shards), the DDTree
//! draft tree (build) and the drafter-free lookup tree, the verify forward's layout ([`VerifyPlan`]: compile), the walk of the
//! target's choices ([`AcceptResult`]: accept) and the acceptance statistics.
// `unsafe` lives in grove-kernels only.
#![forbid(unsafe_code)]

mod accept;
mod candidates;
mod corpus;
mod lookup;
mod merge;
mod plan;
mod scan;
mod stats;
mod tree;

pub use accept::AcceptResult;
pub use candidates::{
    map_to_target_ids, merge_shards, top_k_candidates, DepthCandidates, ShardCandidates,
};
pub use corpus::{NgramCorpus, MAX_CAPACITY as MAX_CORPUS_CAPACITY};
pub use lookup::{lookup_tree, LookupConfig, MAX_OCCURRENCES};
pub use merge::merge_trees;
pub use plan::{SegmentPlan, VerifyPlan};
pub use scan::log_sum_exp;
pub use stats::AcceptanceStats;
pub use tree::DraftTree;
