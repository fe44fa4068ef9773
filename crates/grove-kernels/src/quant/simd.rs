//! AVX-512 (F, BW, DQ, VNNI) kernels in two families, both after llama.cpp's layout of the
//! work: the integer dot of 64 weights with 64 activation bytes is one `vpdpbusd`, and the f32
//! work is amortized:
//! - 32-weight formats (Q8_0, Q5_0), in `simd32.rs`, on the interleaved layout
//!   (`interleave.rs`).
//! - K-quants (Q4_K, Q6_K), activations scaled per 256: within a super-block the sub-block
//!   scales multiply each chunk's dot (Q4_K in integers: `vpmaddubsw` then `vpdpwssd`; Q6_K in
//!   f32 FMAs, which measured faster for it than the integer pair: 1.80 against 2.01 ms at 16
//!   rows), then one FMA per super-block; mins (Q4_K) and the zero point (Q6_K) come from the
//!   activations' 32- and 16-value sums.
//!
//! Each decoded weight chunk is dotted with up to [`TILE`] activation rows; a single
//! activation row (a decode step) goes through [`WEIGHT_ROWS`] weight rows at a time
//! ([`dot_weight_rows`], [`dot_group`]).
// The kernels are `unsafe` only for the intrinsics: every function here is compiled for
// avx512f/bw/dq/vnni + f16c and reached only after `available()` confirmed those features;
// every load reads inside slices whose lengths `QMatrix::new` and `QuantizedRows::new` checked
// (masked loads for partial groups).
#![allow(unsafe_code)]
// Loops over the `R` rows of a tile index several parallel register arrays at once.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;

use super::interleave::GROUP_ROWS;
use super::simd32::{
    block32, block32_gfni, block32_groups, block32_groups_gfni, gfni, Q5_0Gfni, Q5_0, Q8_0,
};
use super::x86::{prefetch, prefetch_at, reduce4, Rows, PREFETCH, PREFETCH_L2};
use super::{QuantFormat, QuantizedRows, WeightRow};

/// Activation rows per pass over a weight row.
const TILE: usize = 8;
pub(super) fn available() -> bool {
    is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512dq")
        && is_x86_feature_detected!("avx512vnni")
        && is_x86_feature_detected!("f16c")
        && is_x86_feature_detected!("bmi2")
}

/// One tile of `$r` rows through `format`'s kernel.
macro_rules! tile {
    ($format:expr, $r:literal, $row:expr, $acts:expr, $start:expr, $out:expr) => {
        match ($format, $row) {
            (QuantFormat::Q8_0, WeightRow::Interleaved { group, p }) => {
                block32::<Q8_0, $r>(group.as_ptr(), p, $acts, $start, $out)
            }
            (QuantFormat::Q5_0, WeightRow::Interleaved { group, p }) => {
                if gfni() {
                    block32_gfni::<Q5_0Gfni, $r>(group.as_ptr(), p, $acts, $start, $out)
                } else {
                    block32::<Q5_0, $r>(group.as_ptr(), p, $acts, $start, $out)
                }
            }
            (QuantFormat::Q4K, WeightRow::Permuted(row)) => {
                kquant::<Q4K, $r>(row, $acts, $start, $out)
            }
            (QuantFormat::Q6K, WeightRow::Permuted(row)) => {
                kquant::<Q6K, $r>(row, $acts, $start, $out)
            }
            _ => unreachable!("{} rows in another layout", $format.name()),
        }
    };
}

