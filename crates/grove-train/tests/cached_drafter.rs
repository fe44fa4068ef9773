//! The cached-features route on a GGUF target written by the test: the cache holds exactly
//! what the inference kernels compute, resumes shard by shard and refuses another target's
//! cache; a drafter trained from it with a reduced vocabulary drafts only that vocabulary and
//! stays lossless through DFlash and DDTree.

mod common;

use std::path::Path;
use std::time::Instant;

use candle_core::quantized::GgmlDType;
use candle_core::{Device, Tensor, D};
use common::{assert_lossless, loop_options};
use grove_kv::PagePool;
use grove_model::config::Family;
use grove_model::{DFlashDrafter, Decoder, ForwardBatch, LogitRows, Model, Segment};
use grove_testkit::gguf_writer::write_gguf;
use grove_testkit::RandomCheckpoint;
use grove_train::drafter_net::DrafterShape;
use grove_train::feature_task::{train_drafter_cached, CachedRun};
use grove_train::features::{extract, target_identity, FeatureCache, FeatureManifest};

/// A 2-layer Qwen2 GGUF (Q8_0 matrices, 64 wide so the quantized kernels take them).
fn gguf_target(dir: &Path) -> Decoder {
    let spec = RandomCheckpoint {
        family: Family::Qwen2,
        vocab_size: 320,
        hidden_size: 64,
        intermediate_size: 128,
        num_layers: 2,
        num_heads: 4,
        num_kv_heads: 2,
        head_dim: 16,
        tie_word_embeddings: false,
        bf16: false,
        with_tokenizer: false,
        max_position_embeddings: 256,
        seed: 8,
    };
    let checkpoint = dir.join("checkpoint");
    spec.write(&checkpoint).unwrap();
    let path = dir.join("target.gguf");
    write_gguf(&checkpoint, &spec, "qwen2", GgmlDType::Q8_0, &path);
    Decoder::load(&path, &Device::Cpu).unwrap()
}

/// A corpus with structure to learn: short repeating phrases with varying fillers.
fn corpus(len: usize) -> Vec<u32> {
    (0..len as u32)
        .map(|i| match i % 7 {
            0..=3 => 20 + (i % 7) * 3,
            _ => 100 + (i * 13 % 50),
        })
        .collect()
}

fn manifest(target: &Decoder, taps: Vec<usize>) -> FeatureManifest {
    FeatureManifest {
        target: target_identity(target),
        hidden_size: 64,
        taps,
        window: 24,
        windows: 5,
        windows_per_shard: 2,
        seed: 3,
    }
}

#[test]
fn the_cache_holds_what_the_kernels_compute_and_resumes_by_shard() {
    let work = tempfile::tempdir().unwrap();
    let target = gguf_target(work.path());
    let tokens = corpus(2000);
    let dir = work.path().join("features");
    let m = manifest(&target, vec![0, 1]);
    // A deadline already past: nothing is written, and the caller hears it is unfinished.
    assert!(!extract(&target, &tokens, &m, &dir, 7, Some(Instant::now())).unwrap());
    assert!(FeatureCache::load(&dir, &m).is_err());
    assert!(extract(&target, &tokens, &m, &dir, 7, None).unwrap());
    let shard = dir.join("shard-00001.safetensors");
    let written = std::fs::metadata(&shard).unwrap().modified().unwrap();
    // A rerun keeps the shards it finds.
    assert!(extract(&target, &tokens, &m, &dir, 7, None).unwrap());
    assert_eq!(
        std::fs::metadata(&shard).unwrap().modified().unwrap(),
        written
    );
    let cache = FeatureCache::load(&dir, &m).unwrap();
    assert_eq!(cache.len(), 5);

    // Window 3 (second shard), recomputed in one forward: taps and greedy labels agree.
    let window = &cache.tokens[3];
    let pool = PagePool::new(window.len(), 1).unwrap();
    let mut kv = target.new_kv_store(pool.num_slots());
    let mut table = pool.new_table();
    table.reserve(window.len()).unwrap();
    let positions: Vec<usize> = (0..window.len()).collect();
    let batch = ForwardBatch {
        segments: vec![Segment::causal(&table, window, &positions, LogitRows::All)],
        taps: &[0, 1],
    };
    let output = target.forward(&batch, &mut kv).unwrap();
    let labels: Vec<u32> = output.logits.argmax(D::Minus1).unwrap().to_vec1().unwrap();
    assert_eq!(cache.labels[3], labels);
    let direct = Tensor::cat(&output.taps, D::Minus1).unwrap();
    let cached = cache.features(&[3]).unwrap().squeeze(0).unwrap();
    let error: f32 = (cached - &direct)
        .unwrap()
        .abs()
        .unwrap()
        .max_all()
        .unwrap()
        .to_scalar()
        .unwrap();
    let scale: f32 = direct
        .abs()
        .unwrap()
        .max_all()
        .unwrap()
        .to_scalar()
        .unwrap();
    assert!(
        error <= scale * 2e-3,
        "f16 cache error {error} vs scale {scale}"
    );

    // Another target's (or other taps') cache is refused by name.
    let message = FeatureCache::load(&dir, &manifest(&target, vec![1]))
        .unwrap_err()
        .to_string();
    assert!(message.contains("was made for"), "{message}");
}

