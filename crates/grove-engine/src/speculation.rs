//! What a round drafts, as one concept: [`Method`] is a [`SpecAlgorithm`] with its parameters
//! (plain decoding, a DFlash chain, a DDTree tree, a lookup tree of what followed earlier
//! occurrences of the last tokens), and every conversion between the two is a method here. A
//! leaf module: it knows the drafter's shape, not the engine.
//!
//! The engine's flags (`--speculative-algorithm`, budget, block size) set both the default and
//! the ceiling: a request may turn speculation off, switch between DFlash chains and DDTree
//! trees over the same drafter, or verify fewer nodes, but never more rows than the engine's
//! KV reservations and cost bound allow.

use grove_core::ValidationError;
use grove_spec::LookupConfig;

use crate::drafter::Drafter;

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
    /// Drafts from the text itself (prompt lookup), no drafter needed.
    #[serde(rename = "ngram")]
    Ngram,
}

impl SpecAlgorithm {
    pub fn name(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::DFlash => "dflash",
            Self::DDTree => "ddtree",
            Self::Ngram => "ngram",
        }
    }
}

/// Draft nodes a round verifies: a fixed number, or chosen each round from measured costs and
/// predicted acceptance (up to the engine's ceiling).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Budget {
    Fixed(usize),
    Auto,
}

/// Per-request speculation; `None` fields follow the engine.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SpeculationOverride {
    pub algorithm: Option<SpecAlgorithm>,
    /// Draft nodes verified per round (the chain length for DFlash, the tree budget for DDTree).
    pub budget: Option<Budget>,
}

/// The most nodes an automatic DDTree budget verifies unless `max_budget` says otherwise.
pub const DEFAULT_AUTO_MAX_BUDGET: usize = 32;

/// An engine's speculation, as its flags give it; `None` fields take the drafter's defaults.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SpeculationSettings {
    pub algorithm: SpecAlgorithm,
    /// DFlash: anchor + drafts verified per round (default: chosen each round, up to the
    /// drafter's block size).
    pub num_draft_tokens: Option<usize>,
    /// DDTree: non-root nodes per tree (default: chosen each round, up to `max_budget`).
    pub budget: Option<Budget>,
    /// The ceiling of an automatic budget (default: [`DEFAULT_AUTO_MAX_BUDGET`] for DDTree,
    /// the drafter's block size - 1 for DFlash).
    pub max_budget: Option<usize>,
    /// DDTree: candidates per depth (default: the budget).
    pub top_k: Option<usize>,
    /// Ngram: the suffix lengths matched.
    pub lookup: LookupConfig,
    /// DDTree with an automatic budget: lookup drafts join the drafter's tree, and the budget
    /// chooses among both.
    pub lookup_in_trees: bool,
}

/// The most nodes an automatic lookup budget verifies unless `max_budget` says otherwise:
/// a tree as deep as a copied line or two.
pub const DEFAULT_LOOKUP_MAX_BUDGET: usize = 16;

/// Linear speculative decoding with a DFlash-style drafter.
#[derive(Clone, Copy)]
pub struct DFlashSpec<'a> {
    pub drafter: &'a dyn Drafter,
    /// Verify block size (anchor + drafts), `2..=` the drafter's block size. The drafter always
    /// runs its full trained block; only the first `num_draft_tokens - 1` drafts are verified.
    pub num_draft_tokens: usize,
}

/// Speculative decoding with draft trees (DDTree) over a DFlash-style drafter.
#[derive(Clone, Copy)]
pub struct DDTreeSpec<'a> {
    pub drafter: &'a dyn Drafter,
    /// Non-root nodes per tree.
    pub budget: usize,
    /// Candidates per depth; `K = min(top_k, budget, vocab)`.
    pub top_k: usize,
}

