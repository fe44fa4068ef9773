//! Attention over the paged KV pool with an arbitrary per-row visibility.
//!
//! Each row's keys are a prefix of its sequence's logical indices (the committed tokens and,
//! for causal or bidirectional rows, new rows) plus an explicit list (tree ancestors). Keys are
//! read straight from their slots: no gather, no materialized mask. The arithmetic is
//! `grove_kernels::attention`; this module lists each row's visible slots.

use std::sync::{Arc, Mutex};

pub use grove_kernels::attention::{HeadLayout, KvRows};

use crate::forward::{ForwardBatch, Visibility};

/// Which logical indices of its segment one row attends to.
#[derive(Debug, Clone)]
struct RowKeys {
    segment: usize,
    /// The row's position (a sliding window counts back from it).
    position: usize,
    /// Logical indices `0..prefix` are visible.
    prefix: usize,
    /// Further visible logical indices (tree ancestors and the row itself).
    extra: Vec<usize>,
}

/// The keys of every row of a batch, computed once per forward and reused by every layer.
#[derive(Debug)]
pub struct KeyPlan {
    /// Per segment, the slot of each logical index `0..context_len + rows`.
    slots: Vec<Vec<usize>>,
    /// Per segment, the position of each logical index (committed tokens sit at their index).
    positions: Vec<Vec<usize>>,
    rows: Vec<RowKeys>,
    /// Each row's visible key slots, per window the layers have asked for (a model has one
    /// or two): listed once per forward instead of once per layer.
    key_slots: Mutex<Vec<(Option<usize>, Arc<RowSlots>)>>,
}

/// Per row, the slots of its visible keys in order.
type RowSlots = Vec<Vec<usize>>;

impl KeyPlan {
    pub fn new(batch: &ForwardBatch) -> Self {
        let mut slots = Vec::with_capacity(batch.segments.len());
        let mut positions = Vec::with_capacity(batch.segments.len());
        let mut rows = Vec::with_capacity(batch.num_rows());
        for (segment_index, segment) in batch.segments.iter().enumerate() {
            let context = segment.context_len;
            let count = segment.tokens.len();
            slots.push(
                (0..context + count)
                    .map(|i| segment.table.slot(i))
                    .collect(),
            );
            positions.push(
                (0..context)
                    .chain(segment.positions.iter().copied())
                    .collect::<Vec<_>>(),
            );
            let position = |j: usize| segment.positions[j];
            match &segment.visibility {
                Visibility::Causal => rows.extend((0..count).map(|j| RowKeys {
                    segment: segment_index,
                    position: position(j),
                    prefix: context + j + 1,
                    extra: Vec::new(),
                })),
                Visibility::Bidirectional => rows.extend((0..count).map(|j| RowKeys {
                    segment: segment_index,
                    position: position(j),
                    prefix: context + count,
                    extra: Vec::new(),
                })),
                Visibility::Tree { parents } => {
                    // Ancestor lists by inheritance: parents precede children.
                    let mut ancestors: Vec<Vec<usize>> = Vec::with_capacity(count);
                    for (j, parent) in parents.iter().enumerate() {
                        let mut own = parent.map(|p| ancestors[p].clone()).unwrap_or_default();
                        own.push(context + j);
                        ancestors.push(own);
                    }
                    rows.extend(ancestors.into_iter().enumerate().map(|(j, extra)| RowKeys {
                        segment: segment_index,
                        position: position(j),
                        prefix: context,
                        extra,
                    }));
                }
            }
        }
        Self {
            slots,
            positions,
            rows,
            key_slots: Mutex::new(Vec::new()),
        }
    }

