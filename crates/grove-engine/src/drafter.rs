//! The drafter seam: what the decode loop needs from any source of draft blocks. DFlash is the
//! real one; tests plug in oracle and adversarial drafters to pin the loop's lossless
//! behaviour at both extremes of acceptance.
//!
//! All sequences of a batch share one drafter KV store; each sequence owns a page table in it
//! whose length is the number of committed positions whose context has been added.

use candle_core::Tensor;
use grove_core::TokenId;
use grove_kv::{KvStore, PageTable};
use grove_model::{DFlashDrafter, Model, ModelError};

/// One sequence's draft request: its drafter page table, the anchor at `position`, and how
/// many of the slots after the anchor it wants logits for (`depths`, at most
/// `block_size - 1`: a tree of `b` nodes is at most `b` deep).
#[derive(Debug)]
pub struct DraftBlock<'t> {
    pub table: &'t mut PageTable,
    pub anchor: TokenId,
    pub position: usize,
    pub depths: usize,
}

pub trait Drafter: Send + Sync {
    /// Slots per draft block: the anchor plus `block_size - 1` drafts.
    fn block_size(&self) -> usize;

    /// Target layers whose outputs the drafter consumes, in order (may be empty).
    fn target_taps(&self) -> &[usize];

    /// The shared context store for `num_slots` slots (empty for drafters that keep no KV).
    fn new_kv_store(&self, num_slots: usize) -> KvStore;

    /// Adds the target features `[rows, taps * hidden]` of newly committed tokens to the
    /// context of the sequence owning `table`.
    fn extend(
        &self,
        kv: &mut KvStore,
        table: &mut PageTable,
        features: &Tensor,
    ) -> Result<(), ModelError>;

    /// The target ids the draft logits' columns stand for, when the drafter has a reduced
    /// vocabulary (increasing); `None`: column `i` is token `i`.
    fn vocabulary(&self) -> Option<&[TokenId]> {
        None
    }

    /// Draft logits `[depths, vocab]` for the first `depths` slots after each block's anchor,
    /// all blocks in one pass (`vocab`: [`Drafter::vocabulary`]'s length when it has one).
    fn draft(
        &self,
        target: &dyn Model,
        kv: &mut KvStore,
        blocks: &mut [DraftBlock<'_>],
    ) -> Result<Vec<Tensor>, ModelError>;
}

impl Drafter for DFlashDrafter {
    fn block_size(&self) -> usize {
        self.config().block_size
    }

    fn target_taps(&self) -> &[usize] {
        &self.config().target_layer_ids
    }

    fn new_kv_store(&self, num_slots: usize) -> KvStore {
        DFlashDrafter::new_kv_store(self, num_slots)
    }

    fn vocabulary(&self) -> Option<&[TokenId]> {
        self.draft_vocabulary()
    }

    fn extend(
        &self,
        kv: &mut KvStore,
        table: &mut PageTable,
        features: &Tensor,
    ) -> Result<(), ModelError> {
        self.extend_context(features, table, kv)
    }

    fn draft(
        &self,
        target: &dyn Model,
        kv: &mut KvStore,
        blocks: &mut [DraftBlock<'_>],
    ) -> Result<Vec<Tensor>, ModelError> {
        let mut requests: Vec<(&mut PageTable, TokenId, usize)> = blocks
            .iter_mut()
            .map(|block| {
                debug_assert_eq!(
                    block.table.len(),
                    block.position,
                    "drafter context out of step with the target"
                );
                (&mut *block.table, block.anchor, block.depths)
            })
            .collect();
        Ok(self
            .draft_batch(target, &mut requests, kv)?
            .into_iter()
            .map(|output| output.logits)
            .collect())
    }
}
