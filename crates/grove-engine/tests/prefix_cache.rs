//! Prefix caching changes no output: requests sharing system prompts, a follow-up turn whose
//! prompt contains an earlier answer, a pool small enough to evict and preempt, and random
//! streams against an engine without the cache. A hit also leaves the drafter's context as a
//! prefill would have: greedy speculation accepts exactly what it accepts alone. Afterwards
//! every page is free or cached, and clearing the cache frees them all.

mod common;

use std::collections::HashMap;

use anyhow::Result;
use common::*;
use grove_core::TokenId;
use grove_engine::{Engine, EngineEvent, EngineLimits, GenerateOutput, GenerateRequest, Generator};
use proptest::prelude::*;
use rand::{Rng, SeedableRng};

/// Prompts made of one of `systems` shared prefixes and a short suffix of their own; every
/// third request samples (seeded).
fn shared_prefix_requests(count: usize, systems: usize, seed: u64) -> Vec<GenerateRequest> {
    let mut rng = rand_chacha::ChaCha12Rng::seed_from_u64(seed);
    let random_tokens = |rng: &mut rand_chacha::ChaCha12Rng, n: usize| -> Vec<TokenId> {
        (0..n)
            .map(|_| rng.random_range(0..1021) as TokenId)
            .collect()
    };
    let prefixes: Vec<Vec<TokenId>> = (0..systems)
        .map(|_| {
            let length = rng.random_range(20..48);
            random_tokens(&mut rng, length)
        })
        .collect();
    (0..count)
        .map(|i| {
            let mut prompt = prefixes[rng.random_range(0..systems)].clone();
            let suffix = rng.random_range(0..8);
            prompt.extend(random_tokens(&mut rng, suffix));
            let mut request = greedy(&prompt, rng.random_range(6..24));
            if i % 3 == 2 {
                request.sampling = seeded_sampling(i as u64);
            }
            request
        })
        .collect()
}

/// Submits request `i` before step `arrivals[i]` and cancels request `i` before step
/// `cancels[i]` (if any); returns the finished outputs by request index.
fn drive(
    engine: &mut Engine,
    requests: &[GenerateRequest],
    arrivals: &[usize],
    cancels: &[Option<usize>],
) -> Result<HashMap<usize, GenerateOutput>> {
    let mut ids = HashMap::new();
    let mut outputs = HashMap::new();
    let last_arrival = arrivals.iter().copied().max().unwrap_or(0);
    let mut step = 0;
    while step <= last_arrival || !engine.is_idle() {
        for (index, _) in arrivals.iter().enumerate().filter(|(_, &a)| a == step) {
            ids.insert(engine.submit(requests[index].clone())?, index);
        }
        for (id, &index) in &ids {
            if cancels[index] == Some(step) {
                engine.cancel(*id);
            }
        }
        for event in engine.step()? {
            if let EngineEvent::Finished { id, output } = event {
                outputs.insert(ids[&id], *output);
            }
        }
        step += 1;
        assert!(step < 10_000, "the engine stopped making progress");
    }
    Ok(outputs)
}

/// An engine with the prefix cache (4 running, a pool of `max_total_tokens`) driven through
/// `requests`, none cancelled.
fn cached_run<'a>(
    generator: &Generator<'a>,
    max_total_tokens: usize,
    requests: &[GenerateRequest],
    arrivals: &[usize],
) -> Result<(Engine<'a>, HashMap<usize, GenerateOutput>)> {
    let mut engine = generator.engine(EngineLimits {
        max_total_tokens,
        max_running: 4,
        prefix_cache: true,
        prefill_step: None,
        ngram_corpus: None,
        external_corpus: None,
    })?;
    let outputs = drive(&mut engine, requests, arrivals, &vec![None; requests.len()])?;
    Ok((engine, outputs))
}

/// Every page is free or held by the cache alone once the engine is idle; clearing the cache
/// returns them all.
fn assert_pages_return(engine: &mut Engine, label: &str) {
    assert!(engine.is_idle(), "{label}");
    assert_eq!(
        engine.free_pages() + engine.cached_pages(),
        engine.total_pages(),
        "{label}: pages leaked"
    );
    engine.clear_prefix_cache();
    assert_eq!(engine.free_pages(), engine.total_pages(), "{label}");
}

#[test]
fn shared_prefixes_are_prefilled_once_and_change_no_output() -> Result<()> {
    let (target, drafter) = golden_pair()?;
    let requests = shared_prefix_requests(9, 2, 11);
    // Two waves: the second arrives once the first has been prefilled (and partly finished).
    let arrivals: Vec<usize> = (0..requests.len())
        .map(|i| if i < 3 { 0 } else { 4 + i })
        .collect();
    for page_size in [1, 4, 16] {
        for (name, generator) in &three_methods(&target, &drafter, page_size, 8)? {
            let label = format!("{name} page size {page_size}");
            let (mut engine, outputs) = cached_run(generator, 2048, &requests, &arrivals)?;
            let mut hits = 0;
            for (i, request) in requests.iter().enumerate() {
                let alone = generator.generate(request, |_| {})?;
                let output = &outputs[&i];
                assert_eq!(output.token_ids, alone.token_ids, "{label} request {i}");
                assert!(output.stats.cached_tokens < request.prompt.len(), "{label}");
                hits += output.stats.cached_tokens;
                if request.sampling.temperature == 0.0 {
                    // The drafter saw the same context: it drafted and got accepted the same.
                    assert_eq!(
                        output.stats.accept_lengths, alone.stats.accept_lengths,
                        "{label} request {i}"
                    );
                }
            }
            assert!(
                hits >= 2 * 20 / page_size * page_size,
                "{label}: {hits} cached tokens"
            );
            let stats = engine.prefix_stats().expect("the cache is on");
            assert_eq!(stats.hit_tokens as usize, hits, "{label}");
            assert_eq!(stats.lookups as usize, requests.len(), "{label}");
            assert_pages_return(&mut engine, &label);
        }
    }
    Ok(())
}

