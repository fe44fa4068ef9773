//! The tokenizer of a GGUF file, rebuilt from its `tokenizer.ggml.*` metadata into a
//! `tokenizers` tokenizer: `gpt2` byte-level BPE (vocabulary, merges, the pre-tokenizer regex
//! named by `tokenizer.ggml.pre`) or `llama` SentencePiece (vocabulary and scores), control and
//! user-defined tokens as special tokens, BOS when `tokenizer.ggml.add_bos_token` says so, and
//! `tokenizer.chat_template`.
//!
//! SentencePiece as llama.cpp runs it: spaces become `▁` (and one is prepended unless
//! `tokenizer.ggml.add_space_prefix` is false), then [`crate::sentencepiece`] merges by score.

use std::collections::HashMap;
use std::path::Path;

use candle_core::quantized::gguf_file::Value;
use tokenizers::models::bpe::BPE;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::processors::template::TemplateProcessing;
use tokenizers::{
    AddedToken, DecoderWrapper, Model, NormalizerWrapper, PostProcessorWrapper,
    PreTokenizerWrapper, SplitDelimiterBehavior, Tokenizer, TokenizerImpl,
};

use crate::sentencepiece::SentencePiece;
use crate::tokenizer::{Backend, SentencePieceTokenizer, TextTokenizer};
use crate::ModelError;

/// Qwen2's split (from its `tokenizer.json`; llama.cpp's `qwen2` pre-tokenizer).
const QWEN2_PATTERN: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Llama 3's split (llama.cpp's `llama-bpe`).
const LLAMA3_PATTERN: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// GPT-2's split, the default.
const GPT2_PATTERN: &str =
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";

/// llama.cpp's token types that are matched whole before the model runs (normal and unknown
/// are in [`crate::sentencepiece`]).
const CONTROL: i64 = 3;
const USER_DEFINED: i64 = 4;

fn as_i64(value: &Value) -> Option<i64> {
    match value {
        Value::I32(v) => Some(*v as i64),
        Value::U32(v) => Some(*v as i64),
        Value::I64(v) => Some(*v),
        Value::U64(v) => Some(*v as i64),
        Value::I8(v) => Some(*v as i64),
        Value::U8(v) => Some(*v as i64),
        Value::I16(v) => Some(*v as i64),
        Value::U16(v) => Some(*v as i64),
        _ => None,
    }
}

/// gpt2-style byte-level BPE with the split regex `pre` names.
fn byte_level_tokenizer(
    tokens: &[String],
    merges: Vec<(String, String)>,
    pre: &str,
) -> Result<Tokenizer, String> {
    let vocab: tokenizers::models::bpe::Vocab = tokens
        .iter()
        .enumerate()
        .map(|(i, t)| (t.clone(), i as u32))
        .collect();
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .build()
        .map_err(|e| format!("building the BPE model: {e}"))?;
    let pattern = match pre {
        "qwen2" => QWEN2_PATTERN,
        "llama-bpe" => LLAMA3_PATTERN,
        _ => GPT2_PATTERN,
    };
    let split = Split::new(
        SplitPattern::Regex(pattern.into()),
        SplitDelimiterBehavior::Isolated,
        false,
    )
    .map_err(|e| format!("pre-tokenizer regex: {e}"))?;
    let pre_tokenizer = Sequence::new(vec![
        PreTokenizerWrapper::Split(split),
        PreTokenizerWrapper::ByteLevel(ByteLevel::new(false, false, false)),
    ]);
    let mut tokenizer = Tokenizer::new(bpe);
    tokenizer
        .with_pre_tokenizer(Some(pre_tokenizer))
        .with_decoder(Some(ByteLevel::default()));
    Ok(tokenizer)
}

