//! A request's own choice of speculation, within what the engine was started with.
//!
//! The engine's flags (`--speculative-algorithm`, budget, block size) set both the default and
//! the ceiling: a request may turn speculation off, switch between DFlash chains and DDTree
//! trees over the same drafter, or verify fewer nodes, but never more rows than the engine's
//! KV reservations and cost bound allow.

use grove_core::ValidationError;

use crate::drafter::Drafter;
use crate::generate::{DDTreeSpec, DFlashSpec, Generator, Method};

/// Speculative decoding methods, as SGLang's `--speculative-algorithm` names them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SpecAlgorithm {
    #[default]
    None,
    #[serde(rename = "dflash")]
    DFlash,
    #[serde(rename = "ddtree")]
    DDTree,
}

impl SpecAlgorithm {
    pub fn name(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::DFlash => "dflash",
            Self::DDTree => "ddtree",
        }
    }
}

/// Per-request speculation; `None` fields follow the engine.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SpeculationOverride {
    pub algorithm: Option<SpecAlgorithm>,
    /// Draft nodes verified per round (the chain length for DFlash, the tree budget for DDTree).
    pub budget: Option<usize>,
}

/// An engine's speculation, as its flags give it; `None` fields take the drafter's defaults.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SpeculationSettings {
    pub algorithm: SpecAlgorithm,
    /// DFlash: anchor + drafts verified per round (default: the drafter's block size).
    pub num_draft_tokens: Option<usize>,
    /// DDTree: non-root nodes per tree (default: block size - 1).
    pub budget: Option<usize>,
    /// DDTree: candidates per depth (default: the budget).
    pub top_k: Option<usize>,
}

impl<'a> Generator<'a> {
    /// Speculates as `settings` say with `drafter` (which must be given unless the algorithm
    /// is `none`).
    pub fn with_speculation(
        self,
        settings: SpeculationSettings,
        drafter: Option<&'a dyn Drafter>,
    ) -> Result<Self, ValidationError> {
        let Some(drafter) = drafter else {
            return match settings.algorithm {
                SpecAlgorithm::None => Ok(self),
                algorithm => Err(ValidationError::OutOfRange {
                    field: "speculative_draft_model_path",
                    limit: "a drafter directory when the algorithm is dflash or ddtree",
                    value: format!("none for {}", algorithm.name()),
                }),
            };
        };
        let block_size = drafter.block_size();
        match settings.algorithm {
            SpecAlgorithm::None => Ok(self),
            SpecAlgorithm::DFlash => self.with_dflash(DFlashSpec {
                drafter,
                num_draft_tokens: settings.num_draft_tokens.unwrap_or(block_size),
            }),
            SpecAlgorithm::DDTree => {
                let budget = settings.budget.unwrap_or(block_size - 1);
                self.with_ddtree(DDTreeSpec {
                    drafter,
                    budget,
                    top_k: settings.top_k.unwrap_or(budget),
                })
            }
        }
    }
}

impl Generator<'_> {
    /// The algorithm requests get when they do not choose.
    pub fn default_algorithm(&self) -> SpecAlgorithm {
        match self.speculation.map(|s| s.method) {
            None => SpecAlgorithm::None,
            Some(Method::Chain { .. }) => SpecAlgorithm::DFlash,
            Some(Method::Tree { .. }) => SpecAlgorithm::DDTree,
        }
    }

    /// The most draft nodes one round may verify (0 without a drafter).
    pub fn max_budget(&self) -> usize {
        self.verify_rows() - 1
    }

    /// What a request with `choice` drafts each round, checked against the engine's ceiling.
    pub(crate) fn resolve_method(
        &self,
        choice: SpeculationOverride,
    ) -> Result<Option<Method>, ValidationError> {
        let algorithm = choice.algorithm.unwrap_or(self.default_algorithm());
        let Some(spec) = self.speculation else {
            return match algorithm {
                SpecAlgorithm::None => Ok(None),
                _ => Err(ValidationError::OutOfRange {
                    field: "speculative.algorithm",
                    limit:
                        "\"none\" on a server started without a drafter (--speculative-algorithm)",
                    value: format!("\"{}\"", algorithm.name()),
                }),
            };
        };
        if algorithm == SpecAlgorithm::None {
            return Ok(None);
        }
        let ceiling = self.max_budget();
        if let Some(budget) = choice.budget {
            if budget == 0 || budget > ceiling {
                return Err(ValidationError::OutOfRange {
                    field: "speculative.budget",
                    limit: "at least 1 and at most the server's budget",
                    value: format!("{budget} (server budget {ceiling})"),
                });
            }
        }
        let max_depth = spec.drafter.block_size() - 1;
        Ok(Some(match algorithm {
            SpecAlgorithm::DFlash => Method::Chain {
                num_draft_tokens: choice.budget.unwrap_or(ceiling).min(max_depth) + 1,
            },
            _ => {
                let budget = choice.budget.unwrap_or(ceiling);
                let top_k = match spec.method {
                    Method::Tree { top_k, .. } => top_k,
                    Method::Chain { .. } => budget,
                };
                Method::Tree { budget, top_k }
            }
        }))
    }
}

/// Rows one verify of `method` may add past a sequence's committed length.
pub(crate) fn verify_rows(method: Option<Method>) -> usize {
    match method {
        None => 1,
        Some(Method::Chain { num_draft_tokens }) => num_draft_tokens,
        Some(Method::Tree { budget, .. }) => budget + 1,
    }
}
