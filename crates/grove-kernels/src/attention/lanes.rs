//! One piece of a long row's attention with the queries across vector lanes.
//!
//! A piece's query heads (a KV head's group for each row of the job: a decode row's 7 on
//! Qwen2.5-0.5B, a 64-row tree's 448) are transposed into blocks of `L`, one query per lane.
//! A score is then `L` queries' multiply-adds against one broadcast key element, chained over
//! the head dimension; the softmax runs down each lane; the values' weighted sums take `L`
//! queries' weights against one broadcast value element (a single pass, a decode row, runs
//! them along the head dimension instead). Nothing is reduced across lanes (the
//! dot-per-key form spent more on transposing its lane sums than on its multiply-adds), each
//! key and value element is loaded once for a pair of query blocks, and a pair's scores stay
//! in L1 from the dots to the sums.
//!
//! Each lane's arithmetic is its query's alone, in a fixed order (the dot and the weighted
//! sums chained over the head dimension and over the keys, each step one fused multiply-add),
//! so a query gets the same bits in any block, beside any other queries, at any lane count: a
//! token decoded alone and verified in a tree agree bit for bit.

use std::cell::RefCell;

use super::pieces::Piece;
use super::rows::Element;
use crate::threads::scratch as sized;

/// `L` lanes of f32, one query each. Plain loops over the lanes, which the compiler makes
/// vector instructions, the same operations per lane on every build. No closures: a closure
/// the compiler leaves out of line loses the caller's target features (a fused multiply-add
/// then becomes a call to libm's `fmaf`).
#[derive(Clone, Copy)]
struct Lanes<const L: usize>([f32; L]);

impl<const L: usize> Lanes<L> {
    #[inline(always)]
    fn splat(x: f32) -> Self {
        Self([x; L])
    }

    #[inline(always)]
    fn load(from: &[f32]) -> Self {
        let mut lanes = [0f32; L];
        lanes.copy_from_slice(&from[..L]);
        Self(lanes)
    }

    #[inline(always)]
    fn store(self, to: &mut [f32]) {
        to[..L].copy_from_slice(&self.0);
    }

    /// `self * x + add` with one rounding per lane.
    #[inline(always)]
    fn mul_add(self, x: f32, add: Self) -> Self {
        let mut out = add.0;
        for (out, a) in out.iter_mut().zip(self.0) {
            *out = a.mul_add(x, *out);
        }
        Self(out)
    }

    #[inline(always)]
    fn times(mut self, x: f32) -> Self {
        for lane in &mut self.0 {
            *lane *= x;
        }
        self
    }

    #[inline(always)]
    fn plus(mut self, other: Self) -> Self {
        for (lane, x) in self.0.iter_mut().zip(other.0) {
            *lane += x;
        }
        self
    }

    #[inline(always)]
    fn max(mut self, other: Self) -> Self {
        for (lane, x) in self.0.iter_mut().zip(other.0) {
            *lane = lane.max(x);
        }
        self
    }

    /// `e^(self - largest)`, each lane at most its `largest`.
    #[inline(always)]
    fn exp_below(mut self, largest: Self) -> Self {
        for (lane, m) in self.0.iter_mut().zip(largest.0) {
            *lane = exp_nonpositive(*lane - m);
        }
        self
    }
}

/// The most query blocks a pass takes at `L` lanes, each key or value element loaded once for
/// all of them: two at 8 lanes (12 sums in registers, of AVX2's 16), three at 16 (18 of
/// AVX-512's 32; four spilled them). A tree of 5-8 rows (Qwen2.5-1.5B's 30-48 query heads of a
/// KV head) then takes one pass over a piece's keys where it took two.
const fn most_blocks<const L: usize>() -> usize {
    if L >= 16 {
        3
    } else {
        2
    }
}

