//! Helpers shared by the engine's end-to-end tests.
#![allow(dead_code)] // each test binary uses a different subset

use std::path::PathBuf;

use anyhow::Result;
use candle_core::Device;
use grove_core::{SamplingParams, StopCondition, TokenId};
use grove_engine::GenerateRequest;
use grove_model::{DFlashDrafter, Decoder};

/// The golden reference set: `$GROVE_GOLDEN_DIR`, else `../shared/golden` beside the repo.
pub fn golden_dir() -> PathBuf {
    std::env::var_os("GROVE_GOLDEN_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/golden"))
}

/// The golden target and its DFlash drafter.
pub fn golden_pair() -> Result<(Decoder, DFlashDrafter)> {
    let target = Decoder::load(&golden_dir().join("target"), &Device::Cpu)?;
    let drafter = DFlashDrafter::load(
        &golden_dir().join("drafter"),
        &target,
        |_| None,
        &Device::Cpu,
    )?;
    Ok((target, drafter))
}

pub fn greedy(prompt: &[TokenId], max_new_tokens: usize) -> GenerateRequest {
    GenerateRequest {
        prompt: prompt.to_vec(),
        sampling: SamplingParams::greedy(),
        stop: StopCondition {
            max_new_tokens,
            ..Default::default()
        },
    }
}

/// Our per-round tau against the reference's, which keeps going until its committed length
/// passes the limit (overshooting in its last round, or adding one more round when the limit
/// falls exactly on a round boundary) and truncates afterwards; we stop at the limit. So every
/// round but the reference's last must agree, and our final round may be shorter.
pub fn assert_taus_match(ours: &[usize], reference: &[usize], label: &str) {
    let shared = reference.len() - 1;
    assert!(
        ours.len() == shared || ours.len() == reference.len(),
        "{label}: rounds {ours:?} vs {reference:?}"
    );
    let compared = ours.len().min(shared);
    assert_eq!(ours[..compared], reference[..compared], "{label}");
    if ours.len() == reference.len() {
        assert!(ours[shared] <= reference[shared], "{label}: last round");
    }
}
