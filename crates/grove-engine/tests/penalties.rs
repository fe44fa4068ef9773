//! Presence and frequency penalties and `logit_bias` (`GenerateRequest::adjustments`): they
//! change what is generated as OpenAI defines, and speculation (DFlash, DDTree, lookup drafts)
//! stays lossless under them (a tree node is sampled from its row adjusted for the tokens before
//! it, its path's drafts included).

mod common;

use anyhow::Result;
use common::*;
use grove_core::{SamplingParams, TokenId};
use grove_engine::{
    Budget, DDTreeSpec, DFlashSpec, GenerateOutput, GenerateRequest, Generator, GeneratorOptions,
    LogitAdjustments, LookupConfig, SpecAlgorithm, SpeculationSettings,
};
use grove_model::{DFlashDrafter, Decoder};

fn outputs(
    target: &Decoder,
    drafter: &DFlashDrafter,
    request: &GenerateRequest,
) -> Result<Vec<(String, GenerateOutput)>> {
    let plain = Generator::new(target, None, GeneratorOptions::default());
    let mut all = vec![("plain".to_owned(), plain.generate(request, |_| {})?)];
    let dflash =
        Generator::new(target, None, GeneratorOptions::default()).with_dflash(DFlashSpec {
            drafter,
            num_draft_tokens: 8,
        })?;
    all.push(("dflash".into(), dflash.generate(request, |_| {})?));
    for budget in [4, 16] {
        let ddtree =
            Generator::new(target, None, GeneratorOptions::default()).with_ddtree(DDTreeSpec {
                drafter,
                budget,
                top_k: budget,
            })?;
        all.push((
            format!("ddtree {budget}"),
            ddtree.generate(request, |_| {})?,
        ));
    }
    // Lookup drafts from single-token matches: this short prompt repeats little.
    let lookup = SpeculationSettings {
        algorithm: SpecAlgorithm::Ngram,
        budget: Some(Budget::Fixed(8)),
        lookup: LookupConfig {
            min_match: 1,
            max_match: 3,
        },
        ..Default::default()
    };
    let ngram =
        Generator::new(target, None, GeneratorOptions::default()).with_speculation(lookup, None)?;
    all.push(("ngram".into(), ngram.generate(request, |_| {})?));
    Ok(all)
}

fn request(
    prompt: &[TokenId],
    sampling: SamplingParams,
    adjustments: &LogitAdjustments,
) -> GenerateRequest {
    let mut request = greedy(prompt, 48);
    request.sampling = sampling;
    request.adjustments = adjustments.clone();
    request
}

#[test]
fn speculation_is_lossless_under_penalties_and_biases() -> Result<()> {
    let (target, drafter) = golden_pair()?;
    let prompt: Vec<TokenId> = vec![970, 881, 849, 832, 613];
    let unadjusted = Generator::new(&target, None, GeneratorOptions::default())
        .generate(&greedy(&prompt, 48), |_| {})?;
    let first = unadjusted.token_ids[0];
    let settings = [
        LogitAdjustments {
            presence_penalty: 1.5,
            frequency_penalty: 0.5,
            logit_bias: Vec::new(),
        },
        LogitAdjustments {
            presence_penalty: -0.5,
            frequency_penalty: 2.0,
            logit_bias: vec![(first, -100.0), (7, 3.0)],
        },
    ];
    let samplings = [
        SamplingParams::greedy(),
        SamplingParams {
            temperature: 0.9,
            top_k: 40,
            top_p: 0.95,
            seed: Some(5),
        },
    ];
    let mut looked_up = 0;
    for adjustments in &settings {
        for sampling in &samplings {
            let request = request(&prompt, sampling.clone(), adjustments);
            let all = outputs(&target, &drafter, &request)?;
            let plain = &all[0].1;
            for (method, output) in &all[1..] {
                // Penalties keep text from repeating itself: lookup may find nothing in a run.
                if method == "ngram" {
                    looked_up += output.stats.tree_nodes;
                } else {
                    assert!(output.stats.tree_nodes > 0, "{method} drafted nothing");
                }
                assert_eq!(
                    output.token_ids, plain.token_ids,
                    "{method} {adjustments:?}"
                );
            }
        }
    }
    assert!(looked_up > 0, "ngram drafted nothing");
    Ok(())
}

#[test]
fn penalties_and_biases_change_what_is_generated_as_defined() -> Result<()> {
    let (target, _) = golden_pair()?;
    let generator = Generator::new(&target, None, GeneratorOptions::default());
    let prompt: Vec<TokenId> = vec![5, 17, 301, 44];
    let run = |adjustments: LogitAdjustments| {
        generator.generate(
            &request(&prompt, SamplingParams::greedy(), &adjustments),
            |_| {},
        )
    };
    let plain = run(LogitAdjustments::default())?;
    // A ban: the greedy first token never comes.
    let first = plain.token_ids[0];
    let banned = run(LogitAdjustments {
        logit_bias: vec![(first, -100.0)],
        ..Default::default()
    })?;
    assert!(!banned.token_ids.contains(&first), "{:?}", banned.token_ids);
    // A strong enough push makes a token the greedy choice everywhere.
    let pushed = run(LogitAdjustments {
        logit_bias: vec![(7, 100.0)],
        ..Default::default()
    })?;
    assert!(pushed.token_ids.iter().all(|&t| t == 7));
    // A presence penalty at its limit repeats less than no penalty.
    let distinct = |ids: &[TokenId]| ids.iter().collect::<std::collections::HashSet<_>>().len();
    let penalized = run(LogitAdjustments {
        presence_penalty: 2.0,
        frequency_penalty: 2.0,
        logit_bias: Vec::new(),
    })?;
    assert!(
        distinct(&penalized.token_ids) > distinct(&plain.token_ids),
        "{} distinct against {}",
        distinct(&penalized.token_ids),
        distinct(&plain.token_ids)
    );
    Ok(())
}

#[test]
fn adjustments_past_their_limits_are_refused_by_name() -> Result<()> {
    let (target, _) = golden_pair()?;
    let generator = Generator::new(&target, None, GeneratorOptions::default());
    let refused = |adjustments: LogitAdjustments| {
        let request = request(&[1, 2], SamplingParams::greedy(), &adjustments);
        generator
            .generate(&request, |_| {})
            .unwrap_err()
            .to_string()
    };
    let message = refused(LogitAdjustments {
        frequency_penalty: 3.0,
        ..Default::default()
    });
    assert!(message.contains("frequency_penalty"), "{message}");
    let message = refused(LogitAdjustments {
        logit_bias: vec![(1 << 30, 1.0)],
        ..Default::default()
    });
    assert!(message.contains("logit_bias"), "{message}");
    Ok(())
}
