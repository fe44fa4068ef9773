use crate::TokenId;

/// Why a sequence stopped. Serialized as OpenAI's `finish_reason`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FinishReason {
    /// An end-of-sequence token or a stop string was produced.
    Stop,
    /// `max_new_tokens` was reached.
    Length,
}

/// When a sequence ends. A stop token ends the sequence and is kept in the token ids (as HF and
/// vLLM do) but never rendered into text; text is cut before a stop string.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StopCondition {
    pub max_new_tokens: usize,
    pub stop_token_ids: Vec<TokenId>,
    pub stop_strings: Vec<String>,
}

impl StopCondition {
    pub fn is_stop_token(&self, token: TokenId) -> bool {
        self.stop_token_ids.contains(&token)
    }
}
