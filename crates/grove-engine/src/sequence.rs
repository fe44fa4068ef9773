//! One request in flight and how it finishes: its page tables, sampler, emitted text and
//! statistics, and the output it turns into.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use candle_core::Tensor;
use grove_core::{FinishReason, TokenId};
use grove_kv::{KvStore, PagePool, PageTable, PrefixCache};
use grove_spec::{
    lookup_tree, AcceptResult, AcceptanceStats, DepthCandidates, DraftTree, LookupConfig,
    NgramCorpus,
};

use crate::budget::SequenceBudget;
use crate::emitter::Emitter;
use crate::logprobs::TokenLogprob;
use crate::request::{GenerateOutput, GenerateRequest, GenerateStats};
use crate::sampler::{argmax, Sampler};
use crate::speculation::{self, Method};
use crate::structured::{Grammar, Matcher};
use crate::EngineError;

/// KV memory shared by the sequences of one engine.
pub(crate) struct Pools {
    pub pool: PagePool,
    pub kv: KvStore,
    pub draft_pool: PagePool,
    pub draft_kv: KvStore,
    /// Pages of earlier requests' committed tokens, shared by later prompts that start with
    /// them (`None`: prefix caching is off).
    pub prefix: Option<PrefixCache>,
    /// Finished requests' texts, for lookup drafts (`None`: lookups read their own text).
    pub corpus: Option<NgramCorpus>,
    /// Texts the server was given to draft from.
    pub external_corpus: Option<Arc<NgramCorpus>>,
}

impl Pools {
    /// Where lookups look besides the text itself: earlier requests' texts, then the given.
    pub fn corpora(&self) -> Vec<&NgramCorpus> {
        self.corpus
            .iter()
            .chain(self.external_corpus.as_deref())
            .collect()
    }

    /// Whether a sequence running `method` keeps the drafter's context: when it drafts, and
    /// in a speculative engine with a prefix cache even when it does not, so that its cached
    /// prompt serves later requests that draft.
    pub fn keeps_draft_context(&self, method: Method) -> bool {
        method.uses_drafter() || (self.prefix.is_some() && self.draft_pool.total_pages() > 0)
    }

    /// Pages the prefix cache holds that nothing else does (0 without a cache).
    pub fn evictable_pages(&self) -> usize {
        self.prefix.as_ref().map_or(0, PrefixCache::evictable_pages)
    }

    /// Makes `target` free pages in the target pool and `draft` in the drafter's by evicting
    /// cached prefixes if needed; false if they cannot all be made free.
    pub fn make_room(&mut self, target: usize, draft: usize) -> bool {
        let short_target = target.saturating_sub(self.pool.free_pages());
        let short_draft = draft.saturating_sub(self.draft_pool.free_pages());
        if short_target + short_draft > 0 {
            if let Some(cache) = self.prefix.as_mut() {
                cache.evict(short_target, short_draft);
            }
        }
        self.pool.free_pages() >= target && self.draft_pool.free_pages() >= draft
    }
}

/// Time a sequence's rounds spent in each phase, in microseconds (draft, tree build and verify
/// are a step's, charged to every sequence in it; commit is the sequence's own).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct PhaseMicros {
    pub draft: u64,
    pub tree_build: u64,
    pub verify: u64,
    pub commit: u64,
}

/// One request in flight. Its KV may be dropped (preemption) and rebuilt by a new prefill
/// of everything it committed; the sampler and the emitted text carry on untouched.
pub(crate) struct Sequence<'r> {
    pub id: u64,
    pub request: Arc<GenerateRequest>,
    /// What its rounds draft (resolved from the request within the engine's ceiling).
    pub method: Method,
    /// Its rounds verify as many of `method`'s nodes as pay on this machine, chosen each round.
    pub auto: bool,
    /// The automatic budget's state (see `budget.rs`).
    pub budget: SequenceBudget,
    /// It drafts in the round being run (the automatic budget may skip drafting).
    pub draft_now: bool,
    /// Rounds it ran without drafting (for its statistics).
    pub rounds_without_drafts: usize,
    pub table: PageTable,
    /// The drafter's context for this sequence (see [`Pools::keeps_draft_context`]).
    pub draft_table: Option<PageTable>,
    /// Taps of committed tokens not yet in the drafter's context, `[rows, taps * hidden]`.
    pub pending_features: Option<Tensor>,
    /// The last chosen token; not yet in KV.
    pub anchor: TokenId,
    pub sampler: Sampler,
    pub emitter: Emitter<'r>,
    /// The log-probabilities of the tokens emitted so far (when the request asks).
    pub logprobs: Vec<TokenLogprob>,
    /// The prompt's (from its second token), filled as its prefill's chunks run.
    pub prompt_logprobs: Vec<TokenLogprob>,
    /// Those of the round's choices, in walk order: the round's new tokens, before a stop
    /// cuts them.
    pub choice_logprobs: Vec<TokenLogprob>,
    /// Times each token was emitted, for the request's penalties (kept only when it has any).
    pub generated: HashMap<TokenId, u32>,
    /// A row adjusted by the penalties and biases (a buffer reused across choices).
    adjusted_row: Vec<f32>,
    /// Where the request's schema stands after the tokens emitted so far (with a grammar).
    pub grammar_state: Option<Matcher>,
    /// The tokens the schema allows at a position (a buffer reused across choices).
    allowed: Vec<bool>,
    pub acceptance: AcceptanceStats,
    pub phases: PhaseMicros,
    pub emitted: usize,
    pub finish: Option<FinishReason>,
    /// Taps of the prefill's chunks so far, added to the drafter's context when it ends.
    pub prefill_features: Vec<Tensor>,
    /// It left the queue once (a preempted sequence is not started again).
    pub started: bool,
    pub t_prefill: Duration,
    pub decode_start: Instant,
    /// Prompt tokens its first prefill found in the prefix cache.
    pub cached_tokens: usize,
}

