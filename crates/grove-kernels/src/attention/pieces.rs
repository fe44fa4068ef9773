//! The rows that see more than [`KEY_PIECE`] keys: attention in pieces of that many keys per
//! KV head, whose partial softmaxes run in parallel and combine in order.
//!
//! Rows whose pieces see the same keys compute each such piece once, together: a verify's tree
//! rows over their shared context, a prompt's rows over the full pieces before them. The
//! piece's keys and values are then read once for all those rows' query heads instead of once
//! per row (64 tree rows over 4096 tokens of context read each layer's keys and values 64
//! times). Each query's arithmetic is the same whoever shares its piece (`lanes.rs` gives
//! each query a vector lane of its own), and a row is cut by its own ordered keys only, so a
//! token decoded alone, verified in a tree or batched gets the same bits.

use half::bf16;

use super::dot::{self, DotKeys};
use super::lanes::{one_pass, pass_blocks, piece_in_lanes, PieceKeys};
use super::{Buffers, Element, HeadLayout, Inputs, KvRows, KEY_PIECE};
use crate::strips::Bf16Arithmetic;
use crate::threads::{balanced_order, for_each_chunk_mut};

/// One piece's keys and the long rows that see exactly them, in row order.
struct Job {
    piece: usize,
    rows: Vec<usize>,
}

/// A job's softmax for one KV head before normalization, per (row of the job, query head of
/// the KV head's group), in that order: the largest score, the sum of `exp(score - largest)`
/// and the values weighted by those terms.
pub(super) struct Piece {
    pub max: Vec<f32>,
    pub sum: Vec<f32>,
    pub out: Vec<f32>,
}

/// Piece `p` of a row's ordered key slots.
fn piece_slots(slots: &[usize], p: usize) -> &[usize] {
    &slots[p * KEY_PIECE..((p + 1) * KEY_PIECE).min(slots.len())]
}

/// The jobs of the long rows, and for each row its pieces' (job, position among the job's
/// rows), in piece order. A piece joins the last job of its index when that job sees the same
/// keys: the rows that share pieces are neighbours (a tree's rows, a prompt's), and comparing
/// with the neighbour only keeps planning linear.
fn plan(key_slots: &[Vec<usize>]) -> (Vec<Job>, Vec<Vec<(usize, usize)>>) {
    let mut jobs: Vec<Job> = Vec::new();
    let mut places = vec![Vec::new(); key_slots.len()];
    let mut latest: Vec<usize> = Vec::new();
    for (row, slots) in key_slots.iter().enumerate() {
        if slots.len() <= KEY_PIECE {
            continue;
        }
        for p in 0..slots.len().div_ceil(KEY_PIECE) {
            let keys = piece_slots(slots, p);
            let shared = latest.get(p).copied().filter(|&job| {
                let first = jobs[job].rows[0];
                piece_slots(&key_slots[first], p) == keys
            });
            let job = shared.unwrap_or_else(|| {
                jobs.push(Job {
                    piece: p,
                    rows: Vec::new(),
                });
                if latest.len() <= p {
                    latest.resize(p + 1, 0);
                }
                latest[p] = jobs.len() - 1;
                jobs.len() - 1
            });
            places[row].push((job, jobs[job].rows.len()));
            jobs[job].rows.push(row);
        }
    }
    (jobs, places)
}

