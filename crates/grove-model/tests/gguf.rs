//! GGUF loading: a checkpoint written as GGUF (llama.cpp names, reversed dims, the llama Q/K
//! permutation, F32 and Q8_0 tensors, gpt2 tokenizer metadata) computes what the same
//! checkpoint computes from safetensors; bad files give clear errors, never a panic.

use candle_core::quantized::gguf_file::{self, Value};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{DType, Device, Tensor};
use grove_kv::PagePool;
use grove_model::config::Family;
use grove_model::gguf::GgufFile;
use grove_model::{Decoder, ForwardBatch, LogitRows, Model, Segment};
use grove_testkit::gguf_writer::write_gguf;
use grove_testkit::random_checkpoint::RandomCheckpoint;

fn checkpoint(family: Family) -> RandomCheckpoint {
    RandomCheckpoint {
        family,
        vocab_size: 300,
        hidden_size: 64,
        intermediate_size: 96,
        num_layers: 2,
        num_heads: 4,
        num_kv_heads: 2,
        head_dim: 16,
        tie_word_embeddings: family == Family::Qwen2,
        bf16: false,
        with_tokenizer: false,
        max_position_embeddings: 256,
        seed: 4,
    }
}

fn logits(model: &Decoder, tokens: &[u32]) -> Tensor {
    let pool = PagePool::new(64, 1).unwrap();
    let mut kv = model.new_kv_store(pool.num_slots());
    let mut table = pool.new_table();
    table.reserve(tokens.len()).unwrap();
    let positions: Vec<usize> = (0..tokens.len()).collect();
    model
        .forward(
            &ForwardBatch {
                segments: vec![Segment::causal(&table, tokens, &positions, LogitRows::All)],
                taps: &[],
            },
            &mut kv,
        )
        .unwrap()
        .logits
}

/// The largest |x| in `t`.
fn max_abs(t: &Tensor) -> f32 {
    t.abs()
        .and_then(|t| t.flatten_all())
        .and_then(|t| t.max(0))
        .and_then(|t| t.to_scalar())
        .unwrap()
}

#[test]
fn gguf_checkpoints_compute_what_their_safetensors_compute() {
    let tokens = [3u32, 141, 59, 26, 299, 0, 7, 7, 180];
    for (family, arch) in [(Family::Qwen2, "qwen2"), (Family::Llama, "llama")] {
        let dir = tempfile::tempdir().unwrap();
        let spec = checkpoint(family);
        spec.write(dir.path()).unwrap();
        // The GGUF loader does not read rope scaling: compare against a plain-RoPE config.
        let config_path = dir.path().join("config.json");
        let mut config: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&config_path).unwrap()).unwrap();
        config.as_object_mut().unwrap().remove("rope_scaling");
        std::fs::write(&config_path, config.to_string()).unwrap();
        let reference = logits(&Decoder::load(dir.path(), &Device::Cpu).unwrap(), &tokens);
        let scale = max_abs(&reference);
        // F32 tensors: the same numbers. Q8_0 (8-bit blocks of 32): quantization error only,
        // a few percent of the logits' range.
        for (dtype, tolerance) in [(GgmlDType::F32, 1e-4), (GgmlDType::Q8_0, 0.05 * scale)] {
            let path = dir.path().join(format!("model-{dtype:?}.gguf"));
            write_gguf(dir.path(), &spec, arch, dtype, &path);
            let model = Decoder::load(&path, &Device::Cpu).unwrap();
            let diff = max_abs(&(logits(&model, &tokens) - &reference).unwrap());
            assert!(
                diff < tolerance,
                "{arch} {dtype:?}: logits differ by {diff} (range {scale})"
            );
        }
        // Its tokenizer comes from the metadata.
        let file = GgufFile::open(&dir.path().join("model-F32.gguf")).unwrap();
        let tokenizer = file.tokenizer().unwrap();
        assert_eq!(tokenizer.vocab_size(true), spec.vocab_size);
    }
}

