//! The few-row products of decoding and small verifies: the column strips (the dense kernel
//! models use; f32, and bfloat16 weights in each arithmetic) and the streaming kernel against candle's gemm on a Qwen3-0.6B MLP weight
//! (3072 x 1024) for 1, 4, 8 and 16 rows; and the quantized kernels
//! against candle's quantized matmul on a Qwen2.5-0.5B MLP weight (4864 x 896) in each GGUF
//! format. `cargo bench -p grove-kernels`; `QN` / `QK` set the quantized shape (a head:
//! `QN=151936 QK=896`). And attention for a tree's rows over a long context (Qwen2.5-0.5B's
//! heads and Qwen2.5-1.5B's, 4096 tokens of context, 1, 16 and 64 rows).

use candle_core::{Device, Module, Tensor};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use grove_kernels::dense::matmul_transposed;
use grove_kernels::quant::{QMatrix, QuantFormat};
use grove_kernels::strips::{Bf16Arithmetic, DenseStrips};

fn small_row_matmul(c: &mut Criterion) {
    let (n, k) = (3072, 1024);
    let weight = Tensor::randn(0f32, 1.0, (n, k), &Device::Cpu).unwrap();
    let weight_host: Vec<f32> = weight.flatten_all().unwrap().to_vec1().unwrap();
    let strips = DenseStrips::new(&weight_host, n, k);
    let halves: Vec<half::bf16> = weight_host
        .iter()
        .map(|&v| half::bf16::from_f32(v))
        .collect();
    let bf16_strips = DenseStrips::new_bf16(&halves, n, k);
    let mut group = c.benchmark_group("matmul_3072x1024");
    for rows in [1usize, 4, 8, 16] {
        let x = Tensor::randn(0f32, 1.0, (rows, k), &Device::Cpu).unwrap();
        let x_host: Vec<f32> = x.flatten_all().unwrap().to_vec1().unwrap();
        group.bench_with_input(BenchmarkId::new("strips", rows), &rows, |b, &rows| {
            b.iter(|| strips.matmul(&x_host, rows))
        });
        for arithmetic in [Bf16Arithmetic::Widened, Bf16Arithmetic::Dot] {
            let name = format!("bf16 strips, {}", arithmetic.name());
            group.bench_with_input(BenchmarkId::new(name, rows), &rows, |b, &rows| {
                b.iter(|| bf16_strips.matmul_in(&x_host, rows, arithmetic))
            });
        }
        group.bench_with_input(BenchmarkId::new("streaming", rows), &rows, |b, &rows| {
            b.iter(|| matmul_transposed(&x_host, rows, &weight_host, n, k))
        });
        group.bench_with_input(BenchmarkId::new("candle", rows), &rows, |b, _| {
            b.iter(|| x.matmul(&weight.t().unwrap()).unwrap())
        });
    }
    group.finish();
}

fn quantized_matmul(c: &mut Criterion) {
    use candle_core::quantized::{ggml_file::qtensor_from_ggml, GgmlDType, QMatMul};
    let (n, k) = (
        std::env::var("QN")
            .map(|v| v.parse().unwrap())
            .unwrap_or(4864),
        std::env::var("QK")
            .map(|v| v.parse().unwrap())
            .unwrap_or(896),
    );
    let formats = [
        (QuantFormat::Q8_0, GgmlDType::Q8_0),
        (QuantFormat::Q5_0, GgmlDType::Q5_0),
        (QuantFormat::Q5_1, GgmlDType::Q5_1),
        (QuantFormat::Q4_0, GgmlDType::Q4_0),
        // K-quants need k % 256 == 0: 4864 x 1024 instead.
        (QuantFormat::Q2K, GgmlDType::Q2K),
        (QuantFormat::Q3K, GgmlDType::Q3K),
        (QuantFormat::Q4K, GgmlDType::Q4K),
        (QuantFormat::Q5K, GgmlDType::Q5K),
        (QuantFormat::Q6K, GgmlDType::Q6K),
    ];
    for (format, dtype) in formats {
        let k = if format.block_weights() == 256 {
            1024
        } else {
            k
        };
        let matrix = QMatrix::random(format, n, k, 1);
        let bytes = matrix.to_bytes();
        let candle = QMatMul::from_qtensor(
            qtensor_from_ggml(dtype, &bytes, vec![n, k], &Device::Cpu).unwrap(),
        )
        .unwrap();
        let mut group = c.benchmark_group(format!("{}_{n}x{k}", format.name()));
        for rows in [1usize, 4, 16] {
            let x = Tensor::randn(0f32, 1.0, (rows, k), &Device::Cpu).unwrap();
            let x_host: Vec<f32> = x.flatten_all().unwrap().to_vec1().unwrap();
            group.bench_with_input(BenchmarkId::new("grove", rows), &rows, |b, &rows| {
                b.iter(|| matrix.matmul(&x_host, rows))
            });
            group.bench_with_input(BenchmarkId::new("candle", rows), &rows, |b, _| {
                b.iter(|| candle.forward(&x).unwrap())
            });
        }
        group.finish();
    }
}

