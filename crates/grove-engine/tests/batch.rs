//! Batching is lossless: requests run together (one drafter pass and one verify forward per
//! step over all unfinished sequences, ragged trees, sequences finishing at different steps)
//! produce exactly what each produces alone, for plain decoding, DFlash and DDTree.

mod common;

use anyhow::Result;
use common::*;
use grove_core::{SamplingParams, StopCondition, TokenId};
use grove_engine::GenerateRequest;
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
