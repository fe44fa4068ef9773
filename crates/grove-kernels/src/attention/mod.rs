//! Attention's arithmetic: `softmax(scale * q K^T) V` per row and head over each row's list of
//! visible key slots, read straight from a layer's K/V rows (no gather, no materialized mask).
//! Softmax runs in f32 with the max subtracted, like SDPA. Which slots a row sees (causal,
//! bidirectional, tree ancestors, a sliding window) is the model's business (`KeyPlan` in
//! grove-model); this module only needs the lists.

#[cfg(target_arch = "x86_64")]
mod across;
mod dot;
mod lanes;
mod pieces;
mod rows;

use std::cell::RefCell;

pub use rows::KvRows;
#[cfg(target_arch = "x86_64")]
use rows::Listed;
use rows::{gather_rows, Buffers, Element};

use crate::dense::scaled_dots_many;
use crate::threads::for_each_chunk_mut;

/// Below this many multiply-adds attention runs on the calling thread: handing tiny work to
/// the pool costs a wake-up and a context switch per layer.
pub const PARALLEL_MIN_WORK: usize = 1 << 16;

/// Keys per piece of a long row. A row that sees more keys is cut into pieces of this many,
/// whose partial softmaxes run in parallel (a decode step is one row: without this its
/// attention ran on one thread however long the context) and combine in order. How a row is
/// cut depends only on its own ordered keys, never on the batch or the threads, so a token
/// decoded, verified in a tree or batched gets the same bits, which the lossless checks need.
pub const KEY_PIECE: usize = 256;

/// Head layout of one attention layer.
#[derive(Debug, Clone, Copy)]
pub struct HeadLayout {
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
}

impl HeadLayout {
    /// Query heads per KV head.
    pub fn group(&self) -> usize {
        self.num_heads / self.num_kv_heads
    }
}

/// `softmax(scale * q K^T) V` for every row and head, over the row's visible key slots
/// (`key_slots[row]`, in order). `queries` is `[rows, heads * d]` (already rotated);
/// `keys`/`values` are a layer of the KV store, `[kv_heads, slots, d]` (a head's rows of
/// consecutive slots side by side: read in runs). Returns `[rows, heads * d]`.
pub fn attend<'a>(
    key_slots: &[Vec<usize>],
    layout: HeadLayout,
    scale: f32,
    queries: &[f32],
    keys: impl Into<KvRows<'a>>,
    values: impl Into<KvRows<'a>>,
) -> Vec<f32> {
    let (keys, values) = (keys.into(), values.into());
    let HeadLayout {
        num_heads,
        num_kv_heads,
        head_dim,
    } = layout;
    let group = num_heads / num_kv_heads;
    let kv_width = num_kv_heads * head_dim;
    let row_width = num_heads * head_dim;
    let rows = key_slots.len();
    assert_eq!(
        queries.len(),
        rows * row_width,
        "queries are not [rows, heads * d]"
    );
    assert!(
        keys.len() == values.len() && keys.len().is_multiple_of(kv_width.max(1)),
        "keys and values are not [kv_heads, slots, d]"
    );
    let num_slots = keys.len() / kv_width.max(1);
    let mut output = vec![0f32; rows * row_width];
    // Long rows in pieces, in parallel with each other (a long prompt's rows) and within.
    // Shorter rows keep the normalize-then-sum form below rather than one piece (sum, then
    // divide): that rounds differently, and these are the rows the golden references and
    // every short-context result were computed with.
    let inputs = Inputs {
        key_slots,
        layout,
        scale,
        queries,
        keys,
        values,
    };
    inputs.attend_long_rows(&mut output);
    // The short rows, one task per (row, KV head, part of its query heads): the query heads
    // that share a KV head read its keys and values together, once. A decode step's single
    // row is cut into enough parts for every thread (on one thread its attention was a tenth
    // of a Qwen2.5-0.5B step after 200 tokens). A head's arithmetic is the same in any
    // grouping, so the bits depend neither on the parts nor on the threads.
    let parts = group
        .min(rayon::current_num_threads().div_ceil(rows * num_kv_heads))
        .max(1);
    let part_len = group.div_ceil(parts);
    let widened = widened_once(key_slots, (keys, values), num_kv_heads, head_dim);
    let attend_part = |row_kv: usize, part: usize, out: &mut [f32]| {
        let (row, kv_head) = (row_kv / num_kv_heads, row_kv % num_kv_heads);
        let slots = &key_slots[row];
        if slots.len() > KEY_PIECE {
            return;
        }
        let first = kv_head * group + part * part_len;
        let heads = first..first + out.len() / head_dim;
        let queries: Vec<&[f32]> = heads
            .map(|head| &queries[row * row_width + head * head_dim..][..head_dim])
            .collect();
        let (n, d) = (slots.len(), head_dim);
        let head_rows = kv_head * num_slots;
        let (queries, outs) = (&queries[..], out);
        match (keys, values) {
            // Read where they lie.
            (KvRows::F32(keys), KvRows::F32(values)) => {
                let at = |i: usize| (head_rows + slots[i]) * d;
                let (key, value) = (|i| &keys[at(i)..][..d], |i| &values[at(i)..][..d]);
                attend_short(queries, n, scale, outs, key, value);
            }
            // Widened once for every row (a prompt's rows).
            _ if !widened.is_empty() => {
                let (keys, values) = &widened[kv_head];
                let (key, value) = (|i| &keys[i * d..][..d], |i| &values[i * d..][..d]);
                attend_short(queries, n, scale, outs, key, value);
            }
            // Widened into this thread's buffers first.
            kv => {
                let mut buffers = Buffers::take();
                let (keys, values) = buffers.gather(kv, slots, head_rows, d);
                let (key, value) = (|i| &keys[i * d..][..d], |i| &values[i * d..][..d]);
                attend_short(queries, n, scale, outs, key, value);
            }
        }
    };
    let work: usize = key_slots
        .iter()
        .map(Vec::len)
        .filter(|&keys| keys <= KEY_PIECE)
        .sum::<usize>()
        * row_width;
    let (kv_group_width, part_width) = (group * head_dim, part_len * head_dim);
    let mut groups: Vec<&mut [f32]> = output.chunks_mut(kv_group_width).collect();
    if work >= PARALLEL_MIN_WORK {
        for_each_chunk_mut(&mut groups, part_width, attend_part);
    } else {
        for (row_kv, outs) in groups.iter_mut().enumerate() {
            for (part, out) in outs.chunks_mut(part_width).enumerate() {
                attend_part(row_kv, part, out);
            }
        }
    }
    output
}

