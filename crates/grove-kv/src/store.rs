use grove_kernels::attention::KvRows;
use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};

/// How a [`KvStore`] keeps its rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KvDtype {
    /// The projections' own values: what the golden references were computed with.
    F32,
    /// Rounded to the nearest half (what llama.cpp keeps by default): half the memory, and
    /// half the bytes attention reads over a long context.
    F16,
    /// Rounded to the nearest bfloat16 (what a bf16 model's cache holds in vLLM and SGLang):
    /// f16's memory with f32's range, and where the CPU has AVX-512 BF16 a long row's
    /// attention in bfloat16 arithmetic (grove-kernels' `attention/dot.rs`).
    Bf16,
}

impl KvDtype {
    /// Bytes a stored value takes.
    pub fn size(self) -> usize {
        match self {
            Self::F32 => 4,
            Self::F16 | Self::Bf16 => 2,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::F32 => "f32",
            Self::F16 => "f16",
            Self::Bf16 => "bf16",
        }
    }
}

impl std::fmt::Display for KvDtype {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Per layer, all key rows or all value rows.
#[derive(Debug)]
enum Rows {
    F32(Vec<Vec<f32>>),
    F16(Vec<Vec<f16>>),
    Bf16(Vec<Vec<bf16>>),
}

impl Rows {
    fn new(dtype: KvDtype, num_layers: usize, len: usize) -> Self {
        match dtype {
            KvDtype::F32 => Self::F32((0..num_layers).map(|_| vec![0.0; len]).collect()),
            KvDtype::F16 => Self::F16((0..num_layers).map(|_| vec![f16::ZERO; len]).collect()),
            KvDtype::Bf16 => Self::Bf16((0..num_layers).map(|_| vec![bf16::ZERO; len]).collect()),
        }
    }

    fn num_layers(&self) -> usize {
        match self {
            Self::F32(layers) => layers.len(),
            Self::F16(layers) => layers.len(),
            Self::Bf16(layers) => layers.len(),
        }
    }

    fn layer(&self, layer: usize) -> KvRows<'_> {
        match self {
            Self::F32(layers) => KvRows::F32(&layers[layer]),
            Self::F16(layers) => KvRows::F16(&layers[layer]),
            Self::Bf16(layers) => KvRows::Bf16(&layers[layer]),
        }
    }

    /// `row` into `layer` from `at` on, rounded to the nearest half where they are f16.
    fn write(&mut self, layer: usize, at: usize, row: &[f32]) {
        match self {
            Self::F32(layers) => layers[layer][at..at + row.len()].copy_from_slice(row),
            Self::F16(layers) => {
                layers[layer][at..at + row.len()].convert_from_f32_slice(row);
            }
            Self::Bf16(layers) => {
                layers[layer][at..at + row.len()].convert_from_f32_slice(row);
            }
        }
    }

    /// In every layer, `len` values from `from` copied to `to`.
    fn copy_within(&mut self, from: usize, len: usize, to: usize) {
        match self {
            Self::F32(layers) => layers
                .iter_mut()
                .for_each(|rows| rows.copy_within(from..from + len, to)),
            Self::F16(layers) => layers
                .iter_mut()
                .for_each(|rows| rows.copy_within(from..from + len, to)),
            Self::Bf16(layers) => layers
                .iter_mut()
                .for_each(|rows| rows.copy_within(from..from + len, to)),
        }
    }
}

/// Key and value rows for every slot of a pool, per layer, each KV head's rows together:
/// `[num_layers][num_heads, num_slots, head_dim]`.
///
/// The model writes the rows of new tokens (`[num_heads * head_dim]` each, as projected) and
/// reads the rows a query may see; the slot of a token comes from its sequence's
/// [`crate::PageTable`]. Head by head because attention reads one KV head's keys for a run of
/// slots at a time: laid slot by slot, a model with 8 KV heads of 128 had each head's row of a
/// slot 4 KiB from the next, a page apart, and its decode read them at half the memory's pace.
/// Kept in f32, f16 or bf16 ([`KvDtype`]).
#[derive(Debug)]
pub struct KvStore {
    keys: Rows,
    values: Rows,
    dtype: KvDtype,
    num_heads: usize,
    head_dim: usize,
    num_slots: usize,
}

impl KvStore {
    /// An f32 store.
    pub fn new(num_layers: usize, num_slots: usize, num_heads: usize, head_dim: usize) -> Self {
        Self::with_dtype(num_layers, num_slots, num_heads, head_dim, KvDtype::F32)
    }

    pub fn with_dtype(
        num_layers: usize,
        num_slots: usize,
        num_heads: usize,
        head_dim: usize,
        dtype: KvDtype,
    ) -> Self {
        let len = num_heads * num_slots * head_dim;
        Self {
            keys: Rows::new(dtype, num_layers, len),
            values: Rows::new(dtype, num_layers, len),
            dtype,
            num_heads,
            head_dim,
            num_slots,
        }
    }

    pub fn dtype(&self) -> KvDtype {
        self.dtype
    }

    /// Floats of one slot's row in every head: `num_heads * head_dim`.
    pub fn kv_width(&self) -> usize {
        self.num_heads * self.head_dim
    }

    pub fn num_slots(&self) -> usize {
        self.num_slots
    }