/// What a round drafts: an algorithm with its parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Method {
    /// No drafts: the round verifies the anchor alone.
    Plain,
    /// A chain of `num_draft_tokens - 1` argmax drafts.
    Chain { num_draft_tokens: usize },
    /// A best-first tree of `budget` nodes over the top-`top_k` tokens per depth.
    Tree { budget: usize, top_k: usize },
    /// A tree of at most `budget` nodes from what followed earlier occurrences of the text's
    /// last tokens (no drafter).
    Lookup { budget: usize },
}

impl Method {
    pub fn algorithm(self) -> SpecAlgorithm {
        match self {
            Self::Plain => SpecAlgorithm::None,
            Self::Chain { .. } => SpecAlgorithm::DFlash,
            Self::Tree { .. } => SpecAlgorithm::DDTree,
            Self::Lookup { .. } => SpecAlgorithm::Ngram,
        }
    }

    /// Draft nodes one round verifies at most (0 for plain decoding).
    pub fn budget(self) -> usize {
        match self {
            Self::Plain => 0,
            Self::Chain { num_draft_tokens } => num_draft_tokens - 1,
            Self::Tree { budget, .. } | Self::Lookup { budget } => budget,
        }
    }

    /// Its rounds verify drafts.
    pub fn drafts(self) -> bool {
        self != Self::Plain
    }

    /// Its drafts come from the drafter (which then keeps the sequence's context).
    pub fn uses_drafter(self) -> bool {
        matches!(self, Self::Chain { .. } | Self::Tree { .. })
    }

    /// Rows one verify may add past a sequence's committed length: the anchor and the drafts.
    pub fn verify_rows(self) -> usize {
        self.budget() + 1
    }

    /// The depth a round may draft to with a drafter of `block_size` when `remaining` tokens
    /// may still be emitted (a round emits at most depth + 1), and the candidates per depth.
    /// A `constrained` chain (a schema refuses some tokens) keeps a few candidates a depth, so
    /// that it can draft the best one the schema allows where the drafter's first is refused.
    pub fn draft_shape(
        self,
        block_size: usize,
        remaining: usize,
        constrained: bool,
    ) -> (usize, usize) {
        let depth_cap = remaining.saturating_sub(1);
        match self {
            Self::Plain | Self::Lookup { .. } => (0, 0),
            Self::Chain { num_draft_tokens } => (
                (num_draft_tokens - 1).min(depth_cap),
                if constrained {
                    CONSTRAINED_CHAIN_CANDIDATES
                } else {
                    1
                },
            ),
            // A tree of `budget` nodes is at most `budget` deep.
            Self::Tree { budget, top_k } => (
                (block_size - 1).min(depth_cap).min(budget),
                top_k.min(budget),
            ),
        }
    }
}

/// Candidates a depth of a chain under a schema, from which it drafts the best one the
/// schema allows after the chain so far (a refused first choice would end the chain there).
const CONSTRAINED_CHAIN_CANDIDATES: usize = 8;

/// The KV slots a sequence holding `tokens` tokens needs for its next round: the one formula
/// behind admission, reservation and the pool's sizing.
pub(crate) fn kv_need(tokens: usize, method: Method) -> usize {
    tokens + method.verify_rows()
}

/// An engine's drafter (an engine drafting by lookup alone has none) and the method its
/// requests get by default (and at most).
#[derive(Clone, Copy)]
pub(crate) struct Speculation<'a> {
    pub drafter: Option<&'a dyn Drafter>,
    pub method: Method,
    /// Requests that do not choose get a budget chosen each round, up to `method`'s.
    pub auto: bool,
    /// How lookup trees match the text.
    pub lookup: LookupConfig,
    /// Automatic-budget DDTree rounds merge a lookup tree into the drafter's.
    pub lookup_in_trees: bool,
}

