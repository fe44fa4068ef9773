//! DFlash and DDTree at T = 1 sample from the target's own distribution. On a 16-token random target
//! with a random DFlash drafter, the joint law of the first two generated tokens (the second
//! one decided by the draft-and-verify walk) is compared with the exact law
//! `p(t1) p(t2 | t1)` by a chi-square test at significance 0.001. A negative control shows the
//! test has the power to catch a walk that accepts drafts without checking them.

use anyhow::Result;
use candle_core::{Device, Tensor};
use grove_core::{SamplingParams, StopCondition, TokenId};
use grove_engine::{
    processed_distribution, Budget, DDTreeSpec, DFlashSpec, DraftBlock, Drafter, GenerateRequest,
    Generator, GeneratorOptions, SpecAlgorithm, SpeculationSettings,
};
use grove_kv::{KvStore, PagePool, PageTable};
use grove_model::{
    DFlashDrafter, Decoder, Family, ForwardBatch, LogitRows, Model, ModelError, Segment,
};
use grove_testkit::random_checkpoint::{RandomCheckpoint, RandomDrafter};

const VOCAB: usize = 16;
const SAMPLES: u64 = 8_000;
const PROMPT: [TokenId; 3] = [1, 2, 3];
/// Standard normal quantile of 1 - 0.001.
const Z_0_001: f64 = 3.090;

fn target_spec() -> RandomCheckpoint {
    RandomCheckpoint {
        family: Family::Qwen3,
        vocab_size: VOCAB,
        hidden_size: 32,
        intermediate_size: 64,
        num_layers: 3,
        num_heads: 2,
        num_kv_heads: 1,
        head_dim: 16,
        tie_word_embeddings: false,
        bf16: false,
        with_tokenizer: false,
        max_position_embeddings: 64,
        seed: 3,
    }
}

fn t1() -> SamplingParams {
    SamplingParams {
        temperature: 1.0,
        top_k: 0,
        top_p: 1.0,
        seed: None,
    }
}

/// The target's T = 1 next-token law after `tokens`.
fn next_token_law(model: &Decoder, tokens: &[TokenId]) -> Result<Vec<f64>> {
    let pool = PagePool::new(tokens.len(), 1)?;
    let mut kv = model.new_kv_store(pool.num_slots());
    let mut table = pool.new_table();
    table.reserve(tokens.len())?;
    let positions: Vec<usize> = (0..tokens.len()).collect();
    let batch = ForwardBatch {
        segments: vec![Segment::causal(&table, tokens, &positions, LogitRows::Last)],
        taps: &[],
    };
    let logits = model.forward(&batch, &mut kv)?.logits_row(0)?;
    let mut law = vec![0.0; VOCAB];
    for (token, p) in processed_distribution(&logits, &t1()) {
        law[token as usize] = p;
    }
    Ok(law)
}

/// Pearson's chi-square of `counts` against `expected` probabilities, with cells expecting
/// fewer than 5 draws pooled; returns (statistic, critical value at 0.001).
fn chi_square(counts: &[u64], expected: &[f64]) -> (f64, f64) {
    let total: u64 = counts.iter().sum();
    let (mut statistic, mut cells) = (0.0, 0usize);
    let (mut pooled_count, mut pooled_expected) = (0.0, 0.0);
    for (&count, &p) in counts.iter().zip(expected) {
        let e = p * total as f64;
        if e < 5.0 {
            pooled_count += count as f64;
            pooled_expected += e;
        } else {
            statistic += (count as f64 - e).powi(2) / e;
            cells += 1;
        }
    }
    if pooled_expected > 0.0 {
        statistic += (pooled_count - pooled_expected).powi(2) / pooled_expected.max(1e-9);
        cells += 1;
    }
    // Wilson-Hilferty approximation of the chi-square quantile.
    let df = (cells - 1) as f64;
    let critical = df * (1.0 - 2.0 / (9.0 * df) + Z_0_001 * (2.0 / (9.0 * df)).sqrt()).powi(3);
    (statistic, critical)
}