    pub fn num_layers(&self) -> usize {
        self.keys.num_layers()
    }

    /// Bytes held by the store.
    pub fn bytes(&self) -> usize {
        2 * self.num_layers() * self.num_slots * self.kv_width() * self.dtype.size()
    }

    /// Where head `head`'s row of `slot` starts in a layer.
    fn at(&self, head: usize, slot: usize) -> usize {
        (head * self.num_slots + slot) * self.head_dim
    }

    /// Writes one token's key and value rows (`[num_heads * head_dim]` each) into `slot` of
    /// `layer`.
    pub fn write(&mut self, layer: usize, slot: usize, key: &[f32], value: &[f32]) {
        assert!(key.len() == self.kv_width() && value.len() == self.kv_width());
        let d = self.head_dim;
        for head in 0..self.num_heads {
            let at = self.at(head, slot);
            let part = head * d..(head + 1) * d;
            self.keys.write(layer, at, &key[part.clone()]);
            self.values.write(layer, at, &value[part]);
        }
    }

    /// All key rows and all value rows of `layer`: head `h`'s row of slot `s` at
    /// `(h * num_slots + s) * head_dim`.
    pub fn layer(&self, layer: usize) -> (KvRows<'_>, KvRows<'_>) {
        (self.keys.layer(layer), self.values.layer(layer))
    }

    /// Copies the rows of `source` into `destination` in every layer and head (KV compaction).
    pub fn copy_slot(&mut self, source: usize, destination: usize) {
        let (d, heads, slots) = (self.head_dim, self.num_heads, self.num_slots);
        for head in 0..heads {
            let from = (head * slots + source) * d;
            let to = (head * slots + destination) * d;
            self.keys.copy_within(from, d, to);
            self.values.copy_within(from, d, to);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{KvDtype, KvStore};

    /// Every value of a layer's rows, widened.
    fn all(rows: grove_kernels::attention::KvRows<'_>) -> Vec<f32> {
        (0..rows.len()).map(|i| rows.get(i)).collect()
    }

    #[test]
    fn rows_go_head_by_head_and_copies_move_every_head() {
        for dtype in [KvDtype::F32, KvDtype::F16, KvDtype::Bf16] {
            let mut store = KvStore::with_dtype(1, 3, 2, 2, dtype);
            store.write(0, 1, &[1.0, 2.0, 3.0, 4.0], &[5.0, 6.0, 7.0, 8.0]);
            let (keys, values) = store.layer(0);
            // Head 0: slots 0, 1, 2; then head 1.
            assert_eq!(
                all(keys),
                [0.0, 0.0, 1.0, 2.0, 0.0, 0.0, 0.0, 0.0, 3.0, 4.0, 0.0, 0.0]
            );
            let values = all(values);
            assert_eq!(values[2..4], [5.0, 6.0]);
            assert_eq!(values[8..10], [7.0, 8.0]);
            store.copy_slot(1, 2);
            assert_eq!(
                all(store.layer(0).0),
                [0.0, 0.0, 1.0, 2.0, 1.0, 2.0, 0.0, 0.0, 3.0, 4.0, 3.0, 4.0],
                "{dtype}"
            );
            assert_eq!(store.bytes(), 2 * 3 * 4 * dtype.size());
            assert_eq!(store.dtype(), dtype);
        }
    }

    #[test]
    fn half_rows_hold_the_nearest_half() {
        let mut store = KvStore::with_dtype(2, 1, 1, 4, KvDtype::F16);
        // Halfway between 1 and the next half (1 + 2^-10) rounds to even; past the largest
        // half (65504) is infinite, as llama.cpp's f16 cache stores it.
        let row = [1.0 + 2f32.powi(-11), 1.0 + 3.0 * 2f32.powi(-11), -0.1, 1e6];
        store.write(1, 0, &row, &row);
        let expected: Vec<f32> = row
            .iter()
            .map(|&x| half::f16::from_f32(x).to_f32())
            .collect();
        assert_eq!(all(store.layer(1).1), expected);
        assert_eq!(expected[0], 1.0);
        assert_eq!(expected[1], 1.0 + 2.0 * 2f32.powi(-10));
        assert_eq!(expected[3], f32::INFINITY);
        assert_eq!(all(store.layer(0).0), [0.0; 4]);
    }

    #[test]
    fn bfloat16_rows_hold_the_nearest_bfloat16() {
        let mut store = KvStore::with_dtype(1, 1, 1, 4, KvDtype::Bf16);
        // Halfway between 1 and the next bfloat16 (1 + 2^-7) rounds to even; 1e6 is far past
        // f16's range and kept (to 3 significant digits).
        let row = [1.0 + 2f32.powi(-8), 1.0 + 3.0 * 2f32.powi(-8), -0.1, 1e6];
        store.write(0, 0, &row, &row);
        let kept = all(store.layer(0).0);
        assert_eq!(kept[..2], [1.0, 1.0 + 2.0 * 2f32.powi(-7)]);
        assert_eq!(kept[2], half::bf16::from_f32(-0.1).to_f32());
        assert!((kept[3] - 1e6).abs() < 1e6 / 128.0);
        assert_eq!(all(store.layer(0).1), kept);
        assert_eq!(store.dtype().name(), "bf16");
    }
}
