//! The automatic budget (`Budget::Auto`) chooses per round how much to draft and verify from
//! measured costs and the drafter's calibrated predictions. Whatever it chooses, greedy output
//! equals plain greedy decoding and seeded sampling draws exactly plain seeded sampling's tokens:
//! checked over random cost tables and three drafters (the golden DFlash drafter, an oracle that
//! is always right, an adversary that is never right), for DDTree trees and DFlash chains.

mod common;

use anyhow::Result;
use common::*;
use grove_core::{SamplingParams, TokenId};
use grove_engine::{Drafter, GenerateRequest, Generator, GeneratorOptions, SpecAlgorithm};
use grove_model::Model;
use rand::{Rng, SeedableRng};

/// A random verify curve (1 ms for one row, a random cost per further row, from free to 1.5x
/// a row) and a random draft cost (free to 3 rows).
fn random_costs(rng: &mut impl Rng) -> Costs {
    let per_row = rng.random_range(0.0..1.5e-3);
    let verify = [1, 2, 4, 8, 13]
        .iter()
        .map(|&rows| (rows, 1e-3 + per_row * (rows - 1) as f64))
        .collect();
    (verify, vec![(1, rng.random_range(0.0..3e-3))])
}

fn sampled(request: &GenerateRequest, seed: u64) -> GenerateRequest {
    GenerateRequest {
        sampling: SamplingParams {
            temperature: 0.7,
            top_k: 0,
            top_p: 1.0,
            seed: Some(seed),
        },
        ..request.clone()
    }
}

#[test]
fn any_chosen_budget_gives_plain_decodings_tokens() -> Result<()> {
    let (target, golden) = golden_pair()?;
    let plain = Generator::new(&target, None, GeneratorOptions::default());
    let vocab_size = target.config().vocab_size;
    let mut rng = rand_chacha::ChaCha12Rng::seed_from_u64(24);
    for trial in 0..4 {
        let prompt: Vec<TokenId> = (0..rng.random_range(1..30))
            .map(|_| rng.random_range(0..1021))
            .collect();
        let request = greedy(&prompt, rng.random_range(8..48));
        let reference = plain.generate(&request, |_| {})?;
        let sampled_reference = plain.generate(&sampled(&request, trial), |_| {})?;
        let mut sequence = prompt.clone();
        sequence.extend(&reference.token_ids);
        let scripted = |adversarial| ScriptedDrafter {
            sequence: sequence.clone(),
            vocab_size,
            block_size: 8,
            adversarial,
        };
        let (oracle, adversary) = (scripted(false), scripted(true));
        let drafters: [(&str, &dyn Drafter); 3] = [
            ("golden", &golden),
            ("oracle", &oracle),
            ("adversary", &adversary),
        ];
        for (name, drafter) in drafters {
            for algorithm in [SpecAlgorithm::DDTree, SpecAlgorithm::DFlash] {
                let costs = random_costs(&mut rng);
                let label = format!("trial {trial} {name} {algorithm:?} costs {costs:?}");
                let generator = auto(&target, drafter, algorithm, &costs)?;
                let output = generator.generate(&request, |_| {})?;
                assert_eq!(output.token_ids, reference.token_ids, "{label}");
                // The seeded sampler is asked once per emitted token, as plain decoding asks.
                let output = generator.generate(&sampled(&request, trial), |_| {})?;
                assert_eq!(output.token_ids, sampled_reference.token_ids, "{label}");
            }
        }
    }
    Ok(())
}

/// On the golden pair's tiny target a verified row costs about a decode step (measured), so
/// no drafter pays: a never-right one is dropped after a look or two.
#[test]
fn a_drafter_that_is_never_right_is_skipped() -> Result<()> {
    let (target, _) = golden_pair()?;
    let prompt: Vec<TokenId> = (0..20).map(|i| (i * 37 % 1021) as TokenId).collect();
    let [_, (adversary, reference)] = scripted_pair(&target, &prompt, 48)?;
    let output = run_auto(&target, &adversary, &prompt, 48, &(vec![], vec![]))?;
    assert_eq!(output.token_ids, reference);
    let stats = &output.stats;
    assert!(stats.auto_budget);
    assert!(
        stats.rounds_without_drafts * 4 >= stats.rounds * 3,
        "{} of {} rounds drafted nothing",
        stats.rounds_without_drafts,
        stats.rounds
    );
    Ok(())
}
