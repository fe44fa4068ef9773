//! Activation rows quantized for the products: 8-bit values per block with one scale, and
//! what each format's kernels read beside them (sums, zero points' terms).

use std::cell::RefCell;
use std::sync::OnceLock;

use super::{Kernel, QuantFormat};
use crate::threads::for_each_chunk_mut;

/// Activation rows quantized to 8 bits, one f32 scale per `block` values (32 for the
/// 32-weight formats, 256 for the K-quants, matching their blocks as llama.cpp's Q8_0 / Q8_K
/// do), with the integer sums the zero-point and min terms need.
#[derive(Debug)]
pub struct QuantizedRows {
    /// The kernel the rows were made for (what beside the values it reads).
    pub(super) kernel: Kernel,
    pub(super) k: usize,
    pub(super) block: usize,
    /// `[rows, k]` 8-bit values.
    pub(super) q: Vec<i8>,
    /// `[rows, k / block]`.
    pub(super) scale: Vec<f32>,
    /// `[rows, k / 16]`: sums of 16 consecutive values.
    pub(super) sum16: Vec<i32>,
    /// `[rows, k / 32]`: sums of 32 consecutive values.
    pub(super) sum32: Vec<i32>,
    /// `[rows, k / 32]` for Q8_0 and IQ4_NL on AVX-512 CPUs (else empty): where the column
    /// kernel's integer sums of a block start, minus the zero point (128) times the block's
    /// values' sum (a broadcast load, no arithmetic, per block and row).
    pub(super) zero_q8: Vec<i32>,
    /// The same for Q5_0 (zero point 16) and Q4_0 (8).
    pub(super) zero_q5: Vec<i32>,
    pub(super) zero_q4: Vec<i32>,
    /// `[rows, k / 16]` for Q6_K on AVX-512 CPUs (the VNNI kernel's: AMX's tiles centre the
    /// weights instead): where a 16-weight sub-block's integer sums start, minus the zero
    /// point (32) times its values' sum, so the zero point costs a broadcast load per
    /// sub-block and row.
    pub(super) zero_q6: Vec<i32>,
    /// `[rows, k / 32]` for Q5_1 and Q4_1: each block's scale times its values' sum (the activations'
    /// sum, for the weights' min), as llama.cpp's Q8_1 keeps it.
    pub(super) scaled_sum32: Vec<f32>,
    /// Q4_K, Q5_K, IQ4_XS and the grid formats scaled per 32 (Q6_K, Q3_K, Q2_K and those per
    /// 16): `sum32` (`sum16`) as 16-bit values (at most
    /// 32 * 127), so two neighbours are one broadcast word for `vpmaddwd` (`vpdpwssd`) against
    /// two mins or scales (AVX2's Q6_K, and AVX-512's where its zero point comes once per
    /// super-block: `simd_columns::Q6Zero`; Q3_K's zero point and Q2_K's mins, always).
    pub(super) sum32_i16: Vec<i16>,
    pub(super) sum16_i16: Vec<i16>,
    /// What the AMX kernel's lanes read per block, side by side ([`Side`]): made once, by the
    /// product's first tile.
    pub(super) side: OnceLock<Side>,
}

/// The per-block values the AMX kernel's lanes read, in groups of 16 rows whose values of a
/// block lie side by side (`[rows / 16][block][16]`, the last group padded): the scales,
/// Q8_0 zero points (`zero_q8`; the tiles' Q5_0 weights need none) and pairs of 32-value sums as one 32-bit word, the
/// first in its low half (`sum32_i16`: `vpdpwssd`'s broadcast for Q4_K's mins); each empty
/// where its source is. A tile's lanes read its rows' values of a block at fixed offsets
/// from one place. Through each row's own pointer, as the VNNI kernel reads them, the 16
/// pointers did not stay in registers and each value cost a load of its pointer first; all
/// rows of a block side by side put a product of 512 rows' blocks 2 KB apart, in two of
/// L1's sets.
#[derive(Debug, Default)]
pub(super) struct Side {
    pub scale: Vec<f32>,
    pub zero_q8: Vec<i32>,
    pub pairs: Vec<i32>,
}

/// Rows in a group of [`Side`].
pub(super) const SIDE_ROWS: usize = 16;