/// `out[i * stride] = row . acts[first + i]` for `i < count`; 32-weight formats read the
/// interleaved layout, K-quants the permuted one.
pub(super) fn dot_rows(
    format: QuantFormat,
    row: WeightRow<'_>,
    acts: &QuantizedRows,
    first: usize,
    count: usize,
    out: &mut [f32],
    stride: usize,
) {
    assert!(
        acts.in_order_for(format),
        "activations not quantized for {}",
        format.name()
    );
    let mut done = 0;
    while done < count {
        let left = count - done;
        let rows = [TILE, 4, 2, 1]
            .into_iter()
            .find(|&r| r <= left)
            .unwrap_or(1);
        let start = first + done;
        let mut values = [0f32; TILE];
        let tile = &mut values[..rows];
        // SAFETY: the caller (Kernel::detect) checked the features; `row` holds `k / CHUNK`
        // whole chunks of `format` (QMatrix::new; a whole row group for the interleaved
        // layout) and rows `start..start + rows` exist in `acts`, quantized with
        // `format.activation_block()`.
        unsafe {
            match rows {
                TILE => tile!(format, 8, row, acts, start, tile),
                4 => tile!(format, 4, row, acts, start, tile),
                2 => tile!(format, 2, row, acts, start, tile),
                _ => tile!(format, 1, row, acts, start, tile),
            }
        }
        for (r, &value) in tile.iter().enumerate() {
            out[(done + r) * stride] = value;
        }
        done += rows;
    }
}

/// Weight rows per call of [`dot_weight_rows`].
pub(super) const WEIGHT_ROWS: usize = 4;

/// `out[p] = rows[p] . acts[act]`: `WEIGHT_ROWS` K-quant weight rows against one activation
/// row (a decode step). One weight row at a time, the horizontal sum at its end (a chain of
/// dependent shuffles and adds) and the activation loads were a fifth of a short row's time
/// (k = 640 or 896: 10-14 chunks); four rows reduce their sums together. In cache, one
/// thread, 128 rows (`QN=128 RAYON_NUM_THREADS=1 cargo bench -p grove-model --bench kernels
/// -- "_128x.*/grove/1$"`): Q6_K 8.1 -> 6.8 us, Q4_K unchanged (then bound by GGUF's scale
/// packing, since repacked at load: `kpermute.rs`).
pub(super) fn dot_weight_rows(
    format: QuantFormat,
    rows: [&[u8]; WEIGHT_ROWS],
    acts: &QuantizedRows,
    act: usize,
    out: &mut [f32],
) {
    assert!(out.len() >= WEIGHT_ROWS && act < acts.q.len() / acts.k);
    assert!(
        acts.in_order_for(format),
        "activations not quantized for {}",
        format.name()
    );
    let rows = rows.map(<[u8]>::as_ptr);
    // SAFETY: the caller (Kernel::detect) checked the features; every row holds `k / CHUNK`
    // whole chunks of `format` (QMatrix::new), row `act` exists in `acts` (asserted), quantized
    // with `format.activation_block()`, and `out` holds WEIGHT_ROWS values (asserted).
    unsafe {
        match format {
            QuantFormat::Q8_0 | QuantFormat::Q5_0 => unreachable!("interleaved: dot_group"),
            QuantFormat::Q4K => kquant_weight_rows::<Q4K>(rows, acts, act, out.as_mut_ptr()),
            QuantFormat::Q6K => kquant_weight_rows::<Q6K>(rows, acts, act, out.as_mut_ptr()),
        }
    }
}

/// `out[4 g + p] = row p of row group g . acts[act]` for the interleaved row groups laid end to
/// end in `groups` (a decode step's share of a 32-weight format's matrix). One call for all of
/// them: the checks and the activation row's pointers once, not once per 4 rows.
pub(super) fn dot_groups(
    format: QuantFormat,
    groups: &[u8],
    acts: &QuantizedRows,
    act: usize,
    out: &mut [f32],
) {
    let group_bytes = GROUP_ROWS * format.row_bytes(acts.k).expect("whole chunks");
    let count = groups.len() / group_bytes;
    assert_eq!(groups.len(), count * group_bytes, "whole row groups");
    assert!(out.len() >= count * GROUP_ROWS && act < acts.q.len() / acts.k);
    assert!(
        acts.in_order_for(format),
        "activations not quantized for {}",
        format.name()
    );
    let (groups, out) = (groups.as_ptr(), out.as_mut_ptr());
    // SAFETY: the caller (Kernel::detect) checked the features; `groups` holds `count` whole
    // row groups (asserted), row `act` exists in `acts` (asserted), quantized with 32-value
    // blocks, and `out` holds GROUP_ROWS values per row group (asserted).
    unsafe {
        match format {
            QuantFormat::Q8_0 => block32_groups::<Q8_0>(groups, group_bytes, count, acts, act, out),
            QuantFormat::Q5_0 if gfni() => {
                block32_groups_gfni::<Q5_0Gfni>(groups, group_bytes, count, acts, act, out)
            }
            QuantFormat::Q5_0 => block32_groups::<Q5_0>(groups, group_bytes, count, acts, act, out),
            QuantFormat::Q4K | QuantFormat::Q6K => unreachable!("K-quants: dot_weight_rows"),
        }
    }
}

