//! The paged KV pool. Memory for keys and values is cut into pages of `page_size` slots; a
//! sequence owns a [`PageTable`] that maps its logical token index `i` to the physical slot
//! `pages[i / page_size] * page_size + i % page_size`. Pages return to the pool when the table
//! is truncated or dropped, so a request that ends in any way gives its memory back.
//!
//! Pages are reference-counted: a [`PrefixCache`] keeps the pages of finished prompts so that
//! a later request starting with the same tokens shares them instead of prefilling again.
//!
//! The crate knows nothing of models: a [`KvStore`] is, per layer and KV head, one K row and
//! one V row of `head_dim` values per slot, in f32 or f16 ([`KvDtype`]).
// `unsafe` lives in grove-kernels only.
#![forbid(unsafe_code)]

mod pool;
mod prefix;
mod store;

pub use pool::{PagePool, PageTable};
pub use prefix::{PrefixCache, PrefixCacheStats, PrefixMatch};
pub use store::{KvDtype, KvStore};

/// A physical page of the pool.
pub type PageId = u32;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KvError {
    #[error(
        "KV pool exhausted: {needed} more pages needed, {free} free of {total} (page size {page_size}); raise `--kv-pages` or lower `max_new_tokens`"
    )]
    OutOfPages {
        needed: usize,
        free: usize,
        total: usize,
        page_size: usize,
    },
    #[error("`page_size` must be at least 1, got 0")]
    ZeroPageSize,
}