/// Proposes, after the first generated token, the target's most likely next token: the
/// drafter a walk accepts most often at T = 1, which gives the test its power.
struct ArgmaxTableDrafter {
    after_first: Vec<TokenId>,
}

impl Drafter for ArgmaxTableDrafter {
    fn block_size(&self) -> usize {
        4
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
            .map(|block| {
                let mut logits = vec![0f32; 3 * VOCAB];
                logits[self.after_first[block.anchor as usize] as usize] = 10.0;
                Ok(Tensor::from_vec(logits, (3, VOCAB), &Device::Cpu)?)
            })
            .collect()
    }
}

/// Samples the first two tokens `SAMPLES` times with `drafter`; checks them against the exact
/// law, and checks that a walk taking `draft_after[t1]` unchecked would be caught.
fn check_law(
    generator: &Generator,
    draft_after: &[TokenId],
    exact: &[f64],
    min_accepted: u64,
) -> Result<()> {
    let mut counts = vec![0u64; VOCAB * VOCAB];
    let mut broken = vec![0u64; VOCAB * VOCAB];
    let mut accepted_second = 0;
    for seed in 0..SAMPLES {
        let request = GenerateRequest {
            prompt: PROMPT.to_vec(),
            sampling: SamplingParams {
                seed: Some(seed),
                ..t1()
            },
            stop: StopCondition {
                max_new_tokens: 3,
                ..Default::default()
            },
            speculation: Default::default(),
            logprobs: None,
            prompt_logprobs: false,
            adjustments: Default::default(),
            grammar: None,
        };
        let output = generator.generate(&request, |_| {})?;
        let (t1, t2) = (output.token_ids[0] as usize, output.token_ids[1] as usize);
        counts[t1 * VOCAB + t2] += 1;
        accepted_second += u64::from(output.stats.accept_lengths[0] > 1);
        // Negative control: a walk that takes the first draft without checking it.
        broken[t1 * VOCAB + draft_after[t1] as usize] += 1;
    }
    assert!(
        accepted_second >= min_accepted,
        "drafts were accepted only {accepted_second} times: the walk is barely exercised"
    );
    let (statistic, critical) = chi_square(&counts, exact);
    let (broken_statistic, _) = chi_square(&broken, exact);
    eprintln!("{SAMPLES} runs, {accepted_second} accepted drafts: chi-square {statistic:.1} (critical {critical:.1}); unchecked walk {broken_statistic:.1}");
    assert!(
        statistic < critical,
        "DFlash samples deviate from the target: chi-square {statistic:.1} >= {critical:.1}"
    );
    let (statistic, critical) = chi_square(&broken, exact);
    assert!(statistic > critical, "the negative control passed (chi-square {statistic:.1} < {critical:.1}): the test has no power");
    Ok(())
}