/// Where the keys and values are f16 or bf16 and every short row's slots begin the longest
/// short row's (a prompt's rows, each seeing the ones before it), that row's keys and values
/// of each KV head widened once (`[kv_heads]` of `[n, d]` each), of which each short row reads
/// its first keys: widening is exact, so a row gets the values it would widen itself, once
/// instead of once per row. Empty where that does not hold or would not save widening.
fn widened_once(
    key_slots: &[Vec<usize>],
    (keys, values): (KvRows<'_>, KvRows<'_>),
    num_kv_heads: usize,
    head_dim: usize,
) -> Vec<(Vec<f32>, Vec<f32>)> {
    if matches!(keys, KvRows::F32(_)) {
        return Vec::new();
    }
    let short = || key_slots.iter().filter(|slots| slots.len() <= KEY_PIECE);
    let Some(longest) = short().max_by_key(|slots| slots.len()) else {
        return Vec::new();
    };
    let total: usize = short().map(Vec::len).sum();
    if total < 2 * longest.len() || !short().all(|slots| longest.starts_with(slots)) {
        return Vec::new();
    }
    let num_slots = keys.len() / (num_kv_heads * head_dim).max(1);
    (0..num_kv_heads)
        .map(|kv_head| {
            let first = kv_head * num_slots;
            let (mut head_keys, mut head_values) = (Vec::new(), Vec::new());
            gather_rows(keys, longest, first, head_dim, &mut head_keys);
            gather_rows(values, longest, first, head_dim, &mut head_values);
            (head_keys, head_values)
        })
        .collect()
}

/// A short row's query heads of one KV head (`queries`, outputs `outs`, `[q, d]`) over its
/// `n` keys and values, the normalize-then-sum form.
fn attend_short<'a>(
    queries: &[&[f32]],
    n: usize,
    scale: f32,
    outs: &mut [f32],
    key: impl Fn(usize) -> &'a [f32],
    value: impl Fn(usize) -> &'a [f32],
) {
    thread_local! {
        /// A task's scores, `[its query heads, keys]`.
        static SCORES: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    }
    let d = outs.len() / queries.len().max(1);
    SCORES.with_borrow_mut(|scores| {
        scores.clear();
        scores.resize(queries.len() * n, 0.0);
        scaled_dots_many(queries, key, scale, scores);
        for scores in scores.chunks_exact_mut(n.max(1)) {
            softmax_in_place(scores);
        }
        weighted_sums::<false>(outs, d, scores, value);
    });
}

