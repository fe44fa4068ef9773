//! Dense f32 weights in column strips, the layout of `quant::columns` without the blocks: rows
//! in strips of [`STRIP`], and for each input `i` the 16 rows' weights `i` side by side.
//!
//! A product then broadcasts one activation value and multiplies it into 16 outputs with one
//! fused multiply-add, each weight vector loaded once for every activation row of a tile, and
//! nothing is reduced horizontally. A dot product per (weight row, activation row), as the
//! streaming kernel of `dense.rs` does, pays a horizontal sum per pair: an 8-row verify of the
//! embedded default pair (in cache) cost 3.4x one row. Every row count runs the same
//! arithmetic per output (two sums, of the even and the odd inputs, added at the end), so a
//! row's outputs are the same bits alone, in a verify's tile or in a prompt: a speculative
//! verify computes exactly what decoding computes.

use std::mem::MaybeUninit;

use rayon::prelude::*;

use crate::threads::{for_each_columns_mut, Columns};

/// A stored weight: f32, or a bfloat16 from a bfloat16 checkpoint. A bfloat16 is the high half
/// of an f32, so widening it is exact: products read half the bytes and give the f32 copy's
/// bits (decoding is a stream over the weights).
pub trait Weight: Copy + Default + Send + Sync + 'static {
    fn value(self) -> f32;
}

impl Weight for f32 {
    #[inline(always)]
    fn value(self) -> f32 {
        self
    }
}

/// A bfloat16 widens by its bits alone (not `to_f32`, which quiets NaNs), as the SIMD loads do.
impl Weight for half::bf16 {
    #[inline(always)]
    fn value(self) -> f32 {
        f32::from_bits(u32::from(self.to_bits()) << 16)
    }
}

/// A strip matrix's weights, as the checkpoint stored them.
#[derive(Debug, Clone)]
enum Values {
    F32(Vec<f32>),
    Bf16(Vec<half::bf16>),
}

/// Weight rows per strip: one f32 lane of a 512-bit vector each.
pub const STRIP: usize = 16;
/// Weight rows per parallel task.
const ROWS_PER_TASK: usize = 64;
/// Below this many multiply-adds a product runs on the calling thread.
const PARALLEL_MIN_WORK: usize = 1 << 18;
/// Activation rows per pass over a strip (the most the registers hold: two sums per row).
const TILE: usize = 8;

/// An `[n, k]` matrix (f32 or bfloat16 weights, f32 arithmetic) in column strips.
#[derive(Debug, Clone)]
pub struct DenseStrips {
    n: usize,
    k: usize,
    /// `[strips, k, 16]`; rows past `n` are zeros.
    values: Values,
}

/// The `[n, k]` row-major matrix `weight` in strips.
fn in_strips<W: Weight>(weight: &[W], n: usize, k: usize) -> Vec<W> {
    assert_eq!(weight.len(), n * k, "weight is not [n, k]");
    let mut values = vec![W::default(); n.div_ceil(STRIP) * STRIP * k];
    values
        .par_chunks_mut(STRIP * k)
        .enumerate()
        .for_each(|(s, strip)| {
            for p in 0..STRIP.min(n - s * STRIP) {
                let row = &weight[(s * STRIP + p) * k..][..k];
                for (i, &w) in row.iter().enumerate() {
                    strip[i * STRIP + p] = w;
                }
            }
        });
    values
}

impl DenseStrips {
    /// The `[n, k]` row-major f32 matrix `weight` in strips.
    pub fn new(weight: &[f32], n: usize, k: usize) -> Self {
        let values = Values::F32(in_strips(weight, n, k));
        Self { n, k, values }
    }

    /// The `[n, k]` row-major bfloat16 matrix `weight` in strips, kept in bfloat16.
    pub fn new_bf16(weight: &[half::bf16], n: usize, k: usize) -> Self {
        let values = Values::Bf16(in_strips(weight, n, k));
        Self { n, k, values }
    }

    /// Bytes per stored weight: 4, or 2 for bfloat16.
    pub fn weight_bytes(&self) -> usize {
        match self.values {
            Values::F32(_) => 4,
            Values::Bf16(_) => 2,
        }
    }

