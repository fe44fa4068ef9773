//! End-to-end generation: greedy output reproduces the reference token ids on the golden
//! checkpoint for every page size; seeded sampling is reproducible; stop tokens, stop strings,
//! incremental UTF-8 text and bad requests behave as documented.

mod common;

use anyhow::{Context, Result};
use candle_core::Device;
use common::*;
use grove_core::{FinishReason, SamplingParams, StopCondition, ValidationError};
use grove_engine::{Detokenizer, EngineError, GenerateRequest, Generator, GeneratorOptions};
use grove_model::{Decoder, TextTokenizer};
use grove_testkit::random_checkpoint::RandomCheckpoint;
use serde_json::Value;

fn golden_cases() -> Result<Vec<Value>> {
    let dir = golden_dir();
    let text = std::fs::read_to_string(dir.join("cases.json")).with_context(|| {
        format!(
            "golden set missing at {} (set GROVE_GOLDEN_DIR)",
            dir.display()
        )
    })?;
    let cases: Value = serde_json::from_str(&text)?;
    Ok(cases["cases"].as_array().context("cases")?.clone())
}

fn request(prompt: Vec<u32>, max_new_tokens: usize, sampling: SamplingParams) -> GenerateRequest {
    GenerateRequest {
        prompt,
        sampling,
        stop: StopCondition {
            max_new_tokens,
            ..Default::default()
        },
        speculation: Default::default(),
        logprobs: None,
        prompt_logprobs: false,
        adjustments: Default::default(),
        grammar: None,
    }
}

fn options(page_size: usize) -> GeneratorOptions {
    GeneratorOptions {
        page_size,
        ..Default::default()
    }
}

#[test]
fn greedy_generation_reproduces_the_reference_for_every_page_size() -> Result<()> {
    let model = Decoder::load(&golden_dir().join("target"), &Device::Cpu)?;
    for case in golden_cases()? {
        let prompt: Vec<u32> = serde_json::from_value(case["prompt"].clone())?;
        let expected: Vec<u32> = serde_json::from_value(case["greedy_ar"]["new_tokens"].clone())?;
        for page_size in [1, 4, 16] {
            let generator = Generator::new(&model, None, options(page_size));
            let output = generator.generate(
                &request(prompt.clone(), expected.len(), SamplingParams::greedy()),
                |_| {},
            )?;
            assert_eq!(
                output.token_ids, expected,
                "case {} page size {page_size}",
                case["id"]
            );
            assert_eq!(output.finish_reason, FinishReason::Length);
            assert_eq!(output.stats.rounds, expected.len() - 1);
            assert!(output.stats.accept_lengths.iter().all(|&a| a == 1));
        }
    }
    Ok(())
}

#[test]
fn seeded_sampling_is_reproducible_and_seed_dependent() -> Result<()> {
    let model = Decoder::load(&golden_dir().join("target"), &Device::Cpu)?;
    let generator = Generator::new(&model, None, options(1));
    let sampled = |seed| -> Result<Vec<u32>> {
        let sampling = SamplingParams {
            temperature: 1.0,
            top_k: 50,
            top_p: 0.95,
            seed: Some(seed),
        };
        Ok(generator
            .generate(&request(vec![970, 881, 849], 24, sampling), |_| {})?
            .token_ids)
    };
    assert_eq!(sampled(1)?, sampled(1)?);
    assert_ne!(sampled(1)?, sampled(2)?);
    Ok(())
}

#[test]
fn a_stop_token_ends_generation_and_is_kept_in_the_ids() -> Result<()> {
    let model = Decoder::load(&golden_dir().join("target"), &Device::Cpu)?;
    let case = &golden_cases()?[0];
    let prompt: Vec<u32> = serde_json::from_value(case["prompt"].clone())?;
    let greedy: Vec<u32> = serde_json::from_value(case["greedy_ar"]["new_tokens"].clone())?;
    let stop_at = greedy[4];
    let first = greedy.iter().position(|&t| t == stop_at).unwrap();
    let mut req = request(prompt, 64, SamplingParams::greedy());
    req.stop.stop_token_ids = vec![stop_at];
    let output = Generator::new(&model, None, options(1)).generate(&req, |_| {})?;
    assert_eq!(output.token_ids, greedy[..=first].to_vec());
    assert_eq!(output.finish_reason, FinishReason::Stop);
    Ok(())
}