/// A 256-weight format: one super-block of a weight row dotted with `R` activation rows,
/// added unreduced into `acc`.
trait SuperBlock {
    const BYTES: usize;
    unsafe fn add<const R: usize>(block: *const u8, s: usize, x: &Rows<R>, acc: &mut [__m512; R]);
}

struct Q4K;
struct Q6K;

#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,f16c,bmi2")]
unsafe fn kquant<F: SuperBlock, const R: usize>(
    row: &[u8],
    acts: &QuantizedRows,
    start: usize,
    out: &mut [f32],
) {
    let x = Rows::<R>::new(acts, start);
    let mut acc = [_mm512_setzero_ps(); R];
    for s in 0..acts.k / 256 {
        let block = row.as_ptr().add(F::BYTES * s);
        prefetch(block, F::BYTES);
        F::add(block, s, &x, &mut acc);
    }
    for r in 0..R {
        out[r] = _mm512_reduce_add_ps(acc[r]);
    }
}

/// Four K-quant weight rows against one activation row: the four rows' super-blocks in turn,
/// one reduction for all four at the end (a 1536-weight row is only 6 super-blocks).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,f16c,bmi2")]
unsafe fn kquant_weight_rows<F: SuperBlock>(
    rows: [*const u8; WEIGHT_ROWS],
    acts: &QuantizedRows,
    act: usize,
    out: *mut f32,
) {
    let blocks = acts.k / 256;
    let x = Rows::<1>::new(acts, act);
    let group_bytes = WEIGHT_ROWS * blocks * F::BYTES;
    let ahead = group_bytes * PREFETCH.div_ceil(group_bytes);
    let ahead_l2 = group_bytes * PREFETCH_L2.div_ceil(group_bytes);
    let mut acc = [[_mm512_setzero_ps(); 1]; WEIGHT_ROWS];
    for s in 0..blocks {
        for p in 0..WEIGHT_ROWS {
            let block = rows[p].add(F::BYTES * s);
            prefetch_at::<_MM_HINT_T0>(block.wrapping_add(ahead), F::BYTES);
            prefetch_at::<_MM_HINT_T1>(block.wrapping_add(ahead_l2), F::BYTES);
            F::add(block, s, &x, &mut acc[p]);
        }
    }
    _mm_storeu_ps(out, reduce4(acc.map(|a| a[0])));
}

