//! Log-probabilities of the chosen tokens (`GenerateRequest::logprobs`): one per emitted token,
//! the target's log-softmax at the position that chose it, and the same bits whether the token
//! was decoded plainly or verified in a DFlash chain or a DDTree tree, greedy or sampled.

mod common;

use anyhow::Result;
use common::*;
use grove_core::{SamplingParams, TokenId};
use grove_engine::{
    DDTreeSpec, DFlashSpec, GenerateOutput, GenerateRequest, Generator, GeneratorOptions,
    TokenLogprob,
};
use grove_kv::PagePool;
use grove_model::{DFlashDrafter, Decoder, ForwardBatch, LogitRows, Model, Segment};

const TOP: usize = 5;

fn with_logprobs(prompt: &[TokenId], max_new: usize, sampling: SamplingParams) -> GenerateRequest {
    let mut request = greedy(prompt, max_new);
    request.sampling = sampling;
    request.logprobs = Some(TOP);
    request
}

/// Plain decoding, DFlash and DDTree at two budgets, each on its own generator.
fn every_method(
    target: &Decoder,
    drafter: &DFlashDrafter,
    request: &GenerateRequest,
) -> Result<Vec<(String, GenerateOutput)>> {
    let options = || GeneratorOptions {
        page_size: 4,
        ..Default::default()
    };
    let mut outputs = vec![(
        "plain".to_owned(),
        Generator::new(target, None, options()).generate(request, |_| {})?,
    )];
    let dflash = Generator::new(target, None, options()).with_dflash(DFlashSpec {
        drafter,
        num_draft_tokens: 8,
    })?;
    outputs.push(("dflash".into(), dflash.generate(request, |_| {})?));
    for budget in [3, 16] {
        let ddtree = Generator::new(target, None, options()).with_ddtree(DDTreeSpec {
            drafter,
            budget,
            top_k: budget,
        })?;
        outputs.push((
            format!("ddtree {budget}"),
            ddtree.generate(request, |_| {})?,
        ));
    }
    Ok(outputs)
}

/// A token, its log-probability's bits and its alternatives' (id, bits).
type Bits = (TokenId, u32, Vec<(TokenId, u32)>);

fn bits(logprobs: &[TokenLogprob]) -> Vec<Bits> {
    logprobs
        .iter()
        .map(|lp| {
            let top = lp.top.iter().map(|&(t, l)| (t, l.to_bits())).collect();
            (lp.token, lp.logprob.to_bits(), top)
        })
        .collect()
}

#[test]
fn speculation_gives_every_token_the_log_probability_plain_decoding_gives_it() -> Result<()> {
    let (target, drafter) = golden_pair()?;
    let prompt: Vec<TokenId> = vec![970, 881, 849, 832, 613];
    let samplings = [
        SamplingParams::greedy(),
        SamplingParams {
            temperature: 0.8,
            top_k: 50,
            top_p: 0.95,
            seed: Some(11),
        },
    ];
    for sampling in samplings {
        let request = with_logprobs(&prompt, 40, sampling.clone());
        let outputs = every_method(&target, &drafter, &request)?;
        let (_, plain) = &outputs[0];
        assert_eq!(plain.logprobs.len(), plain.token_ids.len());
        for (method, output) in &outputs[1..] {
            assert!(output.stats.tree_nodes > 0, "{method} drafted nothing");
            assert_eq!(output.token_ids, plain.token_ids, "{method}");
            assert_eq!(bits(&output.logprobs), bits(&plain.logprobs), "{method}");
        }
        for (lp, &token) in plain.logprobs.iter().zip(&plain.token_ids) {
            assert_eq!(lp.token, token);
            assert_eq!(lp.top.len(), TOP);
            assert!(
                lp.top.windows(2).all(|w| w[0].1 >= w[1].1),
                "most likely first"
            );
            if sampling.is_greedy() {
                assert_eq!(
                    lp.top[0],
                    (token, lp.logprob),
                    "greedy takes the most likely"
                );
            }
        }
    }
    Ok(())
}

