//! GGUF loading: a checkpoint written as GGUF (qwen2, qwen3 and llama: llama.cpp names,
//! reversed dims, the llama Q/K permutation, Llama 3.1's RoPE factors, F32 and Q8_0 tensors,
//! gpt2 tokenizer metadata) computes what the same checkpoint computes from safetensors; bad
//! files give clear errors, never a panic.

use candle_core::quantized::gguf_file::{self, Value};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{DType, Device, Tensor};
use grove_kv::{KvDtype, PagePool};
use grove_model::config::Family;
use grove_model::gguf::GgufFile;
use grove_model::matrix::Matrix;
use grove_model::weights::Weights;
use grove_model::{Decoder, ForwardBatch, LogitRows, Model, Segment};
use grove_testkit::gguf_writer::{split_gguf, write_gguf};
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
    let families = [
        (Family::Qwen2, "qwen2"),
        (Family::Qwen3, "qwen3"),
        (Family::Llama, "llama"),
    ];
    for (family, arch) in families {
        let dir = tempfile::tempdir().unwrap();
        let spec = RandomCheckpoint {
            // Qwen3's heads are wider than hidden / heads (`key_length`).
            head_dim: if family == Family::Qwen3 { 32 } else { 16 },
            ..checkpoint(family)
        };
        // The llama checkpoint has Llama 3.1's RoPE scaling: its GGUF file carries it as
        // `rope_freqs.weight`.
        spec.write(dir.path()).unwrap();
        let safetensors = Decoder::load(dir.path(), &Device::Cpu).unwrap();
        assert_eq!(
            safetensors.kv_dtype(),
            KvDtype::F32,
            "a checkpoint's KV is f32"
        );
        let reference = logits(&safetensors, &tokens);
        let scale = max_abs(&reference);
        // F32 tensors with an f32 KV cache: the same numbers. Q8_0 (8-bit blocks of 32):
        // quantization error only, a few percent of the logits' range. A GGUF file loads with
        // an f16 KV cache: keys and values rounded to halves (11 bits) move the logits a
        // little.
        for (dtype, kv, tolerance) in [
            (GgmlDType::F32, KvDtype::F32, 1e-4),
            (GgmlDType::F32, KvDtype::F16, 5e-3 * scale),
            (GgmlDType::Q8_0, KvDtype::F16, 0.05 * scale),
            (GgmlDType::F32, KvDtype::Bf16, 4e-2 * scale),
            // F16 matrices, kept in f16: the weights rounded to halves.
            (GgmlDType::F16, KvDtype::F32, 5e-3 * scale),
        ] {
            let path = dir.path().join(format!("model-{dtype:?}.gguf"));
            write_gguf(dir.path(), &spec, arch, dtype, &path);
            let model = Decoder::load(&path, &Device::Cpu).unwrap();
            assert_eq!(model.kv_dtype(), KvDtype::F16, "a GGUF file's KV is f16");
            let model = model.with_kv_dtype(kv);
            let diff = max_abs(&(logits(&model, &tokens) - &reference).unwrap());
            assert!(
                diff < tolerance,
                "{arch} {dtype:?}, {kv} KV: logits differ by {diff} (range {scale})"
            );
            if kv != KvDtype::F32 {
                assert!(
                    diff > 0.0,
                    "{arch} {dtype:?}: the {kv} cache rounded nothing"
                );
            }
        }
        // F16 matrices stay f16 (half the bytes of the f32 copies they were).
        let path = dir.path().join("model-F16.gguf");
        let weights = Weights::gguf(GgufFile::open(&path).unwrap(), &path, &Device::Cpu);
        let shape = [spec.intermediate_size, spec.hidden_size];
        match weights
            .matrix("model.layers.0.mlp.up_proj.weight", &shape)
            .unwrap()
        {
            Matrix::Dense(strips) => assert_eq!(strips.weight_bytes(), 2, "{arch}"),
            Matrix::Quantized(_) => panic!("{arch}: an F16 matrix was quantized"),
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
    assert!(message.contains("type 99 ("), "{message}");
    // A type without a kernel (an MoE file's MXFP4 experts), named with its tensor.
    unknown[type_at..type_at + 4].copy_from_slice(&39u32.to_le_bytes());
    let message = error("mxfp4.gguf", &unknown);
    assert!(
        message.contains("tensor `token_embd.weight`: tensor type 39 (MXFP4) is not supported"),
        "{message}"
    );
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

/// A model cut into shards as llama.cpp's `gguf-split` cuts one loads from any shard's path and
/// computes the whole file's logits bit for bit; a missing, misnamed or mismatched shard is
/// named.
#[test]
fn split_models_load_from_any_shard() {
    let dir = tempfile::tempdir().unwrap();
    let spec = checkpoint(Family::Llama);
    spec.write(dir.path()).unwrap();
    let whole = dir.path().join("whole.gguf");
    write_gguf(dir.path(), &spec, "llama", GgmlDType::Q8_0, &whole);
    let tokens = [1u32, 17, 250, 3, 99];
    let reference = logits(&Decoder::load(&whole, &Device::Cpu).unwrap(), &tokens);
    let bytes = GgufFile::open(&whole).unwrap().weight_bytes_per_token();
    // Metadata alone in the first of three (`--no-tensor-in-metadata`), and tensors in both of two.
    let three = split_gguf(&whole, &dir.path().join("three"), 3, true);
    let two = split_gguf(&whole, &dir.path().join("two"), 2, false);
    let size = |paths: &[std::path::PathBuf]| -> u64 {
        paths
            .iter()
            .map(|p| std::fs::metadata(p).unwrap().len())
            .sum()
    };
    for (split, shard) in [(&three, 0), (&three, 2), (&two, 0), (&two, 1)] {
        let shard = &split[shard];
        let model = Decoder::load(shard, &Device::Cpu).unwrap();
        let diff = max_abs(&(logits(&model, &tokens) - &reference).unwrap());
        assert_eq!(diff, 0.0, "{}", shard.display());
        let file = GgufFile::open(shard).unwrap();
        assert_eq!(file.weight_bytes_per_token(), bytes);
        assert_eq!(file.file_bytes(), size(split));
        assert_eq!(file.tokenizer().unwrap().vocab_size(true), spec.vocab_size);
    }

    let error = |path: &std::path::Path| Decoder::load(path, &Device::Cpu).unwrap_err().to_string();
    // Each case in a folder of its own: the others are found beside the given shard.
    let case = |name: &str| {
        let folder = dir.path().join(name);
        std::fs::create_dir(&folder).unwrap();
        let paths: Vec<_> = three
            .iter()
            .map(|shard| {
                let copy = folder.join(shard.file_name().unwrap());
                std::fs::copy(shard, &copy).unwrap();
                copy
            })
            .collect();
        paths
    };
    let missing = case("missing");
    std::fs::remove_file(&missing[1]).unwrap();
    let message = error(&missing[0]);
    assert!(
        message.contains("three-00002-of-00003.gguf") && message.contains("missing: shard 2 of 3"),
        "{message}"
    );
    let misnamed = case("misnamed");
    let renamed = misnamed[2].with_file_name("model.gguf");
    std::fs::rename(&misnamed[2], &renamed).unwrap();
    let message = error(&renamed);
    assert!(
        message.contains("shard 3 of 3") && message.contains("not named"),
        "{message}"
    );
    // Another split's third shard in this one's place.
    let mixed = case("mixed");
    rewritten(&three[2], &mixed[2], set("split.no", Value::U16(1)));
    let message = error(&mixed[0]);
    assert!(message.contains("do not say shard 3 of 3"), "{message}");
    // A tensor in two shards.
    let twice = case("twice");
    let mut reader = std::fs::File::open(&three[1]).unwrap();
    let content = gguf_file::Content::read(&mut reader).unwrap();
    let (name, _) = content.tensor_infos.iter().next().unwrap();
    let tensor = content.tensor(&mut reader, name, &Device::Cpu).unwrap();
    rewritten(&three[2], &twice[2], |_, tensors| {
        tensors.push((name.clone(), tensor))
    });
    let message = error(&twice[1]);
    assert!(
        message.contains(&format!(
            "tensor `{name}` is in shard 2 and again in shard 3"
        )),
        "{message}"
    );
    // The first shard's count of the model's tensors is checked.
    let short = case("short");
    rewritten(
        &three[0],
        &short[0],
        set("split.tensors.count", Value::I32(1000)),
    );
    let message = error(&short[1]);
    assert!(
        message.contains("`split.tensors.count` says 1000 tensors"),
        "{message}"
    );
}

/// A file's metadata and tensors, as [`rewritten`] edits them.
type Metadata = Vec<(String, Value)>;
type Tensors = Vec<(String, QTensor)>;

/// A [`rewritten`] edit: metadata `key` (present) set to `value`.
fn set(key: &'static str, value: Value) -> impl FnOnce(&mut Metadata, &mut Tensors) {
    move |metadata, _| {
        let entry = metadata.iter_mut().find(|(k, _)| k == key);
        entry.unwrap_or_else(|| panic!("no metadata `{key}`")).1 = value;
    }
}

/// `good` rewritten to `out` after `edit` changed its metadata and tensors.
fn rewritten(
    good: &std::path::Path,
    out: &std::path::Path,
    edit: impl FnOnce(&mut Metadata, &mut Tensors),
) {
    let mut reader = std::fs::File::open(good).unwrap();
    let content = gguf_file::Content::read(&mut reader).unwrap();
    let mut metadata: Metadata = content.metadata.clone().into_iter().collect();
    let mut tensors: Tensors = content
        .tensor_infos
        .keys()
        .map(|name| {
            let tensor = content.tensor(&mut reader, name, &Device::Cpu).unwrap();
            (name.clone(), tensor)
        })
        .collect();
    edit(&mut metadata, &mut tensors);
    let metadata: Vec<(&str, &Value)> = metadata.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let tensors: Vec<(&str, &QTensor)> = tensors.iter().map(|(k, v)| (k.as_str(), v)).collect();
    gguf_file::write(
        &mut std::fs::File::create(out).unwrap(),
        &metadata,
        &tensors,
    )
    .unwrap();
}

/// What a Qwen3 or Llama 3.1 file may carry that grove does not run is refused by name: values
/// wider than keys, RoPE factors of the wrong count or sign.
#[test]
fn unsupported_head_shapes_and_bad_rope_factors_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let load = |path: &std::path::Path| Decoder::load(path, &Device::Cpu).unwrap_err().to_string();
    let spec = checkpoint(Family::Qwen3);
    spec.write(dir.path()).unwrap();
    let good = dir.path().join("qwen3.gguf");
    write_gguf(dir.path(), &spec, "qwen3", GgmlDType::F32, &good);
    let wide = dir.path().join("wide-values.gguf");
    rewritten(
        &good,
        &wide,
        set("qwen3.attention.value_length", Value::U32(32)),
    );
    let message = load(&wide);
    assert!(
        message.contains("`qwen3.attention.value_length` is 32 but the key length is 16"),
        "{message}"
    );

    let spec = checkpoint(Family::Llama);
    spec.write(dir.path()).unwrap();
    let good = dir.path().join("llama.gguf");
    write_gguf(dir.path(), &spec, "llama", GgmlDType::F32, &good);
    let factors = |values: &[f32]| {
        let tensor = Tensor::new(values, &Device::Cpu).unwrap();
        QTensor::quantize(&tensor, GgmlDType::F32).unwrap()
    };
    let replaced = |name: &str, tensor: QTensor| {
        let path = dir.path().join(name);
        rewritten(&good, &path, |_, tensors| {
            for (key, value) in tensors.iter_mut() {
                if key == "rope_freqs.weight" {
                    *value = tensor;
                    return;
                }
            }
            panic!("the llama file has no rope_freqs.weight");
        });
        load(&path)
    };
    let message = replaced("short.gguf", factors(&[1.0; 4]));
    assert!(
        message.contains("tensor `rope_freqs.weight` has shape [4]")
            && message.contains("need [8]"),
        "{message}"
    );
    let message = replaced(
        "negative.gguf",
        factors(&[1.0, 1.0, -8.0, 8.0, 8.0, 8.0, 8.0, 8.0]),
    );
    assert!(
        message.contains("`rope_freqs.weight` holds -8") && message.contains("positive and finite"),
        "{message}"
    );
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
    // Every format with the f16 cache; two with a bf16 cache, whose long rows' pieces run in
    // bfloat16 arithmetic on CPUs with AVX-512 BF16.
    let formats = [
        GgmlDType::Q8_0,
        GgmlDType::Q5_0,
        GgmlDType::Q5_1,
        GgmlDType::Q4_0,
        GgmlDType::Q4_1,
        GgmlDType::Q2K,
        GgmlDType::Q3K,
        GgmlDType::Q4K,
        GgmlDType::Q5K,
        GgmlDType::Q6K,
        GgmlDType::F16,
    ];
    let bf16 = [
        (GgmlDType::Q8_0, KvDtype::Bf16),
        (GgmlDType::Q4K, KvDtype::Bf16),
    ];
    let mut files = Vec::new();
    for (dtype, kv_dtype) in formats.map(|f| (f, KvDtype::F16)).into_iter().chain(bf16) {
        let file = dir.path().join(format!("model-{dtype:?}.gguf"));
        write_gguf(dir.path(), &spec, "qwen2", dtype, &file);
        files.push((format!("{dtype:?}"), file, kv_dtype));
    }
    // IQ4_NL and IQ3_S, which candle cannot write: the Q4_0 file's blocks retyped, and the
    // Q3_K file's (110 bytes each, as IQ3_S's; any bytes are an IQ3_S block), each given its
    // Q3_K scale as `d`.
    let iq4_nl = dir.path().join("model-IQ4_NL.gguf");
    retyped_as_iq4_nl(&dir.path().join("model-Q4_0.gguf"), &iq4_nl);
    files.push(("IQ4_NL".into(), iq4_nl, KvDtype::F16));
    let iq3_s = dir.path().join("model-IQ3_S.gguf");
    retyped(
        &dir.path().join("model-Q3K.gguf"),
        &iq3_s,
        GgmlDType::Q3K,
        21,
        |block| block.copy_within(108..110, 0),
    );
    files.push(("IQ3_S".into(), iq3_s, KvDtype::F16));
    for (dtype, file, kv_dtype) in files {
        let model = Decoder::load(&file, &Device::Cpu)
            .unwrap()
            .with_kv_dtype(kv_dtype);
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
                "{dtype}, {kv_dtype} KV, node {node}"
            );
        }
    }
}