    /// `(n, k)`: output rows, inputs per row.
    pub fn dims(&self) -> (usize, usize) {
        (self.n, self.k)
    }

    /// Weight row `j` into `out` (`k` values).
    pub fn row(&self, j: usize, out: &mut [f32]) {
        assert!(
            j < self.n && out.len() == self.k,
            "row {j} of {} rows",
            self.n
        );
        fn read<W: Weight>(values: &[W], j: usize, k: usize, out: &mut [f32]) {
            let strip = &values[j / STRIP * STRIP * k..][..STRIP * k];
            for (value, column) in out.iter_mut().zip(strip.chunks_exact(STRIP)) {
                *value = column[j % STRIP].value();
            }
        }
        match &self.values {
            Values::F32(values) => read(values, j, self.k, out),
            Values::Bf16(values) => read(values, j, self.k, out),
        }
    }

    /// `x W^T` as `[rows, n]` for `x: [rows, k]`.
    pub fn matmul(&self, x: &[f32], rows: usize) -> Vec<f32> {
        match &self.values {
            Values::F32(values) => self.matmul_values(values, x, rows),
            Values::Bf16(values) => self.matmul_values(values, x, rows),
        }
    }

    fn matmul_values<W: Weight>(&self, values: &[W], x: &[f32], rows: usize) -> Vec<f32> {
        let (n, k) = (self.n, self.k);
        assert_eq!(x.len(), rows * k, "input is not [rows, k]");
        if rows == 0 || n == 0 {
            return Vec::new();
        }
        // Each task writes its `w` weight rows' columns of every row (as the quantized
        // products do: `threads::for_each_columns_mut`).
        let mut output: Vec<f32> = Vec::with_capacity(n * rows);
        let strip_len = STRIP * k;
        let task = |_: usize, index: usize, mut columns: Columns<'_, MaybeUninit<f32>>| {
            let first = index * ROWS_PER_TASK;
            let w = columns.width();
            let strips = &values[first / STRIP * strip_len..][..w.div_ceil(STRIP) * strip_len];
            columns.fill(|out| product(strips, k, w, x, rows, out));
        };
        let parallel = n * k * rows >= PARALLEL_MIN_WORK;
        let values = &mut output.spare_capacity_mut()[..n * rows];
        for_each_columns_mut(&mut [values], rows, ROWS_PER_TASK, parallel, task);
        // SAFETY: every task filled its columns of every row of `..n * rows`; a task that
        // panicked never gets here.
        #[allow(unsafe_code)]
        unsafe {
            output.set_len(n * rows)
        };
        output
    }
}

/// `out[r * w + j]` = weight row `j` of `strips` (`j < w`) dotted with `x` row `r`.
fn product<W: Weight>(strips: &[W], k: usize, w: usize, x: &[f32], rows: usize, out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if crate::cpu::allows(crate::cpu::Level::Avx512) {
        // SAFETY: the level includes the features `product_avx512` is compiled for, found on
        // this CPU.
        #[allow(unsafe_code)]
        unsafe {
            return product_avx512(strips, k, w, x, rows, out);
        }
    }
    #[cfg(target_arch = "x86_64")]
    if crate::cpu::allows(crate::cpu::Level::Avx2) {
        // SAFETY: as above, for AVX2 and FMA.
        #[allow(unsafe_code)]
        unsafe {
            return product_avx2(strips, k, w, x, rows, out);
        }
    }
    product_portable(strips, k, w, x, rows, out)
}

/// The reference: per output, the even inputs' and the odd inputs' fused multiply-adds in
/// order, then their sum (what the vector kernel does lane by lane).
#[inline(always)]
fn product_portable<W: Weight>(
    strips: &[W],
    k: usize,
    w: usize,
    x: &[f32],
    rows: usize,
    out: &mut [f32],
) {
    for (s, strip) in strips.chunks_exact(STRIP * k).enumerate() {
        for p in 0..STRIP.min(w - s * STRIP) {
            for r in 0..rows {
                let input = &x[r * k..(r + 1) * k];
                let (mut even, mut odd) = (0f32, 0f32);
                for (i, &value) in input.iter().enumerate() {
                    let weight = strip[i * STRIP + p].value();
                    if i % 2 == 0 {
                        even = value.mul_add(weight, even);
                    } else {
                        odd = value.mul_add(weight, odd);
                    }
                }
                out[r * w + s * STRIP + p] = even + odd;
            }
        }
    }
}

