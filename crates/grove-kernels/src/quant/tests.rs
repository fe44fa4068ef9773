use std::sync::Arc;

use candle_core::quantized::{ggml_file::qtensor_from_ggml, GgmlDType};
use candle_core::Device;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::*;

const FORMATS: [QuantFormat; 4] = [
    QuantFormat::Q8_0,
    QuantFormat::Q5_0,
    QuantFormat::Q4K,
    QuantFormat::Q6K,
];

fn ggml_dtype(format: QuantFormat) -> GgmlDType {
    match format {
        QuantFormat::Q8_0 => GgmlDType::Q8_0,
        QuantFormat::Q5_0 => GgmlDType::Q5_0,
        QuantFormat::Q4K => GgmlDType::Q4K,
        QuantFormat::Q6K => GgmlDType::Q6K,
    }
}

fn random_input(rows: usize, k: usize, seed: u64) -> Vec<f32> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..rows * k)
        .map(|_| rng.random_range(-2.0f32..2.0))
        .collect()
}

#[test]
fn dequantize_matches_candle() {
    for format in FORMATS {
        let (n, k) = (3, 512);
        let matrix = QMatrix::random(format, n, k, 1);
        let ours = matrix.dequantize();
        let candle = qtensor_from_ggml(
            ggml_dtype(format),
            &matrix.to_bytes(),
            vec![n, k],
            &Device::Cpu,
        )
        .and_then(|q| q.dequantize(&Device::Cpu))
        .and_then(|t| t.flatten_all()?.to_vec1::<f32>())
        .expect("candle dequantizes");
        for (i, (a, b)) in ours.iter().zip(&candle).enumerate() {
            assert!(
                (a - b).abs() <= 1e-6 * b.abs().max(1.0),
                "{} element {i}: ours {a}, candle {b}",
                format.name()
            );
        }
    }
}

/// Every kernel against `x W^T` in f32 over the dequantized weights. The only difference
/// allowed is the 8-bit rounding of the activations: at most half a step (`amax / 254`) per
/// value, so `|error| <= sum_i |w_i| * amax(block of i) / 254` per output.
#[test]
fn kernels_match_dequantize_then_matmul() {
    let mut kernels = vec![Kernel::Scalar];
    if Kernel::detect() != Kernel::Scalar {
        kernels.push(Kernel::detect());
    } else {
        eprintln!("no AVX-512 VNNI on this CPU: only the scalar kernel is tested");
    }
    for (format, layout) in layouts() {
        // One activation row (the multi-weight-row kernel, with a leftover row and partial
        // groups of chunks), a single last row after full tiles, several tiles.
        for &(n, k, rows) in &[
            (5, 256, 1),
            (38, 1280, 1),
            (37, 512, 3),
            (13, 960, 1),
            (9, 448, 5),
            (70, 768, 9),
            (40, 256, 70),
        ] {
            // 960 and 448 (every power of two of chunks after the full groups) are for the
            // 32-weight formats only.
            if !usize::is_multiple_of(k, format.block_weights()) {
                continue;
            }
            let matrix = in_layout(&QMatrix::random(format, n, k, n as u64), layout);
            let weights = matrix.dequantize();
            let x = random_input(rows, k, rows as u64);
            for &kernel in &kernels {
                let y = matrix.matmul_with(kernel, &x, rows);
                for r in 0..rows {
                    let input = &x[r * k..(r + 1) * k];
                    for j in 0..n {
                        let w = &weights[j * k..(j + 1) * k];
                        let exact: f32 = w.iter().zip(input).map(|(a, b)| a * b).sum();
                        let block = format.activation_block();
                        let bound: f32 = input
                            .chunks_exact(block)
                            .zip(w.chunks_exact(block))
                            .map(|(xs, ws)| {
                                let amax = xs.iter().fold(0f32, |m, v| m.max(v.abs()));
                                ws.iter().map(|v| v.abs()).sum::<f32>() * amax / 254.0
                            })
                            .sum();
                        let got = y[r * n + j];
                        assert!(
                            (got - exact).abs() <= bound * 1.001 + 1e-3,
                            "{} {layout:?} {kernel:?} [{n}, {k}] x {rows} rows: row {r} col \
                             {j}: {got} vs {exact} (bound {bound})",
                            format.name()
                        );
                    }
                }
            }
        }
    }
}