#[test]
fn a_follow_up_turn_reuses_the_answer_it_contains() -> Result<()> {
    let (target, drafter) = golden_pair()?;
    for page_size in [1, 4] {
        for (name, generator) in &three_methods(&target, &drafter, page_size, 8)? {
            let label = format!("{name} page size {page_size}");
            let mut engine = generator.engine(EngineLimits {
                max_total_tokens: 1024,
                max_running: 2,
                prefix_cache: true,
                prefill_step: None,
                ngram_corpus: None,
                external_corpus: None,
            })?;
            let first = greedy(&(1..30).collect::<Vec<TokenId>>(), 24);
            let answer = drive(&mut engine, std::slice::from_ref(&first), &[0], &[None])?
                .remove(&0)
                .unwrap();
            let mut prompt = first.prompt.clone();
            prompt.extend(&answer.token_ids);
            prompt.extend([7, 8, 9]);
            let turn = greedy(&prompt, 20);
            let output = drive(&mut engine, std::slice::from_ref(&turn), &[0], &[None])?
                .remove(&0)
                .unwrap();
            let alone = generator.generate(&turn, |_| {})?;
            assert_eq!(output.token_ids, alone.token_ids, "{label}");
            assert_eq!(
                output.stats.accept_lengths, alone.stats.accept_lengths,
                "{label}"
            );
            // The prompt and all but the last answer token were cached, in whole pages; a
            // drafting request matches only as far as the drafter's context, which lacks the
            // last round's tokens (they reach it at the next draft, which never came).
            let committed = first.prompt.len() + answer.token_ids.len() - 1;
            let whole = |tokens: usize| tokens / page_size * page_size;
            let cached = output.stats.cached_tokens;
            if *name == "none" {
                assert_eq!(cached, whole(committed), "{label}");
            } else {
                // One round commits its root and at most the 8 drafts of a block.
                assert!(cached >= whole(committed - 9), "{label}: {cached}");
                assert!(cached <= whole(committed), "{label}: {cached}");
            }
            assert_pages_return(&mut engine, &label);
        }
    }
    Ok(())
}

#[test]
fn a_small_pool_evicts_cached_prefixes_before_preempting_and_changes_no_output() -> Result<()> {
    let (target, drafter) = golden_pair()?;
    let requests = shared_prefix_requests(12, 4, 23);
    let arrivals: Vec<usize> = (0..requests.len()).map(|i| 2 * i).collect();
    for page_size in [1, 4] {
        for (name, generator) in &three_methods(&target, &drafter, page_size, 8)? {
            let label = format!("{name} page size {page_size}");
            let (mut engine, outputs) = cached_run(generator, 192, &requests, &arrivals)?;
            for (i, request) in requests.iter().enumerate() {
                let alone = generator.generate(request, |_| {})?;
                assert_eq!(
                    outputs[&i].token_ids, alone.token_ids,
                    "{label} request {i}"
                );
            }
            let stats = engine.prefix_stats().expect("the cache is on");
            assert!(stats.evicted_pages > 0, "{label}: nothing was evicted");
            assert!(stats.hit_tokens > 0, "{label}: nothing was shared");
            assert_pages_return(&mut engine, &label);
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 6, ..ProptestConfig::default() })]

    /// Random streams (arrivals, cancellations, pool sizes, page sizes, methods) give the same
    /// outputs with the cache as without it.
    #[test]
    fn random_streams_match_an_engine_without_the_cache(
        seed in 0u64..1000,
        page_size in prop_oneof![Just(1usize), Just(2), Just(8)],
        method in 0usize..3,
        pool in 120usize..600,
        gaps in proptest::collection::vec(0usize..4, 8),
        cancel_at in proptest::collection::vec(proptest::option::weighted(0.2, 0usize..12), 8),
    ) {
        let (target, drafter) = golden_pair().unwrap();
        let requests = shared_prefix_requests(8, 3, seed);
        let arrivals: Vec<usize> = gaps.iter().scan(0, |at, gap| { *at += gap; Some(*at) }).collect();
        let cancels: Vec<Option<usize>> = cancel_at
            .iter()
            .zip(&arrivals)
            .map(|(cancel, arrival)| cancel.map(|c| arrival + c))
            .collect();
        let methods = three_methods(&target, &drafter, page_size, 6).unwrap();
        let (name, generator) = &methods[method];
        let mut outputs = Vec::new();
        for prefix_cache in [false, true] {
            let mut engine = generator
                .engine(EngineLimits { max_total_tokens: pool, max_running: 3, prefix_cache, prefill_step: None, ngram_corpus: None, external_corpus: None })
                .unwrap();
            outputs.push(drive(&mut engine, &requests, &arrivals, &cancels).unwrap());
            assert_pages_return(&mut engine, name);
        }
        // A cancellation may land before or after a request's end depending on the schedule.
        let (uncached, cached) = (&outputs[0], &outputs[1]);
        for (index, cancel) in cancels.iter().enumerate() {
            match (uncached.get(&index), cached.get(&index)) {
                (Some(a), Some(b)) => prop_assert_eq!(&a.token_ids, &b.token_ids, "{} request {}", name, index),
                _ => prop_assert!(cancel.is_some(), "{} request {} did not finish", name, index),
            }
        }
    }
}