/// SentencePiece (llama.cpp's `llama` tokenizer): our compact model behind `tokenizers`'
/// normalizers and decoders; see [`crate::sentencepiece`].
fn sentencepiece_tokenizer(
    tokens: &[String],
    types: &[i64],
    scores: &[f32],
    add_space_prefix: bool,
) -> Result<SentencePieceTokenizer, String> {
    use tokenizers::decoders::byte_fallback::ByteFallback;
    use tokenizers::decoders::fuse::Fuse;
    use tokenizers::decoders::sequence::Sequence as DecoderSequence;
    use tokenizers::decoders::strip::Strip;
    use tokenizers::normalizers::{Prepend, Replace};

    let mut tokenizer = TokenizerImpl::new(SentencePiece::new(tokens, types, scores)?);
    let mut normalizers = Vec::new();
    if add_space_prefix {
        normalizers.push(NormalizerWrapper::Prepend(Prepend::new("▁".into())));
    }
    normalizers.push(NormalizerWrapper::Replace(
        Replace::new(" ", "▁").map_err(|e| e.to_string())?,
    ));
    tokenizer
        .with_normalizer(Some(NormalizerWrapper::Sequence(
            tokenizers::normalizers::Sequence::new(normalizers),
        )))
        .map_err(|e| format!("normalizer: {e}"))?;
    let mut decoders = vec![
        DecoderWrapper::Replace(Replace::new("▁", " ").map_err(|e| e.to_string())?),
        DecoderWrapper::ByteFallback(ByteFallback::default()),
        DecoderWrapper::Fuse(Fuse::default()),
    ];
    if add_space_prefix {
        decoders.push(DecoderWrapper::Strip(Strip::new(' ', 1, 0)));
    }
    tokenizer.with_decoder(Some(DecoderWrapper::Sequence(DecoderSequence::new(
        decoders,
    ))));
    Ok(tokenizer)
}

/// What both kinds share: control and user-defined pieces matched whole in the input before
/// the model runs (control ones are special, left out of decoded text; user-defined ones are
/// text: Gemma's whitespace runs, Qwen's FIM markers, as llama.cpp's detokenizer treats them),
/// and BOS when the file asks for it.
fn finish<M: Model>(
    tokenizer: &mut TokenizerImpl<
        M,
        NormalizerWrapper,
        PreTokenizerWrapper,
        PostProcessorWrapper,
        DecoderWrapper,
    >,
    tokens: &[String],
    types: &[i64],
    bos_template: Option<PostProcessorWrapper>,
) -> Result<(), String> {
    let added = |kind: i64, special: bool| -> Vec<AddedToken> {
        tokens
            .iter()
            .zip(types)
            .filter(|(_, &t)| t == kind)
            .map(|(token, _)| AddedToken::from(token.clone(), special).normalized(false))
            .collect()
    };
    tokenizer
        .add_special_tokens(added(CONTROL, true))
        .map_err(|e| format!("special tokens: {e}"))?;
    tokenizer
        .add_tokens(added(USER_DEFINED, false))
        .map_err(|e| format!("user-defined tokens: {e}"))?;
    tokenizer.with_post_processor(bos_template);
    Ok(())
}

/// The post-processor that puts `bos` before every sequence (and pair).
fn bos_template(tokens: &[String], bos: u32) -> Result<PostProcessorWrapper, String> {
    let name = tokens
        .get(bos as usize)
        .ok_or_else(|| format!("bos id {bos} is outside the vocabulary"))?;
    let processor = TemplateProcessing::builder()
        .try_single(format!("{name} $A"))
        .and_then(|b| b.try_pair(format!("{name} $A {name} $B")))
        .map_err(|e| format!("bos template: {e}"))?
        .special_tokens(vec![(name.clone(), bos)])
        .build()
        .map_err(|e| format!("bos template: {e}"))?;
    Ok(PostProcessorWrapper::Template(processor))
}

