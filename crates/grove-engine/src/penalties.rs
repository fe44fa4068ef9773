//! OpenAI's presence and frequency penalties and `logit_bias`: adjustments to the target's
//! logits before sampling, which depend on the tokens generated so far.
//!
//! OpenAI defines them on the logits of each position: `logit[j] - count[j] * frequency -
//! (count[j] > 0) * presence + bias[j]`, with `count[j]` the times token `j` was generated
//! before that position (the prompt does not count). In a speculative round the position of a
//! tree node comes after the tokens emitted so far *and* the drafts on the node's path, so a
//! node's row is adjusted with both: what plain decoding would have generated before it, had it
//! reached that node. The walk samples each visited node from its adjusted row, so speculation
//! stays lossless (the tests compare it with plain decoding, greedy and seeded). Log-probabilities
//! stay the raw logits' (`logprobs.rs`).

use std::collections::HashMap;

use grove_core::{TokenId, ValidationError};

/// Bounds OpenAI sets on the fields.
pub const MAX_PENALTY: f32 = 2.0;
pub const MAX_LOGIT_BIAS: f32 = 100.0;

/// A request's adjustments of the target's logits (none by default).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LogitAdjustments {
    /// Subtracted once from the logit of every token generated at least once.
    pub presence_penalty: f32,
    /// Subtracted from a token's logit once per time it was generated.
    pub frequency_penalty: f32,
    /// Added to the logits of these tokens, by id (each id once).
    pub logit_bias: Vec<(TokenId, f32)>,
}

impl LogitAdjustments {
    /// Adjusts nothing: rows are sampled as the target wrote them.
    pub fn is_none(&self) -> bool {
        self.presence_penalty == 0.0 && self.frequency_penalty == 0.0 && self.logit_bias.is_empty()
    }

    /// Checks the fields against OpenAI's limits, and each biased id against `vocab`.
    pub fn validate(&self, vocab: usize) -> Result<(), ValidationError> {
        let penalty = |field, value: f32| {
            if value.is_finite() && value.abs() <= MAX_PENALTY {
                Ok(())
            } else {
                Err(ValidationError::OutOfRange {
                    field,
                    limit: "in [-2, 2]",
                    value: value.to_string(),
                })
            }
        };
        penalty("presence_penalty", self.presence_penalty)?;
        penalty("frequency_penalty", self.frequency_penalty)?;
        for &(token, bias) in &self.logit_bias {
            if token as usize >= vocab {
                return Err(ValidationError::TokenOutOfVocab {
                    field: "logit_bias",
                    id: i64::from(token),
                    vocab_size: vocab,
                });
            }
            if !(bias.is_finite() && bias.abs() <= MAX_LOGIT_BIAS) {
                return Err(ValidationError::OutOfRange {
                    field: "logit_bias",
                    limit: "biases in [-100, 100]",
                    value: bias.to_string(),
                });
            }
        }
        Ok(())
    }

    /// `row` as sampled after the tokens counted in `generated` and then `path` (a node's
    /// drafts, root excluded), into `out`.
    pub fn apply(
        &self,
        row: &[f32],
        generated: &HashMap<TokenId, u32>,
        path: &[TokenId],
        out: &mut Vec<f32>,
    ) {
        out.clear();
        out.extend_from_slice(row);
        let mut counts: HashMap<TokenId, u32> = HashMap::with_capacity(path.len());
        for &token in path {
            *counts.entry(token).or_default() += 1;
        }
        let penalize = |out: &mut [f32], token: TokenId, count: u32| {
            if count > 0 {
                out[token as usize] -=
                    count as f32 * self.frequency_penalty + self.presence_penalty;
            }
        };
        if self.presence_penalty != 0.0 || self.frequency_penalty != 0.0 {
            for (&token, &count) in generated {
                penalize(out, token, count + counts.remove(&token).unwrap_or(0));
            }
            for (token, count) in counts {
                penalize(out, token, count);
            }
        }
        for &(token, bias) in &self.logit_bias {
            out[token as usize] += bias;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn penalties_count_generated_tokens_and_the_path_and_bias_adds() {
        let adjust = LogitAdjustments {
            presence_penalty: 0.5,
            frequency_penalty: 0.25,
            logit_bias: vec![(3, -100.0), (0, 1.0)],
        };
        let row = [1.0f32, 2.0, 3.0, 4.0, 5.0];
        let generated = HashMap::from([(1, 2), (4, 1)]);
        let mut out = Vec::new();
        adjust.apply(&row, &generated, &[4, 2, 4], &mut out);
        // 0: bias +1. 1: two before, 2 - 0.5 - 0.5. 2: once on the path, 3 - 0.25 - 0.5.
        // 3: bias -100. 4: once before and twice on the path, 5 - 0.75 - 0.5.
        assert_eq!(out, [2.0, 1.0, 2.25, -96.0, 3.75]);
        assert!(!adjust.is_none() && LogitAdjustments::default().is_none());
    }

    #[test]
    fn limits_name_the_field() {
        let bad = |adjust: LogitAdjustments| {
            let error = adjust.validate(10).unwrap_err();
            error.field(grove_core::Naming::Engine).into_owned()
        };
        let penalty = |presence_penalty| LogitAdjustments {
            presence_penalty,
            ..Default::default()
        };
        assert_eq!(bad(penalty(2.5)), "presence_penalty");
        assert_eq!(bad(penalty(f32::NAN)), "presence_penalty");
        let bias = |logit_bias| LogitAdjustments {
            logit_bias,
            ..Default::default()
        };
        assert_eq!(bad(bias(vec![(10, 1.0)])), "logit_bias");
        assert_eq!(bad(bias(vec![(1, 101.0)])), "logit_bias");
        assert!(bias(vec![(9, -100.0)]).validate(10).is_ok());
    }
}
