//! `grove bench`: the default run compares decoding methods and prints the verify cost curve
//! (`methods.rs`); `--compare-llama-cpp` measures against llama.cpp on the same GGUF file
//! (`llama.rs`), `--report DIR` sweeps DDTree budgets on code prompts into JSON and charts
//! (`report.rs`), `--load-change DIR` traces the automatic budget under a changing load
//! (`load.rs`), `--serve` loads a running server (`serve.rs`). `args.rs` holds the flags and
//! `measure.rs` what they all measure with.

mod args;
mod llama;
mod load;
mod measure;
mod methods;
mod report;

pub(crate) use report::register_font;
mod serve;

use anyhow::Result;

pub use args::BenchArgs;

use crate::loading;

pub fn run(args: BenchArgs) -> Result<()> {
    if args.serve {
        return serve::run(&args);
    }
    if let Some(dir) = &args.report {
        return report::run(&args, dir);
    }
    if let Some(dir) = &args.load_change {
        return load::run(&args, dir);
    }
    if args.compare_llama_cpp {
        return loading::with_threads(args.model.threads, |threads| llama::run(&args, threads));
    }
    loading::with_threads(args.model.threads, |threads| methods::run(&args, threads))
}
