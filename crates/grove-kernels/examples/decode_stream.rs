//! A decode step's products on their own: one activation row against the 1.5B's Q4_K-shaped
//! matrices (`LAYERS` layers of q/k/v, o, gate/up and down, grouped as a forward hands them to
//! the threads), on `THREADS` threads kept awake as a forward keeps them, beside a plain read
//! of 1 GiB on the same threads (`bench --compare-llama-cpp`'s memory test). It prints both in
//! GB/s, round by round, so the products' share of what the memory gives is a same-sitting
//! ratio on a host whose bandwidth moves. `GROUPS=2` hands the same matrices to the threads
//! in two calls instead (all those 1536 wide, then the down projections), leaving out the
//! hand-offs and waits between a forward's products.
//! `THREADS=2 cargo run --release -p grove-kernels --example decode_stream` (defaults:
//! `THREADS=2 LAYERS=28 ROUNDS=6 ROWS=1`, grouped as a forward; `ROWS` activation rows, a
//! verify's, against the same weights).

use grove_kernels::quant::{matmul_many, streaming_sum, QMatrix, QuantFormat};
use grove_kernels::threads::with_threads_awake;
use rayon::prelude::*;
use std::time::Instant;

fn setting(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Seconds of `run`, the best of five, and GB/s of `bytes` at that pace.
fn best_of_five(bytes: usize, mut run: impl FnMut()) -> f64 {
    let mut best = f64::MAX;
    for _ in 0..5 {
        let start = Instant::now();
        run();
        best = best.min(start.elapsed().as_secs_f64());
    }
    bytes as f64 / best / 1e9
}

fn main() {
    let (threads, layers, rounds) = (
        setting("THREADS", 2),
        setting("LAYERS", 28),
        setting("ROUNDS", 6),
    );
    let (format, hidden, ffn) = (QuantFormat::Q4K, 1536, 8960);
    let shapes: [&[(usize, usize)]; 4] = [
        &[(hidden, hidden), (256, hidden), (256, hidden)],
        &[(hidden, hidden)],
        &[(ffn, hidden), (ffn, hidden)],
        &[(hidden, ffn)],
    ];
    let mut seed = 0;
    let groups: Vec<Vec<QMatrix>> = (0..layers)
        .flat_map(|_| shapes)
        .map(|group| {
            (group.iter())
                .map(|&(n, k)| {
                    seed += 1;
                    QMatrix::random(format, n, k, seed)
                })
                .collect()
        })
        .collect();
    let groups = if setting("GROUPS", 0) == 2 {
        let (narrow, wide): (Vec<QMatrix>, Vec<QMatrix>) = groups
            .into_iter()
            .flatten()
            .partition(|m| m.dims().1 == hidden);
        vec![narrow, wide]
    } else {
        groups
    };
    let bytes: usize = (groups.iter().flatten())
        .map(|m| m.dims().0 * format.row_bytes(m.dims().1).expect("whole blocks"))
        .sum();
    let rows = setting("ROWS", 1);
    let inputs =
        |k: usize| -> Vec<f32> { (0..rows * k).map(|i| (i % 17) as f32 / 8.0 - 1.0).collect() };
    let (narrow, wide) = (inputs(hidden), inputs(ffn));
    let buffer: Vec<u64> = (0..(1u64 << 30) / 8).collect();
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .expect("a pool");
    pool.install(|| {
        for round in 0..rounds {
            let products = best_of_five(bytes, || {
                with_threads_awake(|| {
                    for group in &groups {
                        let matrices: Vec<&QMatrix> = group.iter().collect();
                        let x = if group[0].dims().1 == hidden { &narrow } else { &wide };
                        std::hint::black_box(matmul_many(&matrices, x, rows));
                    }
                })
            });
            let read = best_of_five(buffer.len() * 8, || {
                let sum = (buffer.par_chunks(1 << 16))
                    .map(streaming_sum)
                    .reduce(|| 0, u64::wrapping_add);
                std::hint::black_box(sum);
            });
            println!(
                "round {round}: products of {:.0} MB {products:.1} GB/s, memory read {read:.1} GB/s ({:.0}%)",
                bytes as f64 / 1e6,
                100.0 * products / read
            );
        }
    });
}