/// `from` (a file whose matrices are Q4_0) with every Q4_0 tensor's type set to IQ4_NL, whose
/// blocks have Q4_0's size and layout (an f16 scale, 16 bytes of nibbles): the same bytes, read
/// as indices into IQ4_NL's values.
fn retyped_as_iq4_nl(from: &std::path::Path, to: &std::path::Path) {
    retyped(from, to, GgmlDType::Q4_0, 20, |_| {});
}

/// The file `from` as `to` with its tensors of type `source` retyped as ggml type id
/// `target` (of the same block size), each block then passed to `edit`.
fn retyped(
    from: &std::path::Path,
    to: &std::path::Path,
    source: GgmlDType,
    target: u32,
    edit: impl Fn(&mut [u8]),
) {
    let mut bytes = std::fs::read(from).unwrap();
    let content = gguf_file::Content::read(&mut std::fs::File::open(from).unwrap()).unwrap();
    let mut retyped = 0;
    for (name, info) in &content.tensor_infos {
        if info.ggml_dtype != source {
            continue;
        }
        // The entry: the name (with its length), the rank, the dims (u64 each), the type.
        let mut entry = (name.len() as u64).to_le_bytes().to_vec();
        entry.extend(name.as_bytes());
        let at = bytes.windows(entry.len()).position(|w| w == entry).unwrap() + entry.len();
        let type_at = at + 4 + 8 * info.shape.rank();
        bytes[type_at..type_at + 4].copy_from_slice(&target.to_le_bytes());
        let start = content.tensor_data_offset as usize + info.offset as usize;
        let size = info.shape.elem_count() / source.block_size() * source.type_size();
        for block in bytes[start..start + size].chunks_exact_mut(source.type_size()) {
            edit(block);
        }
        retyped += 1;
    }
    assert!(retyped > 0, "no {source:?} tensor in {from:?}");
    std::fs::write(to, bytes).unwrap();
}