impl Side {
    fn new(acts: &QuantizedRows) -> Self {
        let rows = acts.q.len() / acts.k.max(1);
        let pairs: Vec<i32> = (acts.sum32_i16.chunks_exact(2))
            .map(|two| i32::from(two[0] as u16) | (i32::from(two[1] as u16) << 16))
            .collect();
        Self {
            scale: in_groups(&acts.scale, rows),
            zero_q8: in_groups(&acts.zero_q8, rows),
            pairs: in_groups(&pairs, rows),
        }
    }

    /// Where the values of block `b` of rows `start..` (in one group) begin, in a [`Side`]
    /// of `n` values a row.
    pub fn at(n: usize, start: usize, b: usize) -> usize {
        (start / SIDE_ROWS * n + b) * SIDE_ROWS + start % SIDE_ROWS
    }
}

/// `[rows, n]` values in [`Side`]'s groups.
fn in_groups<T: Copy + Default>(values: &[T], rows: usize) -> Vec<T> {
    if values.is_empty() {
        return Vec::new();
    }
    let n = values.len() / rows;
    let mut out = vec![T::default(); rows.next_multiple_of(SIDE_ROWS) * n];
    for (r, row) in values.chunks_exact(n).enumerate() {
        for (b, &value) in row.iter().enumerate() {
            out[Side::at(n, r, b)] = value;
        }
    }
    out
}

impl QuantizedRows {
    /// `x` (`[rows, k]`) quantized for products with matrices of `formats` (all of one
    /// activation block size), with the copies in kernel order those formats' kernels read.
    pub fn new(x: &[f32], rows: usize, k: usize, formats: &[QuantFormat]) -> Self {
        Self::for_kernel(Kernel::detect().activations(), x, rows, k, formats)
    }

    /// [`QuantizedRows::new`] for `kernel` (one this CPU runs).
    pub(super) fn for_kernel(
        kernel: Kernel,
        x: &[f32],
        rows: usize,
        k: usize,
        formats: &[QuantFormat],
    ) -> Self {
        Self::quantized_by(quantize, kernel, x, rows, k, formats)
    }

    /// [`QuantizedRows::for_kernel`] through the portable quantizer (the same bits), so that
    /// tests can make any kernel's activations on any CPU.
    #[cfg(test)]
    pub(super) fn portable_for(
        kernel: Kernel,
        x: &[f32],
        rows: usize,
        k: usize,
        formats: &[QuantFormat],
    ) -> Self {
        Self::quantized_by(
            |x, rows| quantize_portable(x, rows.parts()),
            kernel,
            x,
            rows,
            k,
            formats,
        )
    }

    /// Rows of the sizes `kernel` and `formats` need, filled by `quantizer`.
    fn quantized_by(
        quantizer: fn(&[f32], &mut Self),
        kernel: Kernel,
        x: &[f32],
        rows: usize,
        k: usize,
        formats: &[QuantFormat],
    ) -> Self {
        let mut quantized = Self::unfilled(kernel, rows, k, formats);
        quantizer(x, &mut quantized);
        quantized.add_sums_for(formats);
        quantized
    }

    /// Rows of the sizes [`QuantizedRows::quantized_by`] fills, whose buffers a quantizer
    /// overwrites whole: the buffers of rows dropped earlier on this thread where there are
    /// some ([`Spare`]), holding their old values.
    fn unfilled(kernel: Kernel, rows: usize, k: usize, formats: &[QuantFormat]) -> Self {
        let block = formats.first().map_or(32, |f| f.activation_block());
        assert!(
            formats.iter().all(|f| f.activation_block() == block),
            "formats of different activation blocks"
        );
        assert!(
            k.is_multiple_of(block) && block.is_multiple_of(32),
            "k = {k} is not a multiple of {block}"
        );
        let spare = Spare::take(rows * k, rows * k / block);
        Self {
            kernel,
            k,
            block,
            q: sized(spare.q, rows * k),
            scale: sized(spare.scale, rows * k / block),
            sum16: sized(spare.sum16, rows * k / 16),
            sum32: sized(spare.sum32, rows * k / 32),
            zero_q8: Vec::new(),
            zero_q5: Vec::new(),
            zero_q4: Vec::new(),
            zero_q6: Vec::new(),
            scaled_sum32: Vec::new(),
            sum32_i16: Vec::new(),
            sum16_i16: Vec::new(),
            side: OnceLock::new(),
        }
    }

