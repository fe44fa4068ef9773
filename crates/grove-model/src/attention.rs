//! Attention over the paged KV pool with an arbitrary per-row visibility.
//!
//! Each row's keys are a prefix of its sequence's logical indices (the committed tokens and,
//! for causal or bidirectional rows, new rows) plus an explicit list (tree ancestors). Keys are
//! read straight from their slots: no gather, no materialized mask. Softmax runs in f32 with
//! the max subtracted, like SDPA.

use rayon::prelude::*;

use crate::forward::{ForwardBatch, Visibility};
use crate::kernels::dot;

/// Below this many multiply-adds attention runs on the calling thread: handing tiny work to
/// the pool costs a wake-up and a context switch per layer.
const PARALLEL_MIN_WORK: usize = 1 << 16;

/// Which logical indices of its segment one row attends to.
#[derive(Debug, Clone)]
struct RowKeys {
    segment: usize,
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
    rows: Vec<RowKeys>,
    max_keys: usize,
}

impl KeyPlan {
    pub fn new(batch: &ForwardBatch) -> Self {
        let mut slots = Vec::with_capacity(batch.segments.len());
        let mut rows = Vec::with_capacity(batch.num_rows());
        for (segment_index, segment) in batch.segments.iter().enumerate() {
            let context = segment.context_len;
            let count = segment.tokens.len();
            slots.push(
                (0..context + count)
                    .map(|i| segment.table.slot(i))
                    .collect(),
            );
            match &segment.visibility {
                Visibility::Causal => rows.extend((0..count).map(|j| RowKeys {
                    segment: segment_index,
                    prefix: context + j + 1,
                    extra: Vec::new(),
                })),
                Visibility::Bidirectional => rows.extend((0..count).map(|_| RowKeys {
                    segment: segment_index,
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
                    rows.extend(ancestors.into_iter().map(|extra| RowKeys {
                        segment: segment_index,
                        prefix: context,
                        extra,
                    }));
                }
            }
        }
        let max_keys = rows
            .iter()
            .map(|r| r.prefix + r.extra.len())
            .max()
            .unwrap_or(0);
        Self {
            slots,
            rows,
            max_keys,
        }
    }
}

/// Head layout of one attention layer.
#[derive(Debug, Clone, Copy)]
pub struct HeadLayout {
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
}

/// `softmax(q K^T / sqrt(d)) V` for every row and head. `queries` is `[rows, heads * d]`
/// (already rotated); `keys`/`values` are a layer of the KV store, `[slots, kv_heads * d]`.
/// Returns `[rows, heads * d]`.
pub fn attend(
    plan: &KeyPlan,
    layout: HeadLayout,
    queries: &[f32],
    keys: &[f32],
    values: &[f32],
) -> Vec<f32> {
    let HeadLayout {
        num_heads,
        num_kv_heads,
        head_dim,
    } = layout;
    let group = num_heads / num_kv_heads;
    let kv_width = num_kv_heads * head_dim;
    let row_width = num_heads * head_dim;
    let scale = 1.0 / (head_dim as f32).sqrt();
    let mut output = vec![0f32; plan.rows.len() * row_width];
    let attend_row =
        |scores: &mut Vec<f32>, ((out_row, query_row), row): ((&mut [f32], &[f32]), &RowKeys)| {
            let slots = &plan.slots[row.segment];
            let key_slots: Vec<usize> = slots[..row.prefix]
                .iter()
                .copied()
                .chain(row.extra.iter().map(|&i| slots[i]))
                .collect();
            let num_keys = key_slots.len();
            for kv_head in 0..num_kv_heads {
                let kv_offset = kv_head * head_dim;
                let heads = kv_head * group..(kv_head + 1) * group;
                // Scores for the `group` query heads sharing this KV head: each key row is
                // read once for all of them.
                for (key_index, &slot) in key_slots.iter().enumerate() {
                    let key = &keys[slot * kv_width + kv_offset..][..head_dim];
                    for (g, head) in heads.clone().enumerate() {
                        let query = &query_row[head * head_dim..][..head_dim];
                        scores[g * num_keys + key_index] = dot(query, key) * scale;
                    }
                }
                for g in 0..group {
                    softmax_in_place(&mut scores[g * num_keys..(g + 1) * num_keys]);
                }
                for (key_index, &slot) in key_slots.iter().enumerate() {
                    let value = &values[slot * kv_width + kv_offset..][..head_dim];
                    for (g, head) in heads.clone().enumerate() {
                        let weight = scores[g * num_keys + key_index];
                        let out = &mut out_row[head * head_dim..][..head_dim];
                        for (o, v) in out.iter_mut().zip(value) {
                            *o += weight * v;
                        }
                    }
                }
            }
        };
    let work: usize = plan
        .rows
        .iter()
        .map(|r| r.prefix + r.extra.len())
        .sum::<usize>()
        * row_width;
    if work >= PARALLEL_MIN_WORK {
        output
            .par_chunks_mut(row_width)
            .zip(queries.par_chunks(row_width))
            .zip(plan.rows.par_iter())
            .for_each_init(|| vec![0f32; group * plan.max_keys], attend_row);
    } else {
        let mut scores = vec![0f32; group * plan.max_keys];
        output
            .chunks_mut(row_width)
            .zip(queries.chunks(row_width))
            .zip(plan.rows.iter())
            .for_each(|item| attend_row(&mut scores, item));
    }
    output
}

fn softmax_in_place(scores: &mut [f32]) {
    let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0f32;
    for score in scores.iter_mut() {
        *score = (*score - max).exp();
        sum += *score;
    }
    let inverse = 1.0 / sum;
    for score in scores.iter_mut() {
        *score *= inverse;
    }
}
