//! Attention's tests: the formula, the bits of rows together and alone, f16 rows.

use super::*;

/// One decode row after `context` committed tokens, 4 query heads on 2 KV heads of 8.
fn long_row(context: usize) -> (Vec<f32>, Vec<f32>) {
    let layout = HeadLayout {
        num_heads: 4,
        num_kv_heads: 2,
        head_dim: 8,
    };
    one_row(context, layout)
}

/// One decode row after `context` committed tokens: ours, and the formula in f64.
fn one_row(context: usize, layout: HeadLayout) -> (Vec<f32>, Vec<f32>) {
    let HeadLayout {
        num_heads,
        num_kv_heads,
        head_dim: d,
    } = layout;
    let (width, kv_width) = (num_heads * d, num_kv_heads * d);
    let total = context + 1;
    // Slots in reverse order of their logical index: the kernel reads slots, not indices.
    let slot = |i: usize| total - 1 - i;
    let key_slots = vec![(0..total).map(slot).collect::<Vec<_>>()];
    let wave = |n: usize, seed: f32| -> Vec<f32> {
        (0..n)
            .map(|i| ((i as f32 + seed) * 0.618).sin() * 2.0)
            .collect()
    };
    let (keys, values) = (wave(total * kv_width, 1.0), wave(total * kv_width, 2.0));
    // `[kv_heads, slots, d]`.
    let at = |kv: usize, slot: usize| (kv * total + slot) * d;
    let query = wave(width, 3.0);
    let scale = 0.35;
    let ours = attend(&key_slots, layout, scale, &query, &keys, &values);
    // The plain formula in f64 over the slots in logical order.
    let mut exact = vec![0f32; width];
    for head in 0..num_heads {
        let kv = head / (num_heads / num_kv_heads);
        let q = &query[head * d..][..d];
        let scores: Vec<f64> = (0..total)
            .map(|i| {
                let k = &keys[at(kv, slot(i))..][..d];
                q.iter()
                    .zip(k)
                    .map(|(a, b)| *a as f64 * *b as f64)
                    .sum::<f64>()
                    * scale as f64
            })
            .collect();
        let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let weights: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
        let total_weight: f64 = weights.iter().sum();
        for e in 0..d {
            exact[head * d + e] = ((0..total)
                .map(|i| weights[i] * values[at(kv, slot(i)) + e] as f64)
                .sum::<f64>()
                / total_weight) as f32;
        }
    }
    (ours, exact)
}

/// Six query heads on two KV heads of `head_dim`.
fn six_on_two(head_dim: usize) -> HeadLayout {
    HeadLayout {
        num_heads: 6,
        num_kv_heads: 2,
        head_dim,
    }
}

/// `n` values of a sine wave of `amplitude` starting at `seed`.
fn wave(n: usize, seed: f32, amplitude: f32) -> Vec<f32> {
    (0..n)
        .map(|i| ((i as f32 + seed) * 0.377).sin() * amplitude)
        .collect()
}

fn on_threads<T: Send>(threads: usize, run: impl FnOnce() -> T + Send) -> T {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap()
        .install(run)
}

/// Rows that share pieces (tree rows over a common context, a prompt's causal rows) get
/// the bits each row gets alone, on any number of threads.
#[test]
fn rows_sharing_pieces_get_the_bits_they_get_alone() {
    let layout = six_on_two(16);
    let (width, kv_width) = (6 * 16, 2 * 16);
    let wave = |n: usize, seed: f32| wave(n, seed, 1.5);
    let (keys, values) = (wave(1200 * kv_width, 1.0), wave(1200 * kv_width, 2.0));
    // A context of 900 slots in scattered order, then a small tree: each row sees the
    // context and its ancestors (slots 900..). Then causal prompt rows across a piece
    // boundary, and a short row between them.
    let context: Vec<usize> = (0..900).map(|i| (i * 7) % 900).collect();
    // Then a chain of 12 more rows: 17 tree rows of 3 query heads per KV head share
    // each context piece, more than one pass of the piece kernel at any lane count.
    let tree_paths: [&[usize]; 5] = [&[900], &[900, 901], &[900, 902], &[900, 901, 903], &[904]];
    let chain = (1..=12).map(|len| (905..905 + len).collect::<Vec<usize>>());
    let mut key_slots: Vec<Vec<usize>> = (tree_paths.iter().map(|path| path.to_vec()))
        .chain(chain)
        .map(|path| context.iter().chain(path.iter()).copied().collect())
        .collect();
    key_slots.push((0..40).collect());
    key_slots.extend((250..262).map(|len| (0..len).collect::<Vec<_>>()));
    key_slots.extend((510..516).map(|len| (0..len).collect::<Vec<_>>()));
    let rows = key_slots.len();
    let queries = wave(rows * width, 3.0);
    let scale = 0.25;
    let alone: Vec<f32> = (0..rows)
        .flat_map(|r| {
            let query = &queries[r * width..(r + 1) * width];
            attend(&key_slots[r..r + 1], layout, scale, query, &keys, &values)
        })
        .collect();
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    for threads in [1, 3] {
        let together = on_threads(threads, || {
            attend(&key_slots, layout, scale, &queries, &keys, &values)
        });
        assert_eq!(bits(&together), bits(&alone), "{threads} threads");
    }
}