    /// The rows' [`Side`], made on the first call.
    pub(super) fn side(&self) -> &Side {
        self.side.get_or_init(|| Side::new(self))
    }

    /// What `self.kernel`'s column kernels of `formats` read beside the values, each only
    /// where a format needs it (AVX2's Q8_0 multiplies signed weights: no zero point).
    fn add_sums_for(&mut self, formats: &[QuantFormat]) {
        let kernel = self.kernel;
        let quantized = self;
        let narrow = |sums: &[i32]| sums.iter().map(|&sum| sum as i16).collect();
        let mins = [
            QuantFormat::Q4K,
            QuantFormat::Q5K,
            QuantFormat::Iq4Xs,
            QuantFormat::Iq3Xxs,
            QuantFormat::Iq3S,
            QuantFormat::Iq2Xxs,
            QuantFormat::Iq1S,
        ];
        if kernel != Kernel::Scalar && mins.iter().any(|format| formats.contains(format)) {
            quantized.sum32_i16 = narrow(&quantized.sum32);
        }
        let sixteen = [
            QuantFormat::Q6K,
            QuantFormat::Q3K,
            QuantFormat::Q2K,
            QuantFormat::Iq2Xs,
            QuantFormat::Iq2S,
            QuantFormat::Iq1M,
        ];
        if kernel != Kernel::Scalar && sixteen.iter().any(|format| formats.contains(format)) {
            quantized.sum16_i16 = narrow(&quantized.sum16);
        }
        if kernel == Kernel::Avx512Vnni {
            let times = |zero: i32, sums: &[i32]| sums.iter().map(|&sum| -zero * sum).collect();
            if formats.contains(&QuantFormat::Q8_0) || formats.contains(&QuantFormat::Iq4Nl) {
                quantized.zero_q8 = times(128, &quantized.sum32);
            }
            if formats.contains(&QuantFormat::Q6K) {
                quantized.zero_q6 = times(32, &quantized.sum16);
            }
        }
        if kernel != Kernel::Scalar && formats.contains(&QuantFormat::Q5_0) {
            quantized.zero_q5 = (quantized.sum32.iter()).map(|&sum| -16 * sum).collect();
        }
        if kernel != Kernel::Scalar && formats.contains(&QuantFormat::Q4_0) {
            quantized.zero_q4 = (quantized.sum32.iter()).map(|&sum| -8 * sum).collect();
        }
        let block_mins = [QuantFormat::Q5_1, QuantFormat::Q4_1];
        if kernel != Kernel::Scalar && block_mins.iter().any(|format| formats.contains(format)) {
            let sums = quantized.sum32.iter().zip(&quantized.scale);
            quantized.scaled_sum32 = sums.map(|(&sum, &scale)| scale * sum as f32).collect();
        }
    }

    /// Whether `kernel` may read these rows: the kernel they were made for.
    pub(super) fn serves(&self, kernel: Kernel) -> bool {
        self.kernel == kernel
    }

    /// Whether what `format`'s column kernel reads beside the values was made.
    pub(super) fn ready_for(&self, format: QuantFormat) -> bool {
        let avx2 = self.kernel == Kernel::Avx2;
        match format {
            QuantFormat::Q8_0 | QuantFormat::Iq4Nl => {
                avx2 || self.zero_q8.len() == self.sum32.len()
            }
            QuantFormat::Q5_0 => self.zero_q5.len() == self.sum32.len(),
            QuantFormat::Q4_0 => self.zero_q4.len() == self.sum32.len(),
            QuantFormat::Q5_1 | QuantFormat::Q4_1 => self.scaled_sum32.len() == self.sum32.len(),
            QuantFormat::Q4K
            | QuantFormat::Q5K
            | QuantFormat::Iq4Xs
            | QuantFormat::Iq3Xxs
            | QuantFormat::Iq3S
            | QuantFormat::Iq2Xxs
            | QuantFormat::Iq1S => self.sum32_i16.len() == self.sum32.len(),
            QuantFormat::Iq2Xs | QuantFormat::Iq2S | QuantFormat::Iq1M => {
                self.sum16_i16.len() == self.sum16.len()
            }
            QuantFormat::Q6K => {
                self.sum16_i16.len() == self.sum16.len()
                    && (avx2 || self.zero_q6.len() == self.sum16.len())
            }
            QuantFormat::Q3K | QuantFormat::Q2K => self.sum16_i16.len() == self.sum16.len(),
        }
    }