/// [`product_portable`] in AVX2 and FMA: a strip's 16 outputs in two vectors of 8, tiles of
/// 2 activation rows (the 16 registers hold two rows' even and odd sums for both halves, and
/// the weights), the same fused multiply-adds per lane in the same order, so the same bits.
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
#[target_feature(enable = "avx2,fma")]
unsafe fn product_avx2<W: Weight>(
    strips: &[W],
    k: usize,
    w: usize,
    x: &[f32],
    rows: usize,
    out: &mut [f32],
) {
    assert!(strips.len() == w.div_ceil(STRIP) * STRIP * k && x.len() >= rows * k);
    assert!(out.len() >= rows * w);
    for_each_tile(
        strips,
        k,
        w,
        rows,
        &[2, 1],
        |tile, strip, done, at, width| {
            // SAFETY: the strip holds `k` vectors, rows `done..done + tile` of `x` exist and each
            // row's `width` outputs are inside `out` (asserted above).
            match tile {
                2 => strip_tile_avx2::<W, 2>(strip, k, x, done, out, at, width),
                _ => strip_tile_avx2::<W, 1>(strip, k, x, done, out, at, width),
            }
        },
    );
}

/// `run(tile, strip, first, at, width)` for every strip and every tile of activation rows
/// (`first..first + tile`, the largest of `sizes` that fits), row `r`'s outputs of the strip
/// at `at(r)` (its first `width` real).
#[cfg(target_arch = "x86_64")]
fn for_each_tile<W: Weight>(
    strips: &[W],
    k: usize,
    w: usize,
    rows: usize,
    sizes: &[usize],
    mut run: impl FnMut(usize, &[W], usize, &dyn Fn(usize) -> usize, usize),
) {
    let mut done = 0;
    while done < rows {
        let tile = (sizes.iter().copied())
            .find(|&t| t <= rows - done)
            .unwrap_or(1);
        for (s, strip) in strips.chunks_exact(STRIP * k).enumerate() {
            let width = STRIP.min(w - s * STRIP);
            let at = |r: usize| (done + r) * w + s * STRIP;
            run(tile, strip, done, &at, width);
        }
        done += tile;
    }
}

/// One strip against activation rows `first..first + R` in AVX2: row `r`'s 16 outputs (the
/// first `width`) at `out[at(r)..]`.
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn strip_tile_avx2<W: Weight, const R: usize>(
    strip: &[W],
    k: usize,
    x: &[f32],
    first: usize,
    out: &mut [f32],
    at: impl Fn(usize) -> usize,
    width: usize,
) {
    use std::arch::x86_64::*;
    let inputs: [*const f32; R] = std::array::from_fn(|r| x.as_ptr().add((first + r) * k));
    let zero = [[_mm256_setzero_ps(); 2]; R];
    let (mut even, mut odd) = (zero, zero);
    let weights = strip.as_ptr();
    let add = |sums: &mut [[__m256; 2]; R], i: usize| {
        let w = [0, 8].map(|h| load8(weights.add(i * STRIP + h)));
        for r in 0..R {
            let value = _mm256_set1_ps(*inputs[r].add(i));
            for h in 0..2 {
                sums[r][h] = _mm256_fmadd_ps(value, w[h], sums[r][h]);
            }
        }
    };
    let mut i = 0;
    while i + 1 < k {
        add(&mut even, i);
        add(&mut odd, i + 1);
        i += 2;
    }
    if i < k {
        add(&mut even, i);
    }
    for r in 0..R {
        let mut sums = [0f32; STRIP];
        for h in 0..2 {
            let sum = _mm256_add_ps(even[r][h], odd[r][h]);
            _mm256_storeu_ps(sums.as_mut_ptr().add(8 * h), sum);
        }
        out[at(r)..at(r) + width].copy_from_slice(&sums[..width]);
    }
}