impl<'r> Sequence<'r> {
    /// A sequence for `request` that holds no KV yet; `max_depth` is the deepest draft its
    /// rounds can make.
    pub fn new(
        id: u64,
        request: Arc<GenerateRequest>,
        (method, auto): (Method, bool),
        emitter: Emitter<'r>,
        pools: &Pools,
        (max_depth, budget): (usize, SequenceBudget),
    ) -> Self {
        Self {
            id,
            method,
            auto,
            budget,
            draft_now: method.drafts(),
            rounds_without_drafts: 0,
            table: pools.pool.new_table(),
            draft_table: pools
                .keeps_draft_context(method)
                .then(|| pools.draft_pool.new_table()),
            pending_features: None,
            anchor: 0,
            sampler: Sampler::new(request.sampling.clone()),
            emitter,
            logprobs: Vec::new(),
            prompt_logprobs: Vec::new(),
            choice_logprobs: Vec::new(),
            generated: HashMap::new(),
            adjusted_row: Vec::new(),
            grammar_state: request.grammar.as_ref().map(Grammar::start),
            allowed: Vec::new(),
            acceptance: AcceptanceStats::new(max_depth),
            phases: PhaseMicros::default(),
            request,
            emitted: 0,
            finish: None,
            prefill_features: Vec::new(),
            started: false,
            t_prefill: Duration::ZERO,
            decode_start: Instant::now(),
            cached_tokens: 0,
        }
    }

    /// Tokens it may still emit.
    pub fn remaining(&self) -> usize {
        self.request.stop.max_new_tokens - self.emitted
    }

    /// Tokens whose K/V the sequence holds once prefilled: the prompt and every emitted token
    /// but the last (the anchor).
    pub fn committed_tokens(&self) -> Vec<TokenId> {
        let emitted = self.emitter.token_ids();
        let mut tokens = self.request.prompt.clone();
        tokens.extend_from_slice(&emitted[..emitted.len().saturating_sub(1)]);
        tokens
    }

    /// What a lookup corpus keeps of it: its prompt and every token it emitted, less the
    /// prompt's start that the prefix cache held (an earlier request's text, so already kept:
    /// a shared system prompt, a conversation's earlier turns) but for its last `overlap`
    /// tokens, so that matches run across the seam.
    pub fn corpus_text(&self, overlap: usize) -> Vec<TokenId> {
        let prompt = &self.request.prompt;
        let cached = self.cached_tokens.saturating_sub(overlap).min(prompt.len());
        let mut tokens = prompt[cached..].to_vec();
        tokens.extend_from_slice(self.emitter.token_ids());
        tokens
    }

    /// KV slots a prefill of everything it committed and its first round take (asked of the
    /// queue's front every step: counted, not listed).
    pub fn prefill_need(&self) -> usize {
        let committed = self.request.prompt.len() + self.emitted.saturating_sub(1);
        speculation::kv_need(committed, self.method)
    }

    /// Emits the round's new tokens until one ends the request (the round is cut there), and
    /// records it; returns the tokens emitted.
    pub fn emit_round(
        &mut self,
        mut result: AcceptResult,
        tree_nodes: usize,
        on_text: &mut impl FnMut(&str),
    ) -> Result<Vec<TokenId>, EngineError> {
        let mut tokens = Vec::new();
        for token in result.new_tokens().collect::<Vec<_>>() {
            tokens.push(token);
            self.count(token);
            self.finish = self.emitter.emit(token, on_text)?;
            if self.finish.is_some() {
                break;
            }
        }
        result.cut(tokens.len());
        let choices = self.choice_logprobs.drain(..);
        self.logprobs.extend(choices.take(tokens.len()));
        self.emitted += tokens.len();
        self.acceptance.record(&result, tree_nodes);
        Ok(tokens)
    }