    /// The buffers a quantizer fills.
    pub(super) fn parts(&mut self) -> Parts<'_> {
        Parts {
            block: self.block,
            q: &mut self.q,
            scale: &mut self.scale,
            sum16: &mut self.sum16,
            sum32: &mut self.sum32,
        }
    }

    pub(super) fn q(&self, row: usize) -> &[i8] {
        &self.q[row * self.k..(row + 1) * self.k]
    }

    pub(super) fn scale(&self, row: usize) -> &[f32] {
        let per_row = self.k / self.block;
        &self.scale[row * per_row..(row + 1) * per_row]
    }
}

impl Drop for QuantizedRows {
    fn drop(&mut self) {
        Spare::keep(Spare {
            q: std::mem::take(&mut self.q),
            scale: std::mem::take(&mut self.scale),
            sum16: std::mem::take(&mut self.sum16),
            sum32: std::mem::take(&mut self.sum32),
        });
    }
}

/// The buffers a quantizer fills, kept from dropped rows for the next rows made on the same
/// thread. Every product quantizes its input into new rows: zeroed, a 512-token prompt's
/// rows of an MLP's wide input were a `memset` of 6 MB on the forward's thread while the
/// others waited for the product (a sixth of a prefill's serial stretches).
#[derive(Default)]
struct Spare {
    q: Vec<i8>,
    scale: Vec<f32>,
    sum16: Vec<i32>,
    sum32: Vec<i32>,
}

/// How many sets of buffers a thread keeps: enough for the sizes a forward's products take
/// (a layer's two input widths, a prompt's last chunk, the logits' rows), so that each size
/// finds its own set. The largest is a 512-token chunk's MLP input (about 6 MB on the
/// Qwen2.5-Coder-1.5B), which the heap kept for the next product anyway
/// (`memory::keep_freed_buffers`).
const SPARES: usize = 4;

thread_local! {
    /// The kept sets, the latest kept last.
    static KEPT: RefCell<Vec<Spare>> = const { RefCell::new(Vec::new()) };
}

impl Spare {
    /// The kept set of exactly `values` values and `scales` scales, else new empty buffers
    /// (a set taken at another size would change its length, and growing back zeroes what
    /// it grows by).
    fn take(values: usize, scales: usize) -> Self {
        KEPT.with_borrow_mut(|kept| {
            let at = kept
                .iter()
                .position(|spare| spare.q.len() == values && spare.scale.len() == scales);
            at.map(|i| kept.remove(i)).unwrap_or_default()
        })
    }

    /// Keeps `self` for later rows, in place of the set kept longest ago if there are
    /// [`SPARES`] already. Buffers of no values are not kept.
    fn keep(self) {
        if self.q.is_empty() {
            return;
        }
        // A thread ending drops its kept sets before its last rows: then there is nowhere
        // to keep them, and they are freed.
        let _ = KEPT.try_with(|kept| {
            let mut kept = kept.borrow_mut();
            kept.push(self);
            if kept.len() > SPARES {
                kept.remove(0);
            }
        });
    }
}

/// `buffer` at `len` values: its old values where it had them (a quantizer overwrites them),
/// zeros past them.
fn sized<T: Copy + Default>(mut buffer: Vec<T>, len: usize) -> Vec<T> {
    buffer.resize(len, T::default());
    buffer
}

/// What a quantizer fills for some whole rows: 8-bit values, one scale per `block` values,
/// and the sums of every 16 and 32 values.
pub(super) struct Parts<'a> {
    pub block: usize,
    pub q: &'a mut [i8],
    pub scale: &'a mut [f32],
    pub sum16: &'a mut [i32],
    pub sum32: &'a mut [i32],
}

