//! Bfloat16 checkpoints' products in bfloat16 arithmetic: the activations rounded to bfloat16
//! once per product and each pair of inputs' two products added to a row's sum by one lane of
//! `vdpbf16ps` (AVX-512 BF16), 32 multiply-adds an instruction where the f32 product's fused
//! multiply-adds do 16. A verify's many rows are bound by those instructions, not by the
//! weights' bytes, so this halves their floor; bf16 activations into the products are what a
//! bf16 model computes in the frameworks that serve it.
//!
//! Every row count runs the same arithmetic per output (two sums, of the even and the odd
//! pairs, added at the end, as the f32 product does), so a verify's rows get a decode step's
//! bits. The portable reference ([`step`]) is the instruction's lane: Intel's definition (two
//! fused multiply-adds, the odd inputs first, denormal inputs read as zero and results flushed
//! to zero), which a Zen 4 computes bit for bit (`the_reference_step_is_the_instructions`).

use std::sync::OnceLock;

use super::{Weight, STRIP};
use crate::threads::OutRows;

/// How a bfloat16 checkpoint's products multiply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bf16Arithmetic {
    /// The weights widened to f32 (exactly) against f32 activations with f32 fused
    /// multiply-adds: an f32 copy's bits.
    Widened,
    /// The activations rounded to bfloat16, and `vdpbf16ps`'s arithmetic ([`step`]).
    Dot,
}

impl Bf16Arithmetic {
    /// [`Bf16Arithmetic::Dot`] where the kernels run at AVX-512 (`GROVE_KERNEL` may lower
    /// them) and the CPU has AVX-512 BF16; else the widened f32 arithmetic.
    pub fn here() -> Self {
        static HERE: OnceLock<Bf16Arithmetic> = OnceLock::new();
        *HERE.get_or_init(|| {
            if crate::cpu::allows(crate::cpu::Level::Avx512) && has_avx512_bf16() {
                Self::Dot
            } else {
                Self::Widened
            }
        })
    }

    /// As reports name it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Widened => "f32",
            Self::Dot => "bf16 dot",
        }
    }
}

/// Whether this CPU runs `vdpbf16ps` on 512-bit vectors.
fn has_avx512_bf16() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bf16")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Rows of `x` (`[rows, k]`) rounded to bfloat16 as `vcvtneps2bf16` rounds (to nearest, ties
/// to even, denormals to zero), each pair of inputs in one `u32`, the even input in the low
/// half, as the weights pair them: `[rows, k / 2]`, an odd `k`'s last pair ending in a zero.
pub(crate) fn pairs(x: &[f32], rows: usize, k: usize) -> Vec<u32> {
    assert_eq!(x.len(), rows * k, "input is not [rows, k]");
    let mut out = vec![0u32; rows * k.div_ceil(2)];
    #[cfg(target_arch = "x86_64")]
    if has_avx512_bf16() {
        // SAFETY: the CPU has the features `pairs_avx512` is compiled for.
        #[allow(unsafe_code)]
        unsafe {
            pairs_avx512(x, k, &mut out)
        };
        return out;
    }
    pairs_portable(x, k, &mut out);
    out
}

/// [`pairs`] one value at a time.
fn pairs_portable(x: &[f32], k: usize, out: &mut [u32]) {
    let half = |v: f32| u32::from(half::bf16::from_f32(flushed(v)).to_bits());
    for (row, pairs) in x.chunks_exact(k).zip(out.chunks_exact_mut(k.div_ceil(2))) {
        for (pair, inputs) in pairs.iter_mut().zip(row.chunks(2)) {
            *pair = half(inputs[0]) | inputs.get(1).map_or(0, |&odd| half(odd) << 16);
        }
    }
}

/// [`pairs`] 16 values an instruction: the pairs of a row are its values in order, as bfloat16.
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
unsafe fn pairs_avx512(x: &[f32], k: usize, out: &mut [u32]) {
    use std::arch::x86_64::*;
    for (row, pairs) in x.chunks_exact(k).zip(out.chunks_exact_mut(k.div_ceil(2))) {
        let halves = pairs.as_mut_ptr().cast::<u16>();
        let mut i = 0;
        while i < k {
            let mask = if k - i >= 16 {
                !0
            } else {
                (1u16 << (k - i)) - 1
            };
            let values = _mm512_maskz_loadu_ps(mask, row.as_ptr().add(i));
            let rounded: __m256i = std::mem::transmute(_mm512_cvtneps_pbh(values));
            _mm256_mask_storeu_epi16(halves.add(i).cast(), mask, rounded);
            i += 16;
        }
    }
}

