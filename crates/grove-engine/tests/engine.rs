//! The engine's scheduling keeps every output exact: requests joining between steps, a KV pool
//! too small for all of them (the newest running sequence is preempted, requeued and prefilled
//! again), and cancellations, for plain decoding, DFlash and DDTree. Afterwards every page is
//! back in the pool.

mod common;

use std::collections::HashMap;
use std::time::Duration;

use anyhow::Result;
use common::*;
use grove_core::TokenId;
use grove_engine::{
    DDTreeSpec, Engine, EngineEvent, EngineLimits, GenerateOutput, GenerateRequest, Generator,
    GeneratorOptions,
};
use rand::{Rng, SeedableRng};

fn requests(count: usize, seed: u64) -> Vec<GenerateRequest> {
    let mut rng = rand_chacha::ChaCha12Rng::seed_from_u64(seed);
    (0..count)
        .map(|i| {
            let length = rng.random_range(1..24);
            let mut request = greedy(
                &(0..length)
                    .map(|_| rng.random_range(0..1021) as TokenId)
                    .collect::<Vec<_>>(),
                rng.random_range(8..40),
            );
            if i % 3 == 2 {
                request.sampling = seeded_sampling(i as u64);
            }
            request
        })
        .collect()
}

/// Runs `requests` through `engine`, submitting request `i` before step `arrivals[i]`; returns
/// the outputs by request index and the text streamed for each.
fn drive(
    engine: &mut Engine,
    requests: &[GenerateRequest],
    arrivals: &[usize],
) -> Result<Vec<(GenerateOutput, String)>> {
    let mut ids = HashMap::new();
    let mut started = std::collections::HashSet::new();
    let mut streamed: HashMap<u64, Vec<u32>> = HashMap::new();
    let mut texts: HashMap<usize, String> = HashMap::new();
    let mut outputs: HashMap<usize, GenerateOutput> = HashMap::new();
    let mut step = 0;
    while outputs.len() < requests.len() {
        for (index, request) in requests
            .iter()
            .enumerate()
            .filter(|(i, _)| arrivals[*i] == step)
        {
            ids.insert(engine.submit(request.clone())?, index);
        }
        for event in engine.step()? {
            match event {
                // Once per request, preempted or not, and before any of its text.
                EngineEvent::Started { id } => {
                    assert!(started.insert(id), "request {id} started twice");
                }
                EngineEvent::Text { id, text } => {
                    assert!(started.contains(&id), "text before start");
                    texts.entry(ids[&id]).or_default().push_str(&text)
                }
                EngineEvent::Tokens { id, tokens, .. } => {
                    streamed.entry(id).or_default().extend(tokens);
                }
                EngineEvent::Finished { id, output } => {
                    // Every token was reported, once and in order, before the end.
                    assert_eq!(streamed.get(&id), Some(&output.token_ids), "request {id}");
                    outputs.insert(ids[&id], *output);
                }
            }
        }
        step += 1;
        assert!(step < 10_000, "the engine stopped making progress");
    }
    Ok((0..requests.len())
        .map(|i| {
            (
                outputs.remove(&i).unwrap(),
                texts.remove(&i).unwrap_or_default(),
            )
        })
        .collect())
}

#[test]
fn late_arrivals_and_a_small_pool_with_preemption_change_no_output() -> Result<()> {
    let (target, drafter) = golden_pair()?;
    let requests = requests(10, 5);
    let arrivals: Vec<usize> = (0..requests.len()).map(|i| (i * 3) % 7).collect();
    for page_size in [1, 4] {
        let generators = three_methods(&target, &drafter, page_size, 8)?;
        for (name, generator) in &generators {
            let solo: Vec<GenerateOutput> = requests
                .iter()
                .map(|r| generator.generate(r, |_| {}))
                .collect::<Result<_, _>>()?;
            // Room for about two sequences at a time while eight may run: preemption is certain.
            // Interleaved prefill (16-token chunks beside running sequences) too: a sequence may
            // be preempted halfway through its prompt.
            for (prefix_cache, prefill_step) in
                [(false, None), (true, None), (true, Some(Duration::ZERO))]
            {
                let mut engine = generator.engine(EngineLimits {
                    max_total_tokens: 140,
                    max_running: 8,
                    prefix_cache,
                    prefill_step,
                    ngram_corpus: None,
                    external_corpus: None,
                })?;
                let outputs = drive(&mut engine, &requests, &arrivals)?;
                let label = format!(
                    "{name} page size {page_size} prefix cache {prefix_cache} \
                     prefill step {prefill_step:?}"
                );
                assert!(
                    engine.preemptions() > 0,
                    "{label}: the pool never ran short"
                );
                for (i, ((output, _), alone)) in outputs.iter().zip(&solo).enumerate() {
                    assert_eq!(output.token_ids, alone.token_ids, "{label} request {i}");
                    assert_eq!(
                        output.finish_reason, alone.finish_reason,
                        "{label} request {i}"
                    );
                }
                assert!(engine.is_idle());
                // A preempted sequence's pages wait in the prefix cache; nothing else holds any.
                assert_eq!(
                    engine.free_pages() + engine.cached_pages(),
                    engine.total_pages(),
                    "{label}: pages leaked"
                );
                engine.clear_prefix_cache();
                assert_eq!(engine.free_pages(), engine.total_pages(), "{label}");
            }
        }
    }
    Ok(())
}

