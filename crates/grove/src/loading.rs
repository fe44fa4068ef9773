//! Model selection and loading shared by the subcommands.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use candle_core::Device;
use clap::Args;
use grove_core::TokenId;
use grove_engine::{Budget, Drafter, Generator, LookupConfig, SpeculationSettings};
use grove_kv::KvDtype;
use grove_model::drafter_manifest::{find_drafter, DrafterManifest, TargetFingerprint};
use grove_model::tokenizer::{generation_sampling, generation_stop_ids};
use grove_model::{DFlashDrafter, Decoder, Model, TextTokenizer};
use grove_server::ServedModel;
use grove_testkit::random_checkpoint::RandomCheckpoint;

/// The embedded default model, resolved at build time so `cargo run` works from any directory.
pub const DEFAULT_MODEL_DIR: &str =
    concat!(env!("CARGO_MANIFEST_DIR"), "/../../assets/default/target");

/// The drafter trained for the default model, used by dflash/ddtree when no draft path is given.
pub const DEFAULT_DRAFTER_DIR: &str =
    concat!(env!("CARGO_MANIFEST_DIR"), "/../../assets/default/drafter");

/// Drafters trained for real targets, one directory each with a `grove-drafter.json` naming
/// its target; dflash/ddtree pick the one matching the loaded target.
pub const SHIPPED_DRAFTERS_DIR: &str =
    concat!(env!("CARGO_MANIFEST_DIR"), "/../../assets/drafters");

/// Where drafters are looked for: `GROVE_DRAFTERS_DIR`, else the shipped ones.
fn drafters_dir() -> PathBuf {
    std::env::var_os("GROVE_DRAFTERS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(SHIPPED_DRAFTERS_DIR))
}

/// The seeded random tiny model kept as a test fixture (`grove tiny-model` writes it).
pub const TINY_MODEL_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../assets/tiny-qwen3");

/// The seed the tiny fixture was written with (`grove tiny-model --seed`).
pub const TINY_MODEL_SEED: u64 = 20261129;

/// Flags every model-running subcommand takes.
#[derive(Debug, Clone, Args)]
pub struct ModelArgs {
    /// A llama.cpp GGUF file, or a HF checkpoint directory (config.json + safetensors
    /// [+ tokenizer.json]); default: the embedded default pair's target (a small trained
    /// Python model, whose drafter speculation picks up).
    #[arg(long)]
    pub model_path: Option<PathBuf>,
    /// Compute threads (rayon and candle's matmuls); default: all cores.
    #[arg(long)]
    pub threads: Option<usize>,
    /// Tokens per KV page.
    #[arg(long, default_value_t = 1)]
    pub page_size: usize,
    /// A Jinja chat template file used instead of the model's own (`tokenizer_config.json`'s
    /// `chat_template`, a GGUF file's `tokenizer.chat_template`), e.g. for a file without one.
    #[arg(long)]
    pub chat_template: Option<PathBuf>,
    /// Variables for the chat template, as a JSON object (llama.cpp's flag), e.g.
    /// '{"enable_thinking": false}' for Qwen3: `generate --chat` renders its prompt with them,
    /// and `serve` gives them to every chat request (a request's own `chat_template_kwargs`
    /// override them name by name).
    #[arg(long, value_parser = parse_template_kwargs)]
    pub chat_template_kwargs: Option<serde_json::Map<String, serde_json::Value>>,
    /// How the KV cache keeps keys and values: f16 (half the memory and half the bytes
    /// attention reads over a long context; llama.cpp's default), bf16 (the same memory, f32's
    /// range; on CPUs with AVX-512 BF16 a long row's attention in bfloat16 arithmetic, faster
    /// for a verify's many rows) or f32. auto: f16 for a GGUF file, f32 for a safetensors
    /// checkpoint (the precision its references were made in).
    #[arg(long, value_enum, ignore_case = true, default_value_t = KvCacheDtype::Auto)]
    pub kv_cache_dtype: KvCacheDtype,
}

fn parse_template_kwargs(text: &str) -> Result<serde_json::Map<String, serde_json::Value>, String> {
    let kwargs = match serde_json::from_str(text) {
        Ok(serde_json::Value::Object(kwargs)) => kwargs,
        Ok(_) => return Err("expected a JSON object of template variables".into()),
        Err(e) => return Err(format!("not JSON: {e}")),
    };
    match grove_model::reserved_template_variable(&kwargs) {
        Some(name) => Err(format!("`{name}` is set by grove")),
        None => Ok(kwargs),
    }
}

/// `--kv-cache-dtype`'s values (vLLM's flag name).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum KvCacheDtype {
    Auto,
    F32,
    F16,
    Bf16,
}

