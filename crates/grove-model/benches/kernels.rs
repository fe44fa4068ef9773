//! The few-row products of decoding and small verifies: the streaming kernel against candle's
//! gemm on a Qwen3-0.6B MLP weight (3072 x 1024) for 1, 4 and 8 rows. `cargo bench -p grove-model`.

use candle_core::{Device, Tensor};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use grove_model::kernels::matmul_transposed;

fn small_row_matmul(c: &mut Criterion) {
    let (n, k) = (3072, 1024);
    let weight = Tensor::randn(0f32, 1.0, (n, k), &Device::Cpu).unwrap();
    let weight_host: Vec<f32> = weight.flatten_all().unwrap().to_vec1().unwrap();
    let mut group = c.benchmark_group("matmul_3072x1024");
    for rows in [1usize, 4, 8] {
        let x = Tensor::randn(0f32, 1.0, (rows, k), &Device::Cpu).unwrap();
        let x_host: Vec<f32> = x.flatten_all().unwrap().to_vec1().unwrap();
        group.bench_with_input(BenchmarkId::new("streaming", rows), &rows, |b, &rows| {
            b.iter(|| matmul_transposed(&x_host, rows, &weight_host, n, k))
        });
        group.bench_with_input(BenchmarkId::new("candle", rows), &rows, |b, _| {
            b.iter(|| x.matmul(&weight.t().unwrap()).unwrap())
        });
    }
    group.finish();
}

criterion_group!(benches, small_row_matmul);
criterion_main!(benches);