/// 8 weights at `p` as f32 (a bfloat16 widened: its bits moved to the high half).
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
#[inline(always)]
unsafe fn load8<W: Weight>(p: *const W) -> std::arch::x86_64::__m256 {
    use std::arch::x86_64::*;
    if std::mem::size_of::<W>() == 4 {
        _mm256_loadu_ps(p.cast())
    } else {
        let halves = _mm256_cvtepu16_epi32(_mm_loadu_si128(p.cast()));
        _mm256_castsi256_ps(_mm256_slli_epi32::<16>(halves))
    }
}

#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
#[target_feature(enable = "avx512f,fma")]
unsafe fn product_avx512<W: Weight>(
    strips: &[W],
    k: usize,
    w: usize,
    x: &[f32],
    rows: usize,
    out: &mut [f32],
) {
    assert!(strips.len() == w.div_ceil(STRIP) * STRIP * k && x.len() >= rows * k);
    assert!(out.len() >= rows * w);
    for_each_tile(
        strips,
        k,
        w,
        rows,
        &[TILE, 4, 2, 1],
        |tile, strip, done, at, width| {
            // SAFETY: the strip holds `k` vectors, rows `done..done + tile` of `x` exist and the
            // masked stores stay inside `out` (asserted above).
            match tile {
                TILE => strip_tile::<W, TILE>(strip, k, x, done, out, at, width),
                4 => strip_tile::<W, 4>(strip, k, x, done, out, at, width),
                2 => strip_tile::<W, 2>(strip, k, x, done, out, at, width),
                _ => strip_tile::<W, 1>(strip, k, x, done, out, at, width),
            }
        },
    );
}

/// One strip against activation rows `first..first + R`: row `r`'s 16 outputs (the first
/// `width`) at `out[at(r)..]`.
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
#[inline]
#[target_feature(enable = "avx512f,fma")]
unsafe fn strip_tile<W: Weight, const R: usize>(
    strip: &[W],
    k: usize,
    x: &[f32],
    first: usize,
    out: &mut [f32],
    at: impl Fn(usize) -> usize,
    width: usize,
) {
    use std::arch::x86_64::*;
    let inputs: [*const f32; R] = std::array::from_fn(|r| x.as_ptr().add((first + r) * k));
    let (mut even, mut odd) = ([_mm512_setzero_ps(); R], [_mm512_setzero_ps(); R]);
    let weights = strip.as_ptr();
    let mut i = 0;
    while i + 1 < k {
        let (w0, w1) = (
            load16(weights.add(i * STRIP)),
            load16(weights.add((i + 1) * STRIP)),
        );
        for r in 0..R {
            even[r] = _mm512_fmadd_ps(_mm512_set1_ps(*inputs[r].add(i)), w0, even[r]);
            odd[r] = _mm512_fmadd_ps(_mm512_set1_ps(*inputs[r].add(i + 1)), w1, odd[r]);
        }
        i += 2;
    }
    if i < k {
        let w0 = load16(weights.add(i * STRIP));
        for r in 0..R {
            even[r] = _mm512_fmadd_ps(_mm512_set1_ps(*inputs[r].add(i)), w0, even[r]);
        }
    }
    let mask = ((1u32 << width) - 1) as __mmask16;
    for r in 0..R {
        let sum = _mm512_add_ps(even[r], odd[r]);
        _mm512_mask_storeu_ps(out.as_mut_ptr().add(at(r)), mask, sum);
    }
}

