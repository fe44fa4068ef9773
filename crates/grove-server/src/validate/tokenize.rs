//! vLLM's `/tokenize` and `/detokenize`: the token ids the server would run for a prompt or a
//! chat's messages, and text for token ids.

use grove_core::{TokenId, ValidationError};
use serde::Deserialize;
use serde_json::Value;

use super::ModelLimits;
use crate::protocol::Message;

/// A prompt to encode as completions would, or messages to render and encode as chat would.
#[derive(Debug, Deserialize)]
pub struct TokenizeRequest {
    pub model: Option<String>,
    pub prompt: Option<String>,
    /// With `prompt`: add the tokenizer's special tokens (BOS) as completions do (default).
    pub add_special_tokens: Option<bool>,
    pub messages: Option<Vec<Message>>,
    /// With `messages`: the tools the template writes into the prompt.
    pub tools: Option<Value>,
    pub chat_template_kwargs: Option<Value>,
}

#[derive(Debug, Deserialize)]
pub struct DetokenizeRequest {
    pub model: Option<String>,
    pub tokens: Vec<i64>,
}

impl ModelLimits {
    /// The token ids of `request`'s prompt, or of its messages as the chat template renders
    /// them: what `/v1/completions` or `/v1/chat/completions` would run.
    pub fn tokenize(&self, request: TokenizeRequest) -> Result<Vec<TokenId>, ValidationError> {
        match (request.prompt, request.messages) {
            (Some(prompt), None) => self.encode(
                &prompt,
                "prompt",
                request.add_special_tokens.unwrap_or(true),
            ),
            (None, Some(messages)) => {
                let tools = crate::tools::tools(request.tools, None)?;
                let definitions = tools.as_ref().map_or(&[][..], |t| &t.definitions);
                let (_, prompt) =
                    self.chat_prompt(messages, definitions, request.chat_template_kwargs)?;
                Ok(prompt)
            }
            _ => Err(ValidationError::Missing {
                field: "prompt` or `messages".into(),
            }),
        }
    }

    /// The text of token ids (special tokens left out, as completions' text leaves them).
    pub fn detokenize(&self, tokens: &[i64]) -> Result<String, ValidationError> {
        let ids = self.token_ids(tokens, "tokens")?;
        let tokenizer = self.tokenizer("tokens")?;
        tokenizer
            .decode(&ids)
            .map_err(|e| ValidationError::Tokenize {
                field: "tokens",
                reason: e.to_string(),
            })
    }
}