#[test]
fn dflash_and_ddtree_at_temperature_one_sample_the_targets_joint_law() -> Result<()> {
    // Tiny matmuls: threads would only add wake-ups (candle reads this per call).
    std::env::set_var("RAYON_NUM_THREADS", "1");
    let dir = tempfile::tempdir()?;
    let spec = target_spec();
    spec.write(&dir.path().join("target"))?;
    let drafter_spec = RandomDrafter {
        num_layers: 1,
        block_size: 4,
        target_layer_ids: vec![0, 1],
        mask_token_id: 15,
        seed: 9,
    };
    drafter_spec.write(&spec, &dir.path().join("drafter"))?;
    let target = Decoder::load(&dir.path().join("target"), &Device::Cpu)?;
    let drafter =
        DFlashDrafter::load(&dir.path().join("drafter"), &target, |_| None, &Device::Cpu)?;

    let first = next_token_law(&target, &PROMPT)?;
    let mut exact = vec![0.0; VOCAB * VOCAB];
    let mut most_likely_second = Vec::new();
    for (t1, p1) in first.iter().enumerate() {
        let second = next_token_law(&target, &[&PROMPT[..], &[t1 as TokenId]].concat())?;
        for (t2, p2) in second.iter().enumerate() {
            exact[t1 * VOCAB + t2] = p1 * p2;
        }
        most_likely_second.push(grove_engine::argmax(
            &second.iter().map(|&p| p as f32).collect::<Vec<_>>(),
        ));
    }

    let plain = || Generator::new(&target, None, GeneratorOptions::default());
    let drafts = draft_table(&target, &drafter)?;
    // The real DFlash network (random weights: rarely right, but every code path runs).
    let dflash = plain().with_dflash(DFlashSpec {
        drafter: &drafter,
        num_draft_tokens: 4,
    })?;
    check_law(&dflash, &drafts, &exact, 1)?;
    // A drafter that is right as often as a drafter can be.
    let oracle = ArgmaxTableDrafter {
        after_first: most_likely_second.clone(),
    };
    let with_oracle = plain().with_dflash(DFlashSpec {
        drafter: &oracle,
        num_draft_tokens: 4,
    })?;
    check_law(&with_oracle, &most_likely_second, &exact, SAMPLES / 5)?;
    // DDTree over both drafters: four candidates per depth, so the walk chooses among
    // siblings; the unchecked walk follows the rank-0 child.
    let tree = plain().with_ddtree(DDTreeSpec {
        drafter: &drafter,
        budget: 6,
        top_k: 4,
    })?;
    check_law(&tree, &drafts, &exact, 1)?;
    let oracle_tree = plain().with_ddtree(DDTreeSpec {
        drafter: &oracle,
        budget: 6,
        top_k: 4,
    })?;
    check_law(&oracle_tree, &most_likely_second, &exact, SAMPLES / 5)?;
    // The automatic budget: each round drafts or not, and verifies as many nodes as its
    // measured costs say; the law is the target's whatever it chooses.
    let auto_tree = plain().with_speculation(
        SpeculationSettings {
            algorithm: SpecAlgorithm::DDTree,
            budget: Some(Budget::Auto),
            max_budget: Some(6),
            top_k: Some(4),
            ..Default::default()
        },
        Some(&oracle),
    )?;
    // Costs fixed where rows are nearly free and drafting is cheap, so that it drafts (on this
    // tiny model's measured costs it would rightly not). It verifies only the drafter's
    // one-hot choice (the siblings' predicted acceptance is nil), which the target samples a
    // fraction of the time, so it drafts when a look says so: fewer accepted drafts than
    // the fixed trees, the same samples.
    let rows: Vec<(usize, f64)> = (1..=7).map(|r| (r, 1e-3 + 1e-5 * r as f64)).collect();
    auto_tree.preload_costs(&rows, &[(1, 1e-5)], true);
    check_law(&auto_tree, &most_likely_second, &exact, 10)
}

/// The drafter's first greedy draft after each possible first token.
fn draft_table(target: &Decoder, drafter: &DFlashDrafter) -> Result<Vec<TokenId>> {
    let pool = PagePool::new(PROMPT.len(), 1)?;
    let mut kv = target.new_kv_store(pool.num_slots());
    let mut table = pool.new_table();
    table.reserve(PROMPT.len())?;
    let positions: Vec<usize> = (0..PROMPT.len()).collect();
    let taps = drafter.target_taps().to_vec();
    let batch = ForwardBatch {
        segments: vec![Segment::causal(
            &table,
            &PROMPT,
            &positions,
            LogitRows::None,
        )],
        taps: &taps,
    };
    let features = Tensor::cat(&target.forward(&batch, &mut kv)?.taps, 1)?;
    (0..VOCAB as TokenId)
        .map(|t1| {
            let draft_pool = PagePool::new(16, 1)?;
            let mut draft_kv = Drafter::new_kv_store(drafter, draft_pool.num_slots());
            let mut table = draft_pool.new_table();
            drafter.extend(&mut draft_kv, &mut table, &features)?;
            let mut blocks = [DraftBlock {
                table: &mut table,
                anchor: t1,
                position: PROMPT.len(),
                depths: 1,
            }];
            let logits = Drafter::draft(drafter, target, &mut draft_kv, &mut blocks)?;
            Ok(logits[0].get(0)?.argmax(0)?.to_scalar::<u32>()?)
        })
        .collect()
}
