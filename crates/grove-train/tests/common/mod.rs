//! Settings shared by the training tests: a tiny target over our own sources, short runs.
#![allow(dead_code)] // each test binary uses a different subset

use std::path::PathBuf;
use std::time::Duration;

use grove_engine::{DDTreeSpec, DFlashSpec, GenerateRequest, Generator, GeneratorOptions};
use grove_model::{DFlashDrafter, Model};
use grove_train::optim::AdamWConfig;
use grove_train::target_task::TargetSpec;
use grove_train::trainer::LoopOptions;

/// Our own sources: present wherever the tests run.
pub fn corpus() -> Vec<PathBuf> {
    vec![PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../grove-core/src")]
}

/// A 2-layer, 32-wide Qwen3 with a 384-token BPE vocabulary.
pub fn tiny_target(seed: u64) -> TargetSpec {
    TargetSpec {
        vocab_size: 384,
        hidden_size: 32,
        num_layers: 2,
        num_heads: 4,
        num_kv_heads: 2,
        head_dim: 8,
        intermediate_size: 64,
        max_position_embeddings: 256,
        seq_len: 32,
        batch_size: 4,
        seed,
    }
}

/// `steps` optimizer steps at peak `lr`, no checkpoint unless stopping or done.
pub fn loop_options(dir: PathBuf, steps: usize, lr: f64, grad_accum: usize) -> LoopOptions {
    LoopOptions {
        adamw: AdamWConfig {
            lr,
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-8,
            weight_decay: 0.1,
            warmup_steps: 5,
            total_steps: steps,
            min_lr_ratio: 0.1,
        },
        grad_accum,
        clip_norm: 1.0,
        dir,
        checkpoint_every: Duration::from_secs(3600),
        resume: false,
        stop_after_steps: None,
        time_limit: None,
        show_progress: false,
    }
}

/// Greedy DFlash (block 4) and DDTree (budget 6, top-k 3) with `drafter` give plain greedy's
/// tokens on every prompt.
pub fn assert_lossless(
    target: &dyn Model,
    drafter: &DFlashDrafter,
    prompts: &[Vec<u32>],
    new_tokens: usize,
) {
    let plain = Generator::new(target, None, GeneratorOptions::default());
    let dflash = Generator::new(target, None, GeneratorOptions::default())
        .with_dflash(DFlashSpec {
            drafter,
            num_draft_tokens: 4,
        })
        .unwrap();
    let ddtree = Generator::new(target, None, GeneratorOptions::default())
        .with_ddtree(DDTreeSpec {
            drafter,
            budget: 6,
            top_k: 3,
        })
        .unwrap();
    for prompt in prompts {
        let request = GenerateRequest::greedy(prompt, new_tokens);
        let reference = plain.generate(&request, |_| {}).unwrap().token_ids;
        for (name, method) in [("dflash", &dflash), ("ddtree", &ddtree)] {
            let tokens = method.generate(&request, |_| {}).unwrap().token_ids;
            assert_eq!(tokens, reference, "{name} on {prompt:?}");
        }
    }
}