/// An IQ4_NL file's matrices load into the kernels, and read as f32 (the loader's route for
/// a tensor it does not multiply) they are the same values.
#[test]
fn iq4_nl_tensors_load_quantized_and_as_f32_alike() {
    let dir = tempfile::tempdir().unwrap();
    let spec = RandomCheckpoint {
        hidden_size: 256,
        intermediate_size: 512,
        ..checkpoint(Family::Qwen2)
    };
    spec.write(dir.path()).unwrap();
    let q4_0 = dir.path().join("model-Q4_0.gguf");
    write_gguf(dir.path(), &spec, "qwen2", GgmlDType::Q4_0, &q4_0);
    let path = dir.path().join("model-IQ4_NL.gguf");
    retyped_as_iq4_nl(&q4_0, &path);
    let file = GgufFile::open(&path).unwrap();
    let name = "model.layers.1.mlp.down_proj.weight";
    let matrix = file
        .quantized(name, grove_kernels::quant::MatrixUse::Products)
        .unwrap()
        .expect("kept quantized");
    assert_eq!(matrix.format().name(), "IQ4_NL");
    assert_eq!(matrix.dims(), (spec.hidden_size, spec.intermediate_size));
    let values = file.tensor(name, &Device::Cpu).unwrap();
    assert_eq!(values.dims(), [spec.hidden_size, spec.intermediate_size]);
    let values: Vec<f32> = values.flatten_all().unwrap().to_vec1().unwrap();
    assert_eq!(values, matrix.dequantize());
    // The model runs on it.
    let model = Decoder::load(&path, &Device::Cpu).unwrap();
    assert!(max_abs(&logits(&model, &[1, 2, 3])).is_finite());
}