impl<'a> Parts<'a> {
    /// The block size and the buffers: values, scales, sums of 16 and 32.
    #[allow(clippy::type_complexity)]
    pub fn split(
        self,
    ) -> (
        usize,
        &'a mut [i8],
        &'a mut [f32],
        &'a mut [i32],
        &'a mut [i32],
    ) {
        (self.block, self.q, self.scale, self.sum16, self.sum32)
    }

    fn reborrow(&mut self) -> Parts<'_> {
        Parts {
            block: self.block,
            q: self.q,
            scale: self.scale,
            sum16: self.sum16,
            sum32: self.sum32,
        }
    }

    /// The parts of each `rows` rows of `k` values (the last part may hold fewer).
    fn by_rows(self, k: usize, rows: usize) -> impl Iterator<Item = Parts<'a>> {
        let block = self.block;
        let values = rows * k;
        (self.q.chunks_mut(values))
            .zip(self.scale.chunks_mut(values / block))
            .zip(self.sum16.chunks_mut(values / 16))
            .zip(self.sum32.chunks_mut(values / 32))
            .map(move |(((q, scale), sum16), sum32)| Parts {
                block,
                q,
                scale,
                sum16,
                sum32,
            })
    }
}

/// Values of a product's input below which one thread quantizes it all (a verify's rows of
/// an MLP's wide input were a serial stretch of tens of microseconds a layer).
const PARALLEL_MIN_VALUES: usize = 1 << 14;

/// `x` in blocks of `block` values: 8-bit values `q`, one `scale` per block (absmax / 127),
/// and the sums of every 16 and 32 values; rows in parallel where there are many values.
/// Every decode step quantizes each product's input: as plain code this was a fifth of a
/// 128 x 1024 one-row Q4_K product (`simd.rs` has the AVX-512 version).
fn quantize(x: &[f32], rows: &mut QuantizedRows) {
    assert_eq!(
        x.len(),
        rows.q.len(),
        "input and quantized rows differ in size"
    );
    let (kernel, k) = (rows.kernel, rows.k);
    let count = x.len() / k.max(1);
    let one = |x: &[f32], parts: Parts<'_>| {
        #[cfg(target_arch = "x86_64")]
        if kernel != Kernel::Scalar {
            return super::simd::quantize(kernel, x, parts);
        }
        quantize_portable(x, parts)
    };
    if count < 2 || x.len() < PARALLEL_MIN_VALUES {
        return one(x, rows.parts());
    }
    let per_task = count.div_ceil(rayon::current_num_threads()).max(1);
    let mut tasks: Vec<(&[f32], Parts<'_>)> = x
        .chunks(per_task * k)
        .zip(rows.parts().by_rows(k, per_task))
        .collect();
    for_each_chunk_mut(&mut [&mut tasks], 1, |_, _, task| {
        let (x, parts) = &mut task[0];
        one(x, parts.reborrow());
    });
}

/// The reference quantizer (and the one on CPUs without AVX-512).
pub(super) fn quantize_portable(x: &[f32], parts: Parts<'_>) {
    let (block, q, scale, sum16, sum32) = parts.split();
    for ((values, quants), scale) in x
        .chunks_exact(block)
        .zip(q.chunks_exact_mut(block))
        .zip(scale.iter_mut())
    {
        let amax = values.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let inverse = if d > 0.0 { 1.0 / d } else { 0.0 };
        for (quant, value) in quants.iter_mut().zip(values) {
            *quant = round_to_i8(value * inverse);
        }
        *scale = d;
    }
    for (sum, values) in sum16.iter_mut().zip(q.chunks_exact(16)) {
        *sum = values.iter().map(|&v| i32::from(v)).sum();
    }
    for (sum, pair) in sum32.iter_mut().zip(sum16.chunks_exact(2)) {
        *sum = pair[0] + pair[1];
    }
}

/// Rounds `v` (|v| <= 127.5) to the nearest integer, ties to even, as llama.cpp's AVX
/// quantizers do (`_mm256_round_ps`). Adding and subtracting 1.5 * 2^23 leaves the rounded
/// value (floats there are integers), without a libm call, so the loop vectorizes.
fn round_to_i8(v: f32) -> i8 {
    const MAGIC: f32 = 12_582_912.0;
    ((v + MAGIC) - MAGIC) as i8
}