/// 16 weights at `p` as f32 (a bfloat16 widened: its bits moved to the high half).
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
#[inline(always)]
unsafe fn load16<W: Weight>(p: *const W) -> std::arch::x86_64::__m512 {
    use std::arch::x86_64::*;
    if std::mem::size_of::<W>() == 4 {
        _mm512_loadu_ps(p.cast())
    } else {
        let halves = _mm512_cvtepu16_epi32(_mm256_loadu_si256(p.cast()));
        _mm512_castsi512_ps(_mm512_slli_epi32::<16>(halves))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wave(n: usize, seed: f32) -> Vec<f32> {
        (0..n).map(|i| ((i as f32 + seed) * 0.713).sin()).collect()
    }

    fn f32_values(strips: &DenseStrips) -> &[f32] {
        match &strips.values {
            Values::F32(values) => values,
            Values::Bf16(_) => panic!("bfloat16 strips"),
        }
    }

    /// Weights kept in bfloat16 give the bits of the same weights widened to f32, in every
    /// tile (the kernel at this CPU's level and the reference), from half the bytes.
    #[test]
    fn bfloat16_strips_give_the_bits_of_their_f32_values() {
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        let (n, k) = (37, 33);
        let halves: Vec<half::bf16> = wave(n * k, 4.0)
            .iter()
            .map(|v| half::bf16::from_bits((v.to_bits() >> 16) as u16))
            .collect();
        let widened: Vec<f32> = halves.iter().map(|h| h.value()).collect();
        let (narrow, wide) = (
            DenseStrips::new_bf16(&halves, n, k),
            DenseStrips::new(&widened, n, k),
        );
        assert_eq!((narrow.weight_bytes(), wide.weight_bytes()), (2, 4));
        let mut row = vec![0f32; k];
        narrow.row(n - 1, &mut row);
        assert_eq!(row, widened[(n - 1) * k..]);
        for rows in [1, 2, 3, 4, 7, 8, 9, 17] {
            let x = wave(rows * k, rows as f32);
            assert_eq!(
                bits(&narrow.matmul(&x, rows)),
                bits(&wide.matmul(&x, rows)),
                "{rows} rows"
            );
        }
    }

    /// Every row count 1..=20 (every tile and remainder), odd `k`, a last strip of 5 rows and
    /// several tasks: the same bits as the reference, and each row as when multiplied alone.
    #[test]
    fn products_equal_the_reference_bit_for_bit_in_any_tile() {
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        for (n, k) in [(37, 33), (133, 64)] {
            let weight = wave(n * k, 1.0);
            let strips = DenseStrips::new(&weight, n, k);
            let mut row = vec![0f32; k];
            strips.row(n - 1, &mut row);
            assert_eq!(row, weight[(n - 1) * k..]);
            for rows in 1..=20 {
                let x = wave(rows * k, rows as f32);
                let ours = strips.matmul(&x, rows);
                let mut reference = vec![0f32; rows * n];
                product_portable(f32_values(&strips), k, n, &x, rows, &mut reference);
                assert_eq!(bits(&ours), bits(&reference), "[{n}, {k}] x {rows}");
                for r in 0..rows {
                    let alone = strips.matmul(&x[r * k..(r + 1) * k], 1);
                    assert_eq!(bits(&alone), bits(&ours[r * n..(r + 1) * n]), "row {r}");
                }
                // And close to the plain product.
                for (i, &value) in ours.iter().enumerate() {
                    let (r, j) = (i / n, i % n);
                    let exact: f64 = (0..k)
                        .map(|e| f64::from(x[r * k + e]) * f64::from(weight[j * k + e]))
                        .sum();
                    assert!(
                        (f64::from(value) - exact).abs() < 1e-4,
                        "{value} vs {exact}"
                    );
                }
            }
        }
    }

    /// The AVX2 build of the reference gives its bits (the AVX-512 one is checked above at
    /// this CPU's level).
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_avx2_product_has_the_reference_bits() {
        let avx2 = crate::cpu::Level::supported() >= crate::cpu::Level::Avx2;
        if crate::skip_without("avx2", avx2, "the_avx2_product_has_the_reference_bits") {
            return;
        }
        let (n, k, rows) = (37, 33, 5);
        let strips = DenseStrips::new(&wave(n * k, 2.0), n, k);
        let x = wave(rows * k, 3.0);
        let (mut ours, mut reference) = (vec![0f32; rows * n], vec![0f32; rows * n]);
        // SAFETY: AVX2 and FMA were found on this CPU (`Level::supported`).
        #[allow(unsafe_code)]
        unsafe {
            product_avx2(f32_values(&strips), k, n, &x, rows, &mut ours)
        };
        product_portable(f32_values(&strips), k, n, &x, rows, &mut reference);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&ours), bits(&reference));
    }
}
