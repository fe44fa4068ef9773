//! Target training: the loss falls on a tiny corpus, a checkpoint resumes to exactly the same
//! next steps, and the written checkpoint loads and generates.

mod common;

use candle_core::Device;
use common::*;
use grove_model::{Decoder, TextTokenizer};
use grove_train::target_task::train_target;
use grove_train::trainer::LoopOptions;

fn options(
    dir: std::path::PathBuf,
    steps: usize,
    stop_after: Option<usize>,
    resume: bool,
) -> LoopOptions {
    LoopOptions {
        stop_after_steps: stop_after,
        resume,
        ..loop_options(dir, steps, 1e-2, 2)
    }
}

#[test]
fn training_lowers_the_loss_and_writes_a_loadable_model() {
    let work = tempfile::tempdir().unwrap();
    let out = work.path().join("model");
    let state = train_target(
        &tiny_target(7),
        &corpus(),
        &["rs"],
        &out,
        &options(work.path().join("run"), 60, None, false),
    )
    .unwrap();
    let first = state.losses[0].1 as f64;
    let last = state.recent_loss(5);
    assert!(last < first - 1.0, "loss {first:.3} -> {last:.3}");
    assert_eq!(state.step, 60);
    // The written model loads (f16 weights, tokenizer, template) and its text round-trips.
    let decoder = Decoder::load(&out, &Device::Cpu).unwrap();
    assert_eq!(grove_model::Model::config(&decoder).num_layers, 2);
    let tokenizer = TextTokenizer::load(&out).unwrap();
    let ids = tokenizer.encode("pub fn validate(&self)", false).unwrap();
    assert_eq!(tokenizer.decode(&ids).unwrap(), "pub fn validate(&self)");
    assert!(tokenizer.has_chat_template());
}

#[test]
fn a_checkpoint_resumes_to_exactly_the_same_next_steps() {
    let work = tempfile::tempdir().unwrap();
    let whole = train_target(
        &tiny_target(7),
        &corpus(),
        &["rs"],
        &work.path().join("a-out"),
        &options(work.path().join("a"), 8, None, false),
    )
    .unwrap();
    let first_half = train_target(
        &tiny_target(7),
        &corpus(),
        &["rs"],
        &work.path().join("b-out"),
        &options(work.path().join("b"), 8, Some(4), false),
    )
    .unwrap();
    assert_eq!(first_half.step, 4);
    assert!(
        !work.path().join("b-out").exists(),
        "an unfinished run writes no model"
    );
    let resumed = train_target(
        &tiny_target(7),
        &corpus(),
        &["rs"],
        &work.path().join("b-out"),
        &options(work.path().join("b"), 8, None, true),
    )
    .unwrap();
    assert_eq!(resumed.step, 8);
    assert_eq!(
        resumed.losses, whole.losses,
        "resumed losses differ from the uninterrupted run"
    );
}