impl Inputs<'_> {
    /// The long rows' outputs (the other rows' are left as they are).
    pub(super) fn attend_long_rows(&self, output: &mut [f32]) {
        let (jobs, places) = plan(self.key_slots);
        if jobs.is_empty() {
            return;
        }
        let kv_heads = self.layout.num_kv_heads;
        // Piece `i` is job `i / kv_heads`'s for KV head `i % kv_heads`, costing its queries
        // times its keys; run in an order that starts the threads on even shares.
        let costs: Vec<usize> = (0..jobs.len() * kv_heads)
            .map(|i| {
                let job = &jobs[i / kv_heads];
                job.rows.len() * piece_slots(&self.key_slots[job.rows[0]], job.piece).len()
            })
            .collect();
        let order = balanced_order(&costs);
        let mut ran: Vec<Option<Piece>> = (0..order.len()).map(|_| None).collect();
        for_each_chunk_mut(&mut [&mut ran], 1, |_, p, piece| {
            let i = order[p];
            piece[0] = Some(self.piece(&jobs[i / kv_heads], i % kv_heads));
        });
        let mut pieces: Vec<Option<Piece>> = (0..order.len()).map(|_| None).collect();
        for (&i, piece) in order.iter().zip(ran) {
            pieces[i] = piece;
        }
        let pieces: Vec<Piece> = pieces
            .into_iter()
            .map(|p| p.expect("every piece ran"))
            .collect();
        // Through `for_each_chunk_mut`, as the pieces: inside a forward its polling helpers
        // take the rows at once, where a rayon job waited for one to look at rayon's queues.
        let row_width = self.layout.num_heads * self.layout.head_dim;
        for_each_chunk_mut(&mut [output], row_width, |_, row, out_row| {
            if !places[row].is_empty() {
                self.combine(&pieces, &places[row], out_row);
            }
        });
    }

    /// One row's pieces (`places`: its (job, position) per piece, in order) combined into its
    /// output.
    fn combine(&self, pieces: &[Piece], places: &[(usize, usize)], out_row: &mut [f32]) {
        let HeadLayout {
            num_kv_heads,
            head_dim,
            ..
        } = self.layout;
        let group = self.layout.group();
        for kv_head in 0..num_kv_heads {
            // Each piece of the row, and where the row's query heads start in it.
            let parts: Vec<(&Piece, usize)> = places
                .iter()
                .map(|&(job, at)| (&pieces[job * num_kv_heads + kv_head], at * group))
                .collect();
            for g in 0..group {
                let max = parts
                    .iter()
                    .fold(f32::NEG_INFINITY, |m, (p, at)| m.max(p.max[at + g]));
                let weights: Vec<f32> = parts
                    .iter()
                    .map(|(p, at)| (p.max[at + g] - max).exp())
                    .collect();
                let sum: f32 = (parts.iter().zip(&weights))
                    .map(|((p, at), w)| p.sum[at + g] * w)
                    .sum();
                let head = kv_head * group + g;
                let out = &mut out_row[head * head_dim..][..head_dim];
                for ((piece, at), weight) in parts.iter().zip(&weights) {
                    let part = &piece.out[(at + g) * head_dim..][..head_dim];
                    for (o, v) in out.iter_mut().zip(part) {
                        *o += weight * v;
                    }
                }
                let inverse = 1.0 / sum;
                for o in out.iter_mut() {
                    *o *= inverse;
                }
            }
        }
    }

    fn piece(&self, job: &Job, kv_head: usize) -> Piece {
        if let (KvRows::Bf16(keys), KvRows::Bf16(values)) = (self.keys, self.values) {
            if Bf16Arithmetic::here() == Bf16Arithmetic::Dot {
                return self.piece_dot(job, kv_head, keys, values);
            }
        }
        #[cfg(target_arch = "x86_64")]
        if crate::cpu::allows(crate::cpu::Level::Avx512) {
            // SAFETY: the level includes the feature `piece_avx512` is compiled for, found on
            // this CPU.
            #[allow(unsafe_code)]
            return unsafe { self.piece_avx512(job, kv_head) };
        }
        #[cfg(target_arch = "x86_64")]
        if crate::cpu::allows(crate::cpu::Level::Avx2) {
            // SAFETY: as above, for `piece_avx2`'s features.
            #[allow(unsafe_code)]
            return unsafe { self.piece_avx2(job, kv_head) };
        }
        self.piece_portable::<8, false>(job, kv_head)
    }

    /// The piece over bfloat16 rows in bfloat16 arithmetic (`dot.rs`), its rows read where
    /// they lie.
    fn piece_dot(&self, job: &Job, kv_head: usize, keys: &[bf16], values: &[bf16]) -> Piece {
        let (queries, slots) = self.piece_queries(job, kv_head);
        let d = self.layout.head_dim;
        let head_rows = kv_head * (keys.len() / (self.layout.num_kv_heads * d));
        let at = |i: usize| (head_rows + slots[i]) * d;
        let keys = DotKeys {
            n: slots.len(),
            key: |i: usize| &keys[at(i)..][..d],
            value: |i: usize| &values[at(i)..][..d],
        };
        dot::piece(&queries, d, self.scale, &keys)
    }

    /// The queries of a job's rows for one KV head (its group of query heads, row after row),
    /// and the job's piece of key slots.
    fn piece_queries(&self, job: &Job, kv_head: usize) -> (Vec<&[f32]>, &[usize]) {
        let (group, head_dim) = (self.layout.group(), self.layout.head_dim);
        let row_width = self.layout.num_heads * head_dim;
        let queries = (job.rows.iter())
            .flat_map(|&row| {
                let heads = kv_head * group..(kv_head + 1) * group;
                heads
                    .map(move |head| &self.queries[row * row_width + head * head_dim..][..head_dim])
            })
            .collect();
        (
            queries,
            piece_slots(&self.key_slots[job.rows[0]], job.piece),
        )
    }

    /// The same loops in 256-bit vectors, with FMA for the fused multiply-adds (the portable
    /// build makes each a call to libm's `fmaf`); a piece of a few queries (a decode row's)
    /// with the keys across the lanes (`across.rs`, the same bits).
    #[cfg(target_arch = "x86_64")]
    #[allow(unsafe_code)]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn piece_avx2(&self, job: &Job, kv_head: usize) -> Piece {
        self.piece_portable::<8, true>(job, kv_head)
    }

    /// The same loops in 512-bit vectors, sixteen queries a block (lane by lane, so the same
    /// bits as the portable build, which only has SSE2); a piece of up to 8 queries (a decode
    /// row's) with 16 keys across the lanes (`across.rs`, the same bits).
    #[cfg(target_arch = "x86_64")]
    #[allow(unsafe_code)]
    #[target_feature(enable = "avx512f,avx2,fma")]
    unsafe fn piece_avx512(&self, job: &Job, kv_head: usize) -> Piece {
        self.piece_portable::<16, true>(job, kv_head)
    }

    /// `L` lanes per block of queries: 8 for 256-bit vectors, 16 for 512-bit ones (the bits
    /// are the same at either). `ACROSS`: a few queries take `across.rs`'s form in vectors of
    /// `L` lanes (only where the caller has AVX2 and FMA, and AVX-512 F for 16).
    #[inline(always)]
    fn piece_portable<const L: usize, const ACROSS: bool>(
        &self,
        job: &Job,
        kv_head: usize,
    ) -> Piece {
        let (layout, head_dim) = (self.layout, self.layout.head_dim);
        let num_slots = self.keys.len() / (layout.num_kv_heads * head_dim);
        let (queries, slots) = self.piece_queries(job, kv_head);
        let (n, d, head_rows) = (slots.len(), head_dim, kv_head * num_slots);
        let at = |i: usize| (head_rows + slots[i]) * d;
        let direct = queries.len() <= DIRECT_PASSES * passes::<L>(queries.len());
        match (self.keys, self.values) {
            // Read where they lie.
            (KvRows::F32(keys), KvRows::F32(values)) => {
                let keys = PieceKeys {
                    n,
                    key: |i: usize| &keys[at(i)..][..d],
                    value: |i: usize| &values[at(i)..][..d],
                };
                self.piece_of::<L, ACROSS, _>(&queries, &keys, direct)
            }
            // Read where they lie too, widened as they are loaded (a tile of keys at a time in
            // the lanes form), but for more than `DIRECT_PASSES` passes (a large tree's, a
            // prompt's): widened into this thread's buffers first, once for all passes.
            (KvRows::F16(keys), KvRows::F16(values)) if direct => {
                let keys = PieceKeys {
                    n,
                    key: |i: usize| &keys[at(i)..][..d],
                    value: |i: usize| &values[at(i)..][..d],
                };
                self.piece_of::<L, ACROSS, _>(&queries, &keys, true)
            }
            kv => {
                let mut buffers = Buffers::take();
                let (keys, values) = buffers.gather(kv, slots, head_rows, d);
                let keys = PieceKeys {
                    n,
                    key: |i: usize| &keys[i * d..][..d],
                    value: |i: usize| &values[i * d..][..d],
                };
                self.piece_of::<L, ACROSS, _>(&queries, &keys, false)
            }
        }
    }

    /// [`Self::piece_portable`] once the piece's queries and rows are listed: the keys across
    /// the lanes where that form takes the queries, else the lanes form, in passes of
    /// [`one_pass`]'s worth of queries where `in_passes` (each pass's rows from L2 after the
    /// first, nothing packed; a query's bits do not depend on its company).
    #[inline(always)]
    fn piece_of<'a, const L: usize, const ACROSS: bool, E: Element>(
        &self,
        queries: &[&[f32]],
        keys: &PieceKeys<impl Fn(usize) -> &'a [E], impl Fn(usize) -> &'a [E]>,
        in_passes: bool,
    ) -> Piece {
        if ACROSS {
            if let Some(piece) = self.across::<L, _>(queries, keys) {
                return piece;
            }
        }
        let (d, scale) = (self.layout.head_dim, self.scale);
        if !in_passes {
            return piece_in_lanes::<L, _>(queries, d, scale, keys);
        }
        // No closure or iterator adapter here: it would be compiled without this function's
        // target features.
        let mut all: Option<Piece> = None;
        for pass in queries.chunks(passes::<L>(queries.len())) {
            let part = piece_in_lanes::<L, _>(pass, d, scale, keys);
            match &mut all {
                None => all = Some(part),
                Some(all) => {
                    all.max.extend(part.max);
                    all.sum.extend(part.sum);
                    all.out.extend(part.out);
                }
            }
        }
        all.expect("a piece has queries")
    }

    /// The piece with the keys across `L` lanes (`across.rs`), where that form takes these
    /// queries. Only `piece_avx2` (L = 8) and `piece_avx512` (L = 16) ask, and only where the
    /// CPU has their features.
    #[inline(always)]
    fn across<'a, const L: usize, E: Element>(
        &self,
        queries: &[&[f32]],
        keys: &PieceKeys<impl Fn(usize) -> &'a [E], impl Fn(usize) -> &'a [E]>,
    ) -> Option<Piece> {
        let head_dim = self.layout.head_dim;
        // SAFETY: as the callers promise (above).
        #[cfg(target_arch = "x86_64")]
        #[allow(unsafe_code)]
        return unsafe {
            if L == 16 {
                super::across::piece_avx512(queries, head_dim, self.scale, keys)
            } else {
                super::across::piece_avx2(queries, head_dim, self.scale, keys)
            }
        };
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = (queries, keys, head_dim);
            None
        }
    }
}

