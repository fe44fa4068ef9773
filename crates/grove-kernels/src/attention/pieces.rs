//! The rows that see more than [`KEY_PIECE`] keys: attention in pieces of that many keys per
//! KV head, whose partial softmaxes run in parallel and combine in order.
//!
//! Rows whose pieces see the same keys compute each such piece once, together: a verify's tree
//! rows over their shared context, a prompt's rows over the full pieces before them. The
//! piece's keys and values are then read once for all those rows' query heads instead of once
//! per row (64 tree rows over 4096 tokens of context read each layer's keys and values 64
//! times). Each query's arithmetic is the same whoever shares its piece (`scaled_dots_many`
//! and `weighted_sums` work query by query, element by element), and a row is cut by its own
//! ordered keys only, so a token decoded alone, verified in a tree or batched gets the same
//! bits.

use std::cell::RefCell;

use rayon::prelude::*;

use super::{weighted_sums, HeadLayout, Inputs, KEY_PIECE};
use crate::dense::scaled_dots_many;
use crate::threads::for_each_chunk_mut;

/// One piece's keys and the long rows that see exactly them, in row order.
struct Job {
    piece: usize,
    rows: Vec<usize>,
}

/// A job's softmax for one KV head before normalization, per (row of the job, query head of
/// the KV head's group), in that order: the largest score, the sum of `exp(score - largest)`
/// and the values weighted by those terms.
struct Piece {
    max: Vec<f32>,
    sum: Vec<f32>,
    out: Vec<f32>,
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
        let mut pieces: Vec<Option<Piece>> = (0..jobs.len() * kv_heads).map(|_| None).collect();
        for_each_chunk_mut(&mut [&mut pieces], 1, |_, i, piece| {
            piece[0] = Some(self.piece(&jobs[i / kv_heads], i % kv_heads));
        });
        let pieces: Vec<Piece> = pieces
            .into_iter()
            .map(|p| p.expect("every piece ran"))
            .collect();
        let row_width = self.layout.num_heads * self.layout.head_dim;
        output
            .par_chunks_mut(row_width)
            .zip(places.par_iter())
            .filter(|(_, places)| !places.is_empty())
            .for_each(|(out_row, places)| self.combine(&pieces, places, out_row));
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
        self.piece_portable(job, kv_head)
    }

    /// The same loops in 256-bit vectors, with FMA for the fused multiply-adds (the portable
    /// build makes each a call to libm's `fmaf`).
    #[cfg(target_arch = "x86_64")]
    #[allow(unsafe_code)]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn piece_avx2(&self, job: &Job, kv_head: usize) -> Piece {
        self.piece_portable(job, kv_head)
    }

    /// The same loops in 512-bit vectors (element-wise, so the same bits as the portable
    /// build, which only has SSE2).
    #[cfg(target_arch = "x86_64")]
    #[allow(unsafe_code)]
    #[target_feature(enable = "avx512f")]
    unsafe fn piece_avx512(&self, job: &Job, kv_head: usize) -> Piece {
        self.piece_portable(job, kv_head)
    }

    #[inline(always)]
    fn piece_portable(&self, job: &Job, kv_head: usize) -> Piece {
        let (layout, head_dim) = (self.layout, self.layout.head_dim);
        let group = layout.group();
        let (kv_width, row_width) = (layout.num_kv_heads * head_dim, layout.num_heads * head_dim);
        let kv_offset = kv_head * head_dim;
        let slots = piece_slots(&self.key_slots[job.rows[0]], job.piece);
        let n = slots.len();
        let key = |i: usize| &self.keys[slots[i] * kv_width + kv_offset..][..head_dim];
        let queries: Vec<&[f32]> = (job.rows.iter())
            .flat_map(|&row| {
                let heads = kv_head * group..(kv_head + 1) * group;
                heads
                    .map(move |head| &self.queries[row * row_width + head * head_dim..][..head_dim])
            })
            .collect();
        thread_local! {
            /// A job's scores, `[its query heads, keys]`: kept, since a fresh vector of a few
            /// hundred KiB per job is a fresh mapping (page faults, and its unmapping's TLB
            /// shootdowns on the other cores).
            static SCORES: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
        }
        SCORES.with_borrow_mut(|scores| {
            scores.clear();
            scores.resize(queries.len() * n, 0.0);
            scaled_dots_many(&queries, key, self.scale, scores);
            let mut max = vec![f32::NEG_INFINITY; queries.len()];
            let mut sum = vec![0f32; queries.len()];
            for (q, scores) in scores.chunks_exact_mut(n).enumerate() {
                max[q] = largest(scores);
                sum[q] = exp_and_sum(scores, max[q]);
            }
            let mut out = vec![0f32; queries.len() * head_dim];
            let value = |i: usize| &self.values[slots[i] * kv_width + kv_offset..][..head_dim];
            weighted_sums::<true>(&mut out, head_dim, scores, value);
            Piece { max, sum, out }
        })
    }
}

/// Lanes of the piece loops below: written as 16 independent sums (and maxima) so that the
/// compiler makes them vector instructions on every build, the same operations in the same
/// order on each (a single running sum was a chain of dependent adds, one per key and query
/// head: the longest part of a long row's softmax).
const LANES: usize = 16;