#[test]
fn bad_gguf_files_give_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let spec = checkpoint(Family::Qwen2);
    spec.write(dir.path()).unwrap();
    let good = dir.path().join("good.gguf");
    write_gguf(dir.path(), &spec, "qwen2", GgmlDType::F32, &good);
    let bytes = std::fs::read(&good).unwrap();
    let error = |name: &str, data: &[u8]| -> String {
        let path = dir.path().join(name);
        std::fs::write(&path, data).unwrap();
        Decoder::load(&path, &Device::Cpu).unwrap_err().to_string()
    };
    let message = error("magic.gguf", &[b"XXXX".as_slice(), &bytes[4..]].concat());
    assert!(message.contains("not a readable GGUF file"), "{message}");
    let message = error("truncated.gguf", &bytes[..bytes.len() - 1000]);
    assert!(
        message.contains("past the end of the file") && message.contains("truncated"),
        "{message}"
    );
    // An unknown tensor type id (99) in the first tensor's info.
    let name = b"token_embd.weight";
    let at = bytes
        .windows(name.len())
        .position(|w| w == name)
        .expect("tensor info")
        + name.len();
    let dims = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
    let type_at = at + 4 + 8 * dims;
    let mut unknown = bytes.clone();
    unknown[type_at..type_at + 4].copy_from_slice(&99u32.to_le_bytes());
    let message = error("type.gguf", &unknown);
    assert!(message.contains("99"), "{message}");
    let message = error("header.gguf", &bytes[..40]);
    assert!(message.contains("not a readable GGUF file"), "{message}");
    // A missing metadata key is named.
    let tensors =
        candle_core::safetensors::load(dir.path().join("model.safetensors"), &Device::Cpu).unwrap();
    let embed = QTensor::quantize(
        &tensors["model.embed_tokens.weight"]
            .to_dtype(DType::F32)
            .unwrap(),
        GgmlDType::F32,
    )
    .unwrap();
    // Only an architecture and the embeddings: loading must name what is missing.
    let load_with_architecture = |arch: &str| -> String {
        let path = dir.path().join(format!("{arch}-only.gguf"));
        let arch = Value::String(arch.into());
        gguf_file::write(
            &mut std::fs::File::create(&path).unwrap(),
            &[("general.architecture", &arch)],
            &[("token_embd.weight", &embed)],
        )
        .unwrap();
        Decoder::load(&path, &Device::Cpu).unwrap_err().to_string()
    };
    let message = load_with_architecture("qwen2");
    assert!(message.contains("qwen2.embedding_length"), "{message}");
    // An architecture it does not implement is refused by name.
    let message = load_with_architecture("mamba");
    assert!(message.contains("mamba"), "{message}");
}

/// A quantized model's tree rows compute exactly (bit for bit) what their ancestor paths run
/// causally compute, over a context long enough for attention's pieces, in every block
/// format: the products, attention and the rest give a row the same bits whatever rows are
/// computed beside it, which a lossless verify needs (the kernels this CPU allows; CI runs
/// this again under `GROVE_KERNEL=scalar`).
#[test]
fn quantized_tree_rows_equal_their_ancestor_paths_bit_for_bit() {
    use grove_model::Visibility;
    let spec = RandomCheckpoint {
        hidden_size: 256,
        intermediate_size: 512,
        head_dim: 64,
        max_position_embeddings: 1024,
        ..checkpoint(Family::Qwen2)
    };
    let context: Vec<u32> = (0..300u32).map(|i| (i * 37 + 11) % 300).collect();
    // Root 0; children 1, 2; 3 under 1; 4 under 3; 5 under 2; 6 under 1.
    let parents = vec![None, Some(0), Some(0), Some(1), Some(3), Some(2), Some(1)];
    let tokens: Vec<u32> = vec![11, 30, 31, 40, 50, 60, 41];
    let path = |node: usize| {
        let mut path = vec![node];
        while let Some(p) = parents[*path.last().unwrap()] {
            path.push(p);
        }
        path.reverse();
        path
    };
    let dir = tempfile::tempdir().unwrap();
    spec.write(dir.path()).unwrap();
    for dtype in [
        GgmlDType::Q8_0,
        GgmlDType::Q5_0,
        GgmlDType::Q5_1,
        GgmlDType::Q4_0,
        GgmlDType::Q4K,
        GgmlDType::Q5K,
        GgmlDType::Q6K,
    ] {
        let file = dir.path().join(format!("model-{dtype:?}.gguf"));
        write_gguf(dir.path(), &spec, "qwen2", dtype, &file);
        let model = Decoder::load(&file, &Device::Cpu).unwrap();
        let pool = PagePool::new(context.len() + 16, 1).unwrap();
        let mut kv = model.new_kv_store(pool.num_slots());
        let mut table = pool.new_table();
        table.reserve(context.len() + tokens.len()).unwrap();
        let positions: Vec<usize> = (0..context.len()).collect();
        let prefill = Segment::causal(&table, &context, &positions, LogitRows::None);
        let batch = ForwardBatch {
            segments: vec![prefill],
            taps: &[],
        };
        model.forward(&batch, &mut kv).unwrap();
        table.append(context.len());
        let positions: Vec<usize> = (0..tokens.len())
            .map(|node| context.len() + path(node).len() - 1)
            .collect();
        let tree = Segment {
            table: &table,
            context_len: table.len(),
            tokens: &tokens,
            positions: &positions,
            visibility: Visibility::Tree {
                parents: parents.clone(),
            },
            logits: LogitRows::All,
        };
        let batch = ForwardBatch {
            segments: vec![tree],
            taps: &[],
        };
        let tree = model.forward(&batch, &mut kv).unwrap();
        for node in 0..tokens.len() {
            // The path as plain causal rows after the same committed context (never committed:
            // each path writes over the slots the tree used).
            let path_tokens: Vec<u32> = path(node).iter().map(|&i| tokens[i]).collect();
            let positions: Vec<usize> = (0..path_tokens.len()).map(|i| context.len() + i).collect();
            let chain = Segment::causal(&table, &path_tokens, &positions, LogitRows::All);
            let batch = ForwardBatch {
                segments: vec![chain],
                taps: &[],
            };
            let chain = model.forward(&batch, &mut kv).unwrap();
            let bits = |row: Vec<f32>| row.into_iter().map(f32::to_bits).collect::<Vec<_>>();
            assert_eq!(
                bits(tree.logits_row(node).unwrap()),
                bits(chain.logits_row(path_tokens.len() - 1).unwrap()),
                "{dtype:?} node {node}"
            );
        }
    }
}