impl ModelArgs {
    pub fn model_dir(&self) -> PathBuf {
        self.model_path
            .clone()
            .unwrap_or_else(|| PathBuf::from(DEFAULT_MODEL_DIR))
    }
}

/// The compute thread count (default: all cores), also exported as `RAYON_NUM_THREADS`, which
/// candle's matmuls read.
pub fn resolve_threads(threads: Option<usize>) -> usize {
    let threads = threads
        .or_else(|| std::thread::available_parallelism().ok().map(|n| n.get()))
        .unwrap_or(1)
        .max(1);
    std::env::set_var("RAYON_NUM_THREADS", threads.to_string());
    threads
}

/// Runs `job` on a pool of `threads` compute threads (default: all cores). candle's matmuls read
/// the count from `RAYON_NUM_THREADS`, and running the job *inside* the pool makes every
/// parallel section (matmuls, attention) start from a pool thread: started from outside, each
/// one would hand its work to the pool and sleep, a context switch per layer.
pub fn with_threads<T>(
    threads: Option<usize>,
    job: impl FnOnce(usize) -> Result<T> + Send,
) -> Result<T>
where
    T: Send,
{
    let threads = resolve_threads(threads);
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .context("starting the compute thread pool")?;
    pool.install(|| job(threads))
}

/// Speculative decoding methods, named as SGLang's `--speculative-algorithm` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum SpecAlgorithm {
    None,
    #[value(name = "dflash")]
    DFlash,
    #[value(name = "ddtree")]
    DDTree,
    /// Prompt lookup: drafts what followed earlier occurrences of the last tokens (no drafter).
    Ngram,
}

/// A budget flag's value: a number of draft nodes, or `auto`.
pub fn parse_budget(text: &str) -> Result<Budget, String> {
    match text.trim() {
        "auto" => Ok(Budget::Auto),
        // Zero parses: the engine refuses it, naming the flag, as every out-of-range value.
        number => number
            .parse::<usize>()
            .map(Budget::Fixed)
            .map_err(|_| format!("{text:?} is not a budget: a number of draft nodes, or auto")),
    }
}

/// Speculation flags shared by `generate` and `bench`.
#[derive(Debug, Clone, Args)]
pub struct SpecArgs {
    /// none, dflash, ddtree or ngram (case-insensitive). ngram drafts from the text itself
    /// (what followed earlier occurrences of its last tokens) and needs no drafter.
    #[arg(long, value_enum, ignore_case = true, default_value_t = SpecAlgorithm::None)]
    pub speculative_algorithm: SpecAlgorithm,
    /// A DFlash drafter directory (z-lab format: config.json + model.safetensors).
    #[arg(long)]
    pub speculative_draft_model_path: Option<PathBuf>,
    /// Verify block size (anchor + drafts), at most the drafter's block size; default: the
    /// drafter's. With ngram: a fixed budget of this many - 1 drafts.
    #[arg(long)]
    pub speculative_num_draft_tokens: Option<usize>,
    /// DDTree (and DFlash without --speculative-num-draft-tokens): draft nodes verified per
    /// round, or `auto` (the default): chosen each round from this machine's measured verify
    /// and draft costs and the drafter's calibrated acceptance, never more than
    /// --speculative-ddtree-max-budget.
    #[arg(long, value_parser = parse_budget)]
    pub speculative_ddtree_budget: Option<Budget>,
    /// The most draft nodes an `auto` budget verifies per round; default: 32 for DDTree, 16
    /// for ngram, the drafter's block size - 1 for DFlash.
    #[arg(long)]
    pub speculative_ddtree_max_budget: Option<usize>,
    /// DDTree: candidates per depth; default: the budget.
    #[arg(long)]
    pub speculative_ddtree_topk: Option<usize>,
    /// Vocabulary shards for the drafter's per-depth top-K, computed in this process (SGLang's
    /// vocab-parallel LM head, not tensor parallelism: grove runs on one device); results are
    /// identical for any count.
    #[arg(long, default_value_t = 1)]
    pub tp_size: usize,
    /// ngram: the shortest suffix of the text (in tokens) matched against earlier text.
    #[arg(long, default_value_t = LookupConfig::DEFAULT.min_match)]
    pub speculative_ngram_min_match: usize,
    /// ngram: the longest suffix compared (the longest match found is drafted from).
    #[arg(long, default_value_t = LookupConfig::DEFAULT.max_match)]
    pub speculative_ngram_max_match: usize,
    /// DDTree with an automatic budget: lookup drafts (as ngram makes them) join the drafter's
    /// tree each round, and the budget verifies the best nodes of both (true or false).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub speculative_ddtree_lookup: bool,
}