/// Blocks per pass for `blocks` blocks at `L` lanes: as few passes as [`most_blocks`] allows,
/// as even as they come (a pass of one block loads a query vector for every six multiply-adds,
/// and a pass of one query, 48 + 1, wastes 15 lanes of its block).
pub(super) fn pass_blocks<const L: usize>(blocks: usize) -> usize {
    blocks.div_ceil(blocks.div_ceil(most_blocks::<L>()).max(1))
}

/// Whether `queries` take one pass at `L` lanes, reading the keys and values where they lie
/// (more take several over packed copies).
pub(super) fn one_pass<const L: usize>(queries: usize) -> bool {
    queries.div_ceil(L) <= most_blocks::<L>()
}
/// Keys per tile of the scores and head dimensions per tile of the weighted sums (times the
/// blocks of a pass: the sums in registers).
const TILE: usize = 6;

/// A thread's buffers, kept between pieces (a fresh vector per piece is a fresh mapping:
/// page faults, and on unmapping TLB shootdowns on the other cores).
#[derive(Default)]
struct Scratch {
    /// Per pass, `[dim][block of the pass][lane]`: the queries transposed.
    queries: Vec<f32>,
    /// `[tile][dim][key of the tile]`: the keys transposed by tiles (past the last key, the
    /// last tile's first key again: only scores that are dropped read it).
    keys: Vec<f32>,
    /// `[tile of dims][key][dim of the tile]` (past the last dimension, the same).
    values: Vec<f32>,
    /// `[key][block of the pass][lane]`: a pass's scores, then their exponentials.
    scores: Vec<f32>,
    /// `[block][dim][lane]`: the weighted sums (more than one pass).
    sums: Vec<f32>,
    /// `[key of the tile][dim]`: a tile's f16 keys widened (one pass over f16 rows).
    tile: Vec<f32>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

/// A piece's `n` keys and values (each `head_dim` long), by position in the piece.
pub(super) struct PieceKeys<K, V> {
    pub n: usize,
    pub key: K,
    pub value: V,
}

/// The piece's softmax before normalization for each query (`queries`, each `head_dim`
/// long): the largest score, the sum of `exp(score - largest)` and the values weighted by
/// those terms. `L` lanes per block (the bits do not depend on it).
#[inline(always)]
pub(super) fn piece_in_lanes<'a, const L: usize, E: Element>(
    queries: &[&[f32]],
    head_dim: usize,
    scale: f32,
    keys: &PieceKeys<impl Fn(usize) -> &'a [E], impl Fn(usize) -> &'a [E]>,
) -> Piece {
    let (d, n, count) = (head_dim, keys.n, queries.len());
    let blocks = count.div_ceil(L);
    let mut scratch = SCRATCH.take();
    let s = &mut scratch;
    let per_pass = pass_blocks::<L>(blocks);
    transpose_queries(&mut s.queries, queries, d, L, per_pass);
    let (mut max, mut sum) = (vec![0f32; blocks * L], vec![0f32; blocks * L]);
    let mut out = vec![0f32; count * d];
    if one_pass::<L>(count) {
        // One pass (a decode row, a short tree): the keys and values read once where they
        // lie, and the weighted sums along the head dimension (`weighted_sums`: each output
        // the same chain of fused multiply-adds over the keys as the lanes' form below).
        let scores = sized(&mut s.scores, n * blocks * L);
        let mut source = Direct {
            keys,
            d,
            widened: &mut s.tile,
        };
        let down = (&mut scores[..], &mut max[..], &mut sum[..]);
        match blocks {
            1 => scores_down::<L, 1>(&s.queries, &mut source, n, scale, down),
            2 => scores_down::<L, 2>(&s.queries, &mut source, n, scale, down),
            _ => scores_down::<L, 3>(&s.queries, &mut source, n, scale, down),
        }
        let layout = super::WeightLayout {
            n,
            query: 1,
            key: blocks * L,
        };
        super::weighted_sums_laid::<true, _>(&mut out, d, scores, layout, &keys.value);
    } else {
        pack_keys(&mut s.keys, keys, d);
        pack_values(&mut s.values, keys, d);
        let all_sums = sized(&mut s.sums, blocks * d * L);
        let mut packed = Packed {
            keys: &s.keys,
            values: &s.values,
            n,
            d,
        };
        for first in (0..blocks).step_by(per_pass) {
            let pass = per_pass.min(blocks - first);
            let lanes = first * L..(first + pass) * L;
            let at = first * d * L..(first + pass) * d * L;
            let scores = sized(&mut s.scores, n * pass * L);
            let down = (&mut scores[..], &mut max[lanes.clone()], &mut sum[lanes]);
            let (queries, sums) = (&s.queries[at.clone()], &mut all_sums[at]);
            match pass {
                1 => {
                    scores_down::<L, 1>(queries, &mut packed, n, scale, down);
                    packed.sums::<L, 1>(scores, sums);
                }
                2 => {
                    scores_down::<L, 2>(queries, &mut packed, n, scale, down);
                    packed.sums::<L, 2>(scores, sums);
                }
                _ => {
                    scores_down::<L, 3>(queries, &mut packed, n, scale, down);
                    packed.sums::<L, 3>(scores, sums);
                }
            }
        }
        for (queries, sums) in out.chunks_mut(L * d).zip(all_sums.chunks_exact(d * L)) {
            for (e, lanes) in sums.chunks_exact(L).enumerate() {
                for (query, &x) in queries.chunks_exact_mut(d).zip(lanes) {
                    query[e] = x;
                }
            }
        }
    }
    max.truncate(count);
    sum.truncate(count);
    SCRATCH.set(scratch);
    Piece { max, sum, out }
}