fn tiny_model_with_tokenizer() -> Result<(tempfile::TempDir, Decoder, TextTokenizer)> {
    let dir = tempfile::tempdir()?;
    RandomCheckpoint::tiny_qwen3(5).write(dir.path())?;
    let model = Decoder::load(dir.path(), &Device::Cpu)?;
    let tokenizer = TextTokenizer::load(dir.path())?;
    Ok((dir, model, tokenizer))
}

#[test]
fn incremental_detokenization_never_splits_a_character() -> Result<()> {
    let (_dir, _model, tokenizer) = tiny_model_with_tokenizer()?;
    let text = "fn main() { println!(\"héllo wörld 😀 日本語\"); }";
    let ids = tokenizer.encode(text, false)?;
    assert!(
        ids.len() > text.chars().count(),
        "multi-byte characters span several byte tokens"
    );
    let mut detokenizer = Detokenizer::new();
    let mut streamed = String::new();
    for &id in &ids {
        let piece = detokenizer.push(&tokenizer, id)?;
        assert!(
            !piece.contains('\u{FFFD}'),
            "piece {piece:?} split a character"
        );
        streamed.push_str(&piece);
    }
    streamed.push_str(&detokenizer.flush(&tokenizer)?);
    assert_eq!(streamed, text);

    // Output cut inside a character (the emoji's last byte never came): the text ends before
    // it rather than in U+FFFD.
    let ids = tokenizer.encode("ab 😀", false)?;
    let mut detokenizer = Detokenizer::new();
    let mut streamed = String::new();
    for &id in &ids[..ids.len() - 1] {
        streamed.push_str(&detokenizer.push(&tokenizer, id)?);
    }
    streamed.push_str(&detokenizer.flush(&tokenizer)?);
    assert_eq!(streamed, "ab ");
    Ok(())
}

#[test]
fn streamed_text_equals_the_final_text_and_stop_strings_cut_it() -> Result<()> {
    let (_dir, model, tokenizer) = tiny_model_with_tokenizer()?;
    let generator = Generator::new(&model, Some(&tokenizer), options(4));
    let prompt = tokenizer.encode("def add(a, b):", true)?;
    let mut streamed = String::new();
    let mut req = request(prompt.clone(), 40, SamplingParams::greedy());
    let full = generator.generate(&req, |piece| streamed.push_str(piece))?;
    assert_eq!(streamed, full.text);
    // The same text, but for an incomplete character at the very end (held back).
    let decoded = tokenizer.decode(&full.token_ids)?;
    assert_eq!(full.text, decoded.trim_end_matches('\u{FFFD}'));

    // Stop at a piece of the text the model is known to produce.
    let chars: Vec<char> = full.text.chars().collect();
    let stop: String = chars
        .windows(2)
        .skip(chars.len() / 2)
        .find(|pair| !pair.contains(&'\u{FFFD}'))
        .context("a clean pair of characters")?
        .iter()
        .collect();
    req.stop.stop_strings = vec![stop.clone()];
    let mut streamed = String::new();
    let cut = generator.generate(&req, |piece| streamed.push_str(piece))?;
    assert_eq!(cut.finish_reason, FinishReason::Stop);
    assert_eq!(streamed, cut.text);
    assert!(!cut.text.contains(&stop));
    assert!(full.text.starts_with(&cut.text));
    Ok(())
}

#[test]
fn bad_requests_name_the_field_and_limit() -> Result<()> {
    let (_dir, model, _tokenizer) = tiny_model_with_tokenizer()?;
    let generator = Generator::new(&model, None, options(1));
    let error = |req: GenerateRequest| match generator.generate(&req, |_| {}) {
        Err(EngineError::Validation(error)) => error,
        other => panic!("expected a validation error, got {other:?}"),
    };
    let too_long = error(request(vec![1; 4000], 200, SamplingParams::greedy()));
    assert!(matches!(
        too_long,
        ValidationError::ContextOverflow { context: 4096, .. }
    ));
    assert!(too_long.to_string().contains("4096"));
    assert!(matches!(
        error(request(vec![], 4, SamplingParams::greedy())),
        ValidationError::Empty { field: "prompt" }
    ));
    assert!(error(request(vec![1], 0, SamplingParams::greedy()))
        .to_string()
        .contains("max_new_tokens"));
    assert!(error(request(vec![999], 4, SamplingParams::greedy()))
        .to_string()
        .contains("vocabulary"));
    let hot = SamplingParams {
        temperature: f32::NAN,
        ..SamplingParams::greedy()
    };
    assert!(error(request(vec![1], 4, hot))
        .to_string()
        .contains("temperature"));
    Ok(())
}
