//! Dense f32 weights in column strips, the layout of `quant::columns` without the blocks: rows
//! in strips of [`STRIP`], and for each input `i` the 16 rows' weights `i` side by side
//! (bfloat16 weights: for each pair of inputs, the 16 rows' two weights side by side; f16
//! weights as f32's).
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

use crate::threads::{for_each_columns_mut, Columns, OutRows};

pub(crate) mod dot;

pub use dot::Bf16Arithmetic;

/// A stored weight: f32, or a bfloat16 or f16 from a checkpoint or GGUF file that stores
/// them. Widening either to f32 is exact: products read half the bytes and give the f32
/// copy's bits (decoding is a stream over the weights).
pub trait Weight: Copy + Default + Send + Sync + 'static {
    /// How the SIMD loads widen it.
    const STORED: Stored;
    fn value(self) -> f32;
    /// Where input `i` of a strip's row `p` lies in the strip.
    fn at(i: usize, p: usize) -> usize;
    /// Weights per strip of rows of `k` inputs.
    fn strip_len(k: usize) -> usize;
}

/// How a [`Weight`] is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stored {
    F32,
    Bf16,
    F16,
}

/// `[k, 16]`: each input's 16 weights, one vector.
impl Weight for f32 {
    const STORED: Stored = Stored::F32;
    #[inline(always)]
    fn value(self) -> f32 {
        self
    }
    #[inline(always)]
    fn at(i: usize, p: usize) -> usize {
        i * STRIP + p
    }
    fn strip_len(k: usize) -> usize {
        STRIP * k
    }
}

/// `[k / 2, 16, 2]`: each pair of inputs' 32 weights in one vector, a row's two side by side
/// (what `vdpbf16ps` multiplies, and two f32 vectors after a shift and a mask); an odd `k`'s
/// last pair ends in zeros. A bfloat16 widens by its bits alone (not `to_f32`, which quiets
/// NaNs), as the SIMD loads do.
impl Weight for half::bf16 {
    const STORED: Stored = Stored::Bf16;
    #[inline(always)]
    fn value(self) -> f32 {
        f32::from_bits(u32::from(self.to_bits()) << 16)
    }
    #[inline(always)]
    fn at(i: usize, p: usize) -> usize {
        i / 2 * 2 * STRIP + 2 * p + i % 2
    }
    fn strip_len(k: usize) -> usize {
        2 * STRIP * k.div_ceil(2)
    }
}

/// `[k, 16]` as f32's: each input's 16 weights in 32 bytes, which `vcvtph2ps` widens to one
/// f32 vector (exactly).
impl Weight for half::f16 {
    const STORED: Stored = Stored::F16;
    #[inline(always)]
    fn value(self) -> f32 {
        self.to_f32()
    }
    #[inline(always)]
    fn at(i: usize, p: usize) -> usize {
        i * STRIP + p
    }
    fn strip_len(k: usize) -> usize {
        STRIP * k
    }
}

/// A strip matrix's weights, as the checkpoint stored them.
#[derive(Debug, Clone)]
enum Values {
    F32(Vec<f32>),
    Bf16(Vec<half::bf16>),
    F16(Vec<half::f16>),
}

/// Weight rows per strip: one f32 lane of a 512-bit vector each.
pub const STRIP: usize = 16;
/// Weight rows per parallel task.
const ROWS_PER_TASK: usize = 64;
/// Below this many multiply-adds a product runs on the calling thread.
const PARALLEL_MIN_WORK: usize = 1 << 18;
/// Activation rows per pass over a strip (the most the registers hold: two sums per row).
const TILE: usize = 8;
/// The AVX-512 passes' row counts: the rows left, up to [`TILE`], in one pass (a pass of 5
/// rows as 4 and 1 read every strip twice, once at a one-row tile's pace).
const AVX512_TILES: [usize; TILE] = [8, 7, 6, 5, 4, 3, 2, 1];

/// An `[n, k]` matrix (f32 or bfloat16 weights, f32 arithmetic) in column strips.
#[derive(Debug, Clone)]
pub struct DenseStrips {
    n: usize,
    k: usize,
    /// `[strips, k, 16]` (f32) or `[strips, k / 2, 16, 2]` (bfloat16, [`Weight::at`]); rows
    /// past `n` are zeros.
    values: Values,
}

