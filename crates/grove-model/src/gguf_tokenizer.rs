//! The tokenizer of a GGUF file, rebuilt from its `tokenizer.ggml.*` metadata into a
//! `tokenizers` tokenizer: `gpt2` byte-level BPE (vocabulary, merges, the pre-tokenizer regex
//! named by `tokenizer.ggml.pre`), control and user-defined tokens as special tokens, BOS when
//! `tokenizer.ggml.add_bos_token` says so, and `tokenizer.chat_template`.

use std::collections::HashMap;
use std::path::Path;

use candle_core::quantized::gguf_file::Value;
use tokenizers::models::bpe::BPE;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::processors::template::TemplateProcessing;
use tokenizers::{AddedToken, PreTokenizerWrapper, SplitDelimiterBehavior, Tokenizer};

use crate::tokenizer::TextTokenizer;
use crate::ModelError;

/// Qwen2's split (from its `tokenizer.json`; llama.cpp's `qwen2` pre-tokenizer).
const QWEN2_PATTERN: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Llama 3's split (llama.cpp's `llama-bpe`).
const LLAMA3_PATTERN: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// GPT-2's split, the default.
const GPT2_PATTERN: &str =
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";

/// llama.cpp's token types that are special (control, user-defined).
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
    match metadata.get("tokenizer.ggml.model") {
        Some(Value::String(model)) if model == "gpt2" => {}
        Some(Value::String(model)) => {
            return Err(error(format!(
                "`tokenizer.ggml.model` is `{model}`; supported: gpt2 (byte-level BPE)"
            )))
        }
        _ => return Err(error("missing metadata key `tokenizer.ggml.model`".into())),
    }
    let tokens = strings("tokenizer.ggml.tokens")?;
    let merges: Vec<(String, String)> = strings("tokenizer.ggml.merges")?
        .into_iter()
        .map(|m| {
            m.split_once(' ')
                .map(|(a, b)| (a.to_owned(), b.to_owned()))
                .ok_or_else(|| error(format!("merge `{m}` is not two tokens")))
        })
        .collect::<Result<_, _>>()?;
    let types: Vec<i64> = match metadata.get("tokenizer.ggml.token_type") {
        Some(Value::Array(values)) => values.iter().map(|v| as_i64(v).unwrap_or(1)).collect(),
        _ => vec![1; tokens.len()],
    };
    let vocab: tokenizers::models::bpe::Vocab = tokens
        .iter()
        .enumerate()
        .map(|(i, t)| (t.clone(), i as u32))
        .collect();
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .build()
        .map_err(|e| error(format!("building the BPE model: {e}")))?;
    let pattern = match metadata.get("tokenizer.ggml.pre") {
        Some(Value::String(pre)) if pre == "qwen2" => QWEN2_PATTERN,
        Some(Value::String(pre)) if pre == "llama-bpe" => LLAMA3_PATTERN,
        _ => GPT2_PATTERN,
    };
    let split = Split::new(
        SplitPattern::Regex(pattern.into()),
        SplitDelimiterBehavior::Isolated,
        false,
    )
    .map_err(|e| error(format!("pre-tokenizer regex: {e}")))?;
    let pre_tokenizer = Sequence::new(vec![
        PreTokenizerWrapper::Split(split),
        PreTokenizerWrapper::ByteLevel(ByteLevel::new(false, false, false)),
    ]);
    let mut tokenizer = Tokenizer::new(bpe);
    tokenizer
        .with_pre_tokenizer(Some(pre_tokenizer))
        .with_decoder(Some(ByteLevel::default()));
    let special: Vec<AddedToken> = tokens
        .iter()
        .zip(&types)
        .filter(|(_, &t)| t == CONTROL || t == USER_DEFINED)
        .map(|(token, _)| AddedToken::from(token.clone(), true))
        .collect();
    tokenizer
        .add_special_tokens(special)
        .map_err(|e| error(format!("special tokens: {e}")))?;
    let bos = id("tokenizer.ggml.bos_token_id");
    let add_bos = matches!(
        metadata.get("tokenizer.ggml.add_bos_token"),
        Some(Value::Bool(true))
    );
    if let (true, Some(bos)) = (add_bos, bos) {
        let name = tokens
            .get(bos as usize)
            .ok_or_else(|| error(format!("bos id {bos} is outside the vocabulary")))?;
        let processor = TemplateProcessing::builder()
            .try_single(format!("{name} $A"))
            .and_then(|b| b.try_pair(format!("{name} $A {name} $B")))
            .map_err(|e| error(format!("bos template: {e}")))?
            .special_tokens(vec![(name.clone(), bos)])
            .build()
            .map_err(|e| error(format!("bos template: {e}")))?;
        tokenizer.with_post_processor(Some(processor));
    }
    let template = match metadata.get("tokenizer.chat_template") {
        Some(Value::String(t)) => Some(t.clone()),
        _ => None,
    };
    let token_name = |id: Option<u32>| id.and_then(|i| tokens.get(i as usize).cloned());
    Ok(
        TextTokenizer::from_tokenizer(tokenizer, template).with_special_tokens(
            token_name(bos),
            token_name(id("tokenizer.ggml.eos_token_id")),
        ),
    )
}