/// A value as `vdpbf16ps` reads and writes it: a denormal as a zero of its sign.
fn flushed(value: f32) -> f32 {
    if value.is_subnormal() {
        0f32.copysign(value)
    } else {
        value
    }
}

/// The bfloat16 in the low half of `bits`, as `vdpbf16ps` reads it.
fn operand(bits: u32) -> f32 {
    flushed(f32::from_bits(bits << 16))
}

/// One lane of `vdpbf16ps`: `sum` plus the pairs `w` and `x`'s odd inputs' product, then plus
/// their even inputs' product, each a fused multiply-add rounded to nearest.
pub(crate) fn step(sum: f32, w: u32, x: u32) -> f32 {
    let odd = operand(w >> 16).mul_add(operand(x >> 16), flushed(sum));
    flushed(operand(w & 0xffff).mul_add(operand(x & 0xffff), flushed(odd)))
}

/// Output `j` of `out`'s row `r` = weight row `j` of `strips` (`j < w`, bfloat16 pairs)
/// dotted with row `r` of `x` ([`pairs`] of `k` inputs), in bfloat16 arithmetic.
pub(super) fn product(
    strips: &[half::bf16],
    k: usize,
    w: usize,
    x: &[u32],
    rows: usize,
    out: OutRows<'_>,
) {
    #[cfg(target_arch = "x86_64")]
    if has_avx512_bf16() {
        // SAFETY: the CPU has the features `product_avx512` is compiled for.
        #[allow(unsafe_code)]
        unsafe {
            return product_avx512(strips, k, w, x, rows, out);
        }
    }
    product_portable(strips, k, w, x, rows, out)
}

/// The reference: per output, [`step`] through the even pairs and through the odd pairs in
/// order, then their sum (what the vector kernel does lane by lane).
fn product_portable(
    strips: &[half::bf16],
    k: usize,
    w: usize,
    x: &[u32],
    rows: usize,
    mut out: OutRows<'_>,
) {
    let k2 = k.div_ceil(2);
    let bits = |weight: half::bf16| u32::from(weight.to_bits());
    for (s, strip) in strips.chunks_exact(half::bf16::strip_len(k)).enumerate() {
        for p in 0..STRIP.min(w - s * STRIP) {
            for r in 0..rows {
                let (mut even, mut odd) = (0f32, 0f32);
                for (j, &input) in x[r * k2..][..k2].iter().enumerate() {
                    let at = half::bf16::at(2 * j, p);
                    let weight = bits(strip[at]) | bits(strip[at + 1]) << 16;
                    if j % 2 == 0 {
                        even = step(even, weight, input);
                    } else {
                        odd = step(odd, weight, input);
                    }
                }
                out.row(r)[s * STRIP + p].write(even + odd);
            }
        }
    }
}

/// [`product_portable`] in AVX-512 BF16: a strip's 16 outputs in one vector, tiles of up to
/// [`super::TILE`] activation rows, each weight vector (a pair of inputs of 16 rows) loaded
/// once for the tile's rows.
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn product_avx512(
    strips: &[half::bf16],
    k: usize,
    w: usize,
    x: &[u32],
    rows: usize,
    mut out: OutRows<'_>,
) {
    let (strip_len, k2) = (half::bf16::strip_len(k), k.div_ceil(2));
    assert!(strips.len() == w.div_ceil(STRIP) * strip_len && x.len() >= rows * k2);
    assert!(out.rows() >= rows && out.width() >= w);
    let (stride, out) = (out.stride(), out.as_mut_ptr());
    super::for_each_tile(
        strips,
        strip_len,
        w,
        stride,
        rows,
        &super::AVX512_TILES,
        |tile, strip, done, at, width| {
            // SAFETY: the strip holds `k2` vectors, rows `done..done + tile` of `x` exist and
            // the masked stores stay inside `out` (asserted above).
            match tile {
                super::TILE => strip_tile::<{ super::TILE }>(strip, k2, x, done, out, at, width),
                7 => strip_tile::<7>(strip, k2, x, done, out, at, width),
                6 => strip_tile::<6>(strip, k2, x, done, out, at, width),
                5 => strip_tile::<5>(strip, k2, x, done, out, at, width),
                4 => strip_tile::<4>(strip, k2, x, done, out, at, width),
                3 => strip_tile::<3>(strip, k2, x, done, out, at, width),
                2 => strip_tile::<2>(strip, k2, x, done, out, at, width),
                _ => strip_tile::<1>(strip, k2, x, done, out, at, width),
            }
        },
    );
}

