//! A measurement, not a check (run on demand: it prints speeds, and tests never assert timings):
//! where speculation pays, how the automatic budget compares with every fixed budget in the
//! same run. Qwen2.5-Coder-0.5B (GGUF) with an always-right scripted drafter, 128 greedy tokens
//! on three prompts; plain decoding, DDTree at budgets 1-12, then two requests of one automatic
//! generator (the first starts with an empty calibration). Every output is checked against
//! plain greedy. Numbers: docs/benchmarks.md.
//!
//!     GROVE_MODELS_DIR=~/.cache/grove/models cargo test --release -p grove-engine \
//!         --test auto_against_fixed_budgets -- --ignored --nocapture

mod common;

use anyhow::Result;
use common::*;
use grove_core::TokenId;
use grove_engine::{
    Budget, DDTreeSpec, Drafter, Generator, GeneratorOptions, SpecAlgorithm, SpeculationSettings,
};
use grove_model::Decoder;

#[test]
#[ignore = "a measurement: prints speeds (see the module doc)"]
fn auto_against_fixed_budgets_with_an_always_right_drafter() -> Result<()> {
    let Some(path) = model("qwen2.5-coder-0.5b-instruct.gguf") else {
        return Ok(());
    };
    let target = Decoder::load(&path, &candle_core::Device::Cpu)?;
    let prompts: Vec<Vec<TokenId>> = vec![
        vec![750, 75698, 10624, 982, 262],
        vec![474, 2643, 198, 750, 1887],
        vec![1040, 5571, 510, 262, 707],
    ];
    let new = 128;
    let plain = Generator::new(&target, None, GeneratorOptions::default());
    for prompt in &prompts {
        let [(oracle, reference), _] = scripted_pair(&target, prompt, new)?;
        let drafter: &dyn Drafter = &oracle;
        let none = plain
            .generate(&greedy(prompt, new), |_| {})?
            .stats
            .decode_tokens_per_s;
        let mut line = format!("none {none:.1}");
        for b in [1, 2, 4, 7, 12] {
            let g = Generator::new(&target, None, GeneratorOptions::default()).with_ddtree(
                DDTreeSpec {
                    drafter,
                    budget: b,
                    top_k: b,
                },
            )?;
            let o = g.generate(&greedy(prompt, new), |_| {})?;
            assert_eq!(o.token_ids, reference);
            line += &format!(" b{b} {:.1}", o.stats.decode_tokens_per_s);
        }
        let settings = SpeculationSettings {
            algorithm: SpecAlgorithm::DDTree,
            budget: Some(Budget::Auto),
            max_budget: Some(12),
            ..Default::default()
        };
        let g = Generator::new(&target, None, GeneratorOptions::default())
            .with_speculation(settings, Some(drafter))?;
        for rep in 0..2 {
            let o = g.generate(&greedy(prompt, new), |_| {})?;
            assert_eq!(o.token_ids, reference);
            line += &format!(
                " auto{rep} {:.1} (mean {:.2} tau {:.2})",
                o.stats.decode_tokens_per_s, o.stats.mean_budget, o.stats.mean_accept_length
            );
        }
        eprintln!("{line}");
    }
    Ok(())
}
