//! DDTree matches the reference and is lossless: the first rounds' trees (tokens, parents,
//! depths, pop order) equal liranringel/ddtree's for every golden budget; greedy generation
//! reproduces its tokens and every round's tau but the last; greedy DDTree equals plain greedy
//! on random prompts for budgets 1..64 and page sizes 1 and 16; a chain-shaped tree is the
//! DFlash path exactly.

mod common;

use anyhow::{Context, Result};
use candle_core::{Device, Tensor};
use common::*;
use grove_core::{SamplingParams, TokenId};
use grove_engine::{
    DDTreeSpec, DFlashSpec, GenerateOutput, GenerateRequest, Generator, GeneratorOptions,
};
use grove_model::{DFlashDrafter, Decoder};
use grove_spec::{top_k_candidates, DepthCandidates, DraftTree};
use rand::{Rng, SeedableRng};
use serde_json::Value;

fn golden() -> Result<(
    Decoder,
    DFlashDrafter,
    Value,
    std::collections::HashMap<String, Tensor>,
)> {
    let dir = golden_dir();
    let target = Decoder::load(&dir.join("target"), &Device::Cpu)?;
    let drafter = DFlashDrafter::load(&dir.join("drafter"), &target, |_| None, &Device::Cpu)?;
    let cases =
        serde_json::from_str(&std::fs::read_to_string(dir.join("cases.json")).context("cases")?)?;
    let tensors = candle_core::safetensors::load(dir.join("tensors.safetensors"), &Device::Cpu)?;
    Ok((target, drafter, cases, tensors))
}

fn ddtree(
    target: &Decoder,
    drafter: &DFlashDrafter,
    budget: usize,
    top_k: usize,
    page_size: usize,
    request: &GenerateRequest,
) -> Result<GenerateOutput> {
    let generator = Generator::new(
        target,
        None,
        GeneratorOptions {
            page_size,
            ..Default::default()
        },
    )
    .with_ddtree(DDTreeSpec {
        drafter,
        budget,
        top_k,
    })?;
    Ok(generator.generate(request, |_| {})?)
}

#[test]
fn trees_from_the_reference_candidates_equal_the_reference_trees() -> Result<()> {
    let (_, _, cases, tensors) = golden()?;
    let budgets: Vec<usize> = serde_json::from_value(cases["tree_budgets"].clone())?;
    for case in cases["cases"].as_array().context("cases")? {
        for &budget in &budgets {
            for round in case["ddtree"][budget.to_string()]["rounds"]
                .as_array()
                .context("rounds")?
            {
                let log_probs: Vec<Vec<f32>> =
                    tensors[round["top_log_probs"].as_str().unwrap()].to_vec2()?;
                let token_ids: Vec<Vec<i64>> =
                    tensors[round["top_token_ids"].as_str().unwrap()].to_vec2()?;
                let candidates: Vec<DepthCandidates> = log_probs
                    .iter()
                    .zip(&token_ids)
                    .map(|(lp, ids)| DepthCandidates {
                        token_ids: ids.iter().map(|&t| t as TokenId).collect(),
                        log_probs: lp.clone(),
                    })
                    .collect();
                let root = round["verify_input_ids"][0].as_u64().unwrap() as TokenId;
                let tree = DraftTree::build(root, &candidates, budget);
                let label = format!(
                    "case {} budget {budget} round {}",
                    case["id"], round["round"]
                );
                let expected_tokens: Vec<TokenId> =
                    serde_json::from_value(round["node_token_ids"].clone())?;
                let expected_depths: Vec<usize> =
                    serde_json::from_value(round["node_depths"].clone())?;
                let expected_parents: Vec<i64> = serde_json::from_value(round["parents"].clone())?;
                assert_eq!(tree.tokens[1..], expected_tokens[..], "{label}: tokens");
                assert_eq!(tree.depths[1..], expected_depths[..], "{label}: depths");
                let parents: Vec<i64> = tree.parents[1..].iter().map(|&p| p as i64).collect();
                assert_eq!(parents[..], expected_parents[1..], "{label}: parents");
            }
        }
    }
    Ok(())
}

#[test]
fn candidates_from_draft_logits_match_the_reference_top_k() -> Result<()> {
    let (_, _, cases, tensors) = golden()?;
    for case in cases["cases"].as_array().context("cases")? {
        // DDTree's round 0 drafts from the same context and anchor as DFlash's round 0.
        let logits: Vec<Vec<f32>> = tensors[case["dflash"]["rounds"][0]["draft_logits"]
            .as_str()
            .unwrap()]
        .to_vec2()?;
        let round = &case["ddtree"]["64"]["rounds"][0];
        let reference_lp: Vec<Vec<f32>> =
            tensors[round["top_log_probs"].as_str().unwrap()].to_vec2()?;
        let reference_ids: Vec<Vec<i64>> =
            tensors[round["top_token_ids"].as_str().unwrap()].to_vec2()?;
        for (depth, row) in logits.iter().enumerate() {
            for shards in [1, 3] {
                let ours = top_k_candidates(row, 64, shards);
                let ids: Vec<i64> = ours.token_ids.iter().map(|&t| t.into()).collect();
                assert_eq!(
                    ids, reference_ids[depth],
                    "case {} depth {depth} shards {shards}",
                    case["id"]
                );
                for (a, b) in ours.log_probs.iter().zip(&reference_lp[depth]) {
                    assert!(
                        (a - b).abs() < 1e-4,
                        "case {} depth {depth}: {a} vs {b}",
                        case["id"]
                    );
                }
            }
        }
    }
    Ok(())
}

