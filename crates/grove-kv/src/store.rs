/// Key and value rows for every slot of a pool, per layer: `[num_layers][num_slots, kv_width]`.
///
/// The model writes the rows of new tokens and reads the rows a query may see; the slot of a
/// token comes from its sequence's [`crate::PageTable`]. Stored in f32 because CPU matmuls and
/// attention run in f32 here (bf16 is widened and slow on this CPU).
#[derive(Debug)]
pub struct KvStore {
    keys: Vec<Vec<f32>>,   // [num_layers][num_slots * kv_width]
    values: Vec<Vec<f32>>, // [num_layers][num_slots * kv_width]
    kv_width: usize,
    num_slots: usize,
}

impl KvStore {
    pub fn new(num_layers: usize, num_slots: usize, kv_width: usize) -> Self {
        let layer = || vec![0f32; num_slots * kv_width];
        Self {
            keys: (0..num_layers).map(|_| layer()).collect(),
            values: (0..num_layers).map(|_| layer()).collect(),
            kv_width,
            num_slots,
        }
    }

    pub fn kv_width(&self) -> usize {
        self.kv_width
    }

    pub fn num_slots(&self) -> usize {
        self.num_slots
    }

    pub fn num_layers(&self) -> usize {
        self.keys.len()
    }

    /// Bytes held by the store.
    pub fn bytes(&self) -> usize {
        2 * self.keys.len() * self.num_slots * self.kv_width * std::mem::size_of::<f32>()
    }

    /// Writes one token's key and value rows into `slot` of `layer`.
    pub fn write(&mut self, layer: usize, slot: usize, key: &[f32], value: &[f32]) {
        let range = slot * self.kv_width..(slot + 1) * self.kv_width;
        self.keys[layer][range.clone()].copy_from_slice(key);
        self.values[layer][range].copy_from_slice(value);
    }

    /// All key rows and all value rows of `layer`, indexed by `slot * kv_width`.
    pub fn layer(&self, layer: usize) -> (&[f32], &[f32]) {
        (&self.keys[layer], &self.values[layer])
    }

    /// Copies the rows of `source` into `destination` in every layer (KV compaction).
    pub fn copy_slot(&mut self, source: usize, destination: usize) {
        let width = self.kv_width;
        for rows in self.keys.iter_mut().chain(self.values.iter_mut()) {
            rows.copy_within(source * width..(source + 1) * width, destination * width);
        }
    }
}
