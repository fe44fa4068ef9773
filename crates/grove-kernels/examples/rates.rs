//! Int8 multiply-adds per second of each quantized format's product on this CPU's kernel, for
//! 1, 4, 8 and 16 activation rows (best of five): the in-cache rates of docs/benchmarks.md.
//! `RAYON_NUM_THREADS=1 taskset -c 0 cargo run --release -p grove-kernels --example rates`;
//! `QN`, `QK` set the matrix (512 x 1024: in L2), `ROWS` the row counts (`1,4,8,16`),
//! `FORMATS` the formats by name (all twelve: `Q8_0,Q5_0,Q5_1,Q4_0,Q4_1,Q2_K,Q3_K,Q4_K,Q5_K,`
//! `Q6_K,IQ4_NL,IQ4_XS`), for example to run one under `perf stat`.

use grove_kernels::quant::{Kernel, QMatrix, QuantFormat};
use std::time::Instant;
fn main() {
    let n: usize = std::env::var("QN")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(512);
    let k: usize = std::env::var("QK")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1024);
    let rows_list: Vec<usize> = std::env::var("ROWS")
        .ok()
        .map(|v| v.split(',').map(|s| s.parse().unwrap()).collect())
        .unwrap_or(vec![1, 4, 8, 16]);
    for format in QuantFormat::ALL {
        if let Ok(names) = std::env::var("FORMATS") {
            if !names.split(',').any(|name| name == format.name()) {
                continue;
            }
        }
        let m = QMatrix::random(format, n, k, 1);
        let mut line = format!("{:5}", format.name());
        for &rows in &rows_list {
            let x: Vec<f32> = (0..rows * k)
                .map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0)
                .collect();
            let reps = 200 / rows.max(1) + 20;
            let mut best = f64::MAX;
            for _ in 0..5 {
                let t = Instant::now();
                for _ in 0..reps {
                    std::hint::black_box(m.matmul_with(Kernel::detect(), &x, rows));
                }
                best = best.min(t.elapsed().as_secs_f64() / reps as f64);
            }
            line += &format!("  r{rows}: {:6.1} G", (n * k * rows) as f64 / best / 1e9);
        }
        println!("{line}");
    }
}