/// Values ahead of the one in use whose lines are requested: rows of a layer's KV store lie
/// scattered wherever a sequence's slots are, past what the hardware prefetcher follows.
const AHEAD: usize = 16;

/// Requests the cache lines of `bytes` bytes from `p` into L1 (a hint: no fault, no effect on
/// results).
#[inline(always)]
fn prefetch(p: *const i8, bytes: usize) {
    request::<false>(p, bytes);
}

/// Requests the cache lines of `bytes` bytes from `p` into L2 (a hint, as [`prefetch`]).
#[inline(always)]
fn prefetch_l2(p: *const i8, bytes: usize) {
    request::<true>(p, bytes);
}

/// [`prefetch`], or [`prefetch_l2`] where `L2`.
#[inline(always)]
fn request<const L2: bool>(p: *const i8, bytes: usize) {
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    for line in (0..bytes).step_by(64) {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0, _MM_HINT_T1};
        // SAFETY: a prefetch never faults, whatever the address.
        #[allow(unsafe_code)]
        unsafe {
            if L2 {
                _mm_prefetch::<_MM_HINT_T1>(p.wrapping_add(line))
            } else {
                _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(line))
            }
        };
    }
    #[cfg(not(all(target_arch = "x86_64", not(miri))))]
    let _ = (p, bytes);
}

/// [`attend`]'s arguments.
struct Inputs<'a> {
    key_slots: &'a [Vec<usize>],
    layout: HeadLayout,
    scale: f32,
    queries: &'a [f32],
    keys: KvRows<'a>,
    values: KvRows<'a>,
}

/// `outs[j] += weights[j * n + i] * value(i)` for each value in order, element by element
/// (so the same bits on every build), with `outs` `[q, width]` and `weights` `[q, n]`. In
/// 512-bit vectors where the CPU has them, with a few vectors of each output kept in registers
/// across all the values (added into memory, value after value, each add waited on the store
/// before it: 160 rows of 64 values in L2 here, 7.5-11.3 -> 4.7 ns a row), and each value
/// loaded once for up to four outputs (query heads that share a KV head).
///
/// `FUSED` does each `+=` as one fused multiply-add (`f32::mul_add`, one rounding: half the
/// vector instructions) where it is set; the rows whose bits the golden references fix keep
/// the separate multiply and add.
fn weighted_sums<'a, const FUSED: bool>(
    outs: &mut [f32],
    width: usize,
    weights: &[f32],
    value: impl Fn(usize) -> &'a [f32],
) {
    let queries = outs.len().checked_div(width).unwrap_or(0);
    if queries == 0 {
        return;
    }
    assert!(
        weights.len().is_multiple_of(queries),
        "weights are not [q, n]"
    );
    let n = weights.len() / queries;
    let layout = WeightLayout {
        n,
        query: n,
        key: 1,
    };
    weighted_sums_laid::<FUSED, _>(outs, width, weights, layout, value);
}

/// Where query `j`'s weight of value `i` lies: `weights[j * query + i * key]`, `i < n`.
#[derive(Clone, Copy)]
struct WeightLayout {
    n: usize,
    query: usize,
    key: usize,
}

/// [`weighted_sums`] with the weights laid out as `layout` says (the piece kernel's terms
/// are `[key][query]`), over value rows of f32 or of f16 widened as they are loaded.
fn weighted_sums_laid<'a, const FUSED: bool, E: Element>(
    outs: &mut [f32],
    width: usize,
    weights: &[f32],
    layout: WeightLayout,
    value: impl Fn(usize) -> &'a [E],
) {
    let queries = outs.len().checked_div(width).unwrap_or(0);
    if queries == 0 {
        return;
    }
    assert_eq!(outs.len(), queries * width, "outputs are not [q, width]");
    let WeightLayout { n, query, key } = layout;
    if n > 0 {
        let last = (queries - 1) * query + (n - 1) * key;
        assert!(last < weights.len(), "weights past their slice");
    }
    #[cfg(target_arch = "x86_64")]
    if width.is_multiple_of(8) && crate::cpu::allows(crate::cpu::Level::Avx2) {
        let rows = Listed::values(n, width, &value);
        return weighted_sums_listed::<FUSED, _>(outs, weights, layout, &rows);
    }
    for (j, out) in outs.chunks_exact_mut(width).enumerate() {
        let weights = (0..n).map(|i| weights[j * query + i * key]);
        weighted_sum_portable::<FUSED, _>(out, weights, (0..n).map(&value));
    }
}

