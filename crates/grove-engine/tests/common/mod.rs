//! Helpers shared by the engine's end-to-end tests.
#![allow(dead_code)] // each test binary uses a different subset

use std::path::PathBuf;

use anyhow::Result;
use candle_core::{Device, Tensor};
use grove_core::{SamplingParams, TokenId};
use grove_engine::{
    Budget, DDTreeSpec, DFlashSpec, DraftBlock, Drafter, GenerateOutput, GenerateRequest,
    Generator, GeneratorOptions, SpecAlgorithm, SpeculationSettings,
};
use grove_kv::{KvStore, PageTable};
use grove_model::{DFlashDrafter, Decoder, Model, ModelError};

pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

pub fn models_dir() -> PathBuf {
    std::env::var_os("GROVE_MODELS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("models"))
}

pub fn required() -> bool {
    std::env::var_os("GROVE_REQUIRE_LLAMA_CPP").is_some_and(|v| v == "1")
}

/// The installed model file `name`, or `None` with the reason printed.
pub fn model(name: &str) -> Option<PathBuf> {
    let path = models_dir().join(name);
    if path.is_file() {
        return Some(path);
    }
    assert!(
        // CI installs the 0.5B (with its Q5_K_M and Q4_0) and Gemma; the 1.5B may be absent
        // anywhere.
        !required() || !(name.starts_with("qwen2.5-coder-0.5b") || name.starts_with("gemma")),
        "GROVE_REQUIRE_LLAMA_CPP=1 but {} is missing (python3 scripts/install_models.py)",
        path.display()
    );
    eprintln!(
        "skipped {name}: {} is absent (python3 scripts/install_models.py)",
        path.display()
    );
    None
}

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

/// Proposes a known sequence: the target's greedy continuation (oracle) or, shifted by one id,
/// a token that is never the target's choice (adversarial).
pub struct ScriptedDrafter {
    /// The full greedy sequence, prompt included, indexed by position.
    pub sequence: Vec<TokenId>,
    pub vocab_size: usize,
    pub block_size: usize,
    pub adversarial: bool,
}

impl Drafter for ScriptedDrafter {
    fn block_size(&self) -> usize {
        self.block_size
    }

    fn target_taps(&self) -> &[usize] {
        &[]
    }

    fn new_kv_store(&self, _num_slots: usize) -> KvStore {
        KvStore::new(0, 0, 0, 0)
    }

    fn extend(
        &self,
        _kv: &mut KvStore,
        _table: &mut PageTable,
        _features: &Tensor,
    ) -> Result<(), ModelError> {
        Ok(())
    }

    fn draft(
        &self,
        _target: &dyn Model,
        _kv: &mut KvStore,
        blocks: &mut [DraftBlock<'_>],
    ) -> Result<Vec<Tensor>, ModelError> {
        blocks
            .iter()
            .map(|block| self.script(block.position))
            .collect()
    }
}

impl ScriptedDrafter {
    /// One-hot logits for the slots after the anchor at `position`.
    fn script(&self, position: usize) -> Result<Tensor, ModelError> {
        let mut logits = vec![0f32; (self.block_size - 1) * self.vocab_size];
        for slot in 0..self.block_size - 1 {
            let truth = self.sequence.get(position + 1 + slot).copied().unwrap_or(0) as usize;
            let token = if self.adversarial {
                (truth + 1) % self.vocab_size
            } else {
                truth
            };
            logits[slot * self.vocab_size + token] = 10.0;
        }
        Ok(Tensor::from_vec(
            logits,
            (self.block_size - 1, self.vocab_size),
            &Device::Cpu,
        )?)
    }
}

/// Verify seconds by rows and draft seconds by sequences.
pub type Costs = (Vec<(usize, f64)>, Vec<(usize, f64)>);

/// An automatic-budget generator over `drafter`, its cost table fixed to `costs` (measured when
/// they are empty).
pub fn auto<'a>(
    target: &'a Decoder,
    drafter: &'a dyn Drafter,
    algorithm: SpecAlgorithm,
    costs: &Costs,
) -> Result<Generator<'a>> {
    let settings = SpeculationSettings {
        algorithm,
        budget: Some(Budget::Auto),
        max_budget: Some(12),
        ..Default::default()
    };
    let generator = Generator::new(target, None, GeneratorOptions::default())
        .with_speculation(settings, Some(drafter))?;
    assert!(generator.auto_budget());
    generator.preload_costs(&costs.0, &costs.1, !costs.0.is_empty());
    Ok(generator)
}

/// An automatic DDTree budget over `drafter` with `costs` (measured when empty), on `max_new`
/// greedy tokens after `prompt`.
pub fn run_auto(
    target: &Decoder,
    drafter: &dyn Drafter,
    prompt: &[TokenId],
    max_new: usize,
    costs: &Costs,
) -> Result<GenerateOutput> {
    let generator = auto(target, drafter, SpecAlgorithm::DDTree, costs)?;
    let output = generator.generate(&greedy(prompt, max_new), |_| {})?;
    eprintln!("{:?}", generator.auto_budget_report());
    Ok(output)
}

/// The oracle and the adversary of `target`'s greedy continuation of `prompt` (`max_new`
/// tokens), and that continuation.
pub fn scripted_pair(
    target: &Decoder,
    prompt: &[TokenId],
    max_new: usize,
) -> Result<[(ScriptedDrafter, Vec<TokenId>); 2]> {
    let plain = Generator::new(target, None, GeneratorOptions::default());
    let reference = plain.generate(&greedy(prompt, max_new), |_| {})?.token_ids;
    let mut sequence = prompt.to_vec();
    sequence.extend(&reference);
    let scripted = |adversarial| ScriptedDrafter {
        sequence: sequence.clone(),
        vocab_size: target.config().vocab_size,
        block_size: 8,
        adversarial,
    };
    Ok([
        (scripted(false), reference.clone()),
        (scripted(true), reference),
    ])
}