/// Each pass's queries as `[dim][block of the pass][lane]` (query `block * lanes + lane`),
/// zero past the last query; a pass is `pass_blocks` blocks, the last one maybe fewer.
fn transpose_queries(
    to: &mut Vec<f32>,
    queries: &[&[f32]],
    d: usize,
    lanes: usize,
    pass_blocks: usize,
) {
    let blocks = queries.len().div_ceil(lanes);
    to.clear();
    to.resize(blocks * d * lanes, 0.0);
    let per_pass = pass_blocks * lanes;
    for (pass, to) in queries.chunks(per_pass).zip(to.chunks_mut(d * per_pass)) {
        let width = pass.len().div_ceil(lanes) * lanes;
        for (q, query) in pass.iter().enumerate() {
            assert_eq!(query.len(), d, "a query is not head_dim long");
            for (to, &x) in to.chunks_exact_mut(width).zip(*query) {
                to[q] = x;
            }
        }
    }
}

/// The keys as `[tile][dim][key of the tile]`: a score tile's elements side by side.
fn pack_keys<'a, E: Element>(
    to: &mut Vec<f32>,
    keys: &PieceKeys<impl Fn(usize) -> &'a [E], impl Fn(usize) -> &'a [E]>,
    d: usize,
) {
    let to = sized(to, keys.n.div_ceil(TILE) * d * TILE);
    for (i, tile) in (0..keys.n).step_by(TILE).zip(to.chunks_exact_mut(d * TILE)) {
        // The next tile's keys, and its values into L2 for `pack_values` after.
        for k in i + TILE..(i + 2 * TILE).min(keys.n) {
            super::prefetch((keys.key)(k).as_ptr().cast(), size_of::<E>() * d);
            super::prefetch_l2((keys.value)(k).as_ptr().cast(), size_of::<E>() * d);
        }
        // Past the last key, the first key again (its scores are dropped).
        let rows: [&[E]; TILE] = std::array::from_fn(|k| {
            let key = (keys.key)(if i + k < keys.n { i + k } else { i });
            assert_eq!(key.len(), d, "a key is not head_dim long");
            key
        });
        // Dimension by dimension: the tile written front to back (key by key, each store
        // went to another place in it, and the stores waited).
        for (e, to) in tile.chunks_exact_mut(TILE).enumerate() {
            for (to, row) in to.iter_mut().zip(rows) {
                *to = row[e].widen();
            }
        }
    }
}

