//! One forward's attention over every layer of a KV store in memory: `ROWS` rows (a chain of
//! tree rows: row `r` sees the context and rows `0..=r`) over `CONTEXT` tokens of an f16 cache,
//! `LAYERS` layers of `HEADS` query heads on `KV_HEADS` KV heads of `HEAD_DIM` (Qwen2.5-1.5B's
//! 12 on 2 of 128 unless set), each layer's keys and values apart in memory as a model's are. Prints the best and median of `ITERS` forwards.
//! With one layer the cache stays in L2/L3 (criterion's `attention_*` benches); with 28 it
//! streams from memory, as a long context's decode step does, without the products' noise.
//! `RAYON_NUM_THREADS=2 cargo run --release -p grove-kernels --example attention_layers`
//! (defaults: `CONTEXT=4096 ROWS=1 LAYERS=28 ITERS=41`).

use grove_kernels::attention::{attend, HeadLayout, KvRows};
use half::f16;
use std::time::Instant;

fn setting(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    let (context, rows) = (setting("CONTEXT", 4096), setting("ROWS", 1));
    let (layers, iters) = (setting("LAYERS", 28), setting("ITERS", 41).max(1));
    let layout = HeadLayout {
        num_heads: setting("HEADS", 12),
        num_kv_heads: setting("KV_HEADS", 2),
        head_dim: setting("HEAD_DIM", 128),
    };
    let len = (context + rows) * layout.num_kv_heads * layout.head_dim;
    // A fixed sequence in [-0.5, 0.5): the same cache and queries in every run, so the sum
    // printed at the end says whether two builds agree.
    let mut state = 1u32;
    let mut next = || {
        state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
        (state >> 8) as f32 / (1u32 << 24) as f32 - 0.5
    };
    let mut rows_of =
        |len: usize| -> Vec<f16> { (0..len).map(|_| f16::from_f32(next())).collect() };
    let cache: Vec<(Vec<f16>, Vec<f16>)> =
        (0..layers).map(|_| (rows_of(len), rows_of(len))).collect();
    let queries: Vec<f32> = (0..rows * layout.num_heads * layout.head_dim)
        .map(|_| next())
        .collect();
    let key_slots: Vec<Vec<usize>> = (0..rows).map(|r| (0..=context + r).collect()).collect();
    let scale = 1.0 / (layout.head_dim as f32).sqrt();
    let (mut times, mut sum) = (Vec::new(), 0f64);
    for _ in 0..iters {
        let start = Instant::now();
        for (keys, values) in &cache {
            let out = attend(
                &key_slots,
                layout,
                scale,
                &queries,
                KvRows::F16(keys),
                KvRows::F16(values),
            );
            sum += f64::from(out[0]);
        }
        times.push(start.elapsed().as_secs_f64() * 1e3);
    }
    times.sort_by(f64::total_cmp);
    println!(
        "context {context}, {rows} rows, {layers} layers: best {:.3} ms, median {:.3} ms (sum {sum:.6})",
        times[0],
        times[times.len() / 2]
    );
}
