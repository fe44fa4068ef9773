//! The forward contract every caller uses: prefill, decode, chain verify, tree verify and the
//! drafter's block are all one call over a batch of rows.
//!
//! A batch holds segments, one per sequence. A segment's rows are new tokens placed at logical
//! indices `context_len..context_len + rows` of that sequence's [`PageTable`] (so the caller
//! reserves them first); their K/V are written into those slots. Every row sees all of the
//! sequence's committed tokens (`0..context_len`) and the new rows its [`Visibility`] allows.
//! The model returns logits only for the rows asked for, and the hidden states after the
//! requested layers ("taps") for every row.

use candle_core::Tensor;
use grove_core::TokenId;
use grove_kv::PageTable;

/// Which new rows of the same segment a row may attend to, besides all committed tokens.
#[derive(Debug, Clone, PartialEq)]
pub enum Visibility {
    /// Row `j` sees new rows `0..=j`: prefill, decode and chain verify.
    Causal,
    /// Every row sees every new row: the DFlash drafter's block.
    Bidirectional,
    /// Row `j` sees itself and its ancestors (tree verify). `parents[j] < j` or `None` for a
    /// root, which sees only the committed tokens and itself.
    Tree { parents: Vec<Option<usize>> },
}

/// Which rows of a segment need logits.
#[derive(Debug, Clone, PartialEq)]
pub enum LogitRows {
    None,
    Last,
    All,
    /// Row indices within the segment, in the order the logits are returned.
    Some(Vec<usize>),
}

impl LogitRows {
    /// The selected row indices within a segment of `num_rows` rows.
    pub fn indices(&self, num_rows: usize) -> Vec<usize> {
        match self {
            Self::None => Vec::new(),
            Self::Last => num_rows.checked_sub(1).into_iter().collect(),
            Self::All => (0..num_rows).collect(),
            Self::Some(rows) => rows.clone(),
        }
    }
}

/// The new rows of one sequence.
#[derive(Debug)]
pub struct Segment<'a> {
    /// The sequence's pages; committed tokens are `0..context_len`, and capacity must cover
    /// `context_len + tokens.len()`.
    pub table: &'a PageTable,
    pub context_len: usize,
    pub tokens: &'a [TokenId],  // [rows]
    pub positions: &'a [usize], // [rows] absolute RoPE positions
    pub visibility: Visibility,
    pub logits: LogitRows,
}

impl<'a> Segment<'a> {
    /// A causal segment appended after the table's committed tokens, at consecutive positions.
    pub fn causal(
        table: &'a PageTable,
        tokens: &'a [TokenId],
        positions: &'a [usize],
        logits: LogitRows,
    ) -> Self {
        Self {
            table,
            context_len: table.len(),
            tokens,
            positions,
            visibility: Visibility::Causal,
            logits,
        }
    }
}

/// One forward call.
#[derive(Debug)]
pub struct ForwardBatch<'a> {
    pub segments: Vec<Segment<'a>>,
    /// Layers (0-based) whose output, before the final norm, is returned for every row.
    pub taps: &'a [usize],
}

impl ForwardBatch<'_> {
    pub fn num_rows(&self) -> usize {
        self.segments.iter().map(|s| s.tokens.len()).sum()
    }
}

/// What a forward call returns.
#[derive(Debug)]
pub struct ForwardOutput {
    /// `[num_logit_rows, vocab]` f32, segments in batch order, rows in [`LogitRows`] order.
    pub logits: Tensor,
    /// One `[num_rows, hidden]` f32 tensor per requested tap layer, rows in batch order.
    pub taps: Vec<Tensor>,
}

impl ForwardOutput {
    /// Logits of the `index`-th returned row.
    pub fn logits_row(&self, index: usize) -> candle_core::Result<Vec<f32>> {
        self.logits.get(index)?.to_vec1()
    }
}