/// The `[n, k]` row-major matrix `weight` in strips.
fn in_strips<W: Weight>(weight: &[W], n: usize, k: usize) -> Vec<W> {
    assert_eq!(weight.len(), n * k, "weight is not [n, k]");
    let mut values = vec![W::default(); n.div_ceil(STRIP) * W::strip_len(k)];
    values
        .par_chunks_mut(W::strip_len(k))
        .enumerate()
        .for_each(|(s, strip)| {
            for p in 0..STRIP.min(n - s * STRIP) {
                let row = &weight[(s * STRIP + p) * k..][..k];
                for (i, &w) in row.iter().enumerate() {
                    strip[W::at(i, p)] = w;
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

    /// The `[n, k]` row-major f16 matrix `weight` in strips, kept in f16.
    pub fn new_f16(weight: &[half::f16], n: usize, k: usize) -> Self {
        let values = Values::F16(in_strips(weight, n, k));
        Self { n, k, values }
    }

    /// Bytes per stored weight: 4, or 2 for bfloat16 and f16.
    pub fn weight_bytes(&self) -> usize {
        match self.values {
            Values::F32(_) => 4,
            Values::Bf16(_) | Values::F16(_) => 2,
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
            let strip = &values[j / STRIP * W::strip_len(k)..][..W::strip_len(k)];
            for (i, value) in out.iter_mut().enumerate() {
                *value = strip[W::at(i, j % STRIP)].value();
            }
        }
        match &self.values {
            Values::F32(values) => read(values, j, self.k, out),
            Values::Bf16(values) => read(values, j, self.k, out),
            Values::F16(values) => read(values, j, self.k, out),
        }
    }

    /// `x W^T` as `[rows, n]` for `x: [rows, k]`: f32 arithmetic, or for bfloat16 weights
    /// the arithmetic [`Bf16Arithmetic::here`] names.
    pub fn matmul(&self, x: &[f32], rows: usize) -> Vec<f32> {
        self.matmul_in(x, rows, Bf16Arithmetic::here())
    }

    /// [`DenseStrips::matmul`] with bfloat16 weights' products in `arithmetic` (the dot's
    /// portable reference where this CPU lacks AVX-512 BF16; f32 weights ignore it).
    pub fn matmul_in(&self, x: &[f32], rows: usize, arithmetic: Bf16Arithmetic) -> Vec<f32> {
        let k = self.k;
        assert_eq!(x.len(), rows * k, "input is not [rows, k]");
        match &self.values {
            Values::F32(values) => self.matmul_values(values, rows, |strips, w, out| {
                product(strips, k, w, x, rows, out)
            }),
            Values::Bf16(values) if arithmetic == Bf16Arithmetic::Dot => {
                let pairs = dot::pairs(x, rows, k);
                self.matmul_values(values, rows, |strips, w, out| {
                    dot::product(strips, k, w, &pairs, rows, out)
                })
            }
            Values::Bf16(values) => self.matmul_values(values, rows, |strips, w, out| {
                product(strips, k, w, x, rows, out)
            }),
            Values::F16(values) => self.matmul_values(values, rows, |strips, w, out| {
                product(strips, k, w, x, rows, out)
            }),
        }
    }

    /// `[rows, n]` outputs, each task's `w` weight rows (from its strips of `values`) written
    /// in place by `product(strips, w, out)`, output `j` of row `r` as `out`'s row `r`'s `j`.
    fn matmul_values<W: Weight>(
        &self,
        values: &[W],
        rows: usize,
        product: impl Fn(&[W], usize, OutRows<'_>) + Sync,
    ) -> Vec<f32> {
        let (n, k) = (self.n, self.k);
        if rows == 0 || n == 0 {
            return Vec::new();
        }
        // Each task writes its `w` weight rows' columns of every row (as the quantized
        // products do: `threads::for_each_columns_mut`).
        let mut output: Vec<f32> = Vec::with_capacity(n * rows);
        let strip_len = W::strip_len(k);
        let task = |_: usize, index: usize, mut columns: Columns<'_, MaybeUninit<f32>>| {
            let first = index * ROWS_PER_TASK;
            let w = columns.width();
            let strips = &values[first / STRIP * strip_len..][..w.div_ceil(STRIP) * strip_len];
            columns.fill_rows(|out| product(strips, w, out));
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

/// Output `j` of `out`'s row `r` = weight row `j` of `strips` (`j < w`) dotted with `x` row `r`.
fn product<W: Weight>(strips: &[W], k: usize, w: usize, x: &[f32], rows: usize, out: OutRows<'_>) {
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
    mut out: OutRows<'_>,
) {
    for (s, strip) in strips.chunks_exact(W::strip_len(k)).enumerate() {
        for p in 0..STRIP.min(w - s * STRIP) {
            for r in 0..rows {
                let input = &x[r * k..(r + 1) * k];
                let (mut even, mut odd) = (0f32, 0f32);
                for (i, &value) in input.iter().enumerate() {
                    let weight = strip[W::at(i, p)].value();
                    if i % 2 == 0 {
                        even = value.mul_add(weight, even);
                    } else {
                        odd = value.mul_add(weight, odd);
                    }
                }
                out.row(r)[s * STRIP + p].write(even + odd);
            }
        }
    }
}

/// [`product_portable`] in AVX2 and FMA: a strip's 16 outputs in two vectors of 8, tiles of
/// 2 activation rows (the 16 registers hold two rows' even and odd sums for both halves, and
/// the weights), the same fused multiply-adds per lane in the same order, so the same bits.
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn product_avx2<W: Weight>(
    strips: &[W],
    k: usize,
    w: usize,
    x: &[f32],
    rows: usize,
    mut out: OutRows<'_>,
) {
    assert!(strips.len() == w.div_ceil(STRIP) * W::strip_len(k) && x.len() >= rows * k);
    assert!(out.rows() >= rows && out.width() >= w);
    let (stride, out) = (out.stride(), out.as_mut_ptr());
    for_each_tile(
        strips,
        W::strip_len(k),
        w,
        stride,
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

/// `run(tile, strip, first, at, width)` for every strip (`strip_len` weights) and every tile
/// of activation rows (`first..first + tile`, the largest of `sizes` that fits), row `r`'s
/// outputs of the strip at `at(r)` (its first `width` real) from the first output of rows
/// `stride` apart.
#[cfg(target_arch = "x86_64")]
fn for_each_tile<W: Copy>(
    strips: &[W],
    strip_len: usize,
    w: usize,
    stride: usize,
    rows: usize,
    sizes: &[usize],
    mut run: impl FnMut(usize, &[W], usize, &dyn Fn(usize) -> usize, usize),
) {
    let mut done = 0;
    while done < rows {
        let tile = (sizes.iter().copied())
            .find(|&t| t <= rows - done)
            .unwrap_or(1);
        for (s, strip) in strips.chunks_exact(strip_len).enumerate() {
            let width = STRIP.min(w - s * STRIP);
            let at = |r: usize| (done + r) * stride + s * STRIP;
            run(tile, strip, done, &at, width);
        }
        done += tile;
    }
}

/// One strip against activation rows `first..first + R` in AVX2: row `r`'s 16 outputs (the
/// first `width`) at `out.add(at(r))`.
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn strip_tile_avx2<W: Weight, const R: usize>(
    strip: &[W],
    k: usize,
    x: &[f32],
    first: usize,
    out: *mut f32,
    at: impl Fn(usize) -> usize,
    width: usize,
) {
    use std::arch::x86_64::*;
    let inputs: [*const f32; R] = std::array::from_fn(|r| x.as_ptr().add((first + r) * k));
    let zero = [[_mm256_setzero_ps(); 2]; R];
    let (mut even, mut odd) = (zero, zero);
    let weights = strip.as_ptr();
    let add = |sums: &mut [[__m256; 2]; R], w: [__m256; 2], i: usize| {
        for r in 0..R {
            let value = _mm256_set1_ps(*inputs[r].add(i));
            for h in 0..2 {
                sums[r][h] = _mm256_fmadd_ps(value, w[h], sums[r][h]);
            }
        }
    };
    let mut i = 0;
    while i + 1 < k {
        if R > 1 {
            ask_ahead_pair(weights, i);
        }
        let [w0, w1] = [0, 8].map(|h| pair8(weights, i, h));
        add(&mut even, [w0.0, w1.0], i);
        add(&mut odd, [w0.1, w1.1], i + 1);
        i += 2;
    }
    if i < k {
        add(&mut even, [0, 8].map(|h| one8(weights, i, h)), i);
    }
    for r in 0..R {
        let mut sums = [0f32; STRIP];
        for h in 0..2 {
            let sum = _mm256_add_ps(even[r][h], odd[r][h]);
            _mm256_storeu_ps(sums.as_mut_ptr().add(8 * h), sum);
        }
        std::ptr::copy_nonoverlapping(sums.as_ptr(), out.add(at(r)), width);
    }
}

/// How far ahead of its multiplies a strip's lines are asked for, into L1 and into L2: a
/// tile of several rows streams a strip from memory slower than the hardware's own
/// prefetching keeps up with (the distances the quantized products use). A one-row tile, the
/// pace of memory, does not ask.
#[cfg(target_arch = "x86_64")]
const AHEAD_L1: usize = 3072;
#[cfg(target_arch = "x86_64")]
const AHEAD_L2: usize = 16384;

/// Asks for the cache lines [`AHEAD_L1`] and [`AHEAD_L2`] bytes past `line`. Never faults,
/// wherever it points.
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
#[inline(always)]
unsafe fn ask_ahead(line: *const u8) {
    use std::arch::x86_64::*;
    _mm_prefetch::<_MM_HINT_T0>(line.wrapping_add(AHEAD_L1).cast());
    _mm_prefetch::<_MM_HINT_T1>(line.wrapping_add(AHEAD_L2).cast());
}

/// [`ask_ahead`] for each line of inputs `i` and `i + 1` (`i` even) of the strip at `p`.
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
#[inline(always)]
unsafe fn ask_ahead_pair<W: Weight>(p: *const W, i: usize) {
    let first = p.wrapping_add(W::at(i, 0)).cast::<u8>();
    for line in (0..2 * STRIP * size_of::<W>()).step_by(64) {
        ask_ahead(first.wrapping_add(line));
    }
}

/// Inputs `i` and `i + 1` (`i` even) of rows `h..h + 8` of the strip at `p`, as f32 (a
/// bfloat16 pair widened: the even one's bits shifted to the high half, the odd one's masked;
/// f16 by `vcvtph2ps`).
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
#[inline(always)]
unsafe fn pair8<W: Weight>(
    p: *const W,
    i: usize,
    h: usize,
) -> (std::arch::x86_64::__m256, std::arch::x86_64::__m256) {
    use std::arch::x86_64::*;
    match W::STORED {
        Stored::F32 => {
            let at = |i| _mm256_loadu_ps(p.add(W::at(i, h)).cast());
            (at(i), at(i + 1))
        }
        Stored::F16 => {
            let at = |i| _mm256_cvtph_ps(_mm_loadu_si128(p.add(W::at(i, h)).cast()));
            (at(i), at(i + 1))
        }
        Stored::Bf16 => {
            let pairs = _mm256_loadu_si256(p.add(W::at(i, h)).cast());
            let odd = _mm256_and_si256(pairs, _mm256_set1_epi32(0xffff_0000_u32 as i32));
            let even = _mm256_slli_epi32::<16>(pairs);
            (_mm256_castsi256_ps(even), _mm256_castsi256_ps(odd))
        }
    }
}

/// Input `i` (`k`'s last, even) of rows `h..h + 8` as [`pair8`] reads it.
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
#[inline(always)]
unsafe fn one8<W: Weight>(p: *const W, i: usize, h: usize) -> std::arch::x86_64::__m256 {
    use std::arch::x86_64::*;
    match W::STORED {
        Stored::F32 => _mm256_loadu_ps(p.add(W::at(i, h)).cast()),
        Stored::F16 => _mm256_cvtph_ps(_mm_loadu_si128(p.add(W::at(i, h)).cast())),
        Stored::Bf16 => pair8(p, i, h).0,
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
    mut out: OutRows<'_>,
) {
    assert!(strips.len() == w.div_ceil(STRIP) * W::strip_len(k) && x.len() >= rows * k);
    assert!(out.rows() >= rows && out.width() >= w);
    let (stride, out) = (out.stride(), out.as_mut_ptr());
    for_each_tile(
        strips,
        W::strip_len(k),
        w,
        stride,
        rows,
        &AVX512_TILES,
        |tile, strip, done, at, width| {
            // SAFETY: the strip holds `k` vectors, rows `done..done + tile` of `x` exist and the
            // masked stores stay inside `out` (asserted above).
            match tile {
                TILE => strip_tile::<W, TILE>(strip, k, x, done, out, at, width),
                7 => strip_tile::<W, 7>(strip, k, x, done, out, at, width),
                6 => strip_tile::<W, 6>(strip, k, x, done, out, at, width),
                5 => strip_tile::<W, 5>(strip, k, x, done, out, at, width),
                4 => strip_tile::<W, 4>(strip, k, x, done, out, at, width),
                3 => strip_tile::<W, 3>(strip, k, x, done, out, at, width),
                2 => strip_tile::<W, 2>(strip, k, x, done, out, at, width),
                _ => strip_tile::<W, 1>(strip, k, x, done, out, at, width),
            }
        },
    );
}

/// One strip against activation rows `first..first + R`: row `r`'s 16 outputs (the first
/// `width`) at `out.add(at(r))`.
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
#[inline]
#[target_feature(enable = "avx512f,fma")]
unsafe fn strip_tile<W: Weight, const R: usize>(
    strip: &[W],
    k: usize,
    x: &[f32],
    first: usize,
    out: *mut f32,
    at: impl Fn(usize) -> usize,
    width: usize,
) {
    use std::arch::x86_64::*;
    let inputs: [*const f32; R] = std::array::from_fn(|r| x.as_ptr().add((first + r) * k));
    let (mut even, mut odd) = ([_mm512_setzero_ps(); R], [_mm512_setzero_ps(); R]);
    let weights = strip.as_ptr();
    let mut i = 0;
    while i + 1 < k {
        if R > 1 {
            ask_ahead_pair(weights, i);
        }
        let (w0, w1) = pair16(weights, i);
        for r in 0..R {
            even[r] = _mm512_fmadd_ps(_mm512_set1_ps(*inputs[r].add(i)), w0, even[r]);
            odd[r] = _mm512_fmadd_ps(_mm512_set1_ps(*inputs[r].add(i + 1)), w1, odd[r]);
        }
        i += 2;
    }
    if i < k {
        let w0 = one16(weights, i);
        for r in 0..R {
            even[r] = _mm512_fmadd_ps(_mm512_set1_ps(*inputs[r].add(i)), w0, even[r]);
        }
    }
    let mask = ((1u32 << width) - 1) as __mmask16;
    for r in 0..R {
        let sum = _mm512_add_ps(even[r], odd[r]);
        _mm512_mask_storeu_ps(out.add(at(r)), mask, sum);
    }
}

/// Inputs `i` and `i + 1` (`i` even) of the strip at `p`'s 16 rows, as f32 ([`pair8`]).
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
#[inline(always)]
unsafe fn pair16<W: Weight>(
    p: *const W,
    i: usize,
) -> (std::arch::x86_64::__m512, std::arch::x86_64::__m512) {
    use std::arch::x86_64::*;
    match W::STORED {
        Stored::F32 => {
            let at = |i| _mm512_loadu_ps(p.add(W::at(i, 0)).cast());
            (at(i), at(i + 1))
        }
        Stored::F16 => {
            let at = |i| _mm512_cvtph_ps(_mm256_loadu_si256(p.add(W::at(i, 0)).cast()));
            (at(i), at(i + 1))
        }
        Stored::Bf16 => {
            let pairs = _mm512_loadu_si512(p.add(W::at(i, 0)).cast());
            let odd = _mm512_and_si512(pairs, _mm512_set1_epi32(0xffff_0000_u32 as i32));
            let even = _mm512_slli_epi32::<16>(pairs);
            (_mm512_castsi512_ps(even), _mm512_castsi512_ps(odd))
        }
    }
}

/// Input `i` (`k`'s last, even) of the strip at `p`'s 16 rows, as [`pair16`] reads it.
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
#[inline(always)]
unsafe fn one16<W: Weight>(p: *const W, i: usize) -> std::arch::x86_64::__m512 {
    use std::arch::x86_64::*;
    match W::STORED {
        Stored::F32 => _mm512_loadu_ps(p.add(W::at(i, 0)).cast()),
        Stored::F16 => _mm512_cvtph_ps(_mm256_loadu_si256(p.add(W::at(i, 0)).cast())),
        Stored::Bf16 => pair16(p, i).0,
    }
}

#[cfg(test)]
mod tests;
