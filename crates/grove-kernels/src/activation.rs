//! Gated MLP activations on host floats: `act(gate) * up` in one pass, with an exponential
//! the compiler vectorizes. candle's `silu` / `gelu` call libm's scalar `expf` / `tanhf` per
//! element, a tenth of a 128-token Gemma 3 prefill here; this is the same math on 8 or 16
//! lanes at once.

use std::mem::MaybeUninit;

use rayon::prelude::*;

use crate::threads::OutRows;

/// Which function gates the MLP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    Silu,
    /// GELU, tanh approximation (`gelu_pytorch_tanh`; Gemma).
    GeluTanh,
}

/// Below this many values the work stays on the calling thread.
const PARALLEL_MIN_VALUES: usize = 1 << 15;
/// Values per parallel task.
const VALUES_PER_TASK: usize = 1 << 13;

/// `act(gate[i]) * up[i]` for every `i`.
pub fn gated(activation: Activation, gate: &[f32], up: &[f32]) -> Vec<f32> {
    assert_eq!(gate.len(), up.len(), "gate and up differ in length");
    let mut out = Vec::with_capacity(gate.len());
    let values = &mut out.spare_capacity_mut()[..gate.len()];
    if gate.len() >= PARALLEL_MIN_VALUES {
        values
            .par_chunks_mut(VALUES_PER_TASK)
            .zip(gate.par_chunks(VALUES_PER_TASK))
            .zip(up.par_chunks(VALUES_PER_TASK))
            .for_each(|((out, gate), up)| gated_into(activation, gate, up, out));
    } else {
        gated_into(activation, gate, up, values);
    }
    // SAFETY: `gated_into` wrote each of the first `gate.len()` values, every chunk's.
    #[allow(unsafe_code)]
    unsafe {
        out.set_len(gate.len())
    };
    out
}

/// [`gated`] into `out` (as long as `gate`), on the calling thread: every value written, none
/// read, so `out` need not be initialized (a many-row MLP's outputs were zeroed first, a pass
/// over all of them).
pub fn gated_into(activation: Activation, gate: &[f32], up: &[f32], out: &mut [MaybeUninit<f32>]) {
    assert!(
        gate.len() == out.len() && up.len() == out.len(),
        "gate, up and out differ in length"
    );
    #[cfg(target_arch = "x86_64")]
    if crate::cpu::allows(crate::cpu::Level::Avx512) {
        // SAFETY: the level includes the feature `gated_avx512` is compiled for, found on
        // this CPU.
        #[allow(unsafe_code)]
        return unsafe { gated_avx512(activation, gate, up, out) };
    }
    gated_portable(activation, gate, up, out)
}

/// [`gated_into`] for each row of `gate` and `up` (`[rows, out.width()]` each) into the rows
/// of `out`, with the CPU's loop chosen once for all of them: a prompt's MLP gates each
/// task's 32 columns row by row, and a call per row (the choice, the checks, the loop's
/// ends) took about as long as its arithmetic.
pub fn gated_rows(activation: Activation, gate: &[f32], up: &[f32], mut out: OutRows<'_>) {
    let width = out.width();
    assert!(
        gate.len() == out.rows() * width && up.len() == gate.len(),
        "gate, up and out differ in shape"
    );
    if width == 0 {
        return;
    }
    if out.rows() == 1 {
        // A decode step's tasks: the one row's call, as before the rows were gated together.
        return gated_into(activation, gate, up, out.row(0));
    }
    #[cfg(target_arch = "x86_64")]
    if crate::cpu::allows(crate::cpu::Level::Avx512) {
        // SAFETY: as `gated_into`'s.
        #[allow(unsafe_code)]
        return unsafe { gated_rows_avx512(activation, gate, up, out) };
    }
    rows_portable(activation, gate, up, out)
}

#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
#[target_feature(enable = "avx512f")]
unsafe fn gated_rows_avx512(activation: Activation, gate: &[f32], up: &[f32], out: OutRows<'_>) {
    rows_portable(activation, gate, up, out)
}

/// [`gated_portable`] row by row, inlined (as it is) into the caller's features.
#[inline(always)]
fn rows_portable(activation: Activation, gate: &[f32], up: &[f32], mut out: OutRows<'_>) {
    let width = out.width();
    for (r, (gate, up)) in gate
        .chunks_exact(width)
        .zip(up.chunks_exact(width))
        .enumerate()
    {
        gated_portable(activation, gate, up, out.row(r));
    }
}

#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
#[target_feature(enable = "avx512f")]
unsafe fn gated_avx512(
    activation: Activation,
    gate: &[f32],
    up: &[f32],
    out: &mut [MaybeUninit<f32>],
) {
    gated_portable(activation, gate, up, out)
}

