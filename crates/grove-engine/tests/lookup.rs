//! Lookup drafts (`ngram`, no drafter) are lossless: greedy output equals plain greedy decoding
//! token for token, seeded sampling draws the same tokens (the walk samples the target once per
//! visited node, in path order), alone and batched, with fixed and automatic budgets, on an
//! engine started for lookup, on a plain engine and on a DDTree engine when a request asks.

mod common;

use std::sync::Arc;

use anyhow::Result;
use common::*;
use grove_core::{SamplingParams, TokenId};
use grove_engine::{
    Budget, Engine, EngineEvent, EngineLimits, GenerateOutput, GenerateRequest, Generator,
    GeneratorOptions, LookupConfig, NgramCorpus, SpecAlgorithm, SpeculationOverride,
    SpeculationSettings,
};
use grove_model::Decoder;
use rand::{Rng, SeedableRng};

/// Prompts that repeat themselves (a random stretch written two or three times, with other
/// tokens between): lookup drafts from them, and the random target rarely follows. Its greedy
/// outputs come back to stretches it favours, and there drafts are accepted.
fn repetitive_prompts(count: usize, seed: u64) -> Vec<Vec<TokenId>> {
    let mut rng = rand_chacha::ChaCha12Rng::seed_from_u64(seed);
    (0..count)
        .map(|_| {
            let stretch: Vec<TokenId> = (0..rng.random_range(3..12))
                .map(|_| rng.random_range(0..1021))
                .collect();
            let mut prompt = Vec::new();
            for _ in 0..rng.random_range(2..4) {
                prompt.extend((0..rng.random_range(0..4)).map(|_| rng.random_range(0..1021)));
                prompt.extend(&stretch);
            }
            prompt
        })
        .collect()
}

fn requests(prompts: &[Vec<TokenId>], speculation: SpeculationOverride) -> Vec<GenerateRequest> {
    prompts
        .iter()
        .enumerate()
        .map(|(i, prompt)| {
            let mut request = greedy(prompt, 24 + 8 * (i % 7));
            if i % 3 == 2 {
                request.sampling = seeded_sampling(i as u64);
            }
            if i % 4 == 3 {
                request.sampling = SamplingParams {
                    temperature: 0.7,
                    top_k: 20,
                    top_p: 0.9,
                    seed: Some(100 + i as u64),
                };
            }
            request.speculation = speculation;
            request
        })
        .collect()
}

fn lookup_engine(target: &Decoder, budget: Budget, lookup: LookupConfig) -> Result<Generator<'_>> {
    let settings = SpeculationSettings {
        algorithm: SpecAlgorithm::Ngram,
        budget: Some(budget),
        lookup,
        ..Default::default()
    };
    Ok(Generator::new(target, None, GeneratorOptions::default())
        .with_speculation(settings, None)?)
}

/// Each output equals plain decoding's, token for token; returns the accepted drafts.
fn assert_plain(
    outputs: &[GenerateOutput],
    references: &[GenerateOutput],
    algorithm: SpecAlgorithm,
    label: &str,
) -> usize {
    let mut accepted = 0;
    for (i, (output, reference)) in outputs.iter().zip(references).enumerate() {
        assert_eq!(output.token_ids, reference.token_ids, "{label} request {i}");
        assert_eq!(output.stats.algorithm, algorithm, "{label} request {i}");
        accepted += output.stats.accept_lengths.iter().sum::<usize>() - output.stats.rounds;
    }
    accepted
}

#[test]
fn lookup_drafts_emit_exactly_plain_decoding_alone_and_batched() -> Result<()> {
    let (target, _) = golden_pair()?;
    let plain = Generator::new(&target, None, GeneratorOptions::default());
    let prompts = repetitive_prompts(14, 3);
    let requests = requests(&prompts, SpeculationOverride::default());
    let references: Vec<GenerateOutput> = requests
        .iter()
        .map(|r| plain.generate(r, |_| {}))
        .collect::<Result<_, _>>()?;
    let configs = [
        (Budget::Fixed(1), LookupConfig::DEFAULT),
        (Budget::Fixed(4), LookupConfig::DEFAULT),
        (
            Budget::Fixed(16),
            LookupConfig {
                min_match: 1,
                max_match: 6,
            },
        ),
        (Budget::Auto, LookupConfig::DEFAULT),
    ];
    for (budget, lookup) in configs {
        let generator = lookup_engine(&target, budget, lookup)?;
        let label = format!("{budget:?} {lookup:?}");
        let together = generator.generate_batch(&requests)?;
        let accepted = assert_plain(&together, &references, SpecAlgorithm::Ngram, &label);
        // The prompts repeat themselves: drafts were made, and some accepted.
        assert!(accepted > 0, "{label}: no lookup draft was accepted");
        let alone: Vec<GenerateOutput> = requests
            .iter()
            .map(|r| generator.generate(r, |_| {}))
            .collect::<Result<_, _>>()?;
        assert_plain(&alone, &references, SpecAlgorithm::Ngram, &label);
        if let Budget::Fixed(nodes) = budget {
            for output in &together {
                assert_eq!(output.stats.budget, nodes, "{label}");
                assert!(output.stats.accept_lengths.iter().all(|&a| a <= nodes + 1));
            }
        }
    }
    Ok(())
}