/// The most passes over a piece's f16 rows where they lie. Each pass after the first reads the
/// piece's rows from L2 and widens its key tiles again; past this many (a 64-row tree's 384
/// queries at 16 lanes) widening the piece once and packing it for all passes costs less.
const DIRECT_PASSES: usize = 4;

/// Queries a pass takes: [`pass_blocks`]' blocks of `L` (each pass [`one_pass`]'s).
fn passes<const L: usize>(queries: usize) -> usize {
    let per_pass = pass_blocks::<L>(queries.div_ceil(L)).max(1) * L;
    debug_assert!(one_pass::<L>(per_pass));
    per_pass
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_that_see_the_same_keys_share_a_piece() {
        // Three tree rows over 600 context slots (pieces 0-255, 256-511 shared; the last
        // piece holds each row's own path), a short row, then causal rows 513 and 514 over the
        // same first slots.
        let context: Vec<usize> = (0..600).collect();
        let tree = [vec![600], vec![600, 601], vec![602]];
        let mut key_slots: Vec<Vec<usize>> = tree
            .iter()
            .map(|path| context.iter().chain(path).copied().collect())
            .collect();
        key_slots.push((0..10).collect());
        key_slots.extend([(0..513).collect(), (0..514).collect()]);
        let (jobs, places) = plan(&key_slots);
        let rows: Vec<&[usize]> = jobs.iter().map(|job| job.rows.as_slice()).collect();
        // Two full pieces every long row sees, then each row's own last piece.
        assert_eq!(
            rows,
            [
                &[0, 1, 2, 4, 5][..],
                &[0, 1, 2, 4, 5],
                &[0],
                &[1],
                &[2],
                &[4],
                &[5]
            ]
        );
        assert_eq!(places[1], [(0, 1), (1, 1), (3, 0)]);
        assert!(places[3].is_empty());
        assert_eq!(places[5], [(0, 4), (1, 4), (6, 0)]);
    }

    #[test]
    fn a_piece_in_vectors_has_the_portable_bits() {
        let layout = HeadLayout {
            num_heads: 4,
            num_kv_heads: 2,
            head_dim: 32,
        };
        let wave = |n: usize, seed: f32| -> Vec<f32> {
            (0..n)
                .map(|i| ((i as f32 + seed) * 0.291).sin() * 3.0)
                .collect()
        };
        // Up to 100 rows over the same keys: 2 query heads per KV head each, so a piece of 4
        // to 200 queries (one pass, several, even and uneven, and more than the direct passes
        // over f16 rows at 8 and at 16 lanes).
        let slots: Vec<Vec<usize>> = vec![(0..700).rev().collect(); 100];
        let (keys, values) = (wave(700 * 64, 1.0), wave(700 * 64, 2.0));
        let queries = wave(100 * 128, 3.0);
        let inputs = Inputs {
            key_slots: &slots,
            layout,
            scale: 0.2,
            queries: &queries,
            keys: (&keys).into(),
            values: (&values).into(),
        };
        // The same rows kept as f16 against f32 rows of the rounded values.
        let half =
            |v: &[f32]| -> Vec<half::f16> { v.iter().map(|&x| half::f16::from_f32(x)).collect() };
        let (half_keys, half_values) = (half(&keys), half(&values));
        let widen = |v: &[half::f16]| -> Vec<f32> { v.iter().map(|h| h.to_f32()).collect() };
        let (wide_keys, wide_values) = (widen(&half_keys), widen(&half_values));
        let halves = Inputs {
            keys: KvRows::F16(&half_keys),
            values: KvRows::F16(&half_values),
            ..inputs
        };
        let widened = Inputs {
            keys: (&wide_keys).into(),
            values: (&wide_values).into(),
            ..inputs
        };
        use crate::cpu::{level, Level};
        let test = "a_piece_in_vectors_has_the_portable_bits";
        crate::skip_without("avx512", level() >= Level::Avx512, test);
        if crate::skip_without("avx2", level() >= Level::Avx2, test) {
            return;
        }
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        for (piece, rows) in (0..3).flat_map(|p| [2, 9, 20, 25, 70, 100].map(|rows| (p, rows))) {
            let job = Job {
                piece,
                rows: (0..rows).collect(),
            };
            for (kv_head, half) in [(0, false), (1, false), (0, true), (1, true)] {
                let (a, b) = if half {
                    let vector = halves.piece(&job, kv_head);
                    (vector, widened.piece_portable::<8, false>(&job, kv_head))
                } else {
                    let vector = inputs.piece(&job, kv_head);
                    (vector, inputs.piece_portable::<8, false>(&job, kv_head))
                };
                assert_eq!(bits(&a.max), bits(&b.max));
                assert_eq!(
                    bits(&a.sum),
                    bits(&b.sum),
                    "piece {piece}, {rows} rows, KV head {kv_head}, f16 {half}"
                );
                assert_eq!(
                    bits(&a.out),
                    bits(&b.out),
                    "piece {piece}, {rows} rows, KV head {kv_head}, f16 {half}"
                );
            }
        }
    }
}