impl SpecArgs {
    /// Loads the drafter the flags ask for, checked against the target.
    pub fn load_drafter(&self, loaded: &Loaded) -> Result<Option<DFlashDrafter>> {
        match self.drafter_path(loaded)? {
            Some(path) => self.load_drafter_from(loaded, &path).map(Some),
            None => Ok(None),
        }
    }

    /// Where the drafter the flags ask for is (checked against the target when a flag named
    /// it): the flag's directory, the default pair's own, or one trained for this target under
    /// the drafters directory; `None` when nothing is drafted.
    pub fn drafter_path(&self, loaded: &Loaded) -> Result<Option<PathBuf>> {
        let path = match (
            self.speculative_algorithm,
            &self.speculative_draft_model_path,
        ) {
            (SpecAlgorithm::None | SpecAlgorithm::Ngram, None) => return Ok(None),
            (SpecAlgorithm::None, Some(_)) => {
                anyhow::bail!(
                    "--speculative-draft-model-path needs --speculative-algorithm dflash or ddtree"
                )
            }
            // The embedded default model comes with its trained drafter.
            (_, None) if loaded.dir == Path::new(DEFAULT_MODEL_DIR) => {
                Path::new(DEFAULT_DRAFTER_DIR)
            }
            (algorithm, None) => {
                let dir = drafters_dir();
                let Some(found) = find_drafter(&dir, &loaded.fingerprint()) else {
                    anyhow::bail!(
                        "--speculative-algorithm {algorithm:?} needs --speculative-draft-model-path \
                         DIR: no drafter in {} was trained for this target",
                        dir.display()
                    )
                };
                eprintln!("drafter: {} (trained for this target)", found.display());
                return Ok(Some(found));
            }
            (_, Some(path)) => path.as_path(),
        };
        DrafterManifest::check(path, &loaded.fingerprint())?;
        Ok(Some(path.to_owned()))
    }

    pub fn load_drafter_from(&self, loaded: &Loaded, path: &Path) -> Result<DFlashDrafter> {
        let tokenizer = loaded.tokenizer.as_ref();
        let resolve = |token: &str| tokenizer.and_then(|t| t.token_to_id(token));
        DFlashDrafter::load(path, &loaded.model, resolve, &Device::Cpu)
            .with_context(|| format!("loading drafter from {}", path.display()))
    }

    /// The verify block size for `drafter`.
    pub fn num_draft_tokens(&self, drafter: &DFlashDrafter) -> usize {
        self.speculative_num_draft_tokens
            .unwrap_or(drafter.config().block_size)
    }

    /// The DDTree budget the flags give (`auto` unless a number was given).
    pub fn ddtree_budget(&self) -> Budget {
        self.speculative_ddtree_budget.unwrap_or(Budget::Auto)
    }

