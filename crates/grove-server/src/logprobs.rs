//! The `logprobs` objects of responses and chunks, in each endpoint's OpenAI shape.
//!
//! Chat: `{"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob",
//! "bytes"}]}], "refusal": null}`. Completions (the legacy shape): `{"tokens",
//! "token_logprobs", "top_logprobs": [{token: logprob}], "text_offset"}`, each position's
//! alternatives with the chosen token among them (up to `logprobs + 1`, as OpenAI documents).
//! A token's text is the token decoded alone, special tokens written out (a token holding part
//! of a character decodes to U+FFFD; `bytes` are that text's UTF-8); `text_offset` counts characters from the start of
//! the completion's text, token texts laid end to end. A log-probability of minus infinity (a
//! token the model rules out) is written -9999.0, as vLLM does: JSON has no infinities.

use grove_engine::TokenLogprob;
use grove_model::TextTokenizer;
use serde_json::{json, Map, Value};

/// Where a JSON number cannot be minus infinity.
const RULED_OUT: f32 = -9999.0;

/// Decodes tokens one at a time for their `logprobs` entries.
pub(crate) struct TokenTexts<'a> {
    tokenizer: Option<&'a TextTokenizer>,
}

impl<'a> TokenTexts<'a> {
    pub fn new(tokenizer: Option<&'a TextTokenizer>) -> Self {
        Self { tokenizer }
    }

    /// The token's text alone (`token_id:N` for a model served without a tokenizer).
    fn text(&self, token: u32) -> String {
        self.tokenizer
            .and_then(|t| t.token_text(token).ok())
            .unwrap_or_else(|| format!("token_id:{token}"))
    }

    /// Chat's `logprobs` for these tokens.
    pub fn chat(&self, logprobs: &[TokenLogprob]) -> Value {
        let entry = |token: u32, logprob: f32| {
            let text = self.text(token);
            json!({"token": text, "logprob": finite(logprob), "bytes": text.as_bytes()})
        };
        let content: Vec<Value> = logprobs
            .iter()
            .map(|lp| {
                let mut chosen = entry(lp.token, lp.logprob);
                let top: Vec<Value> = lp.top.iter().map(|&(t, l)| entry(t, l)).collect();
                chosen["top_logprobs"] = json!(top);
                chosen
            })
            .collect();
        json!({"content": content, "refusal": null})
    }

    /// Completions' `logprobs` for these tokens, the first at character `offset` of the
    /// completion's text; returns it and the offset after the last token.
    pub fn completion(&self, logprobs: &[TokenLogprob], mut offset: usize) -> (Value, usize) {
        let (mut tokens, mut values, mut tops, mut offsets) = (vec![], vec![], vec![], vec![]);
        for lp in logprobs {
            let text = self.text(lp.token);
            let mut top = Map::new();
            for &(token, logprob) in &lp.top {
                top.insert(self.text(token), json!(finite(logprob)));
            }
            top.insert(text.clone(), json!(finite(lp.logprob)));
            offsets.push(offset);
            offset += text.chars().count();
            tokens.push(text);
            values.push(finite(lp.logprob));
            tops.push(Value::Object(top));
        }
        let value = json!({
            "tokens": tokens,
            "token_logprobs": values,
            "top_logprobs": tops,
            "text_offset": offsets,
        });
        (value, offset)
    }
}

impl TokenTexts<'_> {
    /// Completions' `logprobs` with the prompt echoed: its first token (which nothing
    /// scores: `null` where the others have values) and the scored rest, then the completion's
    /// tokens, offsets running from the prompt's start.
    pub fn completion_echo(
        &self,
        first: u32,
        prompt: &[TokenLogprob],
        generated: &[TokenLogprob],
    ) -> Value {
        let text = self.text(first);
        let (rest, offset) = self.completion(prompt, text.chars().count());
        let (completion, _) = self.completion(generated, offset);
        let mut joined = json!({
            "tokens": [text],
            "token_logprobs": [null],
            "top_logprobs": [null],
            "text_offset": [0],
        });
        for key in ["tokens", "token_logprobs", "top_logprobs", "text_offset"] {
            let list = joined[key].as_array_mut().expect("a list");
            for part in [&rest, &completion] {
                list.extend(part[key].as_array().expect("a list").iter().cloned());
            }
        }
        joined
    }
}

fn finite(logprob: f32) -> f32 {
    if logprob.is_finite() {
        logprob
    } else {
        RULED_OUT
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lp(token: u32, logprob: f32, top: &[(u32, f32)]) -> TokenLogprob {
        TokenLogprob {
            token,
            logprob,
            top: top.to_vec(),
        }
    }

    #[test]
    fn chat_and_completion_shapes_carry_every_token_and_its_alternatives() {
        let texts = TokenTexts::new(None);
        let lps = [
            lp(7, -0.25, &[(7, -0.25), (9, -1.5)]),
            lp(3, f32::NEG_INFINITY, &[]),
        ];
        let chat = texts.chat(&lps);
        let content = chat["content"].as_array().unwrap();
        assert_eq!(content.len(), 2);
        assert_eq!(content[0]["token"], "token_id:7");
        assert_eq!(content[0]["logprob"], -0.25);
        assert_eq!(content[0]["bytes"], json!("token_id:7".as_bytes()));
        assert_eq!(content[0]["top_logprobs"][1]["token"], "token_id:9");
        assert_eq!(content[1]["logprob"], -9999.0);
        assert_eq!(content[1]["top_logprobs"], json!([]));

        let (completion, end) = texts.completion(&lps, 5);
        assert_eq!(completion["tokens"], json!(["token_id:7", "token_id:3"]));
        assert_eq!(completion["token_logprobs"], json!([-0.25, -9999.0]));
        assert_eq!(completion["text_offset"], json!([5, 15]));
        assert_eq!(end, 25);
        let first = completion["top_logprobs"][0].as_object().unwrap();
        assert_eq!(
            first.len(),
            2,
            "the chosen token is one of the alternatives here"
        );
        assert_eq!(first["token_id:9"], -1.5);
        assert_eq!(
            completion["top_logprobs"][1],
            json!({"token_id:3": -9999.0}),
            "the chosen token is always listed"
        );
    }
}
