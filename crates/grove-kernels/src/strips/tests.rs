//! The strips' products against their portable reference, bit for bit.

use super::*;

fn wave(n: usize, seed: f32) -> Vec<f32> {
    (0..n).map(|i| ((i as f32 + seed) * 0.713).sin()).collect()
}

/// Each of `[rows, n]` `values` within 1e-4 of the exact sum over inputs `e` of
/// `term(r, j, e)`.
pub(super) fn assert_near_exact(
    values: &[f32],
    n: usize,
    k: usize,
    term: impl Fn(usize, usize, usize) -> f64,
) {
    for (i, &value) in values.iter().enumerate() {
        let (r, j) = (i / n, i % n);
        let exact: f64 = (0..k).map(|e| term(r, j, e)).sum();
        assert!(
            (f64::from(value) - exact).abs() < 1e-4,
            "{value} vs {exact}"
        );
    }
}

fn f32_values(strips: &DenseStrips) -> &[f32] {
    match &strips.values {
        Values::F32(values) => values,
        Values::Bf16(_) | Values::F16(_) => panic!("half-width strips"),
    }
}

/// `halves` (`[37, 33]`, widened by [`Weight::value`]) kept half-width in `narrow` give the
/// bits of the same weights widened to f32, in every tile (the kernel at this CPU's level and
/// the reference), from half the bytes; `narrow_product` multiplies by `narrow` in f32
/// arithmetic.
fn half_width_strips_give_their_f32_bits<W: Weight>(
    halves: &[W],
    narrow: &DenseStrips,
    values: &[W],
    narrow_product: impl Fn(&[f32], usize) -> Vec<f32>,
) {
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    let (n, k) = (37, 33);
    let widened: Vec<f32> = halves.iter().map(|h| h.value()).collect();
    let wide = DenseStrips::new(&widened, n, k);
    assert_eq!((narrow.weight_bytes(), wide.weight_bytes()), (2, 4));
    let mut row = vec![0f32; k];
    narrow.row(n - 1, &mut row);
    assert_eq!(row, widened[(n - 1) * k..]);
    for rows in [1, 2, 3, 4, 7, 8, 9, 17] {
        let x = wave(rows * k, rows as f32);
        let ours = narrow_product(&x, rows);
        assert_eq!(bits(&ours), bits(&wide.matmul(&x, rows)), "{rows} rows");
        let mut reference = vec![0f32; rows * n];
        product_portable(values, k, n, &x, rows, OutRows::block(&mut reference, rows));
        assert_eq!(bits(&reference), bits(&ours), "{rows} rows");
    }
}

/// Weights kept in f16 (widened by `vcvtph2ps` in the SIMD kernels).
#[test]
fn f16_strips_give_the_bits_of_their_f32_values() {
    let halves: Vec<half::f16> = (wave(37 * 33, 5.0).iter())
        .map(|&v| half::f16::from_f32(v))
        .collect();
    let narrow = DenseStrips::new_f16(&halves, 37, 33);
    let Values::F16(values) = &narrow.values else {
        unreachable!()
    };
    half_width_strips_give_their_f32_bits(&halves, &narrow, values, |x, rows| {
        narrow.matmul(x, rows)
    });
}

/// Weights kept in bfloat16, in f32 arithmetic.
#[test]
fn bfloat16_strips_give_the_bits_of_their_f32_values() {
    let halves: Vec<half::bf16> = (wave(37 * 33, 4.0).iter())
        .map(|v| half::bf16::from_bits((v.to_bits() >> 16) as u16))
        .collect();
    let narrow = DenseStrips::new_bf16(&halves, 37, 33);
    let Values::Bf16(values) = &narrow.values else {
        unreachable!()
    };
    half_width_strips_give_their_f32_bits(&halves, &narrow, values, |x, rows| {
        narrow.matmul_in(x, rows, Bf16Arithmetic::Widened)
    });
}

/// Every row count 1..=20 (every tile and remainder), odd `k`, a last strip of 5 rows and
/// several tasks: the same bits as the reference, and each row as when multiplied alone.
#[test]
fn products_equal_the_reference_bit_for_bit_in_any_tile() {
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    for (n, k) in [(37, 33), (133, 64)] {
        let weight = wave(n * k, 1.0);
        let strips = DenseStrips::new(&weight, n, k);
        let mut row = vec![0f32; k];
        strips.row(n - 1, &mut row);
        assert_eq!(row, weight[(n - 1) * k..]);
        for rows in 1..=20 {
            let x = wave(rows * k, rows as f32);
            let ours = strips.matmul(&x, rows);
            let mut reference = vec![0f32; rows * n];
            let block = OutRows::block(&mut reference, rows);
            product_portable(f32_values(&strips), k, n, &x, rows, block);
            assert_eq!(bits(&ours), bits(&reference), "[{n}, {k}] x {rows}");
            for r in 0..rows {
                let alone = strips.matmul(&x[r * k..(r + 1) * k], 1);
                assert_eq!(bits(&alone), bits(&ours[r * n..(r + 1) * n]), "row {r}");
            }
            // And close to the plain product.
            assert_near_exact(&ours, n, k, |r, j, e| {
                f64::from(x[r * k + e]) * f64::from(weight[j * k + e])
            });
        }
    }
}

/// The AVX2 build of the reference gives its bits, f32, bfloat16 and f16 weights (the
/// AVX-512 one is checked above at this CPU's level).
#[cfg(target_arch = "x86_64")]
#[test]
fn the_avx2_product_has_the_reference_bits() {
    let avx2 = crate::cpu::Level::supported() >= crate::cpu::Level::Avx2;
    if crate::skip_without("avx2", avx2, "the_avx2_product_has_the_reference_bits") {
        return;
    }
    fn check<W: Weight>(values: &[W], n: usize, k: usize, x: &[f32], rows: usize) {
        let (mut ours, mut reference) = (vec![0f32; rows * n], vec![0f32; rows * n]);
        // SAFETY: AVX2 and FMA were found on this CPU (`Level::supported`).
        #[allow(unsafe_code)]
        unsafe {
            product_avx2(values, k, n, x, rows, OutRows::block(&mut ours, rows))
        };
        product_portable(values, k, n, x, rows, OutRows::block(&mut reference, rows));
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&ours), bits(&reference), "{} bytes", size_of::<W>());
    }
    let (n, k, rows) = (37, 33, 5);
    let weight = wave(n * k, 2.0);
    let x = wave(rows * k, 3.0);
    let strips = DenseStrips::new(&weight, n, k);
    check(f32_values(&strips), n, k, &x, rows);
    let halves: Vec<half::bf16> = weight.iter().map(|&v| half::bf16::from_f32(v)).collect();
    let Values::Bf16(values) = DenseStrips::new_bf16(&halves, n, k).values else {
        unreachable!()
    };
    check(&values, n, k, &x, rows);
    let halves: Vec<half::f16> = weight.iter().map(|&v| half::f16::from_f32(v)).collect();
    let Values::F16(values) = DenseStrips::new_f16(&halves, n, k).values else {
        unreachable!()
    };
    check(&values, n, k, &x, rows);
}
