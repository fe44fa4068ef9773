//! The products' drivers: the input quantized once, the weight rows cut into tasks for the
//! threads, each task's outputs written in place.

use std::cell::RefCell;
use std::mem::MaybeUninit;

use super::{Kernel, QMatrix, QuantFormat, QuantizedRows, PARALLEL_MIN_WORK, WEIGHT_ROWS_PER_TASK};
use crate::threads::{for_each_columns_mut, scratch, Columns, OutRows};

/// `x W^T` for each of `matrices` (all `[_, k]`), as `[rows, n]` each, on the fastest kernel
/// this CPU has. One parallel pass over all of them: a decoding step hands work to the threads
/// once for q, k and v and once for gate and up, instead of once per matrix (each hand-off
/// and each wait for the slowest thread costs about as much as a small matrix's product).
pub fn matmul_many(matrices: &[&QMatrix], x: &[f32], rows: usize) -> Vec<Vec<f32>> {
    matmul_many_with(Kernel::detect(), matrices, x, rows)
}

/// [`matmul_many`] on a chosen kernel.
pub fn matmul_many_with(
    kernel: Kernel,
    matrices: &[&QMatrix],
    x: &[f32],
    rows: usize,
) -> Vec<Vec<f32>> {
    let Some(k) = matrices.first().map(|m| m.k) else {
        return Vec::new();
    };
    assert!(
        matrices.iter().all(|m| m.k == k),
        "matrices of different widths"
    );
    check_inputs(kernel, x, rows, k);
    let quantized = quantize_for(kernel, matrices, x, rows);
    // Each task writes its weight rows' columns of every row into outputs that nothing
    // writes before it: zeroing a head's 600 KB of logits up front, in memory the weights'
    // stream had pushed out of the caches, and listing its 4748 tasks made its product's
    // preparation 70-90 us (now 4; Qwen2.5-0.5B, all products: 0.5 -> 0.26 ms a step).
    let mut outputs: Vec<Vec<f32>> = matrices
        .iter()
        .map(|m| Vec::with_capacity(m.n * rows))
        .collect();
    let mut values: Vec<&mut [MaybeUninit<f32>]> = outputs
        .iter_mut()
        .zip(matrices)
        .map(|(output, matrix)| &mut output.spare_capacity_mut()[..matrix.n * rows])
        .collect();
    let acts: Vec<&QuantizedRows> = matrices
        .iter()
        .map(|matrix| acts_for(&quantized, matrix))
        .collect();
    let run = |m: usize, index: usize, mut columns: Columns<'_, MaybeUninit<f32>>| {
        let first = index * WEIGHT_ROWS_PER_TASK;
        columns.fill_rows(|out| matrices[m].task(kernel, acts[m], first, out));
    };
    let size: usize = matrices.iter().map(|m| m.n * k * rows).sum();
    let parallel = size >= PARALLEL_MIN_WORK;
    for_each_columns_mut(&mut values, rows, WEIGHT_ROWS_PER_TASK, parallel, run);
    for (output, matrix) in outputs.iter_mut().zip(matrices) {
        // SAFETY: the tasks above initialized all of `..n * rows` (each its own columns of
        // every row); a task that panicked never gets here.
        #[allow(unsafe_code)]
        unsafe {
            output.set_len(matrix.n * rows)
        };
    }
    outputs
}

