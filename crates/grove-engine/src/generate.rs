//! The one-shot API: a [`Generator`] holds an engine's settings (model, tokenizer, options,
//! speculation) and runs requests to completion through an [`Engine`] of its own, the one
//! decode loop.
//!
//! Prefill runs in chunks and chooses the first token (the anchor). Every round then builds a
//! draft tree rooted at the anchor (root only without speculation, a chain of argmax drafts for
//! DFlash, the best-first DDTree for DDTree), verifies all its rows in one target forward
//! (ancestor-only visibility, position = base + depth), walks the target's own choices from the
//! root (argmax, or a fresh sample per visited node at T > 0), commits the accepted path's KV to
//! contiguous positions and emits the accepted drafts plus the target's next token, which
//! becomes the new anchor. Drafts come from one drafter pass over `[anchor, MASK x (S-1)]`; the
//! committed rows' taps extend the drafter's context.

use grove_core::ValidationError;
use grove_model::{Model, TextTokenizer};

use crate::budget::{AutoBudget, AutoBudgetReport, BudgetTracePoint};
use crate::drafter::Drafter;
use crate::request::{GenerateOutput, GenerateRequest, GeneratorOptions};
use crate::runner::RoundRunner;
use crate::scheduler::{Engine, EngineEvent, EngineLimits};
use crate::speculation::{
    self, DDTreeSpec, DFlashSpec, SpecAlgorithm, Speculation, SpeculationSettings,
};
use crate::EngineError;

/// Runs requests against one model. KV pools are sized per call and freed with it.
pub struct Generator<'a> {
    runner: RoundRunner<'a>,
}

impl<'a> Generator<'a> {
    pub fn new(
        model: &'a dyn Model,
        tokenizer: Option<&'a TextTokenizer>,
        options: GeneratorOptions,
    ) -> Self {
        Self {
            runner: RoundRunner {
                model,
                tokenizer,
                options,
                speculation: None,
                auto: AutoBudget::shared(),
            },
        }
    }

    /// Speculates with DFlash chains from now on; refuses a block size the drafter cannot fill.
    pub fn with_dflash(mut self, spec: DFlashSpec<'a>) -> Result<Self, ValidationError> {
        self.runner.speculation = Some(Speculation::dflash(spec)?);
        Ok(self)
    }

    /// Speculates with draft trees from now on; refuses an empty budget or top-k.
    pub fn with_ddtree(mut self, spec: DDTreeSpec<'a>) -> Result<Self, ValidationError> {
        self.runner.speculation = Some(Speculation::ddtree(spec)?);
        Ok(self)
    }

    /// Speculates as `settings` say with `drafter` (which must be given unless the algorithm
    /// is `none`).
    pub fn with_speculation(
        mut self,
        settings: SpeculationSettings,
        drafter: Option<&'a dyn Drafter>,
    ) -> Result<Self, ValidationError> {
        self.runner.speculation = Speculation::from_settings(settings, drafter)?;
        Ok(self)
    }

    /// The algorithm requests get when they do not choose.
    pub fn default_algorithm(&self) -> SpecAlgorithm {
        self.runner.default_method().algorithm()
    }

    /// The most draft nodes one round may verify (0 without a drafter).
    pub fn max_budget(&self) -> usize {
        self.runner.default_method().budget()
    }

    /// Whether requests that do not choose get a budget chosen each round.
    pub fn auto_budget(&self) -> bool {
        self.runner.speculation.is_some_and(|s| s.auto)
    }

    /// The automatic budget's measured cost table and calibration so far.
    pub fn auto_budget_report(&self) -> AutoBudgetReport {
        AutoBudget::lock(&self.runner.auto).report()
    }

    /// Starts the automatic budget's cost table from known step times (seconds) instead of
    /// measuring before the first round: `verify` by rows, `draft` by drafting sequences, at a
    /// short context (a table kept from an earlier run, or a test's). Rounds update it as
    /// usual, unless `fixed`: then every choice follows this table (reproducible choices, for
    /// tests and for comparing runs).
    pub fn preload_costs(&self, verify: &[(usize, f64)], draft: &[(usize, f64)], fixed: bool) {
        let mut auto = AutoBudget::lock(&self.runner.auto);
        for &(rows, seconds) in verify {
            auto.costs.observe_verify(0, rows, seconds);
        }
        for &(sequences, seconds) in draft {
            auto.costs.observe_draft(0, sequences, seconds);
        }
        if fixed {
            auto.costs.fix();
        }
    }

    /// Records every step's choice from now on (for a benchmark's trace).
    pub fn start_budget_trace(&self) {
        AutoBudget::lock(&self.runner.auto).start_trace();
    }

    /// The steps recorded since [`Generator::start_budget_trace`].
    pub fn take_budget_trace(&self) -> Vec<BudgetTracePoint> {
        AutoBudget::lock(&self.runner.auto).take_trace()
    }

    /// An engine with these settings and `limits`, for requests that come and go.
    pub fn engine(&self, limits: EngineLimits) -> Result<Engine<'a>, EngineError> {
        Engine::new(self.runner.clone(), limits)
    }

    /// Generates until a stop token, a stop string or `max_new_tokens`. `on_text` receives
    /// each piece of text as soon as it is final.
    pub fn generate(
        &self,
        request: &GenerateRequest,
        mut on_text: impl FnMut(&str),
    ) -> Result<GenerateOutput, EngineError> {
        let mut outputs = self.run(std::slice::from_ref(request), &mut |_, text: &str| {
            on_text(text)
        })?;
        Ok(outputs.pop().expect("one request in, one output out"))
    }

    /// Generates for several requests at once: each step drafts all unfinished sequences in one
    /// drafter pass and verifies them in one target forward. Every output is exactly what the
    /// request produces alone (up to float rounding of batched matmuls near ties).
    pub fn generate_batch(
        &self,
        requests: &[GenerateRequest],
    ) -> Result<Vec<GenerateOutput>, EngineError> {
        self.run(requests, &mut |_, _: &str| {})
    }

    /// An engine sized for all `requests` at once, stepped until idle.
    fn run(
        &self,
        requests: &[GenerateRequest],
        on_text: &mut impl FnMut(usize, &str),
    ) -> Result<Vec<GenerateOutput>, EngineError> {
        let page_size = self.runner.options.page_size.max(1);
        let method = self.runner.default_method();
        let max_total_tokens = requests
            .iter()
            .map(|r| {
                let tokens = r.prompt.len() + r.stop.max_new_tokens;
                speculation::kv_need(tokens, method).next_multiple_of(page_size)
            })
            .sum();
        // One engine per call: nothing outlives it to share a prefix with.
        let limits = EngineLimits {
            max_total_tokens,
            max_running: requests.len(),
            prefix_cache: false,
            prefill_step: None,
            ngram_corpus: Some(0),
            external_corpus: None,
        };
        let mut engine = self.engine(limits)?;
        for request in requests {
            engine.submit(request.clone())?;
        }
        let mut outputs: Vec<Option<GenerateOutput>> = vec![None; requests.len()];
        while !engine.is_idle() {
            for event in engine.step()? {
                match event {
                    EngineEvent::Text { id, text } => on_text(id as usize, &text),
                    EngineEvent::Finished { id, output } => outputs[id as usize] = Some(*output),
                    EngineEvent::Started { .. } | EngineEvent::Tokens { .. } => {}
                }
            }
        }
        Ok(outputs
            .into_iter()
            .map(|o| o.expect("every request finishes"))
            .collect())
    }
}