/// Keys and values of a layer (`[2 KV heads, slots, 64]`): as f32, as f16, and as f32 rows
/// holding the f16 values.
struct Rows {
    keys: Vec<f32>,
    values: Vec<f32>,
    half_keys: Vec<half::f16>,
    half_values: Vec<half::f16>,
    wide_keys: Vec<f32>,
    wide_values: Vec<f32>,
}

/// [`Rows`] of `slots` slots, sine waves of `amplitude`.
fn rows(slots: usize, amplitude: f32) -> Rows {
    let halves = |values: &[f32]| -> Vec<half::f16> {
        values.iter().map(|&x| half::f16::from_f32(x)).collect()
    };
    let widened = |halves: &[half::f16]| halves.iter().map(|h| h.to_f32()).collect();
    let (keys, values) = (
        wave(slots * 128, 1.0, amplitude),
        wave(slots * 128, 2.0, amplitude),
    );
    let (half_keys, half_values) = (halves(&keys), halves(&values));
    Rows {
        wide_keys: widened(&half_keys),
        wide_values: widened(&half_values),
        keys,
        values,
        half_keys,
        half_values,
    }
}

/// f16 rows are widened before any arithmetic: every kind of row (short, decode rows in
/// pieces, tree rows sharing pieces, a prompt's causal rows) gets the bits it gets from f32
/// rows holding the rounded values, on any number of threads.
#[test]
fn half_rows_give_the_bits_of_f32_rows_of_their_values() {
    let (layout, width) = (six_on_two(64), 6 * 64);
    let wave = |n: usize, seed: f32| wave(n, seed, 1.7);
    let Rows {
        keys,
        values,
        half_keys,
        half_values,
        wide_keys,
        wide_values,
    } = rows(1100, 1.7);
    let context: Vec<usize> = (0..900).map(|i| (i * 7) % 900).collect();
    let tree_paths: [&[usize]; 4] = [&[900], &[900, 901], &[900, 902], &[903]];
    let mut key_slots: Vec<Vec<usize>> = (tree_paths.iter())
        .map(|path| context.iter().chain(path.iter()).copied().collect())
        .collect();
    key_slots.push((0..40).rev().collect());
    key_slots.push((500..700).collect());
    key_slots.extend((510..514).map(|len| (0..len).collect::<Vec<_>>()));
    key_slots.push((0..1050).collect());
    let queries = wave(key_slots.len() * width, 3.0);
    let scale = 0.2;
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    let of_f32 = attend(
        &key_slots,
        layout,
        scale,
        &queries,
        &wide_keys,
        &wide_values,
    );
    for threads in [1, 3] {
        let of_f16 = on_threads(threads, || {
            let (keys, values) = (KvRows::F16(&half_keys), KvRows::F16(&half_values));
            attend(&key_slots, layout, scale, &queries, keys, values)
        });
        assert_eq!(bits(&of_f16), bits(&of_f32), "{threads} threads");
    }
    // The rounding is real: the unrounded rows give other bits, close by.
    let unrounded = attend(&key_slots, layout, scale, &queries, &keys, &values);
    assert_ne!(bits(&unrounded), bits(&of_f32));
    for (a, b) in unrounded.iter().zip(&of_f32) {
        assert!((a - b).abs() < 5e-3, "{a} vs {b}");
    }
}

/// A prompt's short rows over f16 rows (each sees the slots of the row before and one
/// more, in scattered order) read keys and values widened once for all of them, and get
/// the bits each row gets alone and the bits of f32 rows holding the same values.
#[test]
fn a_prompts_short_rows_widened_once_get_the_bits_of_each_row_alone() {
    let (layout, width) = (six_on_two(64), 6 * 64);
    let wave = |n: usize, seed: f32| wave(n, seed, 1.3);
    let layer = rows(120, 1.3);
    let order: Vec<usize> = (0..100).map(|i| (i * 37) % 100 + 20).collect();
    let key_slots: Vec<Vec<usize>> = (1..=100).map(|len| order[..len].to_vec()).collect();
    let halves = (
        KvRows::F16(&layer.half_keys),
        KvRows::F16(&layer.half_values),
    );
    assert_eq!(widened_once(&key_slots, halves, 2, 64).len(), 2);
    let queries = wave(key_slots.len() * width, 3.0);
    let scale = 0.3;
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    let alone: Vec<f32> = (0..key_slots.len())
        .flat_map(|r| {
            let query = &queries[r * width..(r + 1) * width];
            assert!(widened_once(&key_slots[r..r + 1], halves, 2, 64).is_empty());
            attend(
                &key_slots[r..r + 1],
                layout,
                scale,
                query,
                halves.0,
                halves.1,
            )
        })
        .collect();
    let wide = (&layer.wide_keys, &layer.wide_values);
    let of_f32 = attend(&key_slots, layout, scale, &queries, wide.0, wide.1);
    assert_eq!(bits(&alone), bits(&of_f32));
    for threads in [1, 3] {
        let together = on_threads(threads, || {
            attend(&key_slots, layout, scale, &queries, halves.0, halves.1)
        });
        assert_eq!(bits(&together), bits(&alone), "{threads} threads");
    }
}