/// `gate(x W_g^T, x W_u^T)` (both `[n, k]`) as `[rows, n]`: `gate` maps a block of the two
/// products (equal shapes, `[rows, w]` each) to the same block of the output, as a gated MLP's
/// activation does elementwise. One parallel pass where each task computes its rows of both
/// products and gates them while they are in L1: the activation leaves the serial stretch
/// between the products (it was 6 us a layer of a Qwen2.5-0.5B decode step, its inputs cold).
pub fn matmul_gated(
    gate_matrix: &QMatrix,
    up_matrix: &QMatrix,
    x: &[f32],
    rows: usize,
    gate: impl Fn(&[f32], &[f32], OutRows<'_>) + Sync,
) -> Vec<f32> {
    matmul_gated_with(Kernel::detect(), gate_matrix, up_matrix, x, rows, gate)
}

/// [`matmul_gated`] on a chosen kernel.
pub fn matmul_gated_with(
    kernel: Kernel,
    gate_matrix: &QMatrix,
    up_matrix: &QMatrix,
    x: &[f32],
    rows: usize,
    gate: impl Fn(&[f32], &[f32], OutRows<'_>) + Sync,
) -> Vec<f32> {
    let (n, k) = gate_matrix.dims();
    assert_eq!(up_matrix.dims(), (n, k), "gate and up differ in shape");
    check_inputs(kernel, x, rows, k);
    let quantized = quantize_for(kernel, &[gate_matrix, up_matrix], x, rows);
    let (gate_acts, up_acts) = (
        acts_for(&quantized, gate_matrix),
        acts_for(&quantized, up_matrix),
    );
    let mut output: Vec<f32> = Vec::with_capacity(n * rows);
    thread_local! {
        /// A task's two products, before they are gated into its columns of the output.
        static PRODUCTS: RefCell<(Vec<f32>, Vec<f32>)> = const { RefCell::new((Vec::new(), Vec::new())) };
    }
    let run = |_: usize, index: usize, mut columns: Columns<'_, MaybeUninit<f32>>| {
        let first = index * WEIGHT_ROWS_PER_TASK;
        let w = columns.width();
        columns.fill_rows(|out| {
            PRODUCTS.with_borrow_mut(|(gates, ups)| {
                let (gates, ups) = (scratch(gates, w * rows), scratch(ups, w * rows));
                gate_matrix.task(kernel, gate_acts, first, OutRows::block(gates, rows));
                up_matrix.task(kernel, up_acts, first, OutRows::block(ups, rows));
                gate(gates, ups, out);
            })
        });
    };
    let values = &mut output.spare_capacity_mut()[..n * rows];
    let parallel = 2 * n * k * rows >= PARALLEL_MIN_WORK;
    for_each_columns_mut(&mut [values], rows, WEIGHT_ROWS_PER_TASK, parallel, run);
    // SAFETY: every task's columns of `..n * rows` were initialized (`Columns::fill`); a
    // task that panicked never gets here.
    #[allow(unsafe_code)]
    unsafe {
        output.set_len(n * rows)
    };
    output
}

/// Panics unless `x` is `[rows, k]` and `kernel` runs on this CPU (the SIMD kernels are only
/// sound where it has their features).
fn check_inputs(kernel: Kernel, x: &[f32], rows: usize, k: usize) {
    assert_eq!(x.len(), rows * k, "input is not [rows, k]");
    assert!(kernel.runs_here(), "{kernel:?} kernel on a CPU without it");
}

/// `x` quantized once per activation block size the formats of `matrices` need (32 and/or
/// 256).
fn quantize_for(
    kernel: Kernel,
    matrices: &[&QMatrix],
    x: &[f32],
    rows: usize,
) -> Vec<QuantizedRows> {
    let mut quantized: Vec<QuantizedRows> = Vec::new();
    for matrix in matrices {
        let block = matrix.format.activation_block();
        if !quantized.iter().any(|acts| acts.block == block) {
            let mut formats: Vec<QuantFormat> = matrices
                .iter()
                .map(|m| m.format)
                .filter(|f| f.activation_block() == block)
                .collect();
            formats.dedup();
            quantized.push(QuantizedRows::for_kernel(
                kernel.activations(),
                x,
                rows,
                matrix.k,
                &formats,
            ));
        }
    }
    quantized
}

/// The quantized input `matrix`'s format reads, among those [`quantize_for`] made.
fn acts_for<'a>(quantized: &'a [QuantizedRows], matrix: &QMatrix) -> &'a QuantizedRows {
    let block = matrix.format.activation_block();
    quantized
        .iter()
        .find(|acts| acts.block == block)
        .expect("quantized for every matrix")
}
