//! A streaming matmul for the few-row products that dominate decoding and small verifies:
//! `y = x W^T` with `x: [rows, k]`, `W: [n, k]` row-major. Each weight row is read from memory
//! once and dotted with every input row while it sits in L1, so the cost stays at one pass
//! over the weights for up to [`MAX_STREAMING_ROWS`] rows. candle's general f32 gemm packs the
//! whole weight matrix on every call, which at one row reads and writes it twice.

use rayon::prelude::*;

/// Above this many rows candle's blocked gemm wins (measured on the development machine: equal
/// at 16 rows on a Qwen3-0.6B-shaped model, streaming ahead below).
pub const MAX_STREAMING_ROWS: usize = 8;

/// Weight rows per parallel task: enough work to amortize scheduling, small enough to balance.
const ROWS_PER_TASK: usize = 64;

/// Below this many multiply-adds a product runs on the calling thread: handing it to the pool
/// would cost more (a wake-up and a context switch) than it saves.
const PARALLEL_MIN_WORK: usize = 1 << 20;

/// `x W^T` as `[rows, n]`.
pub fn matmul_transposed(x: &[f32], rows: usize, weight: &[f32], n: usize, k: usize) -> Vec<f32> {
    debug_assert_eq!(x.len(), rows * k);
    debug_assert_eq!(weight.len(), n * k);
    // Computed weight-row major ([n, rows]) so each task writes one contiguous block.
    let mut transposed = vec![0f32; n * rows];
    let task = |(outputs, weights): (&mut [f32], &[f32])| {
        for (out, w) in outputs.chunks_exact_mut(rows).zip(weights.chunks_exact(k)) {
            for (value, input) in out.iter_mut().zip(x.chunks_exact(k)) {
                *value = dot(input, w);
            }
        }
    };
    if n * k * rows >= PARALLEL_MIN_WORK {
        transposed
            .par_chunks_mut(ROWS_PER_TASK * rows)
            .zip(weight.par_chunks(ROWS_PER_TASK * k))
            .for_each(task);
    } else {
        transposed
            .chunks_mut(ROWS_PER_TASK * rows)
            .zip(weight.chunks(ROWS_PER_TASK * k))
            .for_each(task);
    }
    let mut output = vec![0f32; rows * n];
    for (j, column) in transposed.chunks_exact(rows).enumerate() {
        for (i, &value) in column.iter().enumerate() {
            output[i * n + j] = value;
        }
    }
    output
}

/// Dot product; uses AVX2 + FMA when the CPU has them.
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
        // SAFETY: the features `dot_fma` is compiled for were just detected on this CPU.
        #[allow(unsafe_code)]
        return unsafe { dot_fma(a, b) };
    }
    dot_portable(a, b)
}

const LANES: usize = 16;

fn dot_portable(a: &[f32], b: &[f32]) -> f32 {
    dot_lanes(a, b, |x, y, acc| acc + x * y)
}

/// The same loop compiled for AVX2 with fused multiply-adds (two 8-wide accumulators).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn dot_fma(a: &[f32], b: &[f32]) -> f32 {
    dot_lanes(a, b, |x, y, acc| x.mul_add(y, acc))
}

/// `LANES` independent accumulators over fixed-size chunks (no bounds checks, so the loop
/// vectorizes); inlined so that each caller compiles it with its own target features.
#[inline(always)]
fn dot_lanes(a: &[f32], b: &[f32], step: impl Fn(f32, f32, f32) -> f32) -> f32 {
    let mut acc = [0f32; LANES];
    let (chunks_a, chunks_b) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    let tail: f32 = chunks_a
        .remainder()
        .iter()
        .zip(chunks_b.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in chunks_a.zip(chunks_b) {
        let (x, y): (&[f32; LANES], &[f32; LANES]) =
            (x.try_into().expect("lanes"), y.try_into().expect("lanes"));
        for l in 0..LANES {
            acc[l] = step(x[l], y[l], acc[l]);
        }
    }
    acc.iter().sum::<f32>() + tail
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Tensor};

    #[test]
    fn streaming_matmul_equals_candle_for_every_small_row_count() {
        let (n, k) = (37, 133); // ragged against lanes and task size
        let weight = Tensor::randn(0f32, 1.0, (n, k), &Device::Cpu).unwrap();
        for rows in [1, 2, 3, 8, MAX_STREAMING_ROWS] {
            let x = Tensor::randn(0f32, 1.0, (rows, k), &Device::Cpu).unwrap();
            let expected: Vec<f32> = x
                .matmul(&weight.t().unwrap())
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1()
                .unwrap();
            let ours = matmul_transposed(
                &x.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
                rows,
                &weight.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
                n,
                k,
            );
            for (a, b) in ours.iter().zip(&expected) {
                assert!(
                    (a - b).abs() < 1e-4 * (1.0 + b.abs()),
                    "rows {rows}: {a} vs {b}"
                );
            }
        }
    }

    #[test]
    fn portable_and_fma_dots_agree() {
        let a: Vec<f32> = (0..101).map(|i| (i as f32 * 0.37).sin()).collect();
        let b: Vec<f32> = (0..101).map(|i| (i as f32 * 0.11).cos()).collect();
        let exact: f64 = a
            .iter()
            .zip(&b)
            .map(|(x, y)| f64::from(*x) * f64::from(*y))
            .sum();
        assert!((f64::from(dot_portable(&a, &b)) - exact).abs() < 1e-4);
        assert!((f64::from(dot(&a, &b)) - exact).abs() < 1e-4);
    }
}