/// The values as `[tile of dims][key][dim of the tile]`: a sums tile's elements in one run.
fn pack_values<'a, E: Element>(
    to: &mut Vec<f32>,
    keys: &PieceKeys<impl Fn(usize) -> &'a [E], impl Fn(usize) -> &'a [E]>,
    d: usize,
) {
    let n = keys.n;
    let to = sized(to, d.div_ceil(TILE) * n * TILE);
    let rows: Vec<&[E]> = (0..n).map(|i| (keys.value)(i)).collect();
    assert!(
        rows.iter().all(|v| v.len() == d),
        "a value is not head_dim long"
    );
    // A tile of dimensions at a time, key after key: each tile written front to back (key by
    // key, the stores went to every tile in turn).
    for (first, tile) in (0..d).step_by(TILE).zip(to.chunks_exact_mut(n * TILE)) {
        for (to, value) in tile.chunks_exact_mut(TILE).zip(&rows) {
            match <&[E; TILE]>::try_from(value.get(first..first + TILE).unwrap_or(&[])) {
                Ok(part) => {
                    for (to, x) in to.iter_mut().zip(part) {
                        *to = x.widen();
                    }
                }
                Err(_) => to
                    .iter_mut()
                    .zip(&value[first..])
                    .for_each(|(to, x)| *to = x.widen()),
            }
        }
    }
}

/// Where the scores read a tile of keys' elements: for each dimension, the tile's keys (zero
/// or a repeated key past the last, whose scores are not kept).
trait KeyTiles {
    fn tile(&mut self, first: usize) -> impl Iterator<Item = [f32; TILE]> + '_;
}

/// Tiles packed by [`pack_keys`] and [`pack_values`].
struct Packed<'s> {
    keys: &'s [f32],
    values: &'s [f32],
    n: usize,
    d: usize,
}

impl KeyTiles for Packed<'_> {
    #[inline(always)]
    fn tile(&mut self, first: usize) -> impl Iterator<Item = [f32; TILE]> + '_ {
        let tile = &self.keys[first * self.d..][..TILE * self.d];
        tile.chunks_exact(TILE)
            .map(|k| k.try_into().expect("a tile"))
    }
}

impl Packed<'_> {
    /// The weighted sums of a pass's `B` blocks into `sums` (`[block][dim][lane]`), a tile
    /// of dimensions at a time: each key's terms (as [`scores_down`] left the scores) times
    /// its value, key after key, one fused multiply-add each, in registers.
    #[inline(always)]
    fn sums<const L: usize, const B: usize>(&self, terms: &[f32], sums: &mut [f32]) {
        let (n, d) = (self.n, self.d);
        for (first, values) in (0..d).step_by(TILE).zip(self.values.chunks_exact(n * TILE)) {
            let mut acc = [[Lanes::<L>::splat(0.0); TILE]; B];
            for (p, v) in terms.chunks_exact(B * L).zip(values.chunks_exact(TILE)) {
                let mut lanes = [Lanes::<L>::splat(0.0); B];
                for (b, lanes) in lanes.iter_mut().enumerate() {
                    *lanes = Lanes::load(&p[b * L..]);
                }
                for (e, &x) in v.iter().enumerate() {
                    for b in 0..B {
                        acc[b][e] = lanes[b].mul_add(x, acc[b][e]);
                    }
                }
            }
            for e in 0..TILE.min(d - first) {
                for (b, acc) in acc.iter().enumerate() {
                    acc[e].store(&mut sums[(b * d + first + e) * L..]);
                }
            }
        }
    }
}

/// The keys where they lie: f32 rows read in place, f16 rows widened a tile at a time into
/// `widened` (in L1 while the tile's multiply-adds read it).
struct Direct<'k, 'w, K, V> {
    keys: &'k PieceKeys<K, V>,
    d: usize,
    widened: &'w mut Vec<f32>,
}

