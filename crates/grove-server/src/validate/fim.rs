//! Completions' `suffix`: the fill-in-the-middle prompt in the vocabulary's own tokens.

use grove_core::{TokenId, ValidationError};
use grove_model::TextTokenizer;

use super::ModelLimits;

/// A vocabulary's fill-in-the-middle tokens (Qwen2.5-Coder's `<|fim_prefix|>` names, or
/// StarCoder's `<fim_prefix>`), and the tokens that end a middle.
#[derive(Debug)]
pub(super) struct FimTokens {
    prefix: TokenId,
    suffix: TokenId,
    middle: TokenId,
    pub stops: Vec<TokenId>,
}

impl FimTokens {
    pub fn of(tokenizer: &TextTokenizer) -> Option<Self> {
        let id = |name: &str| tokenizer.token_to_id(name);
        let named = |open: &str, close: &str| {
            Some((
                id(&format!("{open}fim_prefix{close}"))?,
                id(&format!("{open}fim_suffix{close}"))?,
                id(&format!("{open}fim_middle{close}"))?,
                id(&format!("{open}fim_pad{close}")),
            ))
        };
        let (prefix, suffix, middle, pad) = named("<|", "|>").or_else(|| named("<", ">"))?;
        let stops = [id("<|endoftext|>"), pad].into_iter().flatten().collect();
        Some(Self {
            prefix,
            suffix,
            middle,
            stops,
        })
    }

    /// The prefix-suffix-middle prompt: `<fim_prefix>` prefix `<fim_suffix>` suffix
    /// `<fim_middle>`, the two texts encoded without special tokens (either may be empty).
    pub fn prompt(
        &self,
        limits: &ModelLimits,
        prefix: &str,
        suffix: &str,
    ) -> Result<Vec<TokenId>, ValidationError> {
        let encode = |text: &str, field| {
            if text.is_empty() {
                Ok(Vec::new())
            } else {
                limits.encode(text, field, false)
            }
        };
        let mut prompt = vec![self.prefix];
        prompt.extend(encode(prefix, "prompt")?);
        prompt.push(self.suffix);
        prompt.extend(encode(suffix, "suffix")?);
        prompt.push(self.middle);
        Ok(prompt)
    }
}