/// Every format in every layout it can have.
fn layouts() -> Vec<(QuantFormat, Layout)> {
    FORMATS
        .into_iter()
        .flat_map(|format| {
            let interleaved = (format.block_weights() == 32).then_some(Layout::Interleaved);
            [Some(Layout::Gguf), interleaved, Some(Layout::Columns)]
                .into_iter()
                .flatten()
                .map(move |layout| (format, layout))
        })
        .collect()
}

fn in_layout(matrix: &QMatrix, layout: Layout) -> QMatrix {
    let (n, k) = matrix.dims();
    let bytes = Bytes::Owned(Arc::new(matrix.to_bytes()));
    QMatrix::with_layout(matrix.format(), n, k, bytes, layout).expect("a valid matrix")
}

#[test]
fn lane_blocking_places_every_word_once_in_its_blocks_lanes() {
    for chunks in [1, 2, 4, 8] {
        let mut seen = vec![false; chunks * CHUNK / 4];
        for b in 0..2 * chunks {
            for d in 0..8 {
                let at = interleave::lane_offset(chunks, b, d);
                assert_eq!(at % 4, 0);
                assert!(
                    !std::mem::replace(&mut seen[at / 4], true),
                    "{chunks}: {b} {d}"
                );
                // Every lane holds one block: the one the kernels' spread scales give it.
                assert_eq!((at % CHUNK / 4) % (2 * chunks), b);
            }
        }
        assert!(seen.iter().all(|&s| s));
    }
    // Rows of 15 chunks: groups of 8, 4, 2 and 1, one after another.
    let spans: Vec<_> = (0..interleave::group_count(15))
        .map(|q| interleave::group_span(15, q))
        .collect();
    assert_eq!(spans, [(0, 8), (8, 4), (12, 2), (14, 1)]);
    // Any row: the groups tile it in order, in powers of two no larger than 8, shrinking.
    for chunks in 1..=70 {
        let mut next = 0;
        let mut last = usize::MAX;
        for q in 0..interleave::group_count(chunks) {
            let (first, count) = interleave::group_span(chunks, q);
            assert_eq!(first, next, "{chunks} chunks, group {q}");
            assert!(count.is_power_of_two() && count <= 8 && count <= last);
            (next, last) = (first + count, count);
        }
        assert_eq!(next, chunks, "{chunks} chunks");
    }
}