/// The error loading `drafter` with its `d2t` replaced by `ids`.
fn load_with_d2t(drafter: &Path, target: &Decoder, ids: Vec<i64>, work: &Path) -> String {
    let copy = work.join("bad-drafter");
    std::fs::create_dir_all(&copy).unwrap();
    std::fs::copy(drafter.join("config.json"), copy.join("config.json")).unwrap();
    let mut tensors =
        candle_core::safetensors::load(drafter.join("model.safetensors"), &Device::Cpu).unwrap();
    tensors.insert("d2t".into(), Tensor::new(ids, &Device::Cpu).unwrap());
    candle_core::safetensors::save(&tensors, copy.join("model.safetensors")).unwrap();
    DFlashDrafter::load(&copy, target, |_| None, &Device::Cpu)
        .unwrap_err()
        .to_string()
}

#[test]
fn a_reduced_vocabulary_drafter_trains_from_the_cache_and_drafts_losslessly() {
    let work = tempfile::tempdir().unwrap();
    let target = gguf_target(work.path());
    let mut layers = target.config().clone();
    layers.num_layers = 1;
    let shape = DrafterShape {
        layers,
        target_layer_ids: vec![0, 1],
        block_size: 4,
        mask_token_id: 319,
        d2t: None,
    };
    let run = CachedRun {
        taps_window: 32,
        windows: 12,
        windows_per_shard: 4,
        chunk: 16,
        draft_vocab: Some(48),
        batch_size: 4,
        blocks_per_sequence: 4,
        decay: 0.8,
        eval_prompts: 2,
        eval_prompt_len: 8,
        eval_tokens: 16,
        seed: 2,
    };
    let out = work.path().join("drafter");
    let options = loop_options(work.path().join("work"), 40, 1e-2, 1);
    let state = train_drafter_cached(&target, corpus(4000), &shape, &run, &out, &options)
        .unwrap()
        .expect("no time limit");
    let first = state.losses[0].1 as f64;
    let last = state.recent_loss(5);
    assert!(last < first - 0.5, "drafter loss {first:.3} -> {last:.3}");

    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("config.json")).unwrap()).unwrap();
    assert_eq!(config["dflash_config"]["draft_vocab_size"], 48);
    let drafter = DFlashDrafter::load(&out, &target, |_| None, &Device::Cpu).unwrap();
    assert_eq!(drafter.config().draft_vocab_size, Some(48));

    for (ids, expected) in [
        (vec![5i64; 48], "strictly increasing"),
        ((300..348).collect::<Vec<i64>>(), "is not a token id"),
    ] {
        let message = load_with_d2t(&out, &target, ids, work.path());
        assert!(message.contains(expected), "{message}");
    }

    // Drafts put probability only on the 48 draft tokens.
    let pool = PagePool::new(64, 1).unwrap();
    let mut kv = drafter.new_kv_store(pool.num_slots());
    let mut table = pool.new_table();
    let features = Tensor::randn(0f32, 1.0, (5, 128), &Device::Cpu).unwrap();
    drafter
        .extend_context(&features, &mut table, &mut kv)
        .unwrap();
    let draft = drafter.draft(&target, 21, &mut table, &mut kv).unwrap();
    let vocabulary = drafter.draft_vocabulary().expect("a reduced vocabulary");
    assert_eq!(vocabulary.len(), 48);
    assert_eq!(draft.logits.dims(), [3, 48]);
    let ids: std::collections::BTreeSet<_> = vocabulary.iter().collect();
    assert_eq!(ids.len(), 48, "distinct ids");
    assert!(vocabulary.windows(2).all(|w| w[0] < w[1]) && vocabulary[47] < 320);
    for row in draft.logits.to_vec2::<f32>().unwrap() {
        assert!(row.iter().all(|l| l.is_finite()));
    }

    let prompts = [
        vec![20u32, 23, 26, 29],
        vec![110, 5, 7],
        corpus(40)[9..30].to_vec(),
    ];
    assert_lossless(&target, &drafter, &prompts, 24);
}