impl<'a: 'k, 'k, E: Element, K: Fn(usize) -> &'a [E], V: Fn(usize) -> &'a [E]> KeyTiles
    for Direct<'k, '_, K, V>
{
    #[inline(always)]
    fn tile(&mut self, first: usize) -> impl Iterator<Item = [f32; TILE]> + '_ {
        let (n, d) = (self.keys.n, self.d);
        for k in first + TILE..(first + 2 * TILE).min(n) {
            super::prefetch((self.keys.key)(k).as_ptr().cast(), size_of::<E>() * d);
            // The weighted sums read the values next: into L2, where a piece's fit.
            super::prefetch_l2((self.keys.value)(k).as_ptr().cast(), size_of::<E>() * d);
        }
        // Past the last key, the first key again: no branch per element.
        let keys: [&[E]; TILE] = std::array::from_fn(|k| {
            let key = (self.keys.key)(if first + k < n { first + k } else { first });
            assert_eq!(key.len(), d, "a key is not head_dim long");
            key
        });
        KeyElements {
            keys: E::as_f32(keys, d, self.widened),
            e: 0,
            d,
        }
    }
}

/// [`Direct`]'s key elements, dimension after dimension. Its own iterator, every step
/// inlined: std's adapters here (`Zip`, `array::map`) stayed out of line, a call per element,
/// and checked indexing kept a compare and branch per key and element and the sums in memory.
struct KeyElements<'a> {
    /// Each `d` long.
    keys: [&'a [f32]; TILE],
    e: usize,
    d: usize,
}

impl Iterator for KeyElements<'_> {
    type Item = [f32; TILE];

    #[inline(always)]
    fn next(&mut self) -> Option<[f32; TILE]> {
        if self.e == self.d {
            return None;
        }
        let mut elements = [0f32; TILE];
        for (x, key) in elements.iter_mut().zip(self.keys) {
            // SAFETY: `e < d`, and every key is `d` long (`Element::as_f32`'s rows are).
            #[allow(unsafe_code)]
            unsafe {
                *x = *key.get_unchecked(self.e)
            };
        }
        self.e += 1;
        Some(elements)
    }
}

/// `B` blocks of queries (`[dim][block][lane]`) against a piece's `n` keys: the scores
/// (`[key][block][lane]`), then down each lane the largest score (into `max`) and the terms
/// `exp(score - largest)` in their place, summed key after key (into `sum`).
#[inline(always)]
fn scores_down<const L: usize, const B: usize>(
    queries: &[f32],
    keys: &mut impl KeyTiles,
    n: usize,
    scale: f32,
    (scores, max, sum): (&mut [f32], &mut [f32], &mut [f32]),
) {
    for first in (0..n).step_by(TILE) {
        let dots = score_tile::<L, B>(queries, keys.tile(first), scale);
        for k in 0..TILE.min(n - first) {
            for (b, dots) in dots.iter().enumerate() {
                dots[k].store(&mut scores[((first + k) * B + b) * L..]);
            }
        }
    }
    for b in 0..B {
        let mut largest = Lanes::<L>::splat(f32::NEG_INFINITY);
        for key in scores.chunks_exact(B * L) {
            largest = largest.max(Lanes::load(&key[b * L..]));
        }
        let mut total = Lanes::<L>::splat(0.0);
        for key in scores.chunks_exact_mut(B * L) {
            let term = Lanes::load(&key[b * L..]).exp_below(largest);
            term.store(&mut key[b * L..]);
            total = total.plus(term);
        }
        largest.store(&mut max[b * L..]);
        total.store(&mut sum[b * L..]);
    }
}