impl<'a> Speculation<'a> {
    /// DFlash chains; refuses a block size the drafter cannot fill.
    pub fn dflash(spec: DFlashSpec<'a>) -> Result<Self, ValidationError> {
        let block_size = spec.drafter.block_size();
        if !(2..=block_size).contains(&spec.num_draft_tokens) {
            return Err(ValidationError::OutOfRange {
                field: "speculative_num_draft_tokens",
                limit: "at least 2 and at most the drafter's block_size",
                value: format!("{} (block_size {block_size})", spec.num_draft_tokens),
            });
        }
        Ok(Self {
            drafter: Some(spec.drafter),
            method: Method::Chain {
                num_draft_tokens: spec.num_draft_tokens,
            },
            auto: false,
            lookup: LookupConfig::default(),
            lookup_in_trees: false,
        })
    }

    /// DDTree trees; refuses an empty budget or top-k.
    pub fn ddtree(spec: DDTreeSpec<'a>) -> Result<Self, ValidationError> {
        for (field, value) in [
            ("speculative_ddtree_budget", spec.budget),
            ("speculative_ddtree_topk", spec.top_k),
        ] {
            if value == 0 {
                return Err(ValidationError::OutOfRange {
                    field,
                    limit: "at least 1",
                    value: "0".into(),
                });
            }
        }
        Ok(Self {
            drafter: Some(spec.drafter),
            method: Method::Tree {
                budget: spec.budget,
                top_k: spec.top_k,
            },
            auto: false,
            lookup: LookupConfig::default(),
            lookup_in_trees: false,
        })
    }

    /// What a server started without speculation offers a request that asks for lookup.
    const LOOKUP_ONLY: Self = Self {
        drafter: None,
        method: Method::Lookup {
            budget: DEFAULT_LOOKUP_MAX_BUDGET,
        },
        auto: true,
        lookup: LookupConfig::DEFAULT,
        lookup_in_trees: false,
    };

    /// Lookup trees of `budget` nodes at most (chosen each round when `auto`), matching as
    /// `lookup` says; `drafter` stays available to requests that ask for it.
    pub fn ngram(
        drafter: Option<&'a dyn Drafter>,
        budget: usize,
        auto: bool,
        lookup: LookupConfig,
    ) -> Result<Self, ValidationError> {
        if budget == 0 {
            return Err(ValidationError::OutOfRange {
                field: "speculative_ddtree_budget",
                limit: "at least 1",
                value: "0".into(),
            });
        }
        check_lookup(lookup)?;
        Ok(Self {
            drafter,
            method: Method::Lookup { budget },
            auto,
            lookup,
            lookup_in_trees: false,
        })
    }

