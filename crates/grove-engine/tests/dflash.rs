//! DFlash speculative decoding is lossless and matches the reference: on the golden pair the
//! greedy tokens and every round's acceptance length but the last equal z-lab's; for random
//! prompts greedy DFlash equals plain greedy decoding with the golden drafter, an oracle drafter
//! (every round accepts the whole block) and an adversarial one (every round accepts nothing),
//! for page sizes 1 and 16.

mod common;

use anyhow::{Context, Result};
use common::*;
use grove_core::{SamplingParams, TokenId};
use grove_engine::{
    DFlashSpec, Drafter, GenerateOutput, GenerateRequest, Generator, GeneratorOptions,
};
use grove_model::{Decoder, Model};
use rand::{Rng, SeedableRng};
use serde_json::Value;

fn run(
    target: &Decoder,
    drafter: Option<&dyn Drafter>,
    page_size: usize,
    request: &GenerateRequest,
) -> Result<GenerateOutput> {
    let mut generator = Generator::new(
        target,
        None,
        GeneratorOptions {
            page_size,
            ..Default::default()
        },
    );
    if let Some(drafter) = drafter {
        generator = generator.with_dflash(DFlashSpec {
            drafter,
            num_draft_tokens: drafter.block_size(),
        })?;
    }
    Ok(generator.generate(request, |_| {})?)
}

#[test]
fn greedy_dflash_reproduces_the_reference_tokens_and_acceptance_lengths() -> Result<()> {
    let (target, drafter) = golden_pair()?;
    let cases: Value = serde_json::from_str(
        &std::fs::read_to_string(golden_dir().join("cases.json")).context("cases")?,
    )?;
    for case in cases["cases"].as_array().context("cases")? {
        let prompt: Vec<u32> = serde_json::from_value(case["prompt"].clone())?;
        let expected_tokens: Vec<u32> =
            serde_json::from_value(case["dflash"]["new_tokens"].clone())?;
        let expected_tau: Vec<usize> =
            serde_json::from_value(case["dflash"]["acceptance_lengths"].clone())?;
        for page_size in [1, 16] {
            let output = run(&target, Some(&drafter), page_size, &greedy(&prompt, 64))?;
            let label = format!("case {} page size {page_size}", case["id"]);
            assert_eq!(output.token_ids, expected_tokens, "{label}");
            assert_taus_match(&output.stats.accept_lengths, &expected_tau, &label);
            let tau = &output.stats.accept_lengths;
            assert_eq!(
                tau.iter().sum::<usize>() + 1,
                64,
                "{label}: every token but the prefill's comes from a round"
            );
            let accepted_first = output.stats.accepted_per_position[0];
            assert_eq!(
                accepted_first,
                tau.iter().filter(|&&t| t > 1).count(),
                "{label}"
            );
        }
    }
    Ok(())
}

#[test]
fn greedy_dflash_equals_plain_greedy_with_golden_oracle_and_adversarial_drafters() -> Result<()> {
    let (target, drafter) = golden_pair()?;
    let vocab_size = target.config().vocab_size;
    let mut rng = rand_chacha::ChaCha12Rng::seed_from_u64(42);
    for trial in 0..4 {
        let length = rng.random_range(1..40);
        let prompt: Vec<TokenId> = (0..length).map(|_| rng.random_range(0..1021)).collect();
        let max_new = rng.random_range(1..48);
        let request = greedy(&prompt, max_new);
        let plain = run(&target, None, 1, &request)?;
        let mut sequence = prompt.clone();
        sequence.extend(&plain.token_ids);
        let oracle = ScriptedDrafter {
            sequence: sequence.clone(),
            vocab_size,
            block_size: 8,
            adversarial: false,
        };
        let adversary = ScriptedDrafter {
            sequence,
            vocab_size,
            block_size: 8,
            adversarial: true,
        };
        for page_size in [1, 16] {
            let label =
                format!("trial {trial} (prompt {length}, {max_new} new) page size {page_size}");
            let golden = run(&target, Some(&drafter), page_size, &request)?;
            assert_eq!(golden.token_ids, plain.token_ids, "{label}: golden drafter");

            let with_oracle = run(&target, Some(&oracle), page_size, &request)?;
            assert_eq!(with_oracle.token_ids, plain.token_ids, "{label}: oracle");
            let tau = &with_oracle.stats.accept_lengths;
            assert!(
                tau[..tau.len().saturating_sub(1)].iter().all(|&t| t == 8),
                "{label}: oracle tau {tau:?}"
            );

            let with_adversary = run(&target, Some(&adversary), page_size, &request)?;
            assert_eq!(
                with_adversary.token_ids, plain.token_ids,
                "{label}: adversary"
            );
            assert!(
                with_adversary.stats.accept_lengths.iter().all(|&t| t == 1),
                "{label}: adversary"
            );
            assert_eq!(with_adversary.stats.rounds, max_new - 1);
        }
    }
    Ok(())
}

