use std::sync::Arc;

use candle_core::quantized::{ggml_file::qtensor_from_ggml, GgmlDType};
use candle_core::Device;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::*;

const FORMATS: [QuantFormat; 19] = QuantFormat::ALL;

/// The formats with an AMX kernel (the others go to the AVX-512 VNNI kernel on an AMX CPU).
#[cfg(target_arch = "x86_64")]
pub(super) fn amx_formats() -> impl Iterator<Item = QuantFormat> + Clone {
    FORMATS
        .into_iter()
        .filter(|&format| format.has_amx_kernel())
}

/// Candle's type of `format`, where candle has one (not the IQ types).
fn ggml_dtype(format: QuantFormat) -> Option<GgmlDType> {
    Some(match format {
        QuantFormat::Q8_0 => GgmlDType::Q8_0,
        QuantFormat::Q5_0 => GgmlDType::Q5_0,
        QuantFormat::Q5_1 => GgmlDType::Q5_1,
        QuantFormat::Q4_0 => GgmlDType::Q4_0,
        QuantFormat::Q4_1 => GgmlDType::Q4_1,
        QuantFormat::Q4K => GgmlDType::Q4K,
        QuantFormat::Q6K => GgmlDType::Q6K,
        QuantFormat::Q5K => GgmlDType::Q5K,
        QuantFormat::Q3K => GgmlDType::Q3K,
        QuantFormat::Q2K => GgmlDType::Q2K,
        QuantFormat::Iq4Nl
        | QuantFormat::Iq4Xs
        | QuantFormat::Iq3Xxs
        | QuantFormat::Iq3S
        | QuantFormat::Iq2Xxs
        | QuantFormat::Iq2Xs
        | QuantFormat::Iq2S
        | QuantFormat::Iq1S
        | QuantFormat::Iq1M => return None,
    })
}

pub(super) fn random_input(rows: usize, k: usize, seed: u64) -> Vec<f32> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..rows * k)
        .map(|_| rng.random_range(-2.0f32..2.0))
        .collect()
}

