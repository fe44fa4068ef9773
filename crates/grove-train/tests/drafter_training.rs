//! Drafter training end to end on a tiny target: the loss falls, and the written drafter (z-lab
//! format) loads and runs through DFlash and DDTree losslessly.

mod common;

use candle_core::Device;
use common::*;
use grove_model::{DFlashDrafter, Decoder, Model, TextTokenizer};
use grove_train::drafter_net::DrafterShape;
use grove_train::drafter_task::{train_drafter, DrafterData};
use grove_train::target_task::train_target;

#[test]
fn a_trained_drafter_lowers_its_loss_and_drafts_losslessly() {
    let work = tempfile::tempdir().unwrap();
    let corpus = corpus();
    let target_dir = work.path().join("target");
    let spec = tiny_target(3);
    train_target(
        &spec,
        &corpus,
        &["rs"],
        &target_dir,
        &loop_options(work.path().join("t"), 40, 1e-2, 1),
    )
    .unwrap();
    let target = Decoder::load(&target_dir, &Device::Cpu).unwrap();
    let tokenizer = TextTokenizer::load(&target_dir).unwrap();
    let mask = tokenizer.token_to_id("<|mask|>").unwrap();
    let mut layers = target.config().clone();
    layers.num_layers = 1;
    let shape = DrafterShape {
        layers,
        target_layer_ids: vec![0, 1],
        block_size: 4,
        mask_token_id: mask,
        d2t: None,
    };
    let data = DrafterData {
        sequences: 24,
        prompt_len: 8,
        generated_len: 24,
        batch_size: 4,
        blocks_per_sequence: 3,
        decay: 0.8,
        eval_prompts: 2,
        seed: 5,
    };
    let drafter_dir = work.path().join("drafter");
    let state = train_drafter(
        &target_dir,
        &shape,
        &data,
        &corpus,
        &["rs"],
        &drafter_dir,
        &loop_options(work.path().join("d"), 40, 1e-2, 1),
    )
    .unwrap();
    let first = state.losses[0].1 as f64;
    let last = state.recent_loss(5);
    assert!(last < first - 0.5, "drafter loss {first:.3} -> {last:.3}");
    assert!(state
        .evaluations
        .iter()
        .any(|(_, name, tau)| name.contains("tau") && *tau >= 1.0));

    let drafter = DFlashDrafter::load(&drafter_dir, &target, |_| None, &Device::Cpu).unwrap();
    let prompts: Vec<Vec<u32>> = ["pub fn ", "impl Default for", "    /// The"]
        .iter()
        .map(|text| tokenizer.encode(text, false).unwrap())
        .collect();
    assert_lossless(&target, &drafter, &prompts, 24);
}