/// One strip (`k2` pairs) against activation rows `first..first + R`: row `r`'s 16 outputs
/// (the first `width`) at `out.add(at(r))`.
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
#[inline]
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn strip_tile<const R: usize>(
    strip: &[half::bf16],
    k2: usize,
    x: &[u32],
    first: usize,
    out: *mut f32,
    at: impl Fn(usize) -> usize,
    width: usize,
) {
    use std::arch::x86_64::*;
    let inputs: [*const u32; R] = std::array::from_fn(|r| x.as_ptr().add((first + r) * k2));
    let (mut even, mut odd) = ([_mm512_setzero_ps(); R], [_mm512_setzero_ps(); R]);
    let weights = strip.as_ptr().cast::<__m512i>();
    let pair = |j: usize| -> __m512bh { std::mem::transmute(_mm512_loadu_si512(weights.add(j))) };
    let input = |r: usize, j: usize| -> __m512bh {
        std::mem::transmute(_mm512_set1_epi32(*inputs[r].add(j) as i32))
    };
    let mut j = 0;
    while j + 1 < k2 {
        let (w0, w1) = (pair(j), pair(j + 1));
        if R > 1 {
            super::ask_ahead(weights.add(j).cast());
            super::ask_ahead(weights.add(j + 1).cast());
        }
        for r in 0..R {
            even[r] = _mm512_dpbf16_ps(even[r], w0, input(r, j));
            odd[r] = _mm512_dpbf16_ps(odd[r], w1, input(r, j + 1));
        }
        j += 2;
    }
    if j < k2 {
        let w0 = pair(j);
        for (r, sum) in even.iter_mut().enumerate() {
            *sum = _mm512_dpbf16_ps(*sum, w0, input(r, j));
        }
    }
    let mask = ((1u32 << width) - 1) as __mmask16;
    for r in 0..R {
        let sum = _mm512_add_ps(even[r], odd[r]);
        _mm512_mask_storeu_ps(out.add(at(r)), mask, sum);
    }
}

#[cfg(test)]
mod tests {
    use super::super::DenseStrips;
    use super::*;

    fn wave(n: usize, seed: f32) -> Vec<f32> {
        (0..n).map(|i| ((i as f32 + seed) * 0.713).sin()).collect()
    }

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    /// Whether the AVX-512 BF16 kernel runs here (else the test says it skips, or fails where
    /// `GROVE_REQUIRE_AVX512_BF16=1`).
    fn kernel_runs(test: &str) -> bool {
        !crate::skip_without("avx512_bf16", has_avx512_bf16(), test)
    }