    /// As `settings` say with `drafter` (which must be given unless the algorithm is `none`).
    pub fn from_settings(
        settings: SpeculationSettings,
        drafter: Option<&'a dyn Drafter>,
    ) -> Result<Option<Self>, ValidationError> {
        let auto = |fixed: Option<Budget>| !matches!(fixed, Some(Budget::Fixed(_)));
        if settings.algorithm == SpecAlgorithm::Ngram {
            // As for DFlash, the chain's flag counts the anchor.
            let budget = match settings.num_draft_tokens {
                Some(n) if n < 2 => {
                    return Err(ValidationError::OutOfRange {
                        field: "speculative_num_draft_tokens",
                        limit: "at least 2 (the anchor and a draft)",
                        value: n.to_string(),
                    })
                }
                Some(n) => Some(Budget::Fixed(n - 1)),
                None => settings.budget,
            };
            let nodes = match budget {
                Some(Budget::Fixed(nodes)) => nodes,
                _ => settings.max_budget.unwrap_or(DEFAULT_LOOKUP_MAX_BUDGET),
            };
            return Self::ngram(drafter, nodes, auto(budget), settings.lookup).map(Some);
        }
        let Some(drafter) = drafter else {
            return match settings.algorithm {
                SpecAlgorithm::None => Ok(None),
                algorithm => Err(ValidationError::OutOfRange {
                    field: "speculative_draft_model_path",
                    limit: "a drafter directory when the algorithm is dflash or ddtree",
                    value: format!("none for {}", algorithm.name()),
                }),
            };
        };
        let block_size = drafter.block_size();
        let mut speculation = match settings.algorithm {
            SpecAlgorithm::None | SpecAlgorithm::Ngram => return Ok(None),
            SpecAlgorithm::DFlash => {
                // The chain's own flag fixes it; a fixed tree budget keeps the whole block.
                let budget = match (settings.num_draft_tokens, settings.budget) {
                    (Some(n), _) => Some(Budget::Fixed(n.saturating_sub(1))),
                    (None, Some(Budget::Fixed(_))) => Some(Budget::Fixed(block_size - 1)),
                    (None, budget) => budget,
                };
                let ceiling = settings.max_budget.unwrap_or(block_size - 1);
                let num_draft_tokens = match budget {
                    Some(Budget::Fixed(drafts)) => drafts + 1,
                    _ => ceiling.min(block_size - 1) + 1,
                };
                let mut speculation = Self::dflash(DFlashSpec {
                    drafter,
                    num_draft_tokens,
                })?;
                speculation.auto = auto(budget);
                speculation
            }
            SpecAlgorithm::DDTree => {
                let budget = match settings.budget {
                    Some(Budget::Fixed(budget)) => budget,
                    _ => settings.max_budget.unwrap_or(DEFAULT_AUTO_MAX_BUDGET),
                };
                let mut speculation = Self::ddtree(DDTreeSpec {
                    drafter,
                    budget,
                    top_k: settings.top_k.unwrap_or(budget),
                })?;
                speculation.auto = auto(settings.budget);
                speculation.lookup_in_trees = settings.lookup_in_trees;
                speculation
            }
        };
        // Requests that ask for lookup match as the flags say.
        check_lookup(settings.lookup)?;
        speculation.lookup = settings.lookup;
        Ok(Some(speculation))
    }
}

/// Refuses suffix lengths that cannot match, naming the flag.
fn check_lookup(lookup: LookupConfig) -> Result<(), ValidationError> {
    let checks = [
        (
            "speculative_ngram_min_match",
            lookup.min_match,
            1,
            "at least 1",
        ),
        (
            "speculative_ngram_max_match",
            lookup.max_match,
            lookup.min_match.max(1),
            "at least speculative_ngram_min_match",
        ),
    ];
    for (field, value, least, limit) in checks {
        if value < least {
            return Err(ValidationError::OutOfRange {
                field,
                limit,
                value: value.to_string(),
            });
        }
    }
    Ok(())
}

/// The engine's default method (plain decoding without a drafter).
pub(crate) fn default_method(speculation: Option<Speculation<'_>>) -> Method {
    speculation.map_or(Method::Plain, |s| s.method)
}