#[test]
fn no_q5_0_load_straddles_two_cache_lines() {
    // The kernels read a row's 32 nibble bytes and 8 bytes of fifth bits of each chunk. The
    // interleaved copy starts on a page; with an even chunk count per row (widths that are
    // multiples of 128, as every real model's are) each row group is a multiple of 32 bytes,
    // and no load of any row group may cross a 64-byte line.
    let format = QuantFormat::Q5_0;
    for chunks in (2..=80).step_by(2) {
        let k = chunks * CHUNK;
        let group_bytes = interleave::GROUP_ROWS * format.row_bytes(k).unwrap();
        for g in 0..2 {
            for q in 0..interleave::group_count(chunks) {
                let group = interleave::ChunkGroup::new(format, chunks, q);
                for i in 0..group.chunks {
                    for p in 0..interleave::GROUP_ROWS {
                        let chunk = g * group_bytes + group.chunk(format, i);
                        let (nibbles, bits) = interleave::payload_parts(format, p);
                        for (at, len) in [(chunk + nibbles, 32), (chunk + bits, 8)] {
                            assert_eq!(at / 64, (at + len - 1) / 64, "k {k}, group {g}, {i} {p}");
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn interleaving_keeps_every_block() {
    // Row counts around the 4-row groups, chunk counts around the 8-chunk groups.
    for format in [QuantFormat::Q8_0, QuantFormat::Q5_0] {
        for n in [1, 3, 4, 5, 9] {
            for k in [64, 448, 512, 576, 1088] {
                let gguf = QMatrix::random(format, n, k, (n * k) as u64);
                let gguf = in_layout(&gguf, Layout::Gguf);
                let interleaved = in_layout(&gguf, Layout::Interleaved);
                assert_eq!(interleaved.layout(), Layout::Interleaved);
                assert_eq!(
                    interleaved.to_bytes(),
                    gguf.to_bytes(),
                    "{} [{n}, {k}]",
                    format.name()
                );
                assert_eq!(interleaved.dequantize(), gguf.dequantize());
            }
        }
    }
    let bytes = Bytes::Owned(Arc::new(vec![0; 144]));
    let error = QMatrix::with_layout(QuantFormat::Q4K, 1, 256, bytes, Layout::Interleaved);
    assert!(error.unwrap_err().contains("not kept interleaved"));
}

#[test]
fn permuting_k_quants_keeps_every_super_block() {
    for format in [QuantFormat::Q4K, QuantFormat::Q6K] {
        for (n, k) in [(1, 256), (3, 512), (5, 1536)] {
            let gguf = QMatrix::random(format, n, k, (n * k) as u64);
            let gguf = in_layout(&gguf, Layout::Gguf);
            let permuted = in_layout(&gguf, Layout::Permuted);
            assert_eq!(permuted.layout(), Layout::Permuted);
            let name = format!("{} [{n}, {k}]", format.name());
            assert_eq!(permuted.to_bytes(), gguf.to_bytes(), "{name}");
            assert_eq!(permuted.dequantize(), gguf.dequantize(), "{name}");
            // The layout moves quants, not headers, and changes the bytes.
            assert_ne!(permuted.bytes.as_slice(), gguf.bytes.as_slice(), "{name}");
        }
    }
    let bytes = Bytes::Owned(Arc::new(vec![0; 44]));
    let error = QMatrix::with_layout(QuantFormat::Q5_0, 1, 64, bytes, Layout::Permuted);
    assert!(error.unwrap_err().contains("not kept permuted"));
}

#[test]
fn a_permuted_lane_holds_one_sub_block() {
    use super::kpermute::at;
    for (format, sub_block) in [(QuantFormat::Q4K, 32), (QuantFormat::Q6K, 16)] {
        let mut seen = [false; 256];
        for l in 0..16 {
            let lane: Vec<usize> = (0..4)
                .flat_map(|v| (0..4).map(move |b| at(format, v, l, b)))
                .collect();
            let first = lane[0] / sub_block;
            assert!(lane.iter().all(|&w| w / sub_block == first), "{lane:?}");
            for w in lane {
                assert!(!std::mem::replace(&mut seen[w], true), "weight {w} twice");
            }
        }
        assert!(
            seen.iter().all(|&s| s),
            "{}: every weight placed",
            format.name()
        );
    }
}

#[test]
fn a_mapped_source_released_while_copied_still_reads_the_same() {
    // Large enough for several slabs and whole pages to release.
    let (n, k) = (8195, 2048);
    let source = QMatrix::random(QuantFormat::Q8_0, n, k, 3).to_bytes();
    assert!(source.len() > 2 * INTERLEAVE_SLAB);
    let path = std::env::temp_dir().join(format!("grove-release-{}.bin", std::process::id()));
    std::fs::write(&path, &source).unwrap();
    let file = std::fs::File::open(&path).unwrap();
    // SAFETY: a private temporary file nobody else writes.
    #[allow(unsafe_code)]
    let map = Arc::new(unsafe { memmap2::Mmap::map(&file) }.unwrap());
    let bytes = Bytes::Mapped {
        map: map.clone(),
        start: 0,
        len: source.len(),
    };
    let matrix = QMatrix::with_layout(QuantFormat::Q8_0, n, k, bytes, Layout::Interleaved);
    let matrix = matrix.unwrap();
    std::fs::remove_file(&path).unwrap();
    assert_eq!(matrix.to_bytes(), source);
    // The released pages read back from the file.
    assert!(map[..] == source[..]);
}

#[cfg(target_arch = "x86_64")]
#[test]
fn q5_0_kernels_with_and_without_gfni_give_the_same_bits() {
    let test = "q5_0_kernels_with_and_without_gfni_give_the_same_bits";
    if crate::skip_without("avx512", Kernel::detect() != Kernel::Scalar, test)
        || crate::skip_without("gfni", std::arch::is_x86_feature_detected!("gfni"), test)
    {
        return;
    }
    // Decode rows and tiles, a partial chunk group, a row group past the last row.
    let (n, k) = (37, 1280);
    let matrix = QMatrix::random(QuantFormat::Q5_0, n, k, 5);
    for rows in [1, 3, 9] {
        let x = random_input(rows, k, rows as u64);
        let with = matrix.matmul(&x, rows);
        super::simd32::set_gfni_allowed(false);
        let without = matrix.matmul(&x, rows);
        super::simd32::set_gfni_allowed(true);
        assert_eq!(with, without, "{rows} rows");
    }
}

#[test]
fn simd_and_scalar_agree_closely() {
    let simd = Kernel::detect();
    if crate::skip_without(
        "avx512",
        simd != Kernel::Scalar,
        "simd_and_scalar_agree_closely",
    ) {
        return;
    }
    for (format, rows) in FORMATS.into_iter().flat_map(|f| [(f, 1), (f, 6)]) {
        let (n, k) = (300, 1024);
        let matrix = QMatrix::random(format, n, k, 7);
        assert_eq!(matrix.layout(), Layout::for_kernel(format, simd));
        let x = random_input(rows, k, 8);
        let a = matrix.matmul_with(Kernel::Scalar, &x, rows);
        let b = matrix.matmul_with(simd, &x, rows);
        // Same arithmetic, other summation order: f32 rounding of terms as large as the
        // largest outputs.
        let largest = a.iter().fold(0f32, |m, v| m.max(v.abs()));
        for (i, (a, b)) in a.iter().zip(&b).enumerate() {
            assert!(
                (a - b).abs() <= 1e-5 * largest,
                "{} x {rows} rows, output {i}: scalar {a}, simd {b}",
                format.name()
            );
        }
    }
}

#[test]
fn bad_shapes_are_refused() {
    let bytes = Bytes::Owned(Arc::new(vec![0; 34 * 3]));
    let error = QMatrix::new(QuantFormat::Q8_0, 1, 96, bytes).unwrap_err();
    assert!(error.contains("96 weights"), "{error}");
    let bytes = Bytes::Owned(Arc::new(vec![0; 100]));
    let error = QMatrix::new(QuantFormat::Q8_0, 1, 64, bytes).unwrap_err();
    assert!(error.contains("needs 68 bytes, got 100"), "{error}");
    assert_eq!(QuantFormat::Q4K.row_bytes(128), None);
}

#[test]
fn streaming_sum_is_the_wrapping_sum() {
    // Whole lines, a tail, and values that wrap; the expected sum in 128 bits, reduced.
    let vnni = Kernel::detect() != Kernel::Scalar;
    for len in [0usize, 7, 8, 1001, 4096] {
        let words: Vec<u64> = (0..len as u64)
            .map(|i| i.wrapping_mul(0x9e37_79b9_7f4a_7c15))
            .collect();
        let expected = words.iter().map(|&w| u128::from(w)).sum::<u128>() as u64;
        assert_eq!(super::streaming_sum(&words), expected, "len {len}");
        #[cfg(target_arch = "x86_64")]
        if vnni {
            assert_eq!(super::simd::streaming_sum(&words), expected, "len {len}");
        }
    }
    crate::skip_without(
        "avx512",
        vnni,
        "streaming_sum_is_the_wrapping_sum (its AVX-512 loop)",
    );
}

#[test]
fn one_pass_over_several_matrices_equals_one_at_a_time() {
    // Mixed activation blocks (32 and 256) and sizes on both sides of the parallel threshold.
    let k = 512;
    let matrices: Vec<QMatrix> = [
        (QuantFormat::Q5_0, 600),
        (QuantFormat::Q4K, 40),
        (QuantFormat::Q8_0, 64),
        (QuantFormat::Q6K, 300),
    ]
    .into_iter()
    .enumerate()
    .map(|(seed, (format, n))| QMatrix::random(format, n, k, seed as u64))
    .collect();
    let refs: Vec<&QMatrix> = matrices.iter().collect();
    for rows in [1, 3, 70] {
        let x = random_input(rows, k, 9);
        let together = super::matmul_many(&refs, &x, rows);
        assert_eq!(together.len(), matrices.len());
        for (matrix, output) in matrices.iter().zip(&together) {
            assert_eq!(output, &matrix.matmul(&x, rows), "{matrix:?}, {rows} rows");
        }
    }
    assert!(super::matmul_many(&[], &[], 0).is_empty());
}

#[test]
fn vector_quantizer_equals_the_reference_exactly() {
    let vnni = Kernel::detect() != Kernel::Scalar;
    if crate::skip_without(
        "avx512",
        vnni,
        "vector_quantizer_equals_the_reference_exactly",
    ) {
        return;
    }
    for block in [32, 256] {
        let k = 1024;
        let mut x = random_input(3, k, block as u64);
        // A block of zeros, one with an exact tie after scaling (0.5 * 127 / 127.0 steps), and
        // one whose maximum is negative.
        x[..block].fill(0.0);
        for (i, v) in x[block..2 * block].iter_mut().enumerate() {
            *v = if i == 0 { 127.0 } else { (i % 7) as f32 + 0.5 };
        }
        x[2 * block] = -40.0;
        let n = x.len();
        let run = |vector: bool| {
            let mut rows = QuantizedRows {
                k,
                block,
                q: vec![0i8; n],
                scale: vec![0f32; n / block],
                sum16: vec![0i32; n / 16],
                sum32: vec![0i32; n / 32],
                scaled_sum32: Vec::new(),
                lanes: Vec::new(),
                lane_sums: Vec::new(),
                q4k: Vec::new(),
                q6k: Vec::new(),
                q6k_zero: Vec::new(),
                neg_sum32: Vec::new(),
                neg_sum16: Vec::new(),
            };
            if vector {
                super::simd::quantize(&x, &mut rows);
            } else {
                super::quantize_portable(&x, &mut rows);
            }
            (rows.q, rows.scale, rows.sum16, rows.sum32)
        };
        assert_eq!(run(true), run(false), "block {block}");
    }
}

#[test]
fn gated_products_equal_the_products_then_the_gate() {
    let mut kernels = vec![Kernel::Scalar];
    if Kernel::detect() != Kernel::Scalar {
        kernels.push(Kernel::detect());
    }
    let gate = |g: &[f32], u: &[f32], out: &mut [f32]| {
        crate::activation::gated_into(crate::activation::Activation::Silu, g, u, out)
    };
    for (format, layout) in layouts() {
        // A ragged last task, several tasks in parallel, tiles of several rows.
        for &(n, k, rows) in &[(37, 256, 1), (300, 1024, 1), (70, 512, 3), (45, 256, 9)] {
            let gate_matrix = in_layout(&QMatrix::random(format, n, k, 1), layout);
            let up_matrix = in_layout(&QMatrix::random(format, n, k, 2), layout);
            let x = random_input(rows, k, 3);
            for &kernel in &kernels {
                let [g, u] = <[Vec<f32>; 2]>::try_from(matmul_many_with(
                    kernel,
                    &[&gate_matrix, &up_matrix],
                    &x,
                    rows,
                ))
                .unwrap();
                let mut expected = vec![0f32; n * rows];
                gate(&g, &u, &mut expected);
                let ours = matmul_gated_with(kernel, &gate_matrix, &up_matrix, &x, rows, gate);
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(
                    bits(&ours),
                    bits(&expected),
                    "{} {layout:?} [{n}, {k}] x {rows} rows, {kernel:?}",
                    format.name()
                );
            }
        }
    }
}