/// Each token's value is the log-softmax of the logits a causal forward over the prompt and
/// the tokens before it gives at its position (one forward over the whole text, every row).
#[test]
fn log_probabilities_are_the_targets_log_softmax_at_each_position() -> Result<()> {
    let (target, _) = golden_pair()?;
    let prompt: Vec<TokenId> = vec![5, 17, 301, 44];
    let request = with_logprobs(
        &prompt,
        12,
        SamplingParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            seed: Some(3),
        },
    );
    let output =
        Generator::new(&target, None, GeneratorOptions::default()).generate(&request, |_| {})?;
    let tokens: Vec<TokenId> = prompt.iter().chain(&output.token_ids).copied().collect();
    let rows = every_row(&target, &tokens)?;
    for (i, lp) in output.logprobs.iter().enumerate() {
        let row = &rows[prompt.len() - 1 + i];
        let norm: f64 = row.iter().map(|&x| f64::from(x).exp()).sum();
        let expected = |t: TokenId| f64::from(row[t as usize]) - norm.ln();
        assert!(
            (f64::from(lp.logprob) - expected(lp.token)).abs() < 1e-4,
            "token {i}: {} against {}",
            lp.logprob,
            expected(lp.token)
        );
        for &(t, value) in &lp.top {
            assert!(
                (f64::from(value) - expected(t)).abs() < 1e-4,
                "token {i}, {t}"
            );
        }
    }
    Ok(())
}

#[test]
fn a_request_that_does_not_ask_gets_none() -> Result<()> {
    let (target, _) = golden_pair()?;
    let output = Generator::new(&target, None, GeneratorOptions::default())
        .generate(&greedy(&[1, 2, 3], 6), |_| {})?;
    assert!(output.logprobs.is_empty());
    let json = serde_json::to_value(&output)?;
    assert!(json.get("logprobs").is_none(), "omitted from the JSON too");
    Ok(())
}

/// A scored prompt (`prompt_logprobs`): one entry per prompt token after the first, each the
/// log-softmax of a causal forward's row before it, over a prompt longer than a scoring chunk;
/// what is generated after it does not change.
#[test]
fn a_scored_prompt_gets_each_tokens_log_probability_and_the_same_generation() -> Result<()> {
    let (target, _) = golden_pair()?;
    let prompt: Vec<TokenId> = (0..150).map(|i| (i * 37 % 1000) as TokenId).collect();
    let generator = Generator::new(&target, None, GeneratorOptions::default());
    let plain = generator.generate(&greedy(&prompt, 6), |_| {})?;
    let mut request = with_logprobs(&prompt, 6, SamplingParams::greedy());
    request.prompt_logprobs = true;
    let scored = generator.generate(&request, |_| {})?;
    assert_eq!(scored.token_ids, plain.token_ids);
    assert_eq!(scored.prompt_logprobs.len(), prompt.len() - 1);
    let rows = every_row(&target, &prompt)?;
    for (i, lp) in scored.prompt_logprobs.iter().enumerate() {
        assert_eq!(lp.token, prompt[i + 1]);
        assert_eq!(lp.top.len(), TOP);
        let row = &rows[i];
        let norm: f64 = row.iter().map(|&x| f64::from(x).exp()).sum();
        let expected = f64::from(row[lp.token as usize]) - norm.ln();
        assert!(
            (f64::from(lp.logprob) - expected).abs() < 1e-4,
            "prompt token {}",
            i + 1
        );
    }
    Ok(())
}

/// Every row's logits of one causal forward over `tokens`.
fn every_row(target: &Decoder, tokens: &[TokenId]) -> Result<Vec<Vec<f32>>> {
    let pool = PagePool::new(tokens.len(), 1)?;
    let mut kv = target.new_kv_store(pool.num_slots());
    let mut table = pool.new_table();
    table.reserve(tokens.len())?;
    let positions: Vec<usize> = (0..tokens.len()).collect();
    let batch = ForwardBatch {
        segments: vec![Segment::causal(&table, tokens, &positions, LogitRows::All)],
        taps: &[],
    };
    let forward = target.forward(&batch, &mut kv)?;
    (0..tokens.len())
        .map(|row| Ok(forward.logits_row(row)?))
        .collect()
}
