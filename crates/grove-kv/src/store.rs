/// Key and value rows for every slot of a pool, per layer, each KV head's rows together:
/// `[num_layers][num_heads, num_slots, head_dim]`.
///
/// The model writes the rows of new tokens (`[num_heads * head_dim]` each, as projected) and
/// reads the rows a query may see; the slot of a token comes from its sequence's
/// [`crate::PageTable`]. Head by head because attention reads one KV head's keys for a run of
/// slots at a time: laid slot by slot, a model with 8 KV heads of 128 had each head's row of a
/// slot 4 KiB from the next, a page apart, and its decode read them at half the memory's pace.
/// Stored in f32 because CPU matmuls and attention run in f32 here (bf16 is widened and slow
/// on this CPU).
#[derive(Debug)]
pub struct KvStore {
    keys: Vec<Vec<f32>>,   // [num_layers][num_heads * num_slots * head_dim]
    values: Vec<Vec<f32>>, // [num_layers][num_heads * num_slots * head_dim]
    num_heads: usize,
    head_dim: usize,
    num_slots: usize,
}

impl KvStore {
    pub fn new(num_layers: usize, num_slots: usize, num_heads: usize, head_dim: usize) -> Self {
        let layer = || vec![0f32; num_heads * num_slots * head_dim];
        Self {
            keys: (0..num_layers).map(|_| layer()).collect(),
            values: (0..num_layers).map(|_| layer()).collect(),
            num_heads,
            head_dim,
            num_slots,
        }
    }

    /// Floats of one slot's row in every head: `num_heads * head_dim`.
    pub fn kv_width(&self) -> usize {
        self.num_heads * self.head_dim
    }

    pub fn num_slots(&self) -> usize {
        self.num_slots
    }

    pub fn num_layers(&self) -> usize {
        self.keys.len()
    }

    /// Bytes held by the store.
    pub fn bytes(&self) -> usize {
        2 * self.keys.len() * self.num_slots * self.kv_width() * std::mem::size_of::<f32>()
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
            self.keys[layer][at..at + d].copy_from_slice(&key[part.clone()]);
            self.values[layer][at..at + d].copy_from_slice(&value[part]);
        }
    }

    /// All key rows and all value rows of `layer`: head `h`'s row of slot `s` at
    /// `(h * num_slots + s) * head_dim`.
    pub fn layer(&self, layer: usize) -> (&[f32], &[f32]) {
        (&self.keys[layer], &self.values[layer])
    }

    /// Copies the rows of `source` into `destination` in every layer and head (KV compaction).
    pub fn copy_slot(&mut self, source: usize, destination: usize) {
        let (d, heads, slots) = (self.head_dim, self.num_heads, self.num_slots);
        for rows in self.keys.iter_mut().chain(self.values.iter_mut()) {
            for head in 0..heads {
                let from = (head * slots + source) * d;
                rows.copy_within(from..from + d, (head * slots + destination) * d);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::KvStore;

    #[test]
    fn rows_go_head_by_head_and_copies_move_every_head() {
        let mut store = KvStore::new(1, 3, 2, 2);
        store.write(0, 1, &[1.0, 2.0, 3.0, 4.0], &[5.0, 6.0, 7.0, 8.0]);
        let (keys, values) = store.layer(0);
        // Head 0: slots 0, 1, 2; then head 1.
        assert_eq!(
            keys,
            [0.0, 0.0, 1.0, 2.0, 0.0, 0.0, 0.0, 0.0, 3.0, 4.0, 0.0, 0.0]
        );
        assert_eq!(values[2..4], [5.0, 6.0]);
        assert_eq!(values[8..10], [7.0, 8.0]);
        store.copy_slot(1, 2);
        let (keys, _) = store.layer(0);
        assert_eq!(
            keys,
            [0.0, 0.0, 1.0, 2.0, 1.0, 2.0, 0.0, 0.0, 3.0, 4.0, 3.0, 4.0]
        );
        assert_eq!(store.bytes(), 2 * 3 * 4 * 4);
    }
}