/// [`weighted_sums_laid`] over listed values (`outs` `[q, rows.width()]`), in 512-bit vectors
/// where the CPU has AVX-512 F and the width is whole vectors of them, else in 256-bit ones:
/// only for CPUs with AVX2 and FMA and widths of whole 8-lane vectors (checked).
#[cfg(target_arch = "x86_64")]
fn weighted_sums_listed<const FUSED: bool, E: Element>(
    outs: &mut [f32],
    weights: &[f32],
    layout: WeightLayout,
    rows: &Listed<'_, E>,
) {
    use crate::cpu::{allows, Level};
    let width = rows.width();
    let WeightLayout { n, query, key } = layout;
    let queries = outs.len().checked_div(width).unwrap_or(0);
    assert_eq!(outs.len(), queries * width, "outputs are not [q, width]");
    assert_eq!(rows.rows().len(), n, "a row for each value");
    if queries == 0 {
        return;
    }
    if n > 0 {
        let last = (queries - 1) * query + (n - 1) * key;
        assert!(last < weights.len(), "weights past their slice");
    }
    let rows = rows.rows();
    // SAFETY (both): the level includes the features the function is compiled for, found on
    // this CPU; every row is `width` long (`Listed`).
    if width.is_multiple_of(16) && allows(Level::Avx512) {
        #[allow(unsafe_code)]
        return unsafe { all_queries_avx512::<FUSED, _>(outs, width, weights, layout, rows) };
    }
    assert!(
        width.is_multiple_of(8) && allows(Level::Avx2),
        "listed weighted sums need AVX2 and whole vectors"
    );
    #[allow(unsafe_code)]
    unsafe {
        all_queries_avx2::<FUSED, _>(outs, width, weights, layout, rows)
    }
}

