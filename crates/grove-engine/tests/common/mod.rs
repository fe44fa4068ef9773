//! Helpers shared by the engine's end-to-end tests.
#![allow(dead_code)] // each test binary uses a different subset

use std::path::PathBuf;

use anyhow::Result;
use candle_core::Device;
use grove_core::{SamplingParams, TokenId};
use grove_engine::{DDTreeSpec, DFlashSpec, GenerateRequest, Generator, GeneratorOptions};
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
    GenerateRequest::greedy(prompt, max_new_tokens)
}

/// Sampling at temperature 1 from the whole distribution, seeded.
pub fn seeded_sampling(seed: u64) -> SamplingParams {
    SamplingParams {
        temperature: 1.0,
        top_k: 0,
        top_p: 1.0,
        seed: Some(seed),
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

/// Plain decoding, DFlash (block 8) and DDTree (`budget`) over the golden pair.
pub fn three_methods<'a>(
    target: &'a Decoder,
    drafter: &'a DFlashDrafter,
    page_size: usize,
    budget: usize,
) -> Result<[(&'static str, Generator<'a>); 3]> {
    let options = GeneratorOptions {
        page_size,
        ..Default::default()
    };
    Ok([
        ("none", Generator::new(target, None, options.clone())),
        (
            "dflash",
            Generator::new(target, None, options.clone()).with_dflash(DFlashSpec {
                drafter,
                num_draft_tokens: 8,
            })?,
        ),
        (
            "ddtree",
            Generator::new(target, None, options).with_ddtree(DDTreeSpec {
                drafter,
                budget,
                top_k: budget,
            })?,
        ),
    ])
}