/// A request may ask for lookup on an engine started without speculation (no drafter is
/// needed) and on a DDTree engine, batched with requests that draft otherwise.
#[test]
fn a_request_may_ask_for_lookup_on_any_engine() -> Result<()> {
    let (target, drafter) = golden_pair()?;
    let [(_, plain), _, (_, ddtree)] = three_methods(&target, &drafter, 1, 12)?;
    let prompts = repetitive_prompts(9, 8);
    let ngram = |budget| SpeculationOverride {
        algorithm: Some(SpecAlgorithm::Ngram),
        budget,
    };
    let mut requests = requests(&prompts, ngram(None));
    let references: Vec<GenerateOutput> = requests
        .iter()
        .map(|r| {
            let plain_request = GenerateRequest {
                speculation: SpeculationOverride::default(),
                ..r.clone()
            };
            plain.generate(&plain_request, |_| {})
        })
        .collect::<Result<_, _>>()?;
    requests[1].speculation = ngram(Some(Budget::Fixed(3)));
    let on_plain = plain.generate_batch(&requests)?;
    let accepted = assert_plain(&on_plain, &references, SpecAlgorithm::Ngram, "plain engine");
    assert!(accepted > 0, "no lookup draft was accepted");
    assert_eq!(
        on_plain[0].stats.budget, 16,
        "a plain engine's lookup ceiling"
    );
    assert!(on_plain[0].stats.auto_budget);
    assert_eq!(on_plain[1].stats.budget, 3);
    // Beside DDTree trees and plain rounds in the same steps.
    requests[4].speculation = SpeculationOverride::default();
    requests[5].speculation = SpeculationOverride {
        algorithm: Some(SpecAlgorithm::None),
        budget: None,
    };
    let mixed = ddtree.generate_batch(&requests)?;
    for (i, (output, reference)) in mixed.iter().zip(&references).enumerate() {
        assert_eq!(output.token_ids, reference.token_ids, "mixed request {i}");
    }
    assert_eq!(mixed[0].stats.algorithm, SpecAlgorithm::Ngram);
    assert_eq!(mixed[4].stats.algorithm, SpecAlgorithm::DDTree);
    // Trees need the drafter a lookup engine does not have: refused, naming the field.
    let lookup = lookup_engine(&target, Budget::Auto, LookupConfig::DEFAULT)?;
    let tree = GenerateRequest {
        speculation: SpeculationOverride {
            algorithm: Some(SpecAlgorithm::DDTree),
            budget: None,
        },
        ..greedy(&[1, 2], 4)
    };
    let message = lookup.generate(&tree, |_| {}).unwrap_err().to_string();
    assert!(
        message.contains("speculative.algorithm") && message.contains("ngram"),
        "{message}"
    );
    Ok(())
}

#[test]
fn bad_lookup_settings_are_refused_by_name() {
    let (target, _) = golden_pair().expect("golden pair");
    let cases = [
        (Budget::Fixed(0), 2, 4, "speculative_ddtree_budget"),
        (Budget::Auto, 0, 4, "speculative_ngram_min_match"),
        (Budget::Auto, 3, 2, "speculative_ngram_max_match"),
    ];
    for (budget, min_match, max_match, field) in cases {
        let lookup = LookupConfig {
            min_match,
            max_match,
        };
        let error = lookup_engine(&target, budget, lookup)
            .err()
            .expect("refused")
            .to_string();
        assert!(error.contains(field), "{error}");
    }
    let one_token = SpeculationSettings {
        algorithm: SpecAlgorithm::Ngram,
        num_draft_tokens: Some(1),
        ..Default::default()
    };
    let error = Generator::new(&target, None, GeneratorOptions::default())
        .with_speculation(one_token, None)
        .err()
        .expect("refused")
        .to_string();
    assert!(error.contains("speculative_num_draft_tokens"), "{error}");
}