    /// The round's draft from the drafter's per-depth `candidates`: a best-first tree of the
    /// method's budget, or a chain. Under a schema a draft enters only if the schema allows it
    /// after its path: the target can never choose another there, so the budget goes to drafts
    /// that can be accepted (the walk samples the target as it would without them).
    pub fn draft_tree(&self, candidates: &[DepthCandidates]) -> DraftTree {
        let tree = |admit: &mut dyn FnMut(usize, TokenId) -> bool| match self.method {
            Method::Tree { budget, .. } => {
                DraftTree::build_where(self.anchor, candidates, budget, admit)
            }
            _ => DraftTree::chain_where(self.anchor, candidates, admit),
        };
        match (&self.request.grammar, &self.grammar_state) {
            (Some(grammar), Some(state)) => {
                tree(&mut grammar.admission(state, &self.request.stop.stop_token_ids))
            }
            _ => tree(&mut |_, _| true),
        }
    }

    /// The round's lookup draft: a tree of at most `budget` nodes from what followed earlier
    /// occurrences of the text's last tokens (in its prompt and output, and in `corpora`), no
    /// deeper than the tokens it may still emit, and under a schema only of drafts the schema
    /// allows (as `draft_tree`).
    pub fn lookup_tree(
        &self,
        config: LookupConfig,
        budget: usize,
        corpora: &[&NgramCorpus],
    ) -> DraftTree {
        let mut history = self.committed_tokens();
        history.push(self.anchor);
        let depth = self.remaining().saturating_sub(1);
        match (&self.request.grammar, &self.grammar_state) {
            (Some(grammar), Some(state)) => {
                let admit = grammar.admission(state, &self.request.stop.stop_token_ids);
                lookup_tree(&history, corpora, config, budget, depth, admit)
            }
            _ => lookup_tree(&history, corpora, config, budget, depth, |_, _| true),
        }
    }

    /// The target's choice from `row`, a position after the tokens emitted so far and then
    /// `path()` (a tree node's drafts), with the request's penalties and biases applied and
    /// the tokens its schema refuses there masked.
    pub fn choose(&mut self, row: &[f32], path: impl FnOnce() -> Vec<TokenId>) -> TokenId {
        let request = Arc::clone(&self.request);
        let adjustments = &request.adjustments;
        if adjustments.is_none() && request.grammar.is_none() {
            return self.sampler.sample(row);
        }
        let path = path();
        let mut adjusted = std::mem::take(&mut self.adjusted_row);
        if adjustments.is_none() {
            adjusted.clear();
            adjusted.extend_from_slice(row);
        } else {
            adjustments.apply(row, &self.generated, &path, &mut adjusted);
        }
        if let (Some(grammar), Some(state)) = (&request.grammar, &self.grammar_state) {
            let mut state = state.clone();
            for &token in &path {
                grammar.advance(&mut state, token);
            }
            self.restrict(grammar, &state, &mut adjusted);
        }
        let token = self.sampler.sample(&adjusted);
        self.adjusted_row = adjusted;
        token
    }

    /// Masks (to -inf) the entries of `row` that `grammar` refuses in `state`. Greedy choice
    /// needs no mask when the row's largest entry is allowed: masking keeps it the largest.
    fn restrict(&mut self, grammar: &Grammar, state: &Matcher, row: &mut [f32]) {
        let stops = &self.request.stop.stop_token_ids;
        if self.sampler.params().is_greedy() && grammar.allows(state, argmax(row), stops) {
            return;
        }
        self.allowed.resize(row.len(), false);
        if grammar.mask(state, stops, &mut self.allowed) == 0 {
            // Only a text the schema refuses gets here (the walk follows masked choices, so
            // a visited node's path never is one): choose from the row as it is.
            tracing::warn!(request = self.id, "no token continues the schema; unmasked");
            return;
        }
        for (logit, &allowed) in row.iter_mut().zip(&self.allowed) {
            if !allowed {
                *logit = f32::NEG_INFINITY;
            }
        }
    }

    /// Counts an emitted token for the penalties and moves the schema past it.
    pub fn count(&mut self, token: TokenId) {
        if !self.request.adjustments.is_none() {
            *self.generated.entry(token).or_default() += 1;
        }
        if let (Some(grammar), Some(state)) = (&self.request.grammar, &mut self.grammar_state) {
            grammar.advance(state, token);
        }
    }

    /// The log-probabilities of its last `count` emitted tokens (none if it did not ask).
    pub fn last_logprobs(&self, count: usize) -> Vec<TokenLogprob> {
        self.logprobs[self.logprobs.len().saturating_sub(count)..].to_vec()
    }