/// Branch-free loops over plain slices, so each compiles to vector code for the features of
/// the function it is inlined into.
#[inline(always)]
fn gated_portable(activation: Activation, gate: &[f32], up: &[f32], out: &mut [MaybeUninit<f32>]) {
    let values = out.iter_mut().zip(gate.iter().zip(up));
    match activation {
        Activation::Silu => {
            for (out, (&x, &u)) in values {
                out.write(x / (1.0 + exp(-x)) * u);
            }
        }
        Activation::GeluTanh => {
            // 0.5 (1 + tanh(z)) = 1 / (1 + e^(-2z)): no cancellation where tanh is near -1.
            const SQRT_2_OVER_PI: f32 = 0.797_884_6;
            for (out, (&x, &u)) in values {
                let z = SQRT_2_OVER_PI * (x + 0.044_715 * x * x * x);
                out.write(x / (1.0 + exp(-2.0 * z)) * u);
            }
        }
    }
}

/// `e^x` within 2 ulp for finite `x`: `x = n ln2 + r` with `|r| <= ln2 / 2`, `e^r` by its
/// Taylor series to `r^7` (truncation below 6e-9), `2^n` built in the exponent bits. Inputs
/// are clamped to where `2^n` stays a normal float (below: ~1e-38, above: ~2e38), which the
/// activations above only see as 0 or 1 after the division.
#[inline(always)]
fn exp(x: f32) -> f32 {
    const LOG2_E: f32 = std::f32::consts::LOG2_E;
    // ln 2 split so that `n * LN2_HIGH` is exact for |n| < 2^9.
    const LN2_HIGH: f32 = 0.693_145_75;
    const LN2_LOW: f32 = 1.428_606_8e-6;
    // Adding 1.5 * 2^23 rounds to an integer (ties to even).
    const ROUND: f32 = 12_582_912.0;
    let x = x.clamp(-87.0, 88.0);
    let rounded = x * LOG2_E + ROUND;
    let n = rounded - ROUND;
    let r = (x - n * LN2_HIGH) - n * LN2_LOW;
    let p = 1.0
        + r * (1.0
            + r * (0.5
                + r * (1.0 / 6.0
                    + r * (1.0 / 24.0
                        + r * (1.0 / 120.0 + r * (1.0 / 720.0 + r * (1.0 / 5040.0)))))));
    // `n` as an integer: the low bits of `rounded`, whose exponent is that of `ROUND` (`n`
    // is within +-2^22). `n as i32` is a saturating conversion the compiler does not
    // vectorize: one lane at a time, it was most of the activation's time (4864 values: 10
    // -> 3 us).
    let n_bits = rounded.to_bits().wrapping_sub(ROUND.to_bits());
    p * f32::from_bits(n_bits.wrapping_add(127) << 23)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_is_within_two_ulp_of_libm() {
        let mut x = -87.0f32;
        while x <= 88.0 {
            let (ours, libm) = (exp(x), x.exp());
            let ulp = f32::from_bits(libm.to_bits() + 1) - libm;
            assert!(
                (ours - libm).abs() <= 2.0 * ulp,
                "exp({x}) = {ours}, libm {libm}"
            );
            x += 0.0137;
        }
        assert_eq!(exp(0.0), 1.0);
        // Clamped ends stay finite and ordered.
        assert!(exp(-1000.0) > 0.0 && exp(-1000.0) < 1e-37);
        assert!(exp(1000.0).is_finite() && exp(1000.0) > 1e38);
    }

    #[test]
    fn gated_activations_match_their_formulas() {
        let n = 70_000; // over the parallel threshold, with a ragged last task
        let gate: Vec<f32> = (0..n).map(|i| (i as f32 * 0.0173).sin() * 12.0).collect();
        let up: Vec<f32> = (0..n).map(|i| (i as f32 * 0.0071).cos() * 3.0).collect();
        for activation in [Activation::Silu, Activation::GeluTanh] {
            let ours = gated(activation, &gate, &up);
            // The vector build of the loop is the portable one, operation for operation.
            let mut portable = vec![MaybeUninit::new(f32::NAN); n];
            gated_portable(activation, &gate, &up, &mut portable);
            // SAFETY: every value was made with `MaybeUninit::new`.
            #[allow(unsafe_code)]
            let portable: Vec<f32> = portable
                .iter()
                .map(|v| unsafe { v.assume_init() })
                .collect();
            assert_eq!(ours, portable, "{activation:?}");
            for ((&x, &u), &y) in gate.iter().zip(&up).zip(&ours) {
                let x64 = f64::from(x);
                let act = match activation {
                    Activation::Silu => x64 / (1.0 + (-x64).exp()),
                    Activation::GeluTanh => {
                        let z =
                            (2.0 / std::f64::consts::PI).sqrt() * (x64 + 0.044715 * x64.powi(3));
                        0.5 * x64 * (1.0 + z.tanh())
                    }
                };
                let expected = act * f64::from(u);
                assert!(
                    (f64::from(y) - expected).abs() <= 1e-6 * (1.0 + expected.abs()),
                    "{activation:?}({x}) * {u}: {y}, expected {expected}"
                );
            }
        }
    }
}