/// With `lookup_in_trees`, an automatic DDTree budget verifies lookup drafts beside the
/// drafter's: the output is still plain decoding's, greedy and seeded, alone and batched; with
/// a drafter that is always wrong, the lookup drafts alone are accepted.
#[test]
fn lookup_drafts_in_ddtree_trees_are_lossless_and_accepted_beside_a_wrong_drafter() -> Result<()> {
    let (target, drafter) = golden_pair()?;
    let plain = Generator::new(&target, None, GeneratorOptions::default());
    let prompts = repetitive_prompts(10, 21);
    let requests = requests(&prompts, SpeculationOverride::default());
    let references: Vec<GenerateOutput> = requests
        .iter()
        .map(|r| plain.generate(r, |_| {}))
        .collect::<Result<_, _>>()?;
    let settings = |lookup_in_trees| SpeculationSettings {
        algorithm: SpecAlgorithm::DDTree,
        budget: Some(Budget::Auto),
        max_budget: Some(8),
        lookup_in_trees,
        ..Default::default()
    };
    let merged = Generator::new(&target, None, GeneratorOptions::default())
        .with_speculation(settings(true), Some(&drafter))?;
    let together = merged.generate_batch(&requests)?;
    assert_plain(&together, &references, SpecAlgorithm::DDTree, "merged");
    for (request, reference) in requests.iter().zip(&references).take(4) {
        let alone = merged.generate(request, |_| {})?;
        assert_eq!(alone.token_ids, reference.token_ids);
    }
    // A drafter that never proposes the target's choice: what is accepted came from lookup.
    let prompt = &prompts[0];
    let [_, (adversary, reference)] = scripted_pair(&target, prompt, 80)?;
    let mut accepted = [0; 2];
    for (lookup_in_trees, accepted) in [false, true].into_iter().zip(&mut accepted) {
        let generator = Generator::new(&target, None, GeneratorOptions::default())
            .with_speculation(settings(lookup_in_trees), Some(&adversary))?;
        let output = generator.generate(&greedy(prompt, 80), |_| {})?;
        assert_eq!(
            output.token_ids, reference,
            "lookup in trees {lookup_in_trees}"
        );
        *accepted = output.stats.accept_lengths.iter().sum::<usize>() - output.stats.rounds;
    }
    assert_eq!(accepted[0], 0, "the adversary had a draft accepted");
    assert!(
        accepted[1] > 0,
        "no lookup draft was accepted in a DDTree tree"
    );
    Ok(())
}

/// Runs `requests` one after another on `engine` (each starts when the one before finished).
fn one_by_one(
    engine: &mut Engine<'_>,
    requests: &[GenerateRequest],
) -> Result<Vec<GenerateOutput>> {
    let mut outputs = Vec::new();
    for request in requests {
        engine.submit(request.clone())?;
        while !engine.is_idle() {
            for event in engine.step()? {
                if let EngineEvent::Finished { output, .. } = event {
                    outputs.push(*output);
                }
            }
        }
    }
    Ok(outputs)
}