#[test]
fn long_rows_in_pieces_equal_the_formula_and_do_not_depend_on_threads() {
    for context in [255, 256, 700] {
        let (ours, exact) = long_row(context);
        for (a, b) in ours.iter().zip(&exact) {
            assert!((a - b).abs() < 1e-5, "context {context}: {a} vs {b}");
        }
        let on = |threads| on_threads(threads, || long_row(context).0);
        assert_eq!(on(1), on(3), "context {context}");
    }
}

#[test]
fn short_rows_split_by_head_equal_the_formula_and_do_not_depend_on_threads() {
    // Enough work to run in parallel (one task per head), fewer keys than a piece.
    let layout = HeadLayout {
        num_heads: 14,
        num_kv_heads: 2,
        head_dim: 64,
    };
    let context = 200;
    let (ours, exact) = one_row(context, layout);
    assert!((context + 1) * 14 * 64 >= PARALLEL_MIN_WORK);
    for (a, b) in ours.iter().zip(&exact) {
        assert!((a - b).abs() < 1e-5, "{a} vs {b}");
    }
    // One, two and four parts of each KV head's seven query heads.
    let on = |threads| on_threads(threads, || one_row(context, layout).0);
    let one = on(1);
    assert_eq!(one, on(3));
    assert_eq!(one, on(8));
}

#[test]
fn weighted_sums_equal_the_portable_loop_bit_for_bit() {
    // Without AVX2 (or AVX-512) both sides are the portable loop: say so (or fail where CI
    // requires it). `GROVE_KERNEL=avx2` runs the AVX2 path on an AVX-512 CPU.
    use crate::cpu::{level, Level};
    let test = "weighted_sums_equal_the_portable_loop_bit_for_bit";
    crate::skip_without("avx2", level() >= Level::Avx2, test);
    crate::skip_without("avx512", level() >= Level::Avx512, test);
    check_weighted_sums::<false>();
    check_weighted_sums::<true>();
}

/// [`weighted_sums`] against [`weighted_sum_portable`] with each multiply-add kind.
fn check_weighted_sums<const FUSED: bool>() {
    // Value widths of whole vectors (one pass, several, a partial tile) and one that is
    // not (the portable loop itself).
    for width in [16, 64, 80, 128, 256, 24] {
        for count in [0, 1, 7, 300] {
            let weights: Vec<f32> = (0..count).map(|i| (i as f32 * 0.77).sin()).collect();
            let values: Vec<f32> = (0..count * width)
                .map(|i| (i as f32 * 0.31).cos() * 3.0)
                .collect();
            let value = |i: usize| &values[i * width..(i + 1) * width];
            let start: Vec<f32> = (0..width).map(|e| e as f32 * 0.1).collect();
            let mut ours = start.clone();
            weighted_sums::<FUSED>(&mut ours, width, &weights, value);
            let mut portable = start.clone();
            weighted_sum_portable::<FUSED, _>(
                &mut portable,
                weights.iter().copied(),
                (0..count).map(value),
            );
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(
                bits(&ours),
                bits(&portable),
                "fused {FUSED}, width {width}, count {count}"
            );
            // The AVX2 path too where the level above chose AVX-512 (or did not run).
            #[cfg(target_arch = "x86_64")]
            if crate::cpu::Level::supported() >= crate::cpu::Level::Avx2 && width.is_multiple_of(8)
            {
                let mut avx2 = start.clone();
                #[allow(unsafe_code)]
                // SAFETY: this CPU has AVX2 and FMA (`Level::supported`).
                unsafe {
                    let layout = WeightLayout {
                        n: count,
                        query: count,
                        key: 1,
                    };
                    let rows = Listed::values(count, width, &value);
                    all_queries_avx2::<FUSED, _>(&mut avx2, width, &weights, layout, rows.rows())
                };
                assert_eq!(bits(&avx2), bits(&portable), "AVX2, {width} {count}");
            }
            // Several outputs over the same values (1 to 9 query heads of a KV head: each
            // grouping `$all` makes), each with its own weights: each as the portable loop
            // gives it alone.
            for queries in 1..=9 {
                let weights: Vec<f32> = (0..queries * count)
                    .map(|i| (i as f32 * 0.53).cos())
                    .collect();
                let mut ours: Vec<f32> = (0..queries).flat_map(|_| start.clone()).collect();
                weighted_sums::<FUSED>(&mut ours, width, &weights, value);
                for (j, ours) in ours.chunks_exact(width).enumerate() {
                    let mut portable = start.clone();
                    let weights = &weights[j * count..(j + 1) * count];
                    weighted_sum_portable::<FUSED, _>(
                        &mut portable,
                        weights.iter().copied(),
                        (0..count).map(value),
                    );
                    assert_eq!(bits(ours), bits(&portable), "{width} {count} {queries} {j}");
                }
            }
        }
    }
}
