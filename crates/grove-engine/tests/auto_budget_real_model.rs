//! The automatic budget on a real model (Qwen2.5-Coder 0.5B GGUF, which CI installs): there
//! several verified rows cost little more than one, so an always-right drafter is verified
//! several nodes deep and a never-right one is skipped. Alone in its binary: its costs are
//! measured, and other tests running beside it would distort them.

mod common;

use anyhow::Result;
use common::*;
use grove_core::TokenId;
use grove_model::Decoder;

#[test]
fn on_a_real_model_an_always_right_drafter_is_verified_deep() -> Result<()> {
    let Some(path) = model("qwen2.5-coder-0.5b-instruct.gguf") else {
        return Ok(());
    };
    let target = Decoder::load(&path, &candle_core::Device::Cpu)?;
    let prompt: Vec<TokenId> = vec![750, 75698, 10624, 982, 262];
    let [(oracle, reference), (adversary, _)] = scripted_pair(&target, &prompt, 96)?;
    let output = run_auto(&target, &oracle, &prompt, 96)?;
    assert_eq!(output.token_ids, reference);
    // (The scripted drafter puts 0.13 on its token over Qwen's 151,936 ids: the calibration
    // takes a dozen rounds to trust it.)
    let stats = &output.stats;
    assert!(
        stats.mean_accept_length > 2.5 && stats.mean_budget >= 2.0,
        "an always-right drafter is worth verifying: {stats:?}"
    );
    let output = run_auto(&target, &adversary, &prompt, 96)?;
    assert_eq!(output.token_ids, reference);
    let stats = &output.stats;
    assert!(stats.rounds_without_drafts * 2 >= stats.rounds, "{stats:?}");
    Ok(())
}
