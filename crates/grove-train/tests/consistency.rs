//! The training graphs compute what the inference code computes: a target trained here and
//! loaded by `Decoder` gives the same logits, and a drafter trained here and loaded by
//! `DFlashDrafter` drafts the same logits, for the same weights and inputs.

use candle_core::{DType, Device, Tensor};
use grove_kv::PagePool;
use grove_model::{DFlashDrafter, Decoder, DecoderConfig, ForwardBatch, LogitRows, Model, Segment};
use grove_train::checkpoint::{write_drafter, write_target};
use grove_train::drafter_net::{
    drafter_logits, drafter_params, target_features, DraftBatch, DrafterShape, FrozenTarget,
};
use grove_train::net::{target_forward, target_params};
use grove_train::params::Params;

fn tiny_config(model_type: &str, layers: usize) -> DecoderConfig {
    DecoderConfig::from_json(&serde_json::json!({
        "model_type": model_type, "vocab_size": 64, "hidden_size": 32, "intermediate_size": 48,
        "num_hidden_layers": layers, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 8, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
        "max_position_embeddings": 128, "tie_word_embeddings": true
    }))
    .unwrap()
}

fn max_diff(a: &Tensor, b: &Tensor) -> f32 {
    (a - b)
        .unwrap()
        .abs()
        .unwrap()
        .flatten_all()
        .unwrap()
        .max(0)
        .unwrap()
        .to_scalar()
        .unwrap()
}

/// Biases start at zero; give them values so that a bias the graph forgot would show.
fn randomize_biases(params: &Params) {
    for (name, var) in params.iter() {
        if name.ends_with(".bias") {
            var.set(&Tensor::randn(0f32, 0.5, var.shape(), &Device::Cpu).unwrap())
                .unwrap();
        }
    }
}

#[test]
fn trained_target_and_drafter_match_the_inference_code() {
    // Qwen3 (q/k norms) and Qwen2 (q/k/v biases) layers, for the target and the drafter.
    for model_type in ["qwen3", "qwen2"] {
        check(model_type);
    }
}

fn check(model_type: &str) {
    let config = tiny_config(model_type, 3);
    let params = target_params(&config, 1).unwrap();
    randomize_biases(&params);
    let dir = tempfile::tempdir().unwrap();
    write_target(
        &dir.path().join("target"),
        &config,
        &params,
        DType::F32,
        None,
    )
    .unwrap();
    let decoder = Decoder::load(&dir.path().join("target"), &Device::Cpu).unwrap();

    let tokens: Vec<u32> = vec![5, 17, 3, 42, 8, 8, 61, 0, 29, 33, 12, 7];
    let t = tokens.len();
    let input = Tensor::from_vec(tokens.clone(), (1, t), &Device::Cpu).unwrap();
    let taps = [0usize, 2];
    let (logits, _) = target_forward(&params, &input, &taps, &config).unwrap();

    let pool = PagePool::new(64, 1).unwrap();
    let mut kv = decoder.new_kv_store(pool.num_slots());
    let mut table = pool.new_table();
    table.reserve(t).unwrap();
    let positions: Vec<usize> = (0..t).collect();
    let output = decoder
        .forward(
            &ForwardBatch {
                segments: vec![Segment::causal(&table, &tokens, &positions, LogitRows::All)],
                taps: &taps,
            },
            &mut kv,
        )
        .unwrap();
    let diff = max_diff(&logits.squeeze(0).unwrap(), &output.logits);
    assert!(diff < 1e-4, "target logits differ by {diff}");

    // The drafter: context = the first `anchor` tokens' taps, block at `anchor`.
    let shape = DrafterShape {
        layers: tiny_config(model_type, 2),
        target_layer_ids: taps.to_vec(),
        block_size: 4,
        mask_token_id: 63,
        d2t: None,
    };
    let drafter_weights = drafter_params(&shape, 2).unwrap();
    randomize_biases(&drafter_weights);
    write_drafter(
        &dir.path().join("drafter"),
        &shape,
        &config,
        &drafter_weights,
        DType::F32,
    )
    .unwrap();
    let drafter = DFlashDrafter::load(
        &dir.path().join("drafter"),
        &decoder,
        |_| None,
        &Device::Cpu,
    )
    .unwrap();
    let frozen = FrozenTarget {
        weights: params.frozen(),
        config: config.clone(),
    };
    let features = target_features(&frozen, &input, &taps).unwrap();
    let anchors = [5usize, 8];
    let trained = drafter_logits(
        &drafter_weights,
        &frozen,
        &shape,
        DraftBatch {
            tokens: &input,
            features: &features,
            anchors: &[anchors.to_vec()],
        },
    )
    .unwrap()
    .squeeze(0)
    .unwrap();
    let inference_features = Tensor::cat(&output.taps, 1).unwrap();
    for (block, &anchor) in anchors.iter().enumerate() {
        let dpool = PagePool::new(64, 1).unwrap();
        let mut dkv = drafter.new_kv_store(dpool.num_slots());
        let mut dtable = dpool.new_table();
        drafter
            .extend_context(
                &inference_features.narrow(0, 0, anchor).unwrap(),
                &mut dtable,
                &mut dkv,
            )
            .unwrap();
        let drafted = drafter
            .draft(&decoder, tokens[anchor], &mut dtable, &mut dkv)
            .unwrap();
        let ours = trained.narrow(0, block * 4 + 1, 3).unwrap();
        let diff = max_diff(&ours, &drafted.logits);
        assert!(
            diff < 1e-4,
            "block at {anchor}: drafter logits differ by {diff}"
        );
    }
}