    /// Each row's visible key slots, in order, that lie within `window` positions of it (all
    /// of them when `None`).
    fn key_slots(&self, window: Option<usize>) -> Arc<RowSlots> {
        let mut cache = self.key_slots.lock().expect("no panic while listing keys");
        if let Some((_, slots)) = cache.iter().find(|(w, _)| *w == window) {
            return Arc::clone(slots);
        }
        let listed: RowSlots = self
            .rows
            .iter()
            .map(|row| {
                let slots = &self.slots[row.segment];
                let positions = &self.positions[row.segment];
                // Keys at positions `first..` are inside the window.
                let first = window.map_or(0, |w| (row.position + 1).saturating_sub(w));
                (0..row.prefix)
                    .chain(row.extra.iter().copied())
                    .filter(|&i| positions[i] >= first)
                    .map(|i| slots[i])
                    .collect()
            })
            .collect();
        let listed = Arc::new(listed);
        cache.push((window, Arc::clone(&listed)));
        listed
    }
}

/// `softmax(scale * q K^T) V` for every row and head of `plan`, over the row's visible keys
/// that lie within `window` positions of it (all of them when `None`). `queries` is
/// `[rows, heads * d]` (already rotated); `keys`/`values` are a layer of the KV store,
/// `[kv_heads, slots, d]`. Returns `[rows, heads * d]`.
pub fn attend(
    plan: &KeyPlan,
    layout: HeadLayout,
    scale: f32,
    window: Option<usize>,
    queries: &[f32],
    keys: KvRows<'_>,
    values: KvRows<'_>,
) -> Vec<f32> {
    let key_slots = plan.key_slots(window);
    grove_kernels::attention::attend(&key_slots, layout, scale, queries, keys, values)
}

#[cfg(test)]
mod tests {
    use grove_kv::PagePool;

    use super::*;
    use crate::forward::{LogitRows, Segment};

    /// One head of width 2; keys `k_i = (i, 1)`, values `v_i = (i, -i)`, query `(0.5, 1)`.
    fn run(window: Option<usize>) -> Vec<f32> {
        let rows = 6;
        let pool = PagePool::new(rows, 1).unwrap();
        let mut table = pool.new_table();
        table.reserve(rows).unwrap();
        let tokens = vec![0; rows];
        let positions: Vec<usize> = (0..rows).collect();
        let batch = ForwardBatch {
            segments: vec![Segment::causal(&table, &tokens, &positions, LogitRows::All)],
            taps: &[],
        };
        let plan = KeyPlan::new(&batch);
        let mut keys = vec![0f32; pool.num_slots() * 2];
        let mut values = vec![0f32; pool.num_slots() * 2];
        for i in 0..rows {
            let slot = table.slot(i);
            keys[2 * slot..2 * slot + 2].copy_from_slice(&[i as f32, 1.0]);
            values[2 * slot..2 * slot + 2].copy_from_slice(&[i as f32, -(i as f32)]);
        }
        let queries: Vec<f32> = (0..rows).flat_map(|_| [0.5f32, 1.0]).collect();
        let layout = HeadLayout {
            num_heads: 1,
            num_kv_heads: 1,
            head_dim: 2,
        };
        let (keys, values) = (KvRows::F32(&keys), KvRows::F32(&values));
        attend(&plan, layout, 1.0, window, &queries, keys, values)
    }

    /// The softmax-weighted mean of `v_i` over keys `first..=last`.
    fn expected(first: usize, last: usize) -> f32 {
        let weights: Vec<f32> = (first..=last)
            .map(|i| (0.5 * i as f32 + 1.0).exp())
            .collect();
        let total: f32 = weights.iter().sum();
        (first..=last)
            .zip(&weights)
            .map(|(i, w)| i as f32 * w / total)
            .sum()
    }

    #[test]
    fn a_sliding_window_keeps_only_the_last_positions() {
        let full = run(None);
        let windowed = run(Some(2));
        for row in 0..6 {
            assert!((full[2 * row] - expected(0, row)).abs() < 1e-5, "row {row}");
            let first = row.saturating_sub(1);
            assert!(
                (windowed[2 * row] - expected(first, row)).abs() < 1e-5,
                "row {row}: {} vs {}",
                windowed[2 * row],
                expected(first, row)
            );
        }
    }
}
