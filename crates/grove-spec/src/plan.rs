//! Compile: the draft trees of one step laid out as the rows of one verify forward.
//!
//! Each sequence's tree becomes one segment of rows in node order (row 0 the anchor). A row
//! sits at position `base + depth` (its prefix is committed up to `base`, the anchor at `base`)
//! and sees the committed context plus its own ancestors and itself, never its siblings, so
//! every row's logits are those of its ancestor path run causally. The rows' K/V go to the
//! sequence's logical KV indices `base..base + rows` (its page table maps them to slots); the
//! commit later moves the accepted path's K/V to `base..base + path`.

use std::ops::Range;

use grove_core::TokenId;

use crate::tree::DraftTree;

/// One sequence's rows in a verify forward.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentPlan {
    /// Tokens already in the sequence's KV (the anchor is not).
    pub base: usize,
    /// `[rows]`: the tree's tokens in node order, the anchor first.
    pub tokens: Vec<TokenId>,
    /// `[rows]`: `base + depth` of each row's node.
    pub positions: Vec<usize>,
    /// `[rows]`: each row's parent row (`None` for the anchor); a row sees its ancestors,
    /// itself and the committed context.
    pub parents: Vec<Option<usize>>,
    /// `[rows]` logical KV indices the rows' K/V are written to: `base..base + rows`.
    pub kv_indices: Range<usize>,
    /// `[rows]` rows of the forward's logits (and taps) that belong to this segment.
    pub logits_rows: Range<usize>,
}

/// The verify forward of one step: one segment per sequence, rows concatenated in order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VerifyPlan {
    /// `[sequences]`.
    pub segments: Vec<SegmentPlan>,
}

impl VerifyPlan {
    /// Lays out `trees[i]` over a sequence with `bases[i]` committed tokens.
    pub fn new(trees: &[&DraftTree], bases: &[usize]) -> Self {
        assert_eq!(trees.len(), bases.len(), "one base per tree");
        let mut first_row = 0;
        let segments = trees
            .iter()
            .zip(bases)
            .map(|(tree, &base)| {
                let rows = tree.tokens.len();
                let segment = SegmentPlan {
                    base,
                    tokens: tree.tokens.clone(),
                    positions: tree.depths.iter().map(|depth| base + depth).collect(),
                    parents: tree.row_parents(),
                    kv_indices: base..base + rows,
                    logits_rows: first_row..first_row + rows,
                };
                first_row += rows;
                segment
            })
            .collect();
        Self { segments }
    }

    /// Rows of the whole forward.
    pub fn rows(&self) -> usize {
        self.segments.last().map_or(0, |s| s.logits_rows.end)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::candidates::top_k_candidates;

    /// A tree from seeded pseudo-random logits.
    fn tree(seed: u64, depths: usize, budget: usize) -> DraftTree {
        let vocab = 17;
        let candidates: Vec<_> = (0..depths)
            .map(|d| {
                let logits: Vec<f32> = (0..vocab)
                    .map(|t| ((seed as f32 + 1.3) * (t as f32 + 0.7) * (d as f32 + 1.1)).sin())
                    .collect();
                top_k_candidates(&logits, 4, 1)
            })
            .collect();
        DraftTree::build(seed as TokenId % 5, &candidates, budget)
    }

    /// The rows a row sees by following `parents`, itself included, root last.
    fn ancestors(parents: &[Option<usize>], row: usize) -> Vec<usize> {
        let mut seen = vec![row];
        while let Some(parent) = parents[*seen.last().unwrap()] {
            seen.push(parent);
        }
        seen
    }

    proptest! {
        #[test]
        fn a_plan_lays_every_tree_out_in_order(
            shapes in prop::collection::vec((0u64..1000, 0usize..6, 0usize..12, 0usize..300), 0..6)
        ) {
            let trees: Vec<DraftTree> =
                shapes.iter().map(|&(seed, depths, budget, _)| tree(seed, depths, budget)).collect();
            let bases: Vec<usize> = shapes.iter().map(|s| s.3).collect();
            let plan = VerifyPlan::new(&trees.iter().collect::<Vec<_>>(), &bases);
            prop_assert_eq!(plan.segments.len(), trees.len());
            let mut next_row = 0;
            for ((segment, tree), &base) in plan.segments.iter().zip(&trees).zip(&bases) {
                let rows = tree.tokens.len();
                // Rows are contiguous, disjoint and in sequence order.
                prop_assert_eq!(segment.logits_rows.clone(), next_row..next_row + rows);
                next_row += rows;
                prop_assert_eq!(segment.kv_indices.clone(), base..base + rows);
                prop_assert_eq!(&segment.tokens, &tree.tokens);
                prop_assert_eq!(segment.parents[0], None);
                for row in 0..rows {
                    // Position = base + the number of ancestors above the row.
                    let seen = ancestors(&segment.parents, row);
                    prop_assert_eq!(segment.positions[row], base + seen.len() - 1);
                    // Parents precede children, so one forward pass can write them in order.
                    if let Some(parent) = segment.parents[row] {
                        prop_assert!(parent < row);
                        prop_assert_eq!(segment.positions[parent] + 1, segment.positions[row]);
                    }
                    // The ancestors spell the row's prefix: the tree's own path to the node.
                    let mut node = row;
                    for &r in &seen[1..] {
                        prop_assert_eq!(tree.parents[node], r);
                        node = r;
                    }
                }
            }
            prop_assert_eq!(plan.rows(), next_row);
        }
    }
}