pub(crate) fn build(
    metadata: &HashMap<String, Value>,
    path: &Path,
) -> Result<TextTokenizer, ModelError> {
    let error = |message: String| ModelError::Tokenizer {
        path: path.to_owned(),
        message,
    };
    let strings = |key: &str| -> Result<Vec<String>, ModelError> {
        match metadata.get(key) {
            Some(Value::Array(values)) => values
                .iter()
                .map(|v| match v {
                    Value::String(s) => Ok(s.clone()),
                    _ => Err(error(format!("`{key}` must hold strings"))),
                })
                .collect(),
            _ => Err(error(format!("missing metadata key `{key}`"))),
        }
    };
    let id = |key: &str| metadata.get(key).and_then(as_i64).map(|v| v as u32);
    let sentencepiece = match metadata.get("tokenizer.ggml.model") {
        Some(Value::String(model)) if model == "gpt2" => false,
        Some(Value::String(model)) if model == "llama" => true,
        Some(Value::String(model)) => {
            return Err(error(format!(
                "`tokenizer.ggml.model` is `{model}`; supported: gpt2 (byte-level BPE), llama \
                 (SentencePiece)"
            )))
        }
        _ => return Err(error("missing metadata key `tokenizer.ggml.model`".into())),
    };
    let tokens = strings("tokenizer.ggml.tokens")?;
    let types: Vec<i64> = match metadata.get("tokenizer.ggml.token_type") {
        Some(Value::Array(values)) => values.iter().map(|v| as_i64(v).unwrap_or(1)).collect(),
        _ => vec![1; tokens.len()],
    };
    let bos = id("tokenizer.ggml.bos_token_id");
    let add_bos = matches!(
        metadata.get("tokenizer.ggml.add_bos_token"),
        Some(Value::Bool(true))
    );
    let bos_template = match (add_bos, bos) {
        (true, Some(bos)) => Some(bos_template(&tokens, bos).map_err(error)?),
        _ => None,
    };
    let backend = if sentencepiece {
        let scores: Vec<f32> = match metadata.get("tokenizer.ggml.scores") {
            Some(Value::Array(values)) => values
                .iter()
                .map(|v| v.to_f32().map_err(|e| error(format!("scores: {e}"))))
                .collect::<Result<_, _>>()?,
            _ => return Err(error("missing metadata key `tokenizer.ggml.scores`".into())),
        };
        let add_space_prefix = !matches!(
            metadata.get("tokenizer.ggml.add_space_prefix"),
            Some(Value::Bool(false))
        );
        let mut tokenizer =
            sentencepiece_tokenizer(&tokens, &types, &scores, add_space_prefix).map_err(error)?;
        finish(&mut tokenizer, &tokens, &types, bos_template).map_err(error)?;
        Backend::SentencePiece(Box::new(tokenizer))
    } else {
        let merges: Vec<(String, String)> = strings("tokenizer.ggml.merges")?
            .into_iter()
            .map(|m| {
                m.split_once(' ')
                    .map(|(a, b)| (a.to_owned(), b.to_owned()))
                    .ok_or_else(|| error(format!("merge `{m}` is not two tokens")))
            })
            .collect::<Result<_, _>>()?;
        let pre = match metadata.get("tokenizer.ggml.pre") {
            Some(Value::String(pre)) => pre.as_str(),
            _ => "",
        };
        let mut tokenizer = byte_level_tokenizer(&tokens, merges, pre).map_err(error)?;
        finish(&mut tokenizer, &tokens, &types, bos_template).map_err(error)?;
        Backend::Tokenizers(Box::new(tokenizer))
    };
    let template = match metadata.get("tokenizer.chat_template") {
        Some(Value::String(t)) => Some(t.clone()),
        _ => None,
    };
    let token_name = |id: Option<u32>| id.and_then(|i| tokens.get(i as usize).cloned());
    Ok(
        TextTokenizer::from_backend(backend, template).with_special_tokens(
            token_name(bos),
            token_name(id("tokenizer.ggml.eos_token_id")),
        ),
    )
}