/// What a request with `choice` drafts each round, checked against the engine's ceiling, and
/// whether its budget is chosen each round (up to the method's).
pub(crate) fn resolve(
    speculation: Option<Speculation<'_>>,
    choice: SpeculationOverride,
) -> Result<(Method, bool), ValidationError> {
    let algorithm = choice
        .algorithm
        .unwrap_or(default_method(speculation).algorithm());
    if algorithm == SpecAlgorithm::None && choice.budget.is_some() {
        // A budget sizes drafts: without a drafter, or with speculation turned off, there are
        // none, and silently ignoring it would hide a misconfigured client.
        return Err(ValidationError::OutOfRange {
            field: "speculative.budget",
            limit: "absent when no drafting happens (algorithm \"none\", or a server started \
                    without a drafter)",
            value: match choice.budget {
                Some(Budget::Fixed(b)) => b.to_string(),
                _ => "\"auto\"".into(),
            },
        });
    }
    if algorithm == SpecAlgorithm::None {
        return Ok((Method::Plain, false));
    }
    // Lookup needs no drafter: a server started without speculation drafts so when asked.
    let spec = speculation.unwrap_or(Speculation::LOOKUP_ONLY);
    let ceiling = spec.method.budget();
    let (fixed, auto) = match choice.budget {
        Some(Budget::Fixed(budget)) => (Some(budget), false),
        Some(Budget::Auto) => (None, true),
        None => (None, spec.auto),
    };
    if let Some(budget) = fixed {
        if budget == 0 || budget > ceiling {
            return Err(ValidationError::OutOfRange {
                field: "speculative.budget",
                limit: "at least 1 and at most the server's budget",
                value: format!("{budget} (server budget {ceiling})"),
            });
        }
    }
    let budget = fixed.unwrap_or(ceiling);
    let drafter = match (algorithm, spec.drafter) {
        (SpecAlgorithm::Ngram, _) => return Ok((Method::Lookup { budget }, auto)),
        (_, Some(drafter)) => drafter,
        (_, None) => {
            return Err(ValidationError::OutOfRange {
                field: "speculative.algorithm",
                limit: "\"none\" or \"ngram\" on a server started without a drafter \
                        (--speculative-draft-model-path)",
                value: format!("\"{}\"", algorithm.name()),
            })
        }
    };
    let method = match algorithm {
        SpecAlgorithm::DFlash => Method::Chain {
            num_draft_tokens: budget.min(drafter.block_size() - 1) + 1,
        },
        _ => Method::Tree {
            budget,
            top_k: match spec.method {
                Method::Tree { top_k, .. } => top_k,
                _ => budget,
            },
        },
    };
    Ok((method, auto))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_method_names_its_algorithm_and_its_rows() {
        let cases = [
            (Method::Plain, SpecAlgorithm::None, 0),
            (
                Method::Chain {
                    num_draft_tokens: 8,
                },
                SpecAlgorithm::DFlash,
                7,
            ),
            (
                Method::Tree {
                    budget: 5,
                    top_k: 3,
                },
                SpecAlgorithm::DDTree,
                5,
            ),
        ];
        for (method, algorithm, budget) in cases {
            assert_eq!(method.algorithm(), algorithm);
            assert_eq!(method.budget(), budget);
            assert_eq!(method.verify_rows(), budget + 1);
            assert_eq!(kv_need(10, method), 11 + budget);
        }
    }

    #[test]
    fn rounds_draft_no_deeper_than_the_budget_the_block_or_the_length_limit() {
        let tree = Method::Tree {
            budget: 6,
            top_k: 4,
        };
        assert_eq!(tree.draft_shape(16, 100, false), (6, 4));
        assert_eq!(tree.draft_shape(6, 100, false), (5, 4));
        assert_eq!(tree.draft_shape(8, 3, false), (2, 4));
        assert_eq!(tree.draft_shape(8, 1, false), (0, 4));
        let chain = Method::Chain {
            num_draft_tokens: 4,
        };
        assert_eq!(chain.draft_shape(8, 100, false), (3, 1));
        assert_eq!(
            chain.draft_shape(8, 100, true),
            (3, CONSTRAINED_CHAIN_CANDIDATES)
        );
        assert_eq!(tree.draft_shape(16, 100, true), (6, 4));
        assert_eq!(Method::Plain.draft_shape(8, 100, false), (0, 0));
    }

    #[test]
    fn a_budget_without_drafting_is_refused_by_name() {
        let with_budget = |algorithm| SpeculationOverride {
            algorithm,
            budget: Some(Budget::Fixed(3)),
        };
        for algorithm in [None, Some(SpecAlgorithm::None)] {
            let error = resolve(None, with_budget(algorithm)).unwrap_err();
            assert_eq!(
                error.field(grove_core::Naming::OpenAi),
                "speculative.budget"
            );
        }
        assert_eq!(
            resolve(None, SpeculationOverride::default()),
            Ok((Method::Plain, false))
        );
    }
}
