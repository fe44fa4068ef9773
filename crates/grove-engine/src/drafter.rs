//! The drafter seam: what the decode loop needs from any source of draft blocks. DFlash is the
//! real one; tests plug in oracle and adversarial drafters to pin the loop's lossless
//! behaviour at both extremes of acceptance.

use candle_core::Tensor;
use grove_core::TokenId;
use grove_kv::{KvStore, PagePool, PageTable};
use grove_model::{DFlashDrafter, Model, ModelError};

/// A drafter's per-sequence state: its own KV pool, whose table holds exactly the committed
/// positions `0..start` once the pending features are added.
#[derive(Debug)]
pub struct DraftContext {
    pub table: PageTable,
    pub kv: KvStore,
}

impl DraftContext {
    /// A context for drafters that keep no KV.
    pub fn empty() -> Self {
        let pool = PagePool::new(0, 1).expect("page size 1 is valid");
        Self {
            table: pool.new_table(),
            kv: KvStore::new(0, 0, 0),
        }
    }
}

pub trait Drafter: Send + Sync {
    /// Slots per draft block: the anchor plus `block_size - 1` drafts.
    fn block_size(&self) -> usize;

    /// Target layers whose outputs the drafter consumes, in order (may be empty).
    fn target_taps(&self) -> &[usize];

    /// State for one sequence of at most `max_len` committed tokens.
    fn new_context(&self, max_len: usize, page_size: usize) -> Result<DraftContext, ModelError>;

    /// Adds the target features `[rows, taps * hidden]` of newly committed tokens.
    fn extend(&self, context: &mut DraftContext, features: &Tensor) -> Result<(), ModelError>;

    /// Draft logits `[block_size - 1, vocab]` for the slots after `anchor`, which sits at
    /// absolute position `position`.
    fn draft(
        &self,
        target: &dyn Model,
        context: &mut DraftContext,
        anchor: TokenId,
        position: usize,
    ) -> Result<Tensor, ModelError>;
}

impl Drafter for DFlashDrafter {
    fn block_size(&self) -> usize {
        self.config().block_size
    }

    fn target_taps(&self) -> &[usize] {
        &self.config().target_layer_ids
    }

    fn new_context(&self, max_len: usize, page_size: usize) -> Result<DraftContext, ModelError> {
        let pool = PagePool::new((max_len + self.block_size()).div_ceil(page_size), page_size)?;
        Ok(DraftContext {
            kv: self.new_kv_store(pool.num_slots()),
            table: pool.new_table(),
        })
    }

    fn extend(&self, context: &mut DraftContext, features: &Tensor) -> Result<(), ModelError> {
        self.extend_context(features, &mut context.table, &mut context.kv)
    }

    fn draft(
        &self,
        target: &dyn Model,
        context: &mut DraftContext,
        anchor: TokenId,
        position: usize,
    ) -> Result<Tensor, ModelError> {
        debug_assert_eq!(
            context.table.len(),
            position,
            "drafter context out of step with the target"
        );
        Ok(DFlashDrafter::draft(self, target, anchor, &mut context.table, &mut context.kv)?.logits)
    }
}