    /// The engine's speculation as the flags give it.
    pub fn settings(&self) -> SpeculationSettings {
        SpeculationSettings {
            algorithm: match self.speculative_algorithm {
                SpecAlgorithm::None => grove_engine::SpecAlgorithm::None,
                SpecAlgorithm::DFlash => grove_engine::SpecAlgorithm::DFlash,
                SpecAlgorithm::DDTree => grove_engine::SpecAlgorithm::DDTree,
                SpecAlgorithm::Ngram => grove_engine::SpecAlgorithm::Ngram,
            },
            num_draft_tokens: self.speculative_num_draft_tokens,
            budget: self.speculative_ddtree_budget,
            max_budget: self.speculative_ddtree_max_budget,
            top_k: self.speculative_ddtree_topk,
            lookup: LookupConfig {
                min_match: self.speculative_ngram_min_match,
                max_match: self.speculative_ngram_max_match,
            },
            lookup_in_trees: self.speculative_ddtree_lookup,
        }
    }

    /// Configures `generator` for the chosen method with `drafter`.
    pub fn apply<'a>(
        &self,
        generator: Generator<'a>,
        drafter: Option<&'a DFlashDrafter>,
    ) -> Result<Generator<'a>> {
        let drafter = drafter.map(|d| d as &dyn Drafter);
        Ok(generator.with_speculation(self.settings(), drafter)?)
    }
}

pub struct Loaded {
    pub model: Decoder,
    pub tokenizer: Option<TextTokenizer>,
    pub dir: PathBuf,
}

impl Loaded {
    /// What a shipped drafter's manifest must name to fit this target.
    pub fn fingerprint(&self) -> TargetFingerprint {
        TargetFingerprint::of(&self.model, self.tokenizer.as_ref())
    }

    /// What the server's engine thread owns: the model, its drafter and tokenizer.
    pub fn into_served(self, drafter: Option<DFlashDrafter>) -> ServedModel {
        ServedModel {
            model: Box::new(self.model) as Box<dyn Model>,
            drafter: drafter.map(|d| Box::new(d) as Box<dyn Drafter>),
            tokenizer: self.tokenizer.map(std::sync::Arc::new),
        }
    }

    /// Sampling defaults from the checkpoint's `generation_config.json` (none for a GGUF file).
    pub fn sampling_defaults(&self) -> Result<grove_core::SamplingDefaults> {
        Ok(generation_sampling(&self.dir)?)
    }

    /// The ids that end generation: the checkpoint's `eos_token_id`s and the tokenizer's EOS.
    pub fn stop_token_ids(&self) -> Result<Vec<TokenId>> {
        let mut ids = generation_stop_ids(&self.dir, &self.model.config().eos_token_ids)?;
        if let Some(id) = self.tokenizer.as_ref().and_then(|t| t.eos_token_id()) {
            if !ids.contains(&id) {
                ids.push(id);
            }
        }
        Ok(ids)
    }
}

/// Loads the model and, if the directory has one, its tokenizer (with `--chat-template`).
pub fn load(args: &ModelArgs) -> Result<Loaded> {
    let mut loaded = load_model(args)?;
    if let Some(path) = &args.chat_template {
        let template = std::fs::read_to_string(path)
            .with_context(|| format!("--chat-template {}", path.display()))?;
        let tokenizer = loaded.tokenizer.take().with_context(|| {
            format!(
                "--chat-template needs the model's tokenizer ({} has no tokenizer.json)",
                loaded.dir.display()
            )
        })?;
        loaded.tokenizer = Some(
            tokenizer
                .with_chat_template(template)
                .with_context(|| format!("--chat-template {}", path.display()))?,
        );
    }
    Ok(loaded)
}

fn load_model(args: &ModelArgs) -> Result<Loaded> {
    let mut loaded = load_weights(args)?;
    let dtype = match args.kv_cache_dtype {
        KvCacheDtype::Auto => None,
        KvCacheDtype::F32 => Some(KvDtype::F32),
        KvCacheDtype::F16 => Some(KvDtype::F16),
        KvCacheDtype::Bf16 => Some(KvDtype::Bf16),
    };
    if let Some(dtype) = dtype {
        loaded.model = loaded.model.with_kv_dtype(dtype);
    }
    Ok(loaded)
}

