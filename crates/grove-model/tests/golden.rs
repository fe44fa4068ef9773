//! The target reproduces the reference implementation's numbers on the golden checkpoint
//! (`../shared/golden`, computed by transformers in float32): prefill logits at every prompt
//! position and the hidden state after every tapped layer, within 1e-4.

mod common;

use anyhow::{Context, Result};
use candle_core::{Device, Tensor};
use common::{golden_dir, max_abs_diff};
use grove_kv::PagePool;
use grove_model::{Decoder, ForwardBatch, LogitRows, Model, Segment};
use serde_json::Value;

const TOLERANCE: f32 = 1e-4;

#[test]
fn prefill_logits_and_taps_match_the_reference() -> Result<()> {
    let dir = golden_dir();
    let cases: Value = serde_json::from_str(
        &std::fs::read_to_string(dir.join("cases.json")).with_context(|| {
            format!(
                "golden set missing at {} (set GROVE_GOLDEN_DIR)",
                dir.display()
            )
        })?,
    )?;
    let tensors = candle_core::safetensors::load(dir.join("tensors.safetensors"), &Device::Cpu)?;
    let model = Decoder::load(&dir.join("target"), &Device::Cpu)?;
    let num_layers = model.config().num_layers;
    let tap_ids: Vec<usize> = serde_json::from_value(cases["drafter"]["target_layer_ids"].clone())?;
    // Every layer but the last: HF's last hidden state is after the final norm, not a tap.
    let taps: Vec<usize> = (0..num_layers - 1).collect();

    let all_cases = cases["cases"].as_array().context("cases")?;
    assert!(!all_cases.is_empty());
    for case in all_cases {
        let id = &case["id"];
        let prompt: Vec<u32> = serde_json::from_value(case["prompt"].clone())?;
        let pool = PagePool::new(prompt.len(), 1)?;
        let mut kv = model.new_kv_store(pool.num_slots());
        let mut table = pool.new_table();
        table.reserve(prompt.len())?;
        let positions: Vec<usize> = (0..prompt.len()).collect();
        let batch = ForwardBatch {
            segments: vec![Segment::causal(&table, &prompt, &positions, LogitRows::All)],
            taps: &taps,
        };
        let output = model.forward(&batch, &mut kv)?;

        let name = |field: &str| case["prefill"][field].as_str().unwrap().to_owned();
        let reference_logits = &tensors[&name("logits")];
        let diff = max_abs_diff(&output.logits, reference_logits)?;
        assert!(diff < TOLERANCE, "case {id}: logits differ by {diff}");

        let hidden = &tensors[&name("hidden_states")]; // [L+1, P, H]
        for (tap, layer) in output.taps.iter().zip(&taps) {
            let diff = max_abs_diff(tap, &hidden.get(layer + 1)?)?;
            assert!(
                diff < TOLERANCE,
                "case {id}: layer {layer} output differs by {diff}"
            );
        }
        let feature = Tensor::cat(
            &tap_ids
                .iter()
                .map(|&l| output.taps[l].clone())
                .collect::<Vec<_>>(),
            1,
        )?;
        let diff = max_abs_diff(&feature, &tensors[&name("context_feature")])?;
        assert!(
            diff < TOLERANCE,
            "case {id}: context feature differs by {diff}"
        );

        let last = output.logits_row(prompt.len() - 1)?;
        let argmax = grove_argmax(&last);
        assert_eq!(
            argmax,
            case["prefill"]["argmax_last"].as_u64().unwrap() as usize,
            "case {id}"
        );
    }
    Ok(())
}

fn grove_argmax(row: &[f32]) -> usize {
    row.iter()
        .enumerate()
        .fold(0, |best, (i, &v)| if v > row[best] { i } else { best })
}
