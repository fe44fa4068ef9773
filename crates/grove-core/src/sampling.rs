use crate::ValidationError;

/// Temperatures below this are greedy (argmax), as in the DFlash and DDTree references.
pub const GREEDY_TEMPERATURE_EPSILON: f32 = 1e-5;

/// How the target's next token is chosen. Validated once at the edge with [`SamplingParams::validate`].
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SamplingParams {
    /// Softmax temperature; `< 1e-5` means greedy.
    pub temperature: f32,
    /// Keep only the `top_k` most likely tokens; 0 disables the filter.
    pub top_k: usize,
    /// Keep the smallest set of tokens whose probability reaches `top_p`; 1.0 disables it.
    pub top_p: f32,
    /// Seed of the per-request random stream; `None` draws one from the OS.
    pub seed: Option<u64>,
}

/// A checkpoint's sampling defaults (`generation_config.json`'s `temperature`, `top_p`,
/// `top_k`, as vLLM reads them): what a request that does not set a field gets.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SamplingDefaults {
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<usize>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self::greedy()
    }
}

impl SamplingParams {
    pub fn greedy() -> Self {
        Self {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            seed: None,
        }
    }

    pub fn is_greedy(&self) -> bool {
        self.temperature < GREEDY_TEMPERATURE_EPSILON
    }

    /// Checks every field against its limit and names the first one that breaks it.
    pub fn validate(&self) -> Result<(), ValidationError> {
        if !(self.temperature.is_finite() && (0.0..=100.0).contains(&self.temperature)) {
            return Err(ValidationError::OutOfRange {
                field: "temperature",
                limit: "a finite number in [0, 100]",
                value: self.temperature.to_string(),
            });
        }
        if !(self.top_p.is_finite() && self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(ValidationError::OutOfRange {
                field: "top_p",
                limit: "in (0, 1]",
                value: self.top_p.to_string(),
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation_names_the_field_and_limit() {
        let bad = SamplingParams {
            top_p: 0.0,
            ..SamplingParams::greedy()
        };
        let message = bad.validate().unwrap_err().to_string();
        assert!(
            message.contains("top_p") && message.contains("(0, 1]"),
            "{message}"
        );
        let bad = SamplingParams {
            temperature: -1.0,
            ..SamplingParams::greedy()
        };
        assert!(bad
            .validate()
            .unwrap_err()
            .to_string()
            .contains("temperature"));
        assert!(SamplingParams::greedy().validate().is_ok());
    }
}