/// Our decoders against candle's on random blocks as they were made (through the column
/// layout and back, a wrong decoder would agree with itself). Candle has no IQ types:
/// [`iq4_blocks_decode_as_ggml_defines_them`] holds those.
#[test]
fn dequantize_matches_candle() {
    for format in FORMATS {
        let Some(dtype) = ggml_dtype(format) else {
            continue;
        };
        let (n, k) = (3, 512);
        let matrix = QMatrix::random_in(format, n, k, 1, Layout::Gguf);
        let ours = matrix.dequantize();
        let candle = qtensor_from_ggml(dtype, &matrix.to_bytes(), vec![n, k], &Device::Cpu)
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

/// IQ4_NL and IQ4_XS blocks decoded as ggml's `dequantize_row_iq4_nl` and
/// `dequantize_row_iq4_xs` define them, written out here from their bytes: random blocks,
/// every weight, in GGUF's layout and through the column layout.
#[test]
fn iq4_blocks_decode_as_ggml_defines_them() {
    let values = |q: u8| f32::from(IQ4_VALUES[usize::from(q)]);
    let f16 = |b: &[u8]| half::f16::from_le_bytes([b[0], b[1]]).to_f32();
    let (n, k) = (19, 512);
    for format in [QuantFormat::Iq4Nl, QuantFormat::Iq4Xs] {
        let matrix = QMatrix::random_in(format, n, k, 5, Layout::Gguf);
        let bytes = matrix.to_bytes();
        let mut expected = Vec::new();
        for block in bytes.chunks_exact(format.block_bytes()) {
            let d = f16(block);
            if format == QuantFormat::Iq4Nl {
                let qs = &block[2..18];
                expected.extend(qs.iter().map(|&q| d * values(q & 15)));
                expected.extend(qs.iter().map(|&q| d * values(q >> 4)));
                continue;
            }
            let scales_h = u16::from_le_bytes([block[2], block[3]]);
            for ib in 0..8 {
                let low = (block[4 + ib / 2] >> (4 * (ib % 2))) & 15;
                let ls = i32::from(low) | (i32::from(scales_h >> (2 * ib)) & 3) << 4;
                let dl = d * (ls - 32) as f32;
                let qs = &block[8 + 16 * ib..8 + 16 * ib + 16];
                expected.extend(qs.iter().map(|&q| dl * values(q & 15)));
                expected.extend(qs.iter().map(|&q| dl * values(q >> 4)));
            }
        }
        for layout in [Layout::Gguf, Layout::Columns(FifthBits::Masks)] {
            let ours = in_layout(&matrix, layout).dequantize();
            assert_eq!(ours.len(), expected.len());
            for (i, (a, b)) in ours.iter().zip(&expected).enumerate() {
                assert!(
                    (a - b).abs() <= 1e-6 * b.abs().max(1.0),
                    "{} {layout:?} element {i}: ours {a}, ggml's {b}",
                    format.name()
                );
            }
        }
    }
}

/// Every kernel against `x W^T` in f32 over the dequantized weights. The only difference
/// allowed is the 8-bit rounding of the activations: at most half a step (`amax / 254`) per
/// value, so `|error| <= sum_i |w_i| * amax(block of i) / 254` per output.
#[test]
fn kernels_match_dequantize_then_matmul() {
    let kernels = Kernel::available();
    eprintln!("kernels tested: {kernels:?}");
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

/// The column layout in each form of Q5_0's fifth bits.
const COLUMNS: [Layout; 2] = [
    Layout::Columns(FifthBits::Masks),
    Layout::Columns(FifthBits::Planes),
];

/// Every format in every layout.
fn layouts() -> Vec<(QuantFormat, Layout)> {
    FORMATS
        .into_iter()
        .flat_map(|format| {
            [Layout::Gguf]
                .into_iter()
                .chain(COLUMNS)
                .map(move |l| (format, l))
        })
        .collect()
}

pub(super) fn in_layout(matrix: &QMatrix, layout: Layout) -> QMatrix {
    let (n, k) = matrix.dims();
    let bytes = Bytes::Owned(Arc::new(matrix.to_bytes()));
    QMatrix::with_layout(matrix.format(), n, k, bytes, layout).expect("a valid matrix")
}

#[test]
fn the_column_layout_keeps_every_block() {
    // Row counts around the 16-row strips, widths of one and several units.
    for (format, layout) in FORMATS
        .into_iter()
        .flat_map(|format| COLUMNS.map(|layout| (format, layout)))
    {
        for n in [1, 15, 16, 17, 40] {
            for k in [256, 512, 1280] {
                let gguf = in_layout(&QMatrix::random(format, n, k, (n * k) as u64), Layout::Gguf);
                let columns = in_layout(&gguf, layout);
                assert_eq!(columns.layout(), layout);
                let name = format!("{} {layout:?} [{n}, {k}]", format.name());
                assert_eq!(columns.to_bytes(), gguf.to_bytes(), "{name}");
                assert_eq!(columns.dequantize(), gguf.dequantize(), "{name}");
                let strip = super::columns::strip_bytes(format, k);
                assert_eq!(
                    columns.bytes.as_slice().len(),
                    n.div_ceil(16) * strip,
                    "{name}"
                );
            }
        }
    }
}

#[test]
fn gathered_rows_keep_their_blocks_in_either_layout() {
    for (format, layout) in layouts() {
        let (n, k) = (40, 512);
        let matrix = in_layout(&QMatrix::random(format, n, k, 9), layout);
        let ids = [39u32, 0, 17, 17, 5];
        let gathered = matrix.gather_rows(&ids).unwrap();
        assert_eq!(
            (gathered.format(), gathered.dims()),
            (format, (ids.len(), k))
        );
        let name = format!("{} {layout:?}", format.name());
        for (i, &id) in ids.iter().enumerate() {
            assert_eq!(
                gathered.gguf_row(i),
                matrix.gguf_row(id as usize),
                "{name} row {i}"
            );
        }
        let refused = matrix.gather_rows(&[3, n as u32]).unwrap_err();
        assert!(
            refused.contains("row 40 out of range for 40 rows"),
            "{refused}"
        );
    }
}

#[test]
fn a_mapped_source_released_while_copied_still_reads_the_same() {
    // Large enough for several slabs and whole pages to release.
    let (n, k) = (8195, 2048);
    let source = QMatrix::random(QuantFormat::Q8_0, n, k, 3).to_bytes();
    assert!(source.len() > 2 * COPY_SLAB);
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
    let matrix = QMatrix::with_layout(QuantFormat::Q8_0, n, k, bytes, COLUMNS[0]);
    let matrix = matrix.unwrap();
    std::fs::remove_file(&path).unwrap();
    assert_eq!(matrix.to_bytes(), source);
    // The released pages read back from the file.
    assert!(map[..] == source[..]);
}

/// The SIMD kernels this CPU runs (AVX2 and AVX-512 VNNI on an AVX-512 CPU, whatever
/// `GROVE_KERNEL` says): each is compared with the reference, so an AVX-512 machine tests the
/// AVX2 kernels too. A CPU lacking a level prints what it skips (or fails where CI requires it).
fn simd_kernels(test: &str) -> Vec<Kernel> {
    let kernels: Vec<Kernel> = Kernel::available()
        .into_iter()
        .filter(|&kernel| kernel != Kernel::Scalar)
        .collect();
    crate::skip_without("avx2", kernels.contains(&Kernel::Avx2), test);
    crate::skip_without("avx512", kernels.contains(&Kernel::Avx512Vnni), test);
    crate::skip_without("amx", kernels.contains(&Kernel::Amx), test);
    kernels
}

#[test]
fn simd_and_scalar_agree_closely() {
    for simd in simd_kernels("simd_and_scalar_agree_closely") {
        simd_agrees_with_scalar(simd);
    }
}

fn simd_agrees_with_scalar(simd: Kernel) {
    eprintln!("comparing the {simd:?} kernel with the scalar reference");
    // Every tile size and its remainders (rows 1..=67), a last strip of 5 rows, and a larger
    // matrix in several tasks (its last strip of 12 rows, half of it in AVX2's second half)
    // through each way a tile gets its weights (AVX2: decoded where used, or once per half
    // strip for more rows than a tile).
    let shapes = (1..=67).map(|rows| (37, 512, rows)).chain([
        (300, 1024, 1),
        (300, 1024, 6),
        (300, 1024, 13),
    ]);
    for (format, (n, k, rows)) in FORMATS
        .into_iter()
        .flat_map(|f| shapes.clone().map(move |s| (f, s)))
    {
        // Each kernel's own layout (an AVX-512 CPU makes AVX-512's, whose Q5_0 AVX2 does not read).
        let matrix = in_layout(&QMatrix::random(format, n, k, 7), Layout::for_kernel(simd));
        assert_eq!(matrix.runs_on(simd), simd.for_format(format));
        let x = random_input(rows, k, rows as u64);
        let a = matrix.matmul_with(Kernel::Scalar, &x, rows);
        let b = matrix.matmul_with(simd, &x, rows);
        // Same arithmetic, other summation order: f32 rounding of terms as large as the
        // largest outputs.
        let largest = a.iter().fold(0f32, |m, v| m.max(v.abs()));
        for (i, (a, b)) in a.iter().zip(&b).enumerate() {
            assert!(
                (a - b).abs() <= 1e-5 * largest,
                "{} [{n}, {k}] x {rows} rows, output {i}: scalar {a}, simd {b}",
                format.name()
            );
        }
    }
}

/// Both places the VNNI kernel may add Q6_K's zero point (`simd_columns::Q6Zero`: this CPU
/// runs one of them in every other test) against the reference, every tile size and its
/// remainders, several super-blocks and tasks; and a row's bits the same in any tile.
#[cfg(target_arch = "x86_64")]
#[test]
fn both_q6k_zero_points_agree_with_the_reference() {
    use super::simd_columns::{dot_strips_with, Q6Zero};
    let test = "both_q6k_zero_points_agree_with_the_reference";
    if crate::skip_without("avx512", Kernel::Avx512Vnni.runs_here(), test) {
        return;
    }
    eprintln!(
        "Q6_K on the VNNI kernel: this CPU's zero point {:?}",
        Q6Zero::here()
    );
    let shapes = (1..=19)
        .map(|rows| (37, 512, rows))
        .chain([(300, 1024, 13)]);
    for (n, k, rows) in shapes {
        let matrix = in_layout(
            &QMatrix::random(QuantFormat::Q6K, n, k, 9),
            Layout::for_kernel(Kernel::Avx512Vnni),
        );
        let x = random_input(rows, k, 40 + rows as u64);
        let reference = matrix.matmul_with(Kernel::Scalar, &x, rows);
        let largest = reference.iter().fold(0f32, |m, v| m.max(v.abs()));
        let acts = QuantizedRows::portable_for(Kernel::Avx512Vnni, &x, rows, k, &[matrix.format]);
        for zero in [Q6Zero::AtStart, Q6Zero::PerSuperBlock] {
            let product = |first: usize, rows: usize| {
                let mut out = vec![f32::NAN; rows * n];
                let lent = crate::threads::OutRows::block(&mut out, rows);
                let strips = matrix.strips(0, columns::strips(n));
                dot_strips_with(QuantFormat::Q6K, strips, n, &acts, first, lent, false, zero);
                out
            };
            let together = product(0, rows);
            for (i, (a, b)) in reference.iter().zip(&together).enumerate() {
                let close = (a - b).abs() <= 1e-5 * largest;
                assert!(
                    close,
                    "{zero:?} [{n}, {k}] x {rows}, output {i}: {a} vs {b}"
                );
            }
            let last = product(rows - 1, 1);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(
                bits(&together[(rows - 1) * n..]),
                bits(&last),
                "{zero:?} x {rows}"
            );
        }
    }
}

/// A row's outputs do not depend on the rows multiplied beside it (which tile it fell in):
/// a verify's row equals the same row decoded alone, bit for bit, on every kernel.
#[test]
fn a_rows_product_is_the_same_in_any_tile() {
    let kernels = Kernel::available();
    let (n, k, rows) = (37, 512, 19);
    for format in FORMATS {
        let made = QMatrix::random(format, n, k, 11);
        let x = random_input(rows, k, 12);
        for &kernel in &kernels {
            let matrix = in_layout(&made, Layout::for_kernel(kernel));
            assert_eq!(matrix.runs_on(kernel), kernel.for_format(format));
            let together = matrix.matmul_with(kernel, &x, rows);
            for r in 0..rows {
                let alone = matrix.matmul_with(kernel, &x[r * k..(r + 1) * k], 1);
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(
                    bits(&together[r * n..(r + 1) * n]),
                    bits(&alone),
                    "{} {kernel:?}, row {r} of {rows}",
                    format.name()
                );
            }
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
    let kernels = simd_kernels("streaming_sum_is_the_wrapping_sum");
    for len in [0usize, 7, 8, 1001, 4096] {
        let words: Vec<u64> = (0..len as u64)
            .map(|i| i.wrapping_mul(0x9e37_79b9_7f4a_7c15))
            .collect();
        let expected = words.iter().map(|&w| u128::from(w)).sum::<u128>() as u64;
        assert_eq!(super::streaming_sum(&words), expected, "len {len}");
        #[cfg(target_arch = "x86_64")]
        for &kernel in &kernels {
            let sum = super::simd::streaming_sum(kernel, &words);
            assert_eq!(sum, expected, "len {len}, {kernel:?}");
        }
    }
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
        (QuantFormat::Q5K, 100),
        (QuantFormat::Q5_1, 50),
        (QuantFormat::Q4_0, 70),
        (QuantFormat::Iq4Nl, 90),
        (QuantFormat::Q4_1, 30),
        (QuantFormat::Iq4Xs, 20),
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
    let kernels = simd_kernels("vector_quantizer_equals_the_reference_exactly");
    for (block, kernel) in [32, 256]
        .into_iter()
        .flat_map(|block| kernels.iter().map(move |&kernel| (block, kernel)))
    {
        // 33 blocks of 32 a row: the AVX-512 quantizer takes them two at a time, and the
        // last of the three rows' 99 alone.
        let k = if block == 32 { 1056 } else { 1024 };
        let mut x = random_input(3, k, block as u64);
        // A block of zeros, one with an exact tie after scaling (0.5 * 127 / 127.0 steps), and
        // one whose maximum is negative.
        x[..block].fill(0.0);
        for (i, v) in x[block..2 * block].iter_mut().enumerate() {
            *v = if i == 0 { 127.0 } else { (i % 7) as f32 + 0.5 };
        }
        x[2 * block] = -40.0;
        let n = x.len();
        // Each quantizer starts from buffers of other values (as it does from a dropped
        // product's, `rows::Spare`) or of zeros: a value it leaves unwritten shows.
        let run = |vector: bool, dirty: bool| {
            let (q, scale, sum) = if dirty {
                (-99, f32::NAN, i32::MIN)
            } else {
                (0, 0.0, 0)
            };
            let mut rows = QuantizedRows {
                kernel: if vector { kernel } else { Kernel::Scalar },
                k,
                block,
                q: vec![q; n],
                scale: vec![scale; n / block],
                sum16: vec![sum; n / 16],
                sum32: vec![sum; n / 32],
                zero_q8: Vec::new(),
                zero_q5: Vec::new(),
                zero_q4: Vec::new(),
                zero_q6: Vec::new(),
                scaled_sum32: Vec::new(),
                sum32_i16: Vec::new(),
                sum16_i16: Vec::new(),
                side: Default::default(),
            };
            if vector {
                super::simd::quantize(kernel, &x, rows.parts());
            } else {
                super::rows::quantize_portable(&x, rows.parts());
            }
            // The scales' bits: NaN equals no NaN.
            let scales: Vec<u32> = rows.scale.iter().map(|s| s.to_bits()).collect();
            (
                rows.q.clone(),
                scales,
                rows.sum16.clone(),
                rows.sum32.clone(),
            )
        };
        let reference = run(false, false);
        assert_eq!(run(true, true), reference, "block {block}, {kernel:?}");
        assert_eq!(run(true, false), reference, "block {block}, {kernel:?}");
        assert_eq!(run(false, true), reference, "block {block}, scalar");
    }
}

/// Many rows are quantized on several threads (a part of the rows each): every row's values,
/// scales and sums are what it gets quantized alone, on every kernel, with threads or not.
#[test]
fn rows_quantized_in_parallel_equal_each_row_alone() {
    let (rows, k) = (13, 2048);
    let x = random_input(rows, k, 5);
    let formats = [QuantFormat::Q4K, QuantFormat::Q6K];
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(3)
        .build()
        .unwrap();
    for kernel in Kernel::available() {
        let kernel = kernel.activations();
        let together = pool.install(|| QuantizedRows::for_kernel(kernel, &x, rows, k, &formats));
        for r in 0..rows {
            let row = &x[r * k..(r + 1) * k];
            let alone = QuantizedRows::for_kernel(kernel, row, 1, k, &formats);
            assert_eq!(together.q(r), &alone.q[..], "{kernel:?} row {r}");
            assert_eq!(together.scale(r), &alone.scale[..], "{kernel:?} row {r}");
            let sums = |v: &[i32], per: usize| v[r * k / per..(r + 1) * k / per].to_vec();
            assert_eq!(sums(&together.sum16, 16), alone.sum16, "{kernel:?} row {r}");
            assert_eq!(sums(&together.sum32, 32), alone.sum32, "{kernel:?} row {r}");
        }
    }
}

/// Rows made in the buffers of rows of their size dropped before them on the same thread
/// (`rows::Spare`: the old values left in place) are the rows made in new buffers, on every
/// kernel.
#[test]
fn rows_made_in_kept_buffers_equal_new_ones() {
    let formats = [QuantFormat::Q4K, QuantFormat::Q6K, QuantFormat::Q8_0];
    let formats: Vec<&[QuantFormat]> = vec![&formats[..2], &formats[2..]];
    for kernel in Kernel::available() {
        let kernel = kernel.activations();
        for &formats in &formats {
            let made = |rows: usize, k: usize, seed: u64| {
                let x = random_input(rows, k, seed);
                let r = QuantizedRows::for_kernel(kernel, &x, rows, k, formats);
                let scales: Vec<u32> = r.scale.iter().map(|s| s.to_bits()).collect();
                let ints = [&r.sum16, &r.sum32, &r.zero_q8, &r.zero_q6].map(|v| v.to_vec());
                let halves = [&r.sum16_i16, &r.sum32_i16].map(|v| v.to_vec());
                (r.q.as_ptr() as usize, (r.q.to_vec(), scales, ints, halves))
            };
            let shapes = [
                (5, 2048, 1),
                (5, 2048, 2),
                (3, 512, 3),
                (7, 4096, 4),
                (5, 2048, 5),
            ];
            let made = &made;
            let (new, kept) = std::thread::scope(|scope| {
                // Each on a thread of its own: new buffers.
                let new: Vec<_> = shapes
                    .map(|(rows, k, seed)| scope.spawn(move || made(rows, k, seed).1))
                    .map(|thread| thread.join().unwrap())
                    .to_vec();
                // One after another on one thread: each in the buffers of the one before.
                let kept = scope
                    .spawn(|| shapes.map(|(rows, k, seed)| made(rows, k, seed)))
                    .join()
                    .unwrap();
                (new, kept)
            });
            // Rows of one size take the buffers of the last rows of that size.
            assert_eq!(
                kept[1].0, kept[0].0,
                "{kernel:?}: the second rows reuse the first's"
            );
            assert_eq!(
                kept[4].0, kept[1].0,
                "{kernel:?}: the last rows reuse the second's"
            );
            for (i, ((_, kept), new)) in kept.iter().zip(&new).enumerate() {
                assert_eq!(kept, new, "{kernel:?} {formats:?}, shape {i}");
            }
        }
    }
}

#[test]
fn gated_products_equal_the_products_then_the_gate() {
    let kernels = Kernel::available();
    let silu = crate::activation::Activation::Silu;
    let gate = |g: &[f32], u: &[f32], out: crate::threads::OutRows<'_>| {
        crate::activation::gated_rows(silu, g, u, out)
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
                let expected = crate::activation::gated(silu, &g, &u);
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

/// The formats without an AMX kernel go to the AVX-512 VNNI kernel from the AMX kernel, and
/// reports can name them; the other kernels multiply every format and hand nothing on.
#[test]
fn formats_without_an_amx_kernel_are_handed_to_avx512() {
    for format in QuantFormat::ALL {
        let expected = if format.has_amx_kernel() {
            Kernel::Amx
        } else {
            Kernel::Avx512Vnni
        };
        assert_eq!(
            Kernel::Amx.for_format(format),
            expected,
            "{}",
            format.name()
        );
    }
    let names: Vec<&str> = (Kernel::Amx.handed_on().iter())
        .map(|(name, _)| *name)
        .collect();
    assert_eq!(
        names,
        [
            "Q5_1", "Q4_0", "Q4_1", "Q2_K", "Q3_K", "Q5_K", "IQ4_NL", "IQ4_XS", "IQ3_XXS", "IQ3_S",
            "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ1_S", "IQ1_M"
        ]
    );
    for kernel in [Kernel::Scalar, Kernel::Avx2, Kernel::Avx512Vnni] {
        assert!(kernel.handed_on().is_empty(), "{kernel:?}");
    }
}

/// Where Miri runs the tests (`scripts/miri_avx512.sh`, which interprets the AVX-512 kernels
/// on any x86-64 CPU): the AVX-512 VNNI kernel against AVX2's on every format, through every
/// tile size and a remainder, two blocks of activation rows, a last strip of 3 rows and two
/// K-quant super-blocks; and a row's outputs the same alone as in a tile, bit for bit. Against
/// AVX2's kernel rather than the reference: interpreted, the reference's products take
/// minutes, and AVX2's kernels meet the reference natively on every x86 CPU (the tests above).
#[cfg(miri)]
#[test]
fn avx512_agrees_with_avx2_under_miri() {
    assert!(
        Kernel::Avx512Vnni.runs_here(),
        "Miri runs the AVX-512 kernels with their target features on (scripts/miri_avx512.sh)"
    );
    for format in FORMATS {
        let k = 2 * columns::unit_weights(format).max(128);
        let made = QMatrix::random(format, 19, k, 7);
        let [avx2, avx512] = [Kernel::Avx2, Kernel::Avx512Vnni].map(|kernel| {
            let matrix = in_layout(&made, Layout::for_kernel(kernel));
            assert_eq!(matrix.runs_on(kernel), kernel);
            matrix
        });
        for rows in [1, 2, 3, 5, 8, 11, 17] {
            let x = random_input(rows, k, rows as u64);
            let a = avx2.matmul_with(Kernel::Avx2, &x, rows);
            let b = avx512.matmul_with(Kernel::Avx512Vnni, &x, rows);
            // Each within 1e-5 of the largest output of the reference: of each other, twice.
            let largest = a.iter().fold(0f32, |m, v| m.max(v.abs()));
            for (i, (a, b)) in a.iter().zip(&b).enumerate() {
                assert!(
                    (a - b).abs() <= 2e-5 * largest,
                    "{} [19, {k}] x {rows} rows, output {i}: AVX2 {a}, AVX-512 {b}",
                    format.name()
                );
            }
            if rows == 11 {
                for r in 0..rows {
                    let alone = avx512.matmul_with(Kernel::Avx512Vnni, &x[r * k..][..k], 1);
                    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits(&b[r * 19..][..19]), bits(&alone), "{}", format.name());
                }
            }
        }
        eprintln!("{}: AVX-512 VNNI and AVX2 agree", format.name());
    }
}