/// The vector versions of [`weighted_sums`] for one instruction set: `$all` runs every query
/// (`outs.len() / width` of them), up to four at a time (the query heads of a KV head share
/// each value load; with `$wide`, 32 vector registers, six or eight) through `$sums`, which
/// takes the first `Q` outputs (`outs` and `weights` start at the first) and returns `Q`;
/// `$tile` runs vectors `first..first + N` (`$lanes` values each) of them through all the
/// values, in registers. Element-wise the same operations as the portable loop, so the same
/// bits.
#[cfg(target_arch = "x86_64")]
macro_rules! weighted_sums_in {
    ($all:ident, $sums:ident, $tile:ident, $features:literal, $vector:ident, $lanes:literal,
     $wide:literal, $load:ident, $widen:ident, $store:ident, $set1:ident, $fmadd:ident, $mul:ident,
     $add:ident) => {
        #[allow(unsafe_code)]
        #[target_feature(enable = $features)]
        unsafe fn $all<const FUSED: bool, E: Element>(
            outs: &mut [f32],
            width: usize,
            weights: &[f32],
            layout: WeightLayout,
            rows: &[*const E],
        ) {
            let queries = outs.len() / width;
            let mut first = 0;
            while first < queries {
                let (outs, weights) =
                    (&mut outs[first * width..], &weights[first * layout.query..]);
                // A decode row's query heads of a KV head in one pass where the registers
                // hold them: Qwen2.5's 6 or 7 read the values twice instead of four times.
                first += match queries - first {
                    1 => $sums::<1, 4, FUSED, E>(outs, width, weights, layout, rows),
                    2 | 3 => $sums::<2, 4, FUSED, E>(outs, width, weights, layout, rows),
                    5 if $wide => $sums::<5, 4, FUSED, E>(outs, width, weights, layout, rows),
                    6 if $wide => $sums::<6, 4, FUSED, E>(outs, width, weights, layout, rows),
                    7 if $wide => $sums::<7, 3, FUSED, E>(outs, width, weights, layout, rows),
                    8.. if $wide => $sums::<8, 3, FUSED, E>(outs, width, weights, layout, rows),
                    _ => $sums::<4, 4, FUSED, E>(outs, width, weights, layout, rows),
                };
            }
        }

        #[allow(unsafe_code)]
        #[target_feature(enable = $features)]
        unsafe fn $sums<const Q: usize, const TILE: usize, const FUSED: bool, E: Element>(
            outs: &mut [f32],
            width: usize,
            weights: &[f32],
            layout: WeightLayout,
            rows: &[*const E],
        ) -> usize {
            // `TILE`: vectors of each output per pass over the values (at most 4).
            let vectors = width / $lanes;
            let full = vectors / TILE * TILE;
            for first in (0..full).step_by(TILE) {
                $tile::<Q, TILE, FUSED, E>(outs, width, weights, layout, rows, first);
            }
            match vectors - full {
                1 => $tile::<Q, 1, FUSED, E>(outs, width, weights, layout, rows, full),
                2 => $tile::<Q, 2, FUSED, E>(outs, width, weights, layout, rows, full),
                3 => $tile::<Q, 3, FUSED, E>(outs, width, weights, layout, rows, full),
                _ => {}
            }
            Q
        }

        /// `rows`: the values' rows, `n` of them, each `width` elements of `E` ([`Listed`]).
        #[allow(unsafe_code)]
        #[inline]
        #[target_feature(enable = $features)]
        unsafe fn $tile<const Q: usize, const N: usize, const FUSED: bool, E: Element>(
            outs: &mut [f32],
            width: usize,
            weights: &[f32],
            layout: WeightLayout,
            rows: &[*const E],
            first: usize,
        ) {
            use std::arch::x86_64::*;
            let WeightLayout { n, query, key } = layout;
            assert!($lanes * (first + N) <= width, "tile past the output");
            assert!(outs.len() >= Q * width, "fewer than Q outputs");
            assert_eq!(rows.len(), n, "a row for each value");
            assert!(
                n == 0 || (Q - 1) * query + (n - 1) * key < weights.len(),
                "fewer than Q queries' weights"
            );
            let at = |j: usize, t: usize| j * width + $lanes * (first + t);
            // SAFETY (the loads and stores): `at(j, t) + $lanes <= outs.len()` for `j < Q`,
            // `t < N` (checked), every row is `width` long (`Listed` checked), and
            // every weight read is at most the last one checked above. Checked indexing here
            // cost a compare and branch per weight and row: more instructions than the
            // multiply-adds, which then waited on the front end.
            let mut acc: [[std::arch::x86_64::$vector; N]; Q] = std::array::from_fn(|j| {
                std::array::from_fn(|t| unsafe { $load(outs.as_ptr().add(at(j, t))) })
            });
            // The first pass over the values asks for whole rows ahead; the later passes
            // find them in cache.
            let ahead = if first == 0 {
                n.saturating_sub(AHEAD)
            } else {
                0
            };
            for (i, &row) in rows.iter().enumerate() {
                if i < ahead {
                    prefetch(rows[i + AHEAD].cast(), size_of::<E>() * width);
                }
                let row = row.add($lanes * first);
                let v: [std::arch::x86_64::$vector; N] =
                    std::array::from_fn(|t| unsafe { E::$widen(row.add($lanes * t)) });
                let w = weights.as_ptr().add(i * key);
                for (j, acc) in acc.iter_mut().enumerate() {
                    let weight = $set1(*w.add(j * query));
                    for (acc, v) in acc.iter_mut().zip(v) {
                        *acc = if FUSED {
                            $fmadd(weight, v, *acc)
                        } else {
                            $add(*acc, $mul(weight, v))
                        };
                    }
                }
            }
            for (j, acc) in acc.iter().enumerate() {
                for (t, acc) in acc.iter().enumerate() {
                    unsafe { $store(outs.as_mut_ptr().add(at(j, t)), *acc) };
                }
            }
        }
    };
}

#[cfg(target_arch = "x86_64")]
weighted_sums_in!(
    all_queries_avx512,
    weighted_sums_avx512,
    weighted_tile_avx512,
    "avx512f,fma",
    __m512,
    16,
    true,
    _mm512_loadu_ps,
    load16,
    _mm512_storeu_ps,
    _mm512_set1_ps,
    _mm512_fmadd_ps,
    _mm512_mul_ps,
    _mm512_add_ps
);
#[cfg(target_arch = "x86_64")]
weighted_sums_in!(
    all_queries_avx2,
    weighted_sums_avx2,
    weighted_tile_avx2,
    "avx2,fma,f16c",
    __m256,
    8,
    false,
    _mm256_loadu_ps,
    load8,
    _mm256_storeu_ps,
    _mm256_set1_ps,
    _mm256_fmadd_ps,
    _mm256_mul_ps,
    _mm256_add_ps
);

#[inline(always)]
fn weighted_sum_portable<'a, const FUSED: bool, E: Element>(
    out: &mut [f32],
    weights: impl Iterator<Item = f32>,
    values: impl Iterator<Item = &'a [E]>,
) {
    for (weight, value) in weights.zip(values) {
        for (o, v) in out.iter_mut().zip(value) {
            let v = v.widen();
            *o = if FUSED {
                weight.mul_add(v, *o)
            } else {
                *o + weight * v
            };
        }
    }
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

#[cfg(test)]
mod tests;