    /// Its prefill still owes prompt tokens their log-probabilities (the request scores its
    /// prompt), so it needs every prompt row's logits.
    pub fn scores_prompt(&self) -> bool {
        self.request.prompt_logprobs && self.prompt_logprobs.len() + 1 < self.request.prompt.len()
    }

    /// Starts its empty page tables on the longest cached prefix of what it committed (never
    /// the last token: its logits are needed), the drafter's context included when it drafts;
    /// returns the tokens shared.
    pub fn share_cached_prefix(&mut self, pools: &mut Pools) -> usize {
        let Some(cache) = pools.prefix.as_mut() else {
            return 0;
        };
        // Scoring the prompt needs the logits of every prompt row.
        if self.scores_prompt() {
            return 0;
        }
        debug_assert!(self.table.is_empty(), "sharing into a prefilled sequence");
        let tokens = self.committed_tokens();
        let found = cache.lookup(&tokens, tokens.len() - 1, self.draft_table.is_some());
        self.table.share_prefix(&found.pages);
        if let Some(table) = self.draft_table.as_mut() {
            table.share_prefix(&found.draft_pages);
        }
        if self.emitted == 0 {
            self.cached_tokens = found.tokens;
        }
        found.tokens
    }

    /// Offers the whole pages of its committed tokens (and the drafter's context for them) to
    /// the prefix cache, which keeps those it does not hold yet.
    pub fn cache_prefix(&self, pools: &mut Pools) {
        let Some(cache) = pools.prefix.as_mut() else {
            return;
        };
        let tokens = self.committed_tokens();
        // Rows past the committed tokens (a round cut by a stop) are not the tokens' K/V.
        let len = self.table.len().min(tokens.len());
        let page_size = self.table.page_size();
        let draft_pages = self.draft_table.as_ref().map_or(&[][..], |table| {
            &table.pages()[..table.len().min(len) / page_size]
        });
        cache.insert(&tokens[..len], self.table.pages(), draft_pages);
    }

    /// Stops keeping the drafter's context (its pages return; what the prefix cache took
    /// stays there): it will not draft again.
    pub fn drop_draft_context(&mut self) {
        self.draft_table = None;
        self.pending_features = None;
    }

    /// Drops the sequence's KV (its pages return to the pools) until the next prefill.
    pub fn release(&mut self, pools: &Pools) {
        self.table = pools.pool.new_table();
        self.draft_table = self
            .draft_table
            .as_ref()
            .map(|_| pools.draft_pool.new_table());
        self.pending_features = None;
        self.prefill_features.clear();
    }

    /// Flushes a finished sequence's text and completes its statistics; its pages return.
    pub fn into_output(
        self,
        on_text: &mut impl FnMut(&str),
    ) -> Result<GenerateOutput, EngineError> {
        let t_decode = self.decode_start.elapsed();
        let finish_reason = self.finish.expect("finished");
        let prompt_tokens = self.request.prompt.len();
        let (token_ids, text) = self.emitter.finish(on_text)?;
        let seconds = |d: Duration| d.as_secs_f64().max(1e-9);
        let emitted_in_rounds = token_ids.len() - 1;
        let acceptance = self.acceptance;
        let stats = GenerateStats {
            algorithm: self.method.algorithm(),
            budget: self.method.budget(),
            auto_budget: self.auto,
            mean_budget: acceptance.tree_nodes as f64 / acceptance.rounds().max(1) as f64,
            rounds_without_drafts: self.rounds_without_drafts,
            prompt_tokens,
            cached_tokens: self.cached_tokens,
            new_tokens: token_ids.len(),
            rounds: acceptance.rounds(),
            mean_accept_length: acceptance.mean_accept_length(),
            accept_lengths: acceptance.accept_lengths,
            accepted_per_position: acceptance.accepted_per_position,
            prefill_tokens_per_s: prompt_tokens as f64 / seconds(self.t_prefill),
            decode_tokens_per_s: if emitted_in_rounds == 0 {
                0.0
            } else {
                emitted_in_rounds as f64 / seconds(t_decode)
            },
            t_prefill_us: self.t_prefill.as_micros() as u64,
            t_decode_us: t_decode.as_micros() as u64,
            tree_nodes: acceptance.tree_nodes,
            accepted_depth_histogram: acceptance.accepted_depth_histogram,
            t_draft_us: self.phases.draft,
            t_tree_build_us: self.phases.tree_build,
            t_verify_us: self.phases.verify,
            t_commit_us: self.phases.commit,
        };
        Ok(GenerateOutput {
            token_ids,
            text,
            finish_reason,
            logprobs: self.logprobs,
            prompt_logprobs: self.prompt_logprobs,
            stats,
        })
    }
}