#[test]
fn greedy_ddtree_reproduces_the_reference_for_every_budget() -> Result<()> {
    let (target, drafter, cases, _) = golden()?;
    let budgets: Vec<usize> = serde_json::from_value(cases["tree_budgets"].clone())?;
    for case in cases["cases"].as_array().context("cases")? {
        let prompt: Vec<TokenId> = serde_json::from_value(case["prompt"].clone())?;
        for &budget in &budgets {
            let reference = &case["ddtree"][budget.to_string()];
            let expected_tokens: Vec<TokenId> =
                serde_json::from_value(reference["new_tokens"].clone())?;
            let expected_tau: Vec<usize> =
                serde_json::from_value(reference["acceptance_lengths"].clone())?;
            for page_size in [1, 16] {
                let output = ddtree(
                    &target,
                    &drafter,
                    budget,
                    budget,
                    page_size,
                    &greedy(&prompt, 64),
                )?;
                let label = format!("case {} budget {budget} page size {page_size}", case["id"]);
                assert_eq!(output.token_ids, expected_tokens, "{label}");
                assert_taus_match(&output.stats.accept_lengths, &expected_tau, &label);
            }
        }
    }
    Ok(())
}

#[test]
fn greedy_ddtree_equals_plain_greedy_for_every_budget_and_page_size() -> Result<()> {
    let (target, drafter, _, _) = golden()?;
    let mut rng = rand_chacha::ChaCha12Rng::seed_from_u64(7);
    for trial in 0..3 {
        let length = rng.random_range(1..40);
        let prompt: Vec<TokenId> = (0..length).map(|_| rng.random_range(0..1021)).collect();
        let max_new = rng.random_range(2..48);
        let request = greedy(&prompt, max_new);
        let plain = Generator::new(&target, None, GeneratorOptions::default())
            .generate(&request, |_| {})?;
        for budget in [1, 2, 4, 8, 16, 64] {
            for page_size in [1, 16] {
                let output = ddtree(&target, &drafter, budget, budget, page_size, &request)?;
                assert_eq!(
                    output.token_ids, plain.token_ids,
                    "trial {trial} budget {budget} page size {page_size}"
                );
                assert!(output.stats.tree_nodes <= budget * output.stats.rounds);
            }
        }
    }
    Ok(())
}

#[test]
fn a_chain_shaped_tree_is_exactly_the_dflash_path() -> Result<()> {
    let (target, drafter, cases, _) = golden()?;
    for case in cases["cases"].as_array().context("cases")? {
        let prompt: Vec<TokenId> = serde_json::from_value(case["prompt"].clone())?;
        let request = greedy(&prompt, 64);
        let chain = ddtree(&target, &drafter, 7, 1, 4, &request)?;
        let dflash = Generator::new(
            &target,
            None,
            GeneratorOptions {
                page_size: 4,
                ..Default::default()
            },
        )
        .with_dflash(DFlashSpec {
            drafter: &drafter,
            num_draft_tokens: 8,
        })?
        .generate(&request, |_| {})?;
        assert_eq!(chain.token_ids, dflash.token_ids);
        assert_eq!(chain.stats.accept_lengths, dflash.stats.accept_lengths);
        assert_eq!(
            chain.stats.accepted_per_position,
            dflash.stats.accepted_per_position
        );
        assert_eq!(chain.stats.tree_nodes, dflash.stats.tree_nodes);
    }
    Ok(())
}

/// The walk draws one sample per visited node, in path order, so with the same seed DDTree
/// emits exactly what plain sampling emits, for any budget.
#[test]
fn seeded_ddtree_sampling_emits_the_same_tokens_as_seeded_plain_sampling() -> Result<()> {
    let (target, drafter, _, _) = golden()?;
    let prompt: Vec<TokenId> = vec![970, 881, 849, 832, 613];
    for seed in 0..4 {
        let mut request = greedy(&prompt, 40);
        request.sampling = SamplingParams {
            temperature: 0.8,
            top_k: 50,
            top_p: 0.95,
            seed: Some(seed),
        };
        let plain = Generator::new(&target, None, GeneratorOptions::default())
            .generate(&request, |_| {})?;
        for budget in [3, 16] {
            let tree = ddtree(&target, &drafter, budget, budget, 4, &request)?;
            assert_eq!(
                tree.token_ids, plain.token_ids,
                "seed {seed} budget {budget}"
            );
        }
    }
    Ok(())
}
