//! The DFlash drafter reproduces the reference on the golden pair: fed the reference's context
//! features, its normed block output and its draft logits match within 1e-4 in the first two
//! rounds of every case (round 1 exercises the cached context plus one new row), and every
//! refusal of an incompatible drafter names the problem.

mod common;

use anyhow::{Context, Result};
use std::collections::HashMap;

use candle_core::{Device, Tensor};
use common::{golden_dir, max_abs_diff};
use grove_kv::PagePool;
use grove_model::dflash::default_target_layer_ids;
use grove_model::{DFlashDrafter, Decoder};
use serde_json::{json, Value};

const TOLERANCE: f32 = 1e-4;

fn no_tokenizer(_: &str) -> Option<u32> {
    None
}

/// The golden cases and tensors, the target and its drafter.
fn golden_pair() -> Result<(Value, HashMap<String, Tensor>, Decoder, DFlashDrafter)> {
    let dir = golden_dir();
    let cases: Value = serde_json::from_str(
        &std::fs::read_to_string(dir.join("cases.json")).context("golden cases")?,
    )?;
    let tensors = candle_core::safetensors::load(dir.join("tensors.safetensors"), &Device::Cpu)?;
    let target = Decoder::load(&dir.join("target"), &Device::Cpu)?;
    let drafter = DFlashDrafter::load(&dir.join("drafter"), &target, no_tokenizer, &Device::Cpu)?;
    Ok((cases, tensors, target, drafter))
}

#[test]
fn drafter_hidden_and_logits_match_the_reference() -> Result<()> {
    let (cases, tensors, target, drafter) = golden_pair()?;
    assert_eq!(drafter.config().block_size, 8);
    assert_eq!(drafter.config().target_layer_ids, vec![0, 2]);

    for case in cases["cases"].as_array().context("cases")? {
        let pool = PagePool::new(256, 1)?;
        let mut kv = drafter.new_kv_store(pool.num_slots());
        let mut table = pool.new_table();
        for round in &case["dflash"]["rounds"].as_array().context("rounds")?[..2] {
            assert_eq!(
                table.len() as u64,
                round["draft_cache_len_before"].as_u64().unwrap()
            );
            let features = &tensors[round["target_hidden_in"].as_str().unwrap()];
            drafter.extend_context(features, &mut table, &mut kv)?;
            assert_eq!(table.len() as u64, round["start"].as_u64().unwrap());
            let anchor = round["block_input_ids"][0].as_u64().unwrap() as u32;
            let output = drafter.draft(&target, anchor, &mut table, &mut kv)?;
            let hidden_diff = max_abs_diff(
                &output.hidden,
                &tensors[round["draft_hidden"].as_str().unwrap()],
            )?;
            let logits_diff = max_abs_diff(
                &output.logits,
                &tensors[round["draft_logits"].as_str().unwrap()],
            )?;
            let label = format!("case {} round {}", case["id"], round["round"]);
            assert!(
                hidden_diff < TOLERANCE,
                "{label}: drafter hidden differs by {hidden_diff}"
            );
            assert!(
                logits_diff < TOLERANCE,
                "{label}: draft logits differ by {logits_diff}"
            );
            let argmax: Vec<u32> = output.logits.argmax(1)?.to_vec1()?;
            let expected: Vec<u32> = serde_json::from_value(round["draft_argmax"].clone())?;
            assert_eq!(argmax, expected, "{label}");
        }
    }
    Ok(())
}

#[test]
fn a_block_drafted_to_fewer_depths_gives_the_first_rows_of_its_logits() -> Result<()> {
    let (cases, tensors, target, drafter) = golden_pair()?;
    let round = &cases["cases"][0]["dflash"]["rounds"][0];
    let pool = PagePool::new(256, 1)?;
    let mut kv = drafter.new_kv_store(pool.num_slots());
    let mut table = pool.new_table();
    drafter.extend_context(
        &tensors[round["target_hidden_in"].as_str().unwrap()],
        &mut table,
        &mut kv,
    )?;
    let anchor = round["block_input_ids"][0].as_u64().unwrap() as u32;
    let full = drafter.draft(&target, anchor, &mut table, &mut kv)?.logits;
    for depths in [1, 3, 7] {
        let mut blocks = [(&mut table, anchor, depths)];
        let part = drafter
            .draft_batch(&target, &mut blocks, &mut kv)?
            .remove(0);
        assert_eq!(part.logits.dims()[0], depths);
        let expected: Vec<Vec<f32>> = full.narrow(0, 0, depths)?.to_vec2()?;
        assert_eq!(part.logits.to_vec2::<f32>()?, expected, "{depths} depths");
    }
    for depths in [0, 8] {
        let mut blocks = [(&mut table, anchor, depths)];
        let refused = drafter
            .draft_batch(&target, &mut blocks, &mut kv)
            .unwrap_err();
        let message = refused.to_string();
        assert!(
            message.contains(&format!("draft depths {depths} outside 1..=7")),
            "{message}"
        );
    }
    Ok(())
}