fn load_weights(args: &ModelArgs) -> Result<Loaded> {
    let dir = args.model_dir();
    if grove_model::gguf::is_gguf(&dir) {
        // The tokenizer first: building it peaks at several times its final size, and the
        // weights copied into the kernels' layout are resident from the moment they load.
        let tokenizer = grove_model::gguf::GgufFile::open(&dir)?.tokenizer()?;
        grove_kernels::memory::release_freed_memory();
        let model = Decoder::load(&dir, &Device::Cpu)
            .with_context(|| format!("loading model from {}", dir.display()))?;
        return Ok(Loaded {
            model,
            tokenizer: Some(tokenizer),
            dir,
        });
    }
    if !dir.is_dir() {
        anyhow::bail!(
            "--model-path {}: not a directory or a .gguf file",
            dir.display()
        );
    }
    let model = Decoder::load(&dir, &Device::Cpu)
        .with_context(|| format!("loading model from {}", dir.display()))?;
    let tokenizer = if dir.join("tokenizer.json").is_file() {
        Some(TextTokenizer::load(&dir)?)
    } else {
        None
    };
    Ok(Loaded {
        model,
        tokenizer,
        dir,
    })
}

/// Shapes `grove tiny-model` can write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Preset {
    /// The embedded default: 4 layers, hidden 128, byte-level tokenizer.
    Tiny,
    /// Qwen3-0.6B's shape with random weights, for speed measurements.
    #[value(name = "qwen3-0.6b-shape")]
    Qwen3Shape,
    /// Llama 3.2 1B's shape with random weights, for speed measurements.
    #[value(name = "llama3.2-1b-shape")]
    Llama32Shape,
}

#[derive(Debug, Args)]
pub struct TinyModelArgs {
    /// Output directory.
    #[arg(long, default_value = TINY_MODEL_DIR)]
    pub out: PathBuf,
    #[arg(long, default_value_t = TINY_MODEL_SEED)]
    pub seed: u64,
    #[arg(long, value_enum, default_value_t = Preset::Tiny)]
    pub preset: Preset,
    /// Also write the checkpoint as this GGUF file (F32 tensors, llama.cpp's names and layout,
    /// placeholder tokenizer metadata), for llama.cpp's quantizer to turn into the formats real
    /// files use (`scripts/install_models.py --quantize`).
    #[arg(long, value_name = "FILE.gguf")]
    pub gguf: Option<PathBuf>,
}

pub fn write_tiny_model(args: TinyModelArgs) -> Result<()> {
    let spec = match args.preset {
        Preset::Tiny => RandomCheckpoint::tiny_qwen3(args.seed),
        Preset::Qwen3Shape => RandomCheckpoint::qwen3_0_6b_shape(args.seed),
        Preset::Llama32Shape => RandomCheckpoint::llama3_2_1b_shape(args.seed),
    };
    spec.write(&args.out)?;
    eprintln!("wrote {}", args.out.display());
    if let Some(gguf) = &args.gguf {
        let arch = grove_testkit::gguf_writer::architecture(spec.family);
        let f32 = candle_core::quantized::GgmlDType::F32;
        grove_testkit::gguf_writer::try_write_gguf(&args.out, &spec, arch, f32, gguf)
            .with_context(|| format!("writing {}", gguf.display()))?;
        eprintln!("wrote {}", gguf.display());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn template_kwargs_are_a_json_object_of_the_templates_own_variables() {
        let parsed = parse_template_kwargs(r#"{"enable_thinking": false}"#).unwrap();
        assert_eq!(parsed["enable_thinking"], serde_json::json!(false));
        assert!(parse_template_kwargs("[1]").unwrap_err().contains("object"));
        assert!(parse_template_kwargs("{").unwrap_err().contains("JSON"));
        let own = parse_template_kwargs(r#"{"add_generation_prompt": false}"#).unwrap_err();
        assert!(own.contains("add_generation_prompt"), "{own}");
    }
}