/// One layer's attention for `rows` tree rows over 4096 context slots: row `r` sees the context
/// and the path `4096..=4096 + r` (a chain, the deepest tree of that many rows).
fn tree_attention(c: &mut Criterion) {
    use grove_kernels::attention::{attend, HeadLayout, KvRows};
    let to_f16 =
        |v: &[f32]| -> Vec<half::f16> { v.iter().map(|&x| half::f16::from_f32(x)).collect() };
    let to_bf16 =
        |v: &[f32]| -> Vec<half::bf16> { v.iter().map(|&x| half::bf16::from_f32(x)).collect() };
    let context = 4096;
    // Qwen3-0.6B: 8 KV heads of 2 query heads each, the decode row's shape `across.rs` takes.
    let layouts = [
        ("qwen2.5-0.5b", 14, 2, 64),
        ("qwen2.5-1.5b", 12, 2, 128),
        ("qwen3-0.6b", 16, 8, 128),
    ];
    for (name, num_heads, num_kv_heads, head_dim) in layouts {
        let layout = HeadLayout {
            num_heads,
            num_kv_heads,
            head_dim,
        };
        let kv_width = num_kv_heads * head_dim;
        let slots = context + 64;
        let random = |n: usize| -> Vec<f32> {
            let t = Tensor::randn(0f32, 1.0, n, &Device::Cpu).unwrap();
            t.to_vec1().unwrap()
        };
        let (keys, values) = (random(slots * kv_width), random(slots * kv_width));
        let mut group = c.benchmark_group(format!("attention_{name}_context{context}"));
        group.sample_size(10);
        for rows in [1usize, 16, 64] {
            let key_slots: Vec<Vec<usize>> =
                (0..rows).map(|r| (0..=context + r).collect()).collect();
            let queries = random(rows * num_heads * head_dim);
            let scale = 1.0 / (head_dim as f32).sqrt();
            group.bench_with_input(BenchmarkId::new("rows", rows), &rows, |b, _| {
                b.iter(|| attend(&key_slots, layout, scale, &queries, &keys, &values))
            });
            // The cache in f16 (the default) and in bf16 (`dot.rs` where the CPU has it).
            let (keys16, values16) = (to_f16(&keys), to_f16(&values));
            group.bench_with_input(BenchmarkId::new("rows_f16", rows), &rows, |b, _| {
                let (k, v) = (KvRows::F16(&keys16), KvRows::F16(&values16));
                b.iter(|| attend(&key_slots, layout, scale, &queries, k, v))
            });
            let (keys_bf16, values_bf16) = (to_bf16(&keys), to_bf16(&values));
            group.bench_with_input(BenchmarkId::new("rows_bf16", rows), &rows, |b, _| {
                let (k, v) = (KvRows::Bf16(&keys_bf16), KvRows::Bf16(&values_bf16));
                b.iter(|| attend(&key_slots, layout, scale, &queries, k, v))
            });
        }
        group.finish();
    }
}

criterion_group!(benches, small_row_matmul, quantized_matmul, tree_attention);
criterion_main!(benches);