    /// The reference's lane against the instruction's on values of every kind: ordinary,
    /// denormal (read as zero, flushed when produced), zeros of both signs, large and
    /// cancelling sums.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_reference_step_is_the_instructions() {
        if !kernel_runs("the_reference_step_is_the_instructions") {
            return;
        }
        let mut state = 0x9e37_79b9_7f4a_7c15_u64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let special = [
            0u16, 0x8000, 0x0001, 0x807f, 0x0080, 0x3f80, 0xbf80, 0x7f7f, 0x0100,
        ];
        let mut mismatches = Vec::new();
        for round in 0..4000 {
            let half = |r: u64| match round % 4 {
                0 => special[(r % special.len() as u64) as usize],
                // Small exponents, where products and sums underflow.
                1 => (r as u16 & 0x80ff) | 0x0100,
                _ => r as u16 & 0xbfff,
            };
            let (mut sums, mut w, mut x) = ([0f32; 16], [0u32; 16], [0u32; 16]);
            for lane in 0..16 {
                let sum = half(next());
                sums[lane] = f32::from_bits(u32::from(sum) << 16 | (next() as u32 & 0xffff));
                w[lane] = u32::from(half(next())) | u32::from(half(next())) << 16;
                x[lane] = u32::from(half(next())) | u32::from(half(next())) << 16;
            }
            // SAFETY: the CPU has AVX-512 BF16 (`kernel_runs`).
            #[allow(unsafe_code)]
            let lanes = unsafe { instruction(&sums, &w, &x) };
            for lane in 0..16 {
                let ours = step(sums[lane], w[lane], x[lane]);
                if ours.to_bits() != lanes[lane].to_bits()
                    && !(ours.is_nan() && lanes[lane].is_nan())
                {
                    mismatches.push((sums[lane], w[lane], x[lane], ours, lanes[lane]));
                }
            }
        }
        assert!(
            mismatches.is_empty(),
            "{} lanes differ: {:?}",
            mismatches.len(),
            &mismatches[..mismatches.len().min(4)]
        );
    }

    #[cfg(target_arch = "x86_64")]
    #[allow(unsafe_code)]
    #[target_feature(enable = "avx512f,avx512bf16")]
    unsafe fn instruction(sums: &[f32; 16], w: &[u32; 16], x: &[u32; 16]) -> [f32; 16] {
        use std::arch::x86_64::*;
        let load = |v: &[u32; 16]| -> __m512bh { std::mem::transmute(*v) };
        let sums = _mm512_loadu_ps(sums.as_ptr());
        let mut lanes = [0f32; 16];
        _mm512_storeu_ps(lanes.as_mut_ptr(), _mm512_dpbf16_ps(sums, load(w), load(x)));
        lanes
    }

    /// Every row count 1..=20 (every tile and remainder), odd `k`, a last strip of 5 rows and
    /// several tasks: the kernel's bits are the reference's, each row's the same alone as in
    /// a tile, and all close to the exact product of the rounded inputs.
    #[test]
    fn dot_products_equal_the_reference_bit_for_bit_in_any_tile() {
        let kernel = kernel_runs("dot_products_equal_the_reference_bit_for_bit_in_any_tile");
        for (n, k) in [(37, 33), (133, 64)] {
            let halves: Vec<half::bf16> = (wave(n * k, 1.0).iter())
                .map(|&v| half::bf16::from_f32(v))
                .collect();
            let strips = DenseStrips::new_bf16(&halves, n, k);
            let super::super::Values::Bf16(values) = &strips.values else {
                unreachable!()
            };
            for rows in 1..=20 {
                let x = wave(rows * k, rows as f32);
                let ours = strips.matmul_in(&x, rows, Bf16Arithmetic::Dot);
                let mut reference = vec![0f32; rows * n];
                let block = OutRows::block(&mut reference, rows);
                product_portable(values, k, n, &pairs(&x, rows, k), rows, block);
                if kernel {
                    assert_eq!(bits(&ours), bits(&reference), "[{n}, {k}] x {rows}");
                }
                for r in 0..rows {
                    let row = &x[r * k..(r + 1) * k];
                    let alone = strips.matmul_in(row, 1, Bf16Arithmetic::Dot);
                    assert_eq!(bits(&alone), bits(&ours[r * n..(r + 1) * n]), "row {r}");
                }
                super::super::tests::assert_near_exact(&reference, n, k, |r, j, e| {
                    let input = half::bf16::from_f32(x[r * k + e]).to_f64();
                    input * halves[j * k + e].to_f64()
                });
            }
        }
    }

    /// The instruction's rounding and the reference's agree on values of every kind: ties,
    /// denormals, infinities, NaNs, the largest values (which round to infinity), rows of
    /// every length's remainder.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn inputs_round_as_the_instruction_rounds() {
        if !kernel_runs("inputs_round_as_the_instruction_rounds") {
            return;
        }
        let special = [
            0x3f80_8000_u32,
            0x3f81_8000,
            0x0000_0001,
            0x8040_0000,
            0x007f_ffff,
            0x7f7f_ffff,
            0xff7f_8000,
            0x7f80_0000,
            0xff80_0000,
            0x7fc0_0001,
            0x7f80_0001,
            0xffbf_ffff,
            0,
            0x8000_0000,
            0x0080_0000,
            0x3400_7fff,
        ];
        let mut state = 0x2545_f491_4f6c_dd1d_u64;
        let mut values: Vec<f32> = special.iter().map(|&b| f32::from_bits(b)).collect();
        for _ in 0..2000 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            values.push(f32::from_bits(state as u32));
        }
        for k in [1, 7, 16, 33, values.len()] {
            let rows = values.len() / k;
            let x = &values[..rows * k];
            let mut reference = vec![0u32; rows * k.div_ceil(2)];
            pairs_portable(x, k, &mut reference);
            assert_eq!(pairs(x, rows, k), reference, "k {k}");
        }
    }

    /// Inputs pair up as the weights do, rounded to nearest with ties to even, an odd row's
    /// last pair ending in a zero.
    #[test]
    fn inputs_pair_up_rounded_to_nearest_even() {
        let tie_down = f32::from_bits(0x3f80_8000); // 1 + 2^-8: halfway, rounds to 1
        let tie_up = f32::from_bits(0x3f81_8000); // halfway above an odd bfloat16: up
        let x = [tie_down, tie_up, -2.0, 1.0, 0.5, 3.0];
        assert_eq!(
            pairs(&x, 2, 3),
            vec![0x3f80 | 0x3f82 << 16, 0xc000, 0x3f80 | 0x3f00 << 16, 0x4040]
        );
    }
}