/// Copies the golden drafter with `edit` applied to its config; returns the load error.
fn refusal(edit: impl FnOnce(&mut Value)) -> Result<String> {
    let source = golden_dir().join("drafter");
    let dir = tempfile::tempdir()?;
    let mut config: Value =
        serde_json::from_str(&std::fs::read_to_string(source.join("config.json"))?)?;
    edit(&mut config);
    std::fs::write(dir.path().join("config.json"), config.to_string())?;
    std::fs::copy(
        source.join("model.safetensors"),
        dir.path().join("model.safetensors"),
    )?;
    let target = Decoder::load(&golden_dir().join("target"), &Device::Cpu)?;
    match DFlashDrafter::load(dir.path(), &target, no_tokenizer, &Device::Cpu) {
        Ok(_) => anyhow::bail!("the drafter loaded"),
        Err(error) => Ok(error.to_string()),
    }
}

#[test]
fn incompatible_drafters_are_refused_with_the_reason() -> Result<()> {
    let hidden = refusal(|c| c["hidden_size"] = json!(64))?;
    assert!(
        hidden.contains("hidden_size") && hidden.contains("128"),
        "{hidden}"
    );
    let fc = refusal(|c| c["dflash_config"]["target_layer_ids"] = json!([0, 1, 2]))?;
    assert!(fc.contains("fc") && fc.contains("3 x 128"), "{fc}");
    let tap = refusal(|c| c["dflash_config"]["target_layer_ids"] = json!([0, 7]))?;
    assert!(
        tap.contains("tap layer 7") && tap.contains("4-layer"),
        "{tap}"
    );
    let mask = refusal(|c| c["dflash_config"]["mask_token_id"] = json!(4096))?;
    assert!(
        mask.contains("mask token 4096") && mask.contains("1024"),
        "{mask}"
    );
    let variant = refusal(|c| c["dflash_config"]["markov_order"] = json!(2))?;
    assert!(
        variant.contains("variant") && variant.contains("markov_order"),
        "{variant}"
    );
    let conv = refusal(|c| c["conv_kernel_size"] = json!(4))?;
    assert!(
        conv.contains("variant") && conv.contains("conv_kernel_size"),
        "{conv}"
    );
    let depth = refusal(|c| c["num_target_layers"] = json!(36))?;
    assert!(
        depth.contains("num_target_layers") && depth.contains("36"),
        "{depth}"
    );
    let no_mask = refusal(|c| {
        c["dflash_config"]
            .as_object_mut()
            .unwrap()
            .remove("mask_token_id");
        c["dflash_config"]["mask_token"] = json!("<|MASK|>");
    })?;
    assert!(
        no_mask.contains("mask_token") && no_mask.contains("<|MASK|>"),
        "{no_mask}"
    );
    Ok(())
}

#[test]
fn nested_block_size_string_mask_and_derived_taps_are_understood() -> Result<()> {
    assert_eq!(default_target_layer_ids(36, 5), vec![1, 9, 17, 25, 33]);
    assert_eq!(default_target_layer_ids(48, 5), vec![1, 12, 23, 34, 45]);
    assert_eq!(default_target_layer_ids(4, 1), vec![2]);
    let source = golden_dir().join("drafter");
    let mut config: Value =
        serde_json::from_str(&std::fs::read_to_string(source.join("config.json"))?)?;
    config.as_object_mut().unwrap().remove("block_size");
    config["dflash_config"] =
        json!({"block_size": 6, "mask_token": "<|MASK|>", "target_layer_ids": [0, 2]});
    let parsed =
        grove_model::DFlashConfig::from_json(&config, |t| (t == "<|MASK|>").then_some(1023))
            .map_err(anyhow::Error::msg)?;
    assert_eq!((parsed.block_size, parsed.mask_token_id), (6, 1023));
    Ok(())
}
