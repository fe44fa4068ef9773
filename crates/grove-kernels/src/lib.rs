//! The hot loops of inference on host memory, and the only crate of the workspace with
//! `unsafe` code (SIMD intrinsics, raw pointers into weight layouts, the compute threads'
//! shared task lists, file maps). Every other crate denies it.
//!
//! - [`quant`]: GGUF block formats kept quantized, their load-time layouts and products.
//! - [`strips`]: dense f32 matrices in column strips and their products (any row count).
//! - [`dense`]: the streaming f32 product for few rows, and the dot kernels attention uses.
//! - [`attention`]: softmax attention over lists of visible key slots.
//! - [`activation`]: gated MLP activations.
//! - [`norm`]: RMSNorm over host rows, with the residual add before it.
//! - [`threads`]: the compute threads kept awake through a forward and its parallel sections.
//! - [`memory`]: read-only file maps, returning freed heap to the OS, and keeping a forward
//!   pass's large buffers in the heap.
//! - [`cpu`]: which instruction sets the kernels use (the CPU's best, or `GROVE_KERNEL`'s).
//!
//! Each SIMD path is chosen at run time ([`cpu::level`]), with a portable reference that tests
//! compare it to.

pub mod activation;
pub mod attention;
pub mod cpu;
pub mod dense;
pub mod memory;
pub mod norm;
pub mod quant;
pub mod strips;
pub mod threads;

/// Test support: whether a test whose kernel this CPU lacks should run. It prints what it
/// skips, and fails instead where `GROVE_REQUIRE_<FEATURE>=1` says the CPU has the feature
/// (CI sets it from /proc/cpuinfo), so a test cannot pass silently on the wrong machine.
#[cfg(test)]
pub(crate) fn skip_without(feature: &str, present: bool, test: &str) -> bool {
    if present {
        return false;
    }
    let switch = format!("GROVE_REQUIRE_{}", feature.to_ascii_uppercase());
    assert!(
        std::env::var(&switch).as_deref() != Ok("1"),
        "{test}: {switch}=1 but this CPU (or build) lacks {feature}"
    );
    eprintln!("{test}: skipped, no {feature} on this CPU");
    true
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_required_feature_that_is_missing_fails_the_test() {
        // A feature name no other test asks about, so setting its switch races with nothing.
        assert!(!crate::skip_without("testonly_feature", true, "present"));
        assert!(crate::skip_without(
            "testonly_feature",
            false,
            "absent, not required"
        ));
        std::env::set_var("GROVE_REQUIRE_TESTONLY_FEATURE", "1");
        let required = std::panic::catch_unwind(|| {
            crate::skip_without("testonly_feature", false, "absent, required")
        });
        std::env::remove_var("GROVE_REQUIRE_TESTONLY_FEATURE");
        assert!(required.is_err(), "a required feature's absence must fail");
    }
}