/// A tile of keys (for each dimension, the tile's elements) against `B` blocks of queries
/// (`[dim][block][lane]`): the scaled dots, chained over the dimensions in registers.
#[inline(always)]
fn score_tile<const L: usize, const B: usize>(
    queries: &[f32],
    keys: impl Iterator<Item = [f32; TILE]>,
    scale: f32,
) -> [[Lanes<L>; TILE]; B] {
    let mut acc = [[Lanes::<L>::splat(0.0); TILE]; B];
    let mut keys = keys;
    for q in queries.chunks_exact(B * L) {
        let Some(k) = keys.next() else { break };
        let mut lanes = [Lanes::<L>::splat(0.0); B];
        for (b, lanes) in lanes.iter_mut().enumerate() {
            *lanes = Lanes::load(&q[b * L..]);
        }
        for (t, x) in k.into_iter().enumerate() {
            for b in 0..B {
                acc[b][t] = lanes[b].mul_add(x, acc[b][t]);
            }
        }
    }
    for acc in acc.iter_mut().flatten() {
        *acc = acc.times(scale);
    }
    acc
}

/// `e^x` for `x <= 0` within 2 ulp, in plain f32 arithmetic that vectorizes (libm's `expf`
/// is a call per value). Cody and Waite's reduction `x = k ln 2 + r` and Cephes' degree-6
/// polynomial for `e^r` (Moshier, Cephes Math Library, `expf.c`), in fused multiply-adds;
/// `x` below -87 counts as -87 (`e^-87` is 6e-39 of the row's largest term, which is 1).
#[inline(always)]
pub(super) fn exp_nonpositive(x: f32) -> f32 {
    // Adding and subtracting 1.5 * 2^23 rounds to the nearest integer without a call.
    const ROUND: f32 = 12_582_912.0;
    const LN2_HIGH: f32 = 0.693_359_4;
    const LN2_LOW: f32 = -2.121_944_4e-4;
    let x = x.max(-87.0);
    let k = (x * std::f32::consts::LOG2_E + ROUND) - ROUND;
    let r = (-k).mul_add(LN2_LOW, (-k).mul_add(LN2_HIGH, x));
    let p = 1.987_569_1e-4_f32;
    let p = p.mul_add(r, 1.398_199_9e-3);
    let p = p.mul_add(r, 8.333_452e-3);
    let p = p.mul_add(r, 4.166_579_6e-2);
    let p = p.mul_add(r, 1.666_666_5e-1);
    let p = p.mul_add(r, 0.5);
    let y = p.mul_add(r * r, r) + 1.0;
    // 2^k as the bits of its exponent (k >= -126: a normal float). `k + 127` (1..=127) sits
    // in the low mantissa bits of `ROUND + k + 127`, exactly, and the shift moves it to the
    // exponent: a float-to-integer cast here (saturating in Rust) kept the loop scalar.
    y * f32::from_bits(((k + 127.0) + ROUND).to_bits() << 23)
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    pub(in crate::attention) fn wave(n: usize, seed: f32) -> Vec<f32> {
        (0..n)
            .map(|i| ((i as f32 + seed) * 0.377).sin() * 2.5)
            .collect()
    }

    pub(in crate::attention) fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    /// Every query of a piece gets the bits it gets alone, whichever pass form ran (one pass
    /// straight from the keys, or several over packed tiles), at 8 and 16 lanes; and the
    /// formula's values.
    #[test]
    fn a_query_gets_the_same_bits_in_any_company_and_the_formula() {
        for d in [8, 20, 64] {
            for n in [1, 5, 6, 7, 200, 256] {
                let (keys, values) = (wave(n * d, 1.0), wave(n * d, 2.0));
                let piece = PieceKeys {
                    n,
                    key: |i: usize| &keys[i * d..(i + 1) * d],
                    value: |i: usize| &values[i * d..(i + 1) * d],
                };
                let scale = 0.3;
                let all = wave(100 * d, 3.0);
                let queries: Vec<&[f32]> = all.chunks_exact(d).collect();
                let alone: Vec<Piece> = queries
                    .iter()
                    .map(|q| piece_in_lanes::<8, _>(&[q], d, scale, &piece))
                    .collect();
                for count in [1, 7, 16, 17, 33, 45, 49, 70, 100] {
                    for together in [
                        piece_in_lanes::<8, _>(&queries[..count], d, scale, &piece),
                        piece_in_lanes::<16, _>(&queries[..count], d, scale, &piece),
                    ] {
                        for (q, alone) in alone[..count].iter().enumerate() {
                            let case = format!("d {d}, n {n}, {count} queries, query {q}");
                            assert_eq!(together.max[q].to_bits(), alone.max[0].to_bits(), "{case}");
                            assert_eq!(together.sum[q].to_bits(), alone.sum[0].to_bits(), "{case}");
                            let out = &together.out[q * d..(q + 1) * d];
                            assert_eq!(bits(out), bits(&alone.out), "{case}");
                        }
                    }
                }
                // The formula in f64, normalized, for a few queries.
                for (q, query) in queries.iter().enumerate().take(3) {
                    let scores: Vec<f64> = (0..n)
                        .map(|i| {
                            let key = (piece.key)(i);
                            let dot: f64 = query
                                .iter()
                                .zip(key)
                                .map(|(a, b)| *a as f64 * *b as f64)
                                .sum();
                            dot * scale as f64
                        })
                        .collect();
                    let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                    let terms: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
                    let total: f64 = terms.iter().sum();
                    let ours = &alone[q];
                    for e in 0..d {
                        let exact = (0..n)
                            .map(|i| terms[i] * (piece.value)(i)[e] as f64)
                            .sum::<f64>()
                            / total;
                        let got = ours.out[e] as f64 / ours.sum[0] as f64;
                        assert!(
                            (got - exact).abs() < 1e-4,
                            "d {d}, n {n}, query {q}: {got} vs {exact}"
                        );
                    }
                }
            }
        }
    }

    /// f16 rows (widened a tile at a time in one pass, or as they are packed for several)
    /// give every query the bits f32 rows of the same values give, at 8 and 16 lanes.
    #[test]
    fn f16_rows_give_the_bits_of_f32_rows_of_their_values() {
        for d in [8, 20, 64] {
            for n in [1, 5, 6, 7, 200, 256] {
                let half = |v: Vec<f32>| -> Vec<half::f16> {
                    v.into_iter().map(half::f16::from_f32).collect()
                };
                let (keys, values) = (half(wave(n * d, 1.0)), half(wave(n * d, 2.0)));
                let widen =
                    |v: &[half::f16]| -> Vec<f32> { v.iter().map(|h| h.to_f32()).collect() };
                let (wide_keys, wide_values) = (widen(&keys), widen(&values));
                let halves = PieceKeys {
                    n,
                    key: |i: usize| &keys[i * d..(i + 1) * d],
                    value: |i: usize| &values[i * d..(i + 1) * d],
                };
                let widened = PieceKeys {
                    n,
                    key: |i: usize| &wide_keys[i * d..(i + 1) * d],
                    value: |i: usize| &wide_values[i * d..(i + 1) * d],
                };
                let all = wave(100 * d, 3.0);
                let queries: Vec<&[f32]> = all.chunks_exact(d).collect();
                for count in [1, 7, 16, 17, 32, 33, 45, 49, 70, 100] {
                    let queries = &queries[..count];
                    let case = format!("d {d}, n {n}, {count} queries");
                    for (ours, reference) in [
                        (
                            piece_in_lanes::<8, _>(queries, d, 0.3, &halves),
                            piece_in_lanes::<8, _>(queries, d, 0.3, &widened),
                        ),
                        (
                            piece_in_lanes::<16, _>(queries, d, 0.3, &halves),
                            piece_in_lanes::<16, _>(queries, d, 0.3, &widened),
                        ),
                    ] {
                        assert_eq!(bits(&ours.max), bits(&reference.max), "{case}");
                        assert_eq!(bits(&ours.sum), bits(&reference.sum), "{case}");
                        assert_eq!(bits(&ours.out), bits(&reference.out), "{case}");
                    }
                }
            }
        }
    }

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
    }
}