#[test]
fn a_stop_token_inside_an_accepted_run_ends_generation_there() -> Result<()> {
    let (target, drafter) = golden_pair()?;
    let cases: Value =
        serde_json::from_str(&std::fs::read_to_string(golden_dir().join("cases.json"))?)?;
    let case = &cases["cases"][0];
    let prompt: Vec<u32> = serde_json::from_value(case["prompt"].clone())?;
    let tokens: Vec<u32> = serde_json::from_value(case["dflash"]["new_tokens"].clone())?;
    // Case 0's round 7 emits new tokens 16..=21 (tau 6); stop on one in its middle.
    let stop_index = 18;
    let stop = tokens[stop_index];
    let first = tokens.iter().position(|&t| t == stop).unwrap();
    let mut request = greedy(&prompt, 64);
    request.stop.stop_token_ids = vec![stop];
    let output = run(&target, Some(&drafter), 4, &request)?;
    assert_eq!(output.token_ids, tokens[..=first].to_vec());
    assert_eq!(first, stop_index);
    assert_eq!(output.finish_reason, grove_core::FinishReason::Stop);
    assert_eq!(
        output.stats.accept_lengths.last(),
        Some(&3),
        "the round is cut after its third token"
    );
    Ok(())
}

#[test]
fn a_block_larger_than_the_drafter_is_refused() -> Result<()> {
    let (target, drafter) = golden_pair()?;
    let generator = Generator::new(&target, None, GeneratorOptions::default());
    let error = generator
        .with_dflash(DFlashSpec {
            drafter: &drafter,
            num_draft_tokens: 9,
        })
        .err()
        .context("accepted")?;
    assert!(
        error.to_string().contains("speculative_num_draft_tokens"),
        "{error}"
    );
    Ok(())
}

/// Drafts are greedy and the walk draws one sample per emitted token, in order, so with the
/// same seed DFlash emits exactly what plain sampling emits: a stronger check of exactness
/// than any statistic (it holds while verify and decode logits agree, as they do here to ~1e-6).
#[test]
fn seeded_dflash_sampling_emits_the_same_tokens_as_seeded_plain_sampling() -> Result<()> {
    let (target, drafter) = golden_pair()?;
    let prompt: Vec<TokenId> = vec![970, 881, 849, 832, 613];
    let mut accepted_drafts = 0;
    for seed in 0..6 {
        for (temperature, top_k, top_p) in [(1.0, 0, 1.0), (0.7, 40, 0.9)] {
            let mut request = greedy(&prompt, 48);
            request.sampling = SamplingParams {
                temperature,
                top_k,
                top_p,
                seed: Some(seed),
            };
            let plain = run(&target, None, 1, &request)?;
            let speculative = run(&target, Some(&drafter), 4, &request)?;
            assert_eq!(
                speculative.token_ids, plain.token_ids,
                "seed {seed} T {temperature}"
            );
            accepted_drafts += speculative
                .stats
                .accept_lengths
                .iter()
                .map(|t| t - 1)
                .sum::<usize>();
        }
    }
    assert!(
        accepted_drafts > 50,
        "only {accepted_drafts} drafts accepted: the walk was barely exercised"
    );
    Ok(())
}