/// A long prompt arriving while another request decodes is prefilled a chunk per step between
/// its rounds: the running request gets tokens every step (no stall for the whole prompt), and
/// both outputs equal their solo runs.
#[test]
fn a_long_prompt_prefills_between_the_rounds_of_a_running_request() -> Result<()> {
    let (target, drafter) = golden_pair()?;
    let mut rng = rand_chacha::ChaCha12Rng::seed_from_u64(3);
    let long: Vec<TokenId> = (0..300).map(|_| rng.random_range(0..1021)).collect();
    let requests = [greedy(&[5, 9, 2], 200), greedy(&long, 8)];
    // Time-sized chunks (16 tokens at a zero step time), whole chunks, and a configured chunk
    // shorter than the 16-token tile.
    for (chunk, prefill_step, most_steps) in [
        (64, Some(Duration::ZERO), 300 / 16),
        (64, None, 300 / 64),
        (8, Some(Duration::ZERO), 300 / 8),
    ] {
        let options = GeneratorOptions {
            prefill_chunk: chunk,
            ..Default::default()
        };
        let generator = Generator::new(&target, None, options).with_ddtree(DDTreeSpec {
            drafter: &drafter,
            budget: 6,
            top_k: 6,
        })?;
        let mut engine = generator.engine(EngineLimits {
            max_total_tokens: 1200,
            max_running: 2,
            prefix_cache: false,
            prefill_step,
            ngram_corpus: None,
            external_corpus: None,
        })?;
        let short = engine.submit(requests[0].clone())?;
        engine.step()?;
        let long_id = engine.submit(requests[1].clone())?;
        let (mut prefill_steps, mut stalled, mut outputs) = (0, 0, HashMap::new());
        let mut long_prefilled = false;
        while !engine.is_idle() {
            let short_running = !outputs.contains_key(&short);
            let events = engine.step()?;
            let tokens_for = |wanted: u64| {
                events
                    .iter()
                    .any(|e| matches!(e, EngineEvent::Tokens { id, .. } if *id == wanted))
            };
            if !long_prefilled {
                prefill_steps += 1;
                long_prefilled = tokens_for(long_id);
                stalled += usize::from(short_running && !tokens_for(short));
            }
            for event in events {
                if let EngineEvent::Finished { id, output } = event {
                    outputs.insert(id, output);
                }
            }
        }
        let label = format!("chunk {chunk}, prefill step {prefill_step:?}");
        assert!(
            prefill_steps >= most_steps,
            "{label}: the 300-token prompt took {prefill_steps} steps"
        );
        assert_eq!(
            stalled, 0,
            "{label}: a step gave the running request nothing"
        );
        for (id, request) in [short, long_id].into_iter().zip(&requests) {
            let alone = generator.generate(request, |_| {})?;
            assert_eq!(
                outputs[&id].token_ids, alone.token_ids,
                "{label} request {id}"
            );
        }
        assert_eq!(engine.free_pages(), engine.total_pages(), "{label}");
    }
    Ok(())
}

#[test]
fn cancelling_returns_pages_and_the_others_finish_exactly() -> Result<()> {
    let (target, drafter) = golden_pair()?;
    let generator =
        Generator::new(&target, None, GeneratorOptions::default()).with_ddtree(DDTreeSpec {
            drafter: &drafter,
            budget: 6,
            top_k: 6,
        })?;
    let requests = requests(4, 9);
    let mut engine = generator.engine(EngineLimits {
        max_total_tokens: 1000,
        max_running: 4,
        prefix_cache: true,
        prefill_step: None,
        ngram_corpus: None,
        external_corpus: None,
    })?;
    let ids: Vec<u64> = requests
        .iter()
        .map(|r| engine.submit(r.clone()))
        .collect::<Result<_, _>>()?;
    engine.step()?;
    engine.step()?;
    assert!(engine.cancel(ids[1]));
    assert!(!engine.cancel(ids[1]));
    let mut finished = HashMap::new();
    while !engine.is_idle() {
        for event in engine.step()? {
            if let EngineEvent::Finished { id, output } = event {
                finished.insert(id, output);
            }
        }
    }
    assert!(!finished.contains_key(&ids[1]));
    for index in [0, 2, 3] {
        let alone = generator.generate(&requests[index], |_| {})?;
        assert_eq!(
            finished[&ids[index]].token_ids, alone.token_ids,
            "request {index}"
        );
    }
    assert_eq!(
        engine.free_pages() + engine.cached_pages(),
        engine.total_pages()
    );
    engine.clear_prefix_cache();
    assert_eq!(engine.free_pages(), engine.total_pages());
    Ok(())
}

#[test]
fn a_request_larger_than_the_pool_is_refused_naming_the_limit() -> Result<()> {
    let (target, _) = golden_pair()?;
    let generator = Generator::new(&target, None, GeneratorOptions::default());
    let mut engine = generator.engine(EngineLimits {
        max_total_tokens: 64,
        max_running: 2,
        prefix_cache: true,
        prefill_step: None,
        ngram_corpus: None,
        external_corpus: None,
    })?;
    let error = engine
        .submit(greedy(&[1, 2, 3], 100))
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("max_new_tokens") && error.contains("--max-total-tokens"),
        "{error}"
    );
    assert!(engine.is_idle());
    Ok(())
}
