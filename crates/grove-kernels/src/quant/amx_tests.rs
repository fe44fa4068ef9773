//! The AMX kernel's tests: on a model of the tiles wherever AVX-512 runs, and on the CPU's
//! tiles where it has them, bit for bit against the VNNI kernel with the tiles' rounding.
#![cfg(target_arch = "x86_64")]

use std::sync::Arc;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::amx_tiles::{Absent, Emulated};
use super::simd_columns::Share;
use super::tests::{amx_formats, in_layout, random_input};
use super::*;

/// `matrix` times `x`'s `rows` rows by `product`, given the strips and activations of the
/// AVX-512 kernels (which the AMX kernel shares).
fn on_strips(
    matrix: &QMatrix,
    x: &[f32],
    rows: usize,
    product: impl FnOnce(&[u8], &QuantizedRows, crate::threads::OutRows<'_>),
) -> Vec<f32> {
    let (format, (n, k)) = (matrix.format(), matrix.dims());
    let acts = QuantizedRows::portable_for(Kernel::Avx512Vnni, x, rows, k, &[format]);
    let mut out = vec![f32::NAN; rows * n];
    let lent = crate::threads::OutRows::block(&mut out, rows);
    product(matrix.strips(0, columns::strips(n)), &acts, lent);
    out
}

/// The AMX kernel's product on the tiles' model (`amx_tiles::Emulated`), on any CPU.
fn emulated_amx(matrix: &QMatrix, x: &[f32], rows: usize) -> Vec<f32> {
    let (format, n) = (matrix.format(), matrix.dims().0);
    on_strips(matrix, x, rows, |strips, acts, lent| {
        let share = Share::new(Kernel::Amx.activations(), format, strips, n, acts, 0, lent);
        super::amx_columns::on_tiles(&mut Emulated::new(), format, &share, rows);
    })
}

/// The VNNI kernel's product with the AMX tiles' rounding (`simd_columns::dot_strips`'s
/// `exact`), which a process whose tiles multiply the format gives its few-row products.
fn exact_vnni(matrix: &QMatrix, x: &[f32], rows: usize) -> Vec<f32> {
    let (format, n) = (matrix.format(), matrix.dims().0);
    on_strips(matrix, x, rows, |strips, acts, lent| {
        super::simd_columns::dot_strips(format, strips, n, acts, 0, lent, true);
    })
}

/// Whether this CPU runs the AMX kernel's lanes (AVX-512), which the modelled tiles need; a
/// CPU without prints what it skips (or fails where CI requires AVX-512).
fn runs_amx_lanes(test: &str) -> bool {
    !crate::skip_without("avx512", Kernel::Avx512Vnni.runs_here(), test)
}

/// The AMX kernel, its tiles modelled, against the reference on every format: tiles of 1-16
/// rows and the 16-row tiles' remainders, a last strip of 5 rows, K-quants of several
/// super-blocks, and products of enough rows that their tiles share spread weights
/// (`Format::SHARED_ROWS`: 32 rows for Q5_0 and Q6_K, 128 for Q4_K). Its bits are the VNNI
/// kernel's with the tiles' rounding, and where the CPU has AMX, the tiles' own (and the AMX
/// kernel's, whose few-row products are that VNNI kernel's). The VNNI kernel's own rounding
/// differs only for Q4_K and Q6_K.
#[test]
fn amx_kernel_on_modelled_tiles_agrees_with_the_reference() {
    if !runs_amx_lanes("amx_kernel_on_modelled_tiles_agrees_with_the_reference") {
        return;
    }
    let tiles_here = Kernel::Amx.runs_here();
    eprintln!("AMX kernel on modelled tiles; bit for bit against exact VNNI, AMX: {tiles_here}");
    let shapes = (1..=18)
        .chain([31, 32, 33, 47, 67])
        .map(|rows| (37, 512, rows))
        .chain([(48, 1024, 20), (37, 512, 130), (48, 1024, 144)]);
    for (format, (n, k, rows)) in amx_formats().flat_map(|f| shapes.clone().map(move |s| (f, s))) {
        let matrix = in_layout(
            &QMatrix::random(format, n, k, 5),
            Layout::for_kernel(Kernel::Amx),
        );
        let x = random_input(rows, k, 100 + rows as u64);
        let ours = emulated_amx(&matrix, &x, rows);
        let reference = matrix.matmul_with(Kernel::Scalar, &x, rows);
        let largest = reference.iter().fold(0f32, |m, v| m.max(v.abs()));
        for (i, (a, b)) in reference.iter().zip(&ours).enumerate() {
            assert!(
                (a - b).abs() <= 1e-5 * largest,
                "{} [{n}, {k}] x {rows} rows, output {i}: reference {a}, AMX {b}",
                format.name()
            );
        }
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        let name = format.name();
        let exact = bits(&exact_vnni(&matrix, &x, rows));
        assert_eq!(
            exact,
            bits(&ours),
            "{name} [{n}, {k}] x {rows} rows: exact VNNI"
        );
        if tiles_here {
            let amx = bits(&matrix.matmul_with(Kernel::Amx, &x, rows));
            assert_eq!(
                amx,
                bits(&ours),
                "{name} [{n}, {k}] x {rows} rows: the AMX kernel"
            );
        }
        if !matches!(format, QuantFormat::Q4K | QuantFormat::Q6K) {
            let vnni = bits(&matrix.matmul_with(Kernel::Avx512Vnni, &x, rows));
            assert_eq!(vnni, bits(&ours), "{name} [{n}, {k}] x {rows} rows: VNNI");
        }
    }
}

/// On modelled tiles too, a row's outputs do not depend on the rows in its tile.
#[test]
fn amx_rows_are_the_same_in_any_tile() {
    if !runs_amx_lanes("amx_rows_are_the_same_in_any_tile") {
        return;
    }
    let (n, k, rows) = (21, 512, 19);
    for format in amx_formats() {
        let matrix = in_layout(
            &QMatrix::random(format, n, k, 3),
            Layout::for_kernel(Kernel::Amx),
        );
        let x = random_input(rows, k, 4);
        let together = emulated_amx(&matrix, &x, rows);
        for r in [0, 5, 15, 16, 18] {
            let alone = emulated_amx(&matrix, &x[r * k..(r + 1) * k], 1);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(
                bits(&together[r * n..(r + 1) * n]),
                bits(&alone),
                "{}, row {r} of {rows}",
                format.name()
            );
        }
    }
}

/// K-quants at their largest sums, past 2^24, where conversions round: the VNNI kernel's
/// exact partial sums in f32 must round to the same bits as the tiles' one conversion of the
/// integer sum (`simd_columns::with_mins`, `amx_kquants`), on the model and the CPU's
/// tiles. Q4_K: every weight 15, every 6-bit scale and min 63 (8 * 32 * 15 * 127 * 63). Q6_K:
/// every weight -31 (`q = 1`), every scale -127 (16 * 16 * 31 * 127 * 127), each pair of
/// sub-blocks just below 2^24: odd factors, or the sums would be multiples of a power of two
/// that f32 holds exactly.
#[test]
fn k_quant_largest_sums_round_alike_on_tiles_and_lanes() {
    if !runs_amx_lanes("k_quant_largest_sums_round_alike_on_tiles_and_lanes") {
        return;
    }
    let f16 = |value: f32| half::f16::from_f32_const(value).to_bits().to_le_bytes();
    let q4k = |block: &mut [u8]| {
        block.fill(0xFF);
        block[0..2].copy_from_slice(&f16(0.0123));
        block[2..4].copy_from_slice(&f16(0.0071));
    };
    let q6k = |block: &mut [u8]| {
        block[..128].fill(0x11);
        block[128..192].fill(0);
        block[192..208].fill(-127i8 as u8);
        block[208..210].copy_from_slice(&f16(0.0123));
    };
    largest_sums_round_alike(QuantFormat::Q4K, q4k);
    largest_sums_round_alike(QuantFormat::Q6K, q6k);
}

fn largest_sums_round_alike(format: QuantFormat, block: impl Fn(&mut [u8])) {
    let (n, k) = (21, 512);
    let block_bytes = format.row_bytes(256).expect("a super-block");
    let mut bytes = vec![0u8; n * k / 256 * block_bytes];
    bytes.chunks_exact_mut(block_bytes).for_each(block);
    let gguf = QMatrix::new(format, n, k, Bytes::Owned(Arc::new(bytes))).unwrap();
    let matrix = in_layout(&gguf, Layout::for_kernel(Kernel::Amx));
    let rows = 17;
    // Rows of one sign near the row's largest value (sums near their largest and not all
    // multiples of what f32 can hold there), then random signs at full size.
    let mut rng = ChaCha8Rng::seed_from_u64(9);
    let x: Vec<f32> = (0..rows * k)
        .map(|i| match i / k {
            0..=5 => rng.random_range(0.9..=1.0),
            6..=9 => -rng.random_range(2.2..=2.5),
            _ if rng.random() => 1.0,
            _ => -1.0,
        })
        .collect();
    let name = format.name();
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    let lanes = bits(&exact_vnni(&matrix, &x, rows));
    let modelled = bits(&emulated_amx(&matrix, &x, rows));
    assert_eq!(modelled, lanes, "{name}: modelled tiles");
    if Kernel::Amx.runs_here() {
        let tiles = bits(&matrix.matmul_with(Kernel::Amx, &x, rows));
        assert_eq!(tiles, lanes, "{name}: tiles");
    }
    let reference = matrix.matmul_with(Kernel::Scalar, &x, rows);
    let largest = reference.iter().fold(0f32, |m, v| m.max(v.abs()));
    for (a, b) in reference
        .iter()
        .zip(&matrix.matmul_with(Kernel::Avx512Vnni, &x, rows))
    {
        assert!(
            (a - b).abs() <= 1e-5 * largest,
            "{name}: reference {a}, VNNI {b}"
        );
    }
}

/// The AMX kernel's work outside its tiles (spreading weights to bytes, scaling the tiles'
/// sums), timed on tiles that do nothing, beside the VNNI kernel's whole product: on a CPU
/// without AMX, whether the lanes alone would keep the tiles from paying. On one thread, a
/// 512 x 1024 matrix in cache (best of 5 runs of 50 products) and a 2048 x 4096 one read
/// from memory (evicted before each product, best of 5); it prints G int8 multiply-adds a
/// second (a measurement, not a check):
/// `cargo test --release -p grove-kernels amx_lanes_alone -- --ignored --nocapture`.
#[test]
#[ignore]
fn amx_lanes_alone() {
    if !runs_amx_lanes("amx_lanes_alone") {
        return;
    }
    for (place, (n, k), reps) in [("cache", (512, 1024), 50), ("memory", (2048, 4096), 1)] {
        for format in amx_formats() {
            let matrix = in_layout(
                &QMatrix::random(format, n, k, 1),
                Layout::for_kernel(Kernel::Amx),
            );
            let strips = matrix.strips(0, columns::strips(n));
            let mut line = format!("{place:6} {:5}", format.name());
            for rows in [4, 8, 16, 32, 64] {
                let x = random_input(rows, k, 2);
                let kernel = Kernel::Amx.activations();
                let acts = QuantizedRows::portable_for(kernel, &x, rows, k, &[format]);
                let mut out = vec![0f32; rows * n];
                let mut time = |which: usize| {
                    let mut product = || {
                        let lent = crate::threads::OutRows::block(&mut out, rows);
                        match which {
                            0 => {
                                let exact = true;
                                super::simd_columns::dot_strips(
                                    format, strips, n, &acts, 0, lent, exact,
                                )
                            }
                            1 => {
                                let share = Share::new(kernel, format, strips, n, &acts, 0, lent);
                                super::amx_columns::on_tiles(&mut Absent, format, &share, rows);
                            }
                            _ => super::amx_columns::dot_strips(format, strips, n, &acts, 0, lent),
                        }
                    };
                    let seconds = if reps == 1 {
                        super::amx_trial::from_memory(strips, &mut product)
                    } else {
                        let start = std::time::Instant::now();
                        (0..reps).for_each(|_| product());
                        start.elapsed().as_secs_f64()
                    };
                    (n * k * rows * reps) as f64 / seconds / 1e9
                };
                let (mut vnni, mut lanes, mut tiles) = (0f64, 0f64, 0f64);
                for _ in 0..5 {
                    vnni = vnni.max(time(0));
                    lanes = lanes.max(time(1));
                    if Kernel::Amx.runs_here() {
                        tiles = tiles.max(time(2));
                    }
                }
                line += &format!(
                    "  r{rows}: VNNI {vnni:6.1} G, lanes {lanes:6.1} G, tiles {tiles:6.1} G"
                );
            }
            println!("{line}");
        }
    }
}