/// An engine keeps finished requests' texts (`ngram_corpus`): a request that writes what an
/// earlier one wrote drafts it from there and accepts nearly every draft, greedy and seeded,
/// and its output is still plain decoding's. Without the corpus the same request drafts from
/// its own text alone, as the first did.
#[test]
fn a_request_drafts_what_an_earlier_one_wrote() -> Result<()> {
    let (target, drafter) = golden_pair()?;
    let plain = Generator::new(&target, None, GeneratorOptions::default());
    // Distinct tokens: the prompt never repeats itself.
    let prompt: Vec<TokenId> = (0..24).map(|i| 17 + 37 * i).collect();
    let mut requests = vec![greedy(&prompt, 48), greedy(&prompt, 48)];
    let mut seeded = greedy(&prompt, 48);
    seeded.sampling = seeded_sampling(5);
    requests.extend([seeded.clone(), seeded]);
    let references: Vec<GenerateOutput> = requests
        .iter()
        .map(|r| plain.generate(r, |_| {}))
        .collect::<Result<_, _>>()?;
    let limits = |ngram_corpus, prefix_cache| EngineLimits {
        max_total_tokens: 512,
        max_running: 2,
        prefix_cache,
        prefill_step: None,
        ngram_corpus,
        external_corpus: None,
    };
    let lookup = lookup_engine(&target, Budget::Fixed(8), LookupConfig::DEFAULT)?;
    // DDTree with lookup in its trees keeps one by default; fixed budgets never merge.
    let merged = Generator::new(&target, None, GeneratorOptions::default()).with_speculation(
        SpeculationSettings {
            algorithm: SpecAlgorithm::DDTree,
            budget: Some(Budget::Auto),
            max_budget: Some(8),
            lookup_in_trees: true,
            ..Default::default()
        },
        Some(&drafter),
    )?;
    // Its choices from a fixed cost table, rows nearly free beside a forward (a verify of 8
    // rows costing about a decode step): measured, they followed the machine, and on a
    // loaded one its trees took too few nodes for the corpus's drafts to show.
    let rows: Vec<(usize, f64)> = (1..=8).map(|r| (r, 1e-3 + 1e-5 * r as f64)).collect();
    merged.preload_costs(&rows, &[(1, 1e-5)], true);
    for (label, generator, corpus, prefix_cache) in [
        ("ngram, the default corpus", &lookup, None, false),
        ("ngram, a small corpus", &lookup, Some(200), false),
        ("ngram, no corpus", &lookup, Some(0), false),
        ("ngram, a prefix cache", &lookup, None, true),
        ("ddtree with lookup", &merged, None, false),
    ] {
        let mut engine = generator.engine(limits(corpus, prefix_cache))?;
        let outputs = one_by_one(&mut engine, &requests)?;
        let algorithm = generator.default_algorithm();
        assert_plain(&outputs, &references, algorithm, label);
        let accepted: Vec<usize> = outputs
            .iter()
            .map(|o| o.stats.accept_lengths.iter().sum::<usize>() - o.stats.rounds)
            .collect();
        let held = engine.corpus_tokens();
        if corpus == Some(0) {
            assert_eq!(held, 0, "{label}");
            assert_eq!(accepted[1], accepted[0], "{label}: {accepted:?}");
            continue;
        }
        // Four texts of 24 + 48 tokens and their ends; the small corpus keeps two. With the
        // prefix cache, a prompt's cached start is kept once, but for the 4 tokens before
        // the seam. 47 tokens come from rounds of at most 8 drafts: at least 6 rounds, at
        // most 41 drafts accepted.
        let kept = if corpus == Some(200) { 2 } else { 4 };
        let cached: usize = outputs
            .iter()
            .map(|o| o.stats.cached_tokens.saturating_sub(4))
            .sum();
        assert_eq!(cached > 0, prefix_cache, "{label}");
        assert_eq!(held, kept * 73 - cached, "{label}");
        for (first, again) in [(0, 1), (2, 3)] {
            assert!(
                accepted[again] >= 30 && accepted[again] > accepted[first],
                "{label}: accepted drafts {accepted:?}"
            );
        }
    }
    Ok(())
}

/// Texts an engine is given (`external_corpus`) are drafted from like earlier requests':
/// a request that writes one of them accepts nearly every draft, its output still plain
/// decoding's; a corpus indexed for other match lengths is refused by name.
#[test]
fn a_request_drafts_from_the_texts_the_engine_was_given() -> Result<()> {
    let (target, _) = golden_pair()?;
    let plain = Generator::new(&target, None, GeneratorOptions::default());
    let prompt: Vec<TokenId> = (0..24).map(|i| 29 + 41 * i).collect();
    let request = greedy(&prompt, 48);
    let reference = plain.generate(&request, |_| {})?;
    let mut text = prompt.clone();
    text.extend(&reference.token_ids);
    let limits = |external_corpus| EngineLimits {
        max_total_tokens: 512,
        max_running: 2,
        prefix_cache: false,
        prefill_step: None,
        ngram_corpus: Some(0),
        external_corpus,
    };
    let lookup = lookup_engine(&target, Budget::Fixed(8), LookupConfig::DEFAULT)?;
    let mut accepted = Vec::new();
    for external in [
        None,
        Some(NgramCorpus::of_texts(
            &[text.clone()],
            LookupConfig::DEFAULT,
        )),
    ] {
        let mut engine = lookup.engine(limits(external.map(Arc::new)))?;
        let outputs = one_by_one(&mut engine, std::slice::from_ref(&request))?;
        accepted.push(assert_plain(
            &outputs,
            std::slice::from_ref(&reference),
            SpecAlgorithm::Ngram,
            "given",
        ));
    }
    assert!(
        accepted[1] >= 30 && accepted[1] > accepted[0],
        "{accepted:?}"
    );
    let other = LookupConfig {
        min_match: 1,
        max_match: 3,
    };
    let mismatched = Arc::new(NgramCorpus::of_texts(&[text], other));
    let error = lookup
        .engine(limits(Some(mismatched)))
        .err()
        .expect("refused");
    assert!(
        error
            .to_string()
            .contains("speculative_ngram_external_corpus_path"),
        "{error}"
    );
    Ok(())
}
