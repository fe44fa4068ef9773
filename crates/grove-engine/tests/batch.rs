//! Batching is lossless: requests run together (one drafter pass and one verify forward per
//! step over all unfinished sequences, ragged trees, sequences finishing at different steps)
//! produce exactly what each produces alone, for plain decoding, DFlash and DDTree.

mod common;

use anyhow::Result;
use common::*;
use grove_core::{SamplingParams, StopCondition, TokenId};
use grove_engine::{Budget, GenerateRequest, SpecAlgorithm, SpeculationOverride};
use rand::{Rng, SeedableRng};

#[test]
fn batched_requests_produce_exactly_their_solo_outputs() -> Result<()> {
    let (target, drafter) = golden_pair()?;
    let mut rng = rand_chacha::ChaCha12Rng::seed_from_u64(11);
    let requests: Vec<GenerateRequest> = (0..16)
        .map(|i| {
            let length = rng.random_range(1..30);
            let sampling = if i % 5 == 4 {
                SamplingParams {
                    temperature: 0.9,
                    top_k: 0,
                    top_p: 1.0,
                    seed: Some(i),
                }
            } else {
                SamplingParams::greedy()
            };
            GenerateRequest {
                prompt: (0..length)
                    .map(|_| rng.random_range(0..1021) as TokenId)
                    .collect(),
                sampling,
                stop: StopCondition {
                    max_new_tokens: rng.random_range(1..40),
                    ..Default::default()
                },
                speculation: Default::default(),
                logprobs: None,
                prompt_logprobs: false,
                adjustments: Default::default(),
                grammar: None,
            }
        })
        .collect();
    for page_size in [1, 4] {
        let generators = three_methods(&target, &drafter, page_size, 12)?;
        for (name, generator) in &generators {
            let together = generator.generate_batch(&requests)?;
            for (i, (request, batched)) in requests.iter().zip(&together).enumerate() {
                let alone = generator.generate(request, |_| {})?;
                let label = format!("{name} page size {page_size} request {i}");
                assert_eq!(batched.token_ids, alone.token_ids, "{label}");
                assert_eq!(
                    batched.stats.accept_lengths, alone.stats.accept_lengths,
                    "{label}"
                );
                assert_eq!(batched.finish_reason, alone.finish_reason, "{label}");
            }
        }
    }
    Ok(())
}

/// Requests choosing their own speculation (none, DFlash chains and DDTree trees of different
/// budgets, all under the engine's ceiling) share one batched step and still produce exactly
/// their solo outputs, and greedy ones exactly plain greedy decoding.
#[test]
fn per_request_speculation_in_one_batch_is_lossless() -> Result<()> {
    let (target, drafter) = golden_pair()?;
    let [(_, plain), _, (_, generator)] = three_methods(&target, &drafter, 1, 12)?;
    let choices = [
        SpeculationOverride::default(),
        SpeculationOverride {
            algorithm: Some(SpecAlgorithm::None),
            budget: None,
        },
        SpeculationOverride {
            algorithm: Some(SpecAlgorithm::DFlash),
            budget: Some(Budget::Fixed(3)),
        },
        SpeculationOverride {
            algorithm: Some(SpecAlgorithm::DFlash),
            budget: None,
        },
        SpeculationOverride {
            algorithm: Some(SpecAlgorithm::DDTree),
            budget: Some(Budget::Fixed(4)),
        },
        SpeculationOverride {
            algorithm: None,
            budget: Some(Budget::Fixed(1)),
        },
        // Chosen each round from measured costs: the rounds differ, the tokens may not.
        SpeculationOverride {
            algorithm: Some(SpecAlgorithm::DDTree),
            budget: Some(Budget::Auto),
        },
        SpeculationOverride {
            algorithm: Some(SpecAlgorithm::DFlash),
            budget: Some(Budget::Auto),
        },
    ];
    let mut rng = rand_chacha::ChaCha12Rng::seed_from_u64(5);
    let requests: Vec<GenerateRequest> = (0..12)
        .map(|i| {
            let length = rng.random_range(1..20);
            let prompt: Vec<TokenId> = (0..length)
                .map(|_| rng.random_range(0..1021) as TokenId)
                .collect();
            GenerateRequest {
                speculation: choices[i % choices.len()],
                ..greedy(&prompt, rng.random_range(2..30))
            }
        })
        .collect();
    let together = generator.generate_batch(&requests)?;
    for (i, (request, batched)) in requests.iter().zip(&together).enumerate() {
        let alone = generator.generate(request, |_| {})?;
        let unspeculated = GenerateRequest {
            speculation: SpeculationOverride::default(),
            logprobs: None,
            prompt_logprobs: false,
            adjustments: Default::default(),
            grammar: None,
            ..request.clone()
        };
        let reference = plain.generate(&unspeculated, |_| {})?;
        let label = format!("request {i} {:?}", request.speculation);
        assert_eq!(batched.token_ids, alone.token_ids, "{label}");
        assert_eq!(batched.token_ids, reference.token_ids, "{label}");
        let auto = request.speculation.budget == Some(Budget::Auto);
        assert_eq!(batched.stats.auto_budget, auto, "{label}");
        if !auto {
            assert_eq!(
                batched.stats.accept_lengths, alone.stats.accept_lengths,
                "{label}"
            );
        }
        let budget = |ceiling| match request.speculation.budget {
            Some(Budget::Fixed(b)) => b,
            _ => ceiling,
        };
        let expected = match request.speculation.algorithm {
            Some(SpecAlgorithm::None) => (SpecAlgorithm::None, 0),
            Some(SpecAlgorithm::DFlash) => (SpecAlgorithm::DFlash, budget(7)),
            _ => (SpecAlgorithm::DDTree, budget(12)),
        };
        assert_eq!(
            (batched.stats.algorithm, batched.stats.budget),
            expected,
            "{label}"
        );
    }
    // Over the ceiling, or speculating on an engine without a drafter: refused, naming the field.
    let over = GenerateRequest {
        speculation: SpeculationOverride {
            algorithm: None,
            budget: Some(Budget::Fixed(13)),
        },
        ..greedy(&[1, 2], 4)
    };
    let message = generator.generate(&over, |_| {}).unwrap_err().to_string();
    assert!(
        message.contains("speculative.budget") && message.contains("13"),
        "{message}"
    );
    let tree = GenerateRequest {
        speculation: choices[4],
        ..greedy(&[1, 2], 4)
    };
    let message = plain.generate(&tree, |_| {}).unwrap_err().to_string();
    assert!(message.contains("speculative.algorithm"), "{message}");
    Ok(())
}