impl SuperBlock for Q4K {
    const BYTES: usize = 144;

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,f16c,bmi2")]
    unsafe fn add<const R: usize>(block: *const u8, s: usize, x: &Rows<R>, acc: &mut [__m512; R]) {
        let mask = _mm512_set1_epi8(0x0F);
        // The eight 6-bit scales, then the eight mins, one per byte: `pdep` spreads each
        // six bytes of fields (`kpermute` packs them so) into eight. Scalar work on ports the
        // vector work leaves idle; GGUF's packing took ten 128-bit ops, as many as the rest of
        // a super-block's 512-bit work.
        let spread = |at: usize| {
            let bits = std::ptr::read_unaligned(block.add(at).cast::<u64>());
            _pdep_u64(bits, 0x3F3F_3F3F_3F3F_3F3F) as i64
        };
        let fields = _mm_set_epi64x(spread(10), spread(4));
        // Lanes 0-7 d * scale j, lanes 8-15 dmin * min j (d and dmin: two f16 at offset 0).
        let d_dmin = _mm_cvtph_ps(_mm_cvtsi32_si128(std::ptr::read_unaligned(
            block.cast::<i32>(),
        )));
        let d_dmin = _mm512_permutexvar_ps(
            _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0),
            _mm512_castps128_ps512(d_dmin),
        );
        let both = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(fields)), d_dmin);
        // Lane `l`: sub-block `l mod 8`'s scale (`kpermute`'s lanes), shared by the rows.
        let scales = _mm512_shuffle_f32x4::<0b01_00_01_00>(both, both);
        // The four vectors of nibbles: every lane one sub-block's (`kpermute`), so each row's
        // integer dots add into one sum.
        let (q0, q1) = (
            _mm512_loadu_si512(block.add(16).cast()),
            _mm512_loadu_si512(block.add(80).cast()),
        );
        let u = [
            _mm512_and_si512(q0, mask),
            _mm512_and_si512(_mm512_srli_epi16::<4>(q0), mask),
            _mm512_and_si512(q1, mask),
            _mm512_and_si512(_mm512_srli_epi16::<4>(q1), mask),
        ];
        for r in 0..R {
            let values = x.q4k[r].add(256 * s);
            let mut sums = _mm512_setzero_si512();
            for (v, &u) in u.iter().enumerate() {
                let values = _mm512_loadu_si512(values.add(64 * v).cast());
                sums = _mm512_dpbusd_epi32(sums, u, values);
            }
            // d * dx * scale * sums, then minus (dmin * min_j) * (dx * sum of sub-block j's
            // activations), all eight at once (dx enters as a broadcast from memory).
            let dx = _mm512_set1_ps(*x.scale[r].add(s));
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums), _mm512_mul_ps(scales, dx), acc[r]);
            // The sums of sub-blocks 0-7 in lanes 8-15, against the mins there (the masked
            // lanes are not read).
            let x_sums =
                _mm512_maskz_loadu_ps(0xFF00, x.scaled_sum32[r].add(8 * s).wrapping_sub(8));
            acc[r] = _mm512_fnmadd_ps(both, x_sums, acc[r]);
        }
    }
}

impl SuperBlock for Q6K {
    const BYTES: usize = 210;

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,f16c,bmi2")]
    unsafe fn add<const R: usize>(block: *const u8, s: usize, x: &Rows<R>, acc: &mut [__m512; R]) {
        let (low4, top2) = (_mm512_set1_epi8(0x0F), _mm512_set1_epi8(0x30));
        // d * the 16 scales, lane `l` sub-block `l`'s (`kpermute`), shared by the rows.
        let scales =
            _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(block.add(192).cast())));
        let scales = _mm512_mul_ps(scales, _mm512_set1_ps(f16_at(block.add(208))));
        // The four vectors of 6-bit values: low and high nibbles of bytes 0-63, then of
        // bytes 64-127, each with its two top bits from bits 2v of bytes 128-191, moved to
        // bits 4-5 (`(a & 0x0F) | b` is one `vpternlogd`).
        let (ql0, ql1) = (
            _mm512_loadu_si512(block.cast()),
            _mm512_loadu_si512(block.add(64).cast()),
        );
        let qh = _mm512_loadu_si512(block.add(128).cast());
        let join = |low: __m512i, top: __m512i| {
            _mm512_ternarylogic_epi32::<0xEC>(low, _mm512_and_si512(top, top2), low4)
        };
        let u = [
            join(ql0, _mm512_slli_epi16::<4>(qh)),
            join(_mm512_srli_epi16::<4>(ql0), _mm512_slli_epi16::<2>(qh)),
            join(ql1, qh),
            join(_mm512_srli_epi16::<4>(ql1), _mm512_srli_epi16::<2>(qh)),
        ];
        for r in 0..R {
            // Zero point 32: the sums start at -32 * (sum of each sub-block's activations).
            let mut sums = _mm512_loadu_si512(x.q6k_zero[r].add(16 * s).cast());
            let values = x.q6k[r].add(256 * s);
            for (v, &u) in u.iter().enumerate() {
                let values = _mm512_loadu_si512(values.add(64 * v).cast());
                sums = _mm512_dpbusd_epi32(sums, u, values);
            }
            let dx = _mm512_set1_ps(*x.scale[r].add(s));
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums), _mm512_mul_ps(scales, dx), acc[r]);
        }
    }
}