/// The largest of `scores` (not empty).
#[inline(always)]
fn largest(scores: &[f32]) -> f32 {
    let mut lanes = [f32::NEG_INFINITY; LANES];
    let mut chunks = scores.chunks_exact(LANES);
    for chunk in &mut chunks {
        for (lane, &score) in lanes.iter_mut().zip(chunk) {
            *lane = lane.max(score);
        }
    }
    for (lane, &score) in lanes.iter_mut().zip(chunks.remainder()) {
        *lane = lane.max(score);
    }
    lanes.into_iter().fold(f32::NEG_INFINITY, f32::max)
}

/// `scores[i] = e^(scores[i] - max)` for scores at most `max`, and their sum (16 partial sums
/// added in lane order).
#[inline(always)]
fn exp_and_sum(scores: &mut [f32], max: f32) -> f32 {
    let mut lanes = [0f32; LANES];
    let mut chunks = scores.chunks_exact_mut(LANES);
    for chunk in &mut chunks {
        for (lane, score) in lanes.iter_mut().zip(chunk) {
            *score = exp_nonpositive(*score - max);
            *lane += *score;
        }
    }
    for (lane, score) in lanes.iter_mut().zip(chunks.into_remainder()) {
        *score = exp_nonpositive(*score - max);
        *lane += *score;
    }
    lanes.into_iter().sum()
}

/// `e^x` for `x <= 0` within 2 ulp, in plain f32 arithmetic that vectorizes (libm's `expf`
/// is a call per value). Cody and Waite's reduction `x = k ln 2 + r` and Cephes' degree-6
/// polynomial for `e^r` (Moshier, Cephes Math Library, `expf.c`); `x` below -87 counts as
/// -87 (`e^-87` is 6e-39 of the row's largest term, which is 1).
#[inline(always)]
fn exp_nonpositive(x: f32) -> f32 {
    // Adding and subtracting 1.5 * 2^23 rounds to the nearest integer without a call.
    const ROUND: f32 = 12_582_912.0;
    const LN2_HIGH: f32 = 0.693_359_4;
    const LN2_LOW: f32 = -2.121_944_4e-4;
    let x = x.max(-87.0);
    let k = (x * std::f32::consts::LOG2_E + ROUND) - ROUND;
    let r = (x - k * LN2_HIGH) - k * LN2_LOW;
    let p = 1.987_569_1e-4_f32;
    let p = p * r + 1.398_199_9e-3;
    let p = p * r + 8.333_452e-3;
    let p = p * r + 4.166_579_6e-2;
    let p = p * r + 1.666_666_5e-1;
    let p = p * r + 0.5;
    let y = p * (r * r) + r + 1.0;
    // 2^k as the bits of its exponent (k >= -126: a normal float).
    y * f32::from_bits(((k as i32 + 127) as u32) << 23)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_is_within_two_ulp_of_the_exact_value() {
        let mut worst = 0f64;
        for i in 0..=200_000 {
            let x = -87.0 * i as f32 / 200_000.0;
            let exact = (x as f64).exp();
            let ours = exp_nonpositive(x) as f64;
            let ulp = f64::from(f32::EPSILON) * exact;
            worst = worst.max((ours - exact).abs() / ulp);
        }
        assert!(worst <= 2.0, "worst error {worst} ulp");
        assert_eq!(exp_nonpositive(0.0), 1.0);
        assert!(exp_nonpositive(f32::NEG_INFINITY) < 1e-37);
        let mut scores = vec![-1.0f32, 0.0, -2.0, -0.5];
        scores.extend((0..40).map(|i| -(i as f32) / 8.0));
        assert_eq!(largest(&scores), 0.0);
        let sum = exp_and_sum(&mut scores, 0.0) as f64;
        let exact: f64 = [-1.0f64, 0.0, -2.0, -0.5]
            .into_iter()
            .chain((0..40).map(|i| -(i as f64) / 8.0))
            .map(f64::exp)
            .sum();
        assert!((sum - exact).abs() < 1e-5 * exact, "{sum} vs {exact}");
    }

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
        let slots: Vec<Vec<usize>> = vec![(0..700).rev().collect(), (0..700).rev().collect()];
        let (keys, values) = (wave(700 * 64, 1.0), wave(700 * 64, 2.0));
        let queries = wave(2 * 128, 3.0);
        let inputs = Inputs {
            key_slots: &slots,
            layout,
            scale: 0.2,
            queries: &queries,
            keys: &keys,
            values: &values,
        };
        use crate::cpu::{level, Level};
        let test = "a_piece_in_vectors_has_the_portable_bits";
        crate::skip_without("avx512", level() >= Level::Avx512, test);
        if crate::skip_without("avx2", level() >= Level::Avx2, test) {
            return;
        }
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        for piece in 0..3 {
            let job = Job {
                piece,
                rows: vec![0, 1],
            };
            for kv_head in 0..2 {
                let (a, b) = (
                    inputs.piece(&job, kv_head),
                    inputs.piece_portable(&job, kv_head),
                );
                assert_eq!(bits(&a.max), bits(&b.max));
                assert_eq!(
                    bits(&a.sum),
                    bits(&b.sum),
                    "piece {piece}, KV head {kv_head}"
                );
                assert_eq!(
                    bits(&a.out),
                    bits(&b.out),
                    "piece {piece}, KV head {kv_head}"
                );
            }
        }
    }
}