/// [`super::quantize`] in AVX-512: per block the absolute maximum, then 16 values at a time
/// scaled, rounded to nearest-even (`vcvtps2dq` under the default rounding mode, as the
/// portable version's magic-number rounding), clamped to i8 and summed.
pub(super) fn quantize(x: &[f32], rows: &mut QuantizedRows) {
    let n = x.len();
    assert!(rows.block.is_multiple_of(32) && n.is_multiple_of(rows.block));
    assert!(rows.q.len() == n && rows.scale.len() == n / rows.block);
    assert!(rows.sum16.len() == n / 16 && rows.sum32.len() == n / 32);
    // SAFETY: the caller checked the features (`Kernel::detect`); every load and store is
    // inside the slices, whose lengths are asserted above.
    unsafe { quantize_avx512(x, rows) }
}

#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,f16c,bmi2")]
unsafe fn quantize_avx512(x: &[f32], rows: &mut QuantizedRows) {
    let (block, q, scale, sum16, sum32) = rows.parts();
    let (low, high) = (_mm512_set1_epi32(-128), _mm512_set1_epi32(127));
    for (b, d_out) in scale.iter_mut().enumerate() {
        let start = b * block;
        let values = x.as_ptr().add(start);
        let mut amax = _mm512_setzero_ps();
        for i in (0..block).step_by(16) {
            amax = _mm512_max_ps(amax, _mm512_abs_ps(_mm512_loadu_ps(values.add(i))));
        }
        let d = _mm512_reduce_max_ps(amax) / 127.0;
        let inverse = _mm512_set1_ps(if d > 0.0 { 1.0 / d } else { 0.0 });
        for i in (0..block).step_by(16) {
            let scaled = _mm512_mul_ps(_mm512_loadu_ps(values.add(i)), inverse);
            let rounded = _mm512_min_epi32(_mm512_max_epi32(_mm512_cvtps_epi32(scaled), low), high);
            _mm_storeu_si128(
                q.as_mut_ptr().add(start + i).cast(),
                _mm512_cvtepi32_epi8(rounded),
            );
            *sum16.get_unchecked_mut((start + i) / 16) = _mm512_reduce_add_epi32(rounded);
        }
        *d_out = d;
    }
    for (sum, pair) in sum32.iter_mut().zip(sum16.chunks_exact(2)) {
        *sum = pair[0] + pair[1];
    }
}

/// The wrapping sum of `words`, read as the kernels read weights (64-byte loads, requested
/// [`PREFETCH`] bytes ahead): the memory test that decode speed is compared with.
pub(super) fn streaming_sum(words: &[u64]) -> u64 {
    // SAFETY: the caller checked the features (`available()`); loads stay inside `words`.
    unsafe { streaming_sum_avx512(words) }
}

#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,f16c,bmi2")]
unsafe fn streaming_sum_avx512(words: &[u64]) -> u64 {
    let lines = words.chunks_exact(8);
    let tail: u64 = lines.remainder().iter().fold(0, |a, &b| a.wrapping_add(b));
    let mut acc = _mm512_setzero_si512();
    for line in lines {
        prefetch(line.as_ptr().cast(), 64);
        acc = _mm512_add_epi64(acc, _mm512_loadu_si512(line.as_ptr().cast()));
    }
    (_mm512_reduce_add_epi64(acc) as u64).wrapping_add(tail)
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,f16c,bmi2")]
unsafe fn f16_at(p: *const u8) -> f32 {
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(
        p.cast::<u16>().read_unaligned(),
    ))))
}
