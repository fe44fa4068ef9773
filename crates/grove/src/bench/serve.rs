//! `grove bench --serve`: throughput and latency through the real HTTP server. One in-process
//! server (the engine thread and axum on 127.0.0.1) runs DDTree at the flags' budget; requests
//! pick none / dflash / ddtree with the `speculative` extension, so all methods run against the
//! same server in the same run, alternating, at each concurrency.

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use futures_util::StreamExt;
use grove_engine::{Budget, EngineLimits, GeneratorOptions, SpecAlgorithm};
use grove_model::Model;
use grove_server::{EngineSettings, ServerConfig};
use rand::{Rng, SeedableRng};
use serde::Serialize;
use serde_json::{json, Value};

use super::args::BenchArgs;
use crate::loading;

/// One streamed request as the client saw it.
#[derive(Debug, Default)]
struct Timing {
    ttft: f64,
    /// Gaps between successive token chunks (one per engine step).
    gaps: Vec<f64>,
    e2e: f64,
    tokens: usize,
    tau: f64,
}

#[derive(Debug, Serialize)]
struct ServePoint {
    method: String,
    concurrency: usize,
    requests: usize,
    output_tokens_per_s: f64,
    requests_per_s: f64,
    ttft_ms_p50: f64,
    ttft_ms_p90: f64,
    inter_token_ms_p50: f64,
    e2e_ms_p50: f64,
    e2e_ms_p90: f64,
    mean_accept_length: f64,
    /// Output tokens/s relative to `none` at the same concurrency, same run.
    throughput_vs_none: f64,
}

fn percentile(values: &[f64], q: f64) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

pub fn run(args: &BenchArgs) -> Result<()> {
    let threads = loading::resolve_threads(args.model.threads);
    let loaded = loading::load(&args.model)?;
    let drafter = args.spec.load_drafter(&loaded)?;
    let mut methods = vec![("none".to_string(), json!({"algorithm": "none"}))];
    let mut speculation = args.spec.settings();
    if drafter.is_some() {
        speculation.algorithm = SpecAlgorithm::DDTree;
        // The server's own budget (auto unless a number was given), then each --budgets one.
        let own = match args.spec.ddtree_budget() {
            Budget::Auto => "auto".to_string(),
            Budget::Fixed(nodes) => format!("b{nodes}"),
        };
        methods.push(("dflash".into(), json!({"algorithm": "dflash"})));
        methods.push((format!("ddtree-{own}"), json!({"algorithm": "ddtree"})));
        for budget in &args.budgets {
            let (label, value) = match budget {
                Budget::Auto => ("auto".to_string(), json!("auto")),
                Budget::Fixed(nodes) => (format!("b{nodes}"), json!(nodes)),
            };
            if label != own {
                methods.push((
                    format!("ddtree-{label}"),
                    json!({"algorithm": "ddtree", "budget": value}),
                ));
            }
        }
    }
    let max_concurrency = args.concurrency.iter().copied().max().unwrap_or(1);
    let vocab = loaded.model.config().vocab_size;
    let per_request = args.prompt_tokens + args.new_tokens + 128;
    let server = grove_server::start(
        loaded.into_served(drafter),
        ServerConfig {
            model_path: args.model.model_dir().display().to_string(),
            drafter_path: None,
            model_name: "bench".into(),
            api_key: None,
            stop_token_ids: Vec::new(),
            context_length: None,
            sampling_defaults: Default::default(),
            reasoning_parser: None,
            chat_template_kwargs: Default::default(),
            engine: EngineSettings {
                options: GeneratorOptions {
                    page_size: args.model.page_size,
                    ..Default::default()
                },
                speculation,
                limits: EngineLimits {
                    max_total_tokens: per_request * max_concurrency,
                    max_running: max_concurrency,
                    // Every method is sent the same prompts: a cache would prefill them for the
                    // first method only.
                    prefix_cache: false,
                    // Nor may a method draft from the answers an earlier one wrote.
                    ngram_corpus: Some(0),
                    external_corpus: None,
                    prefill_step: None,
                },
                max_queued: 4 * max_concurrency,
                threads,
            },
        },
    )
    .map_err(|e| anyhow::anyhow!("starting the engine: {e}"))?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let points = runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let base = format!("http://{}", listener.local_addr()?);
        let limits = grove_server::ConnectionLimits {
            keep_alive: std::time::Duration::from_secs(10),
            max_connections: grove_server::ConnectionLimits::default_max_connections(),
        };
        tokio::spawn(grove_server::serve(
            listener,
            server.router,
            limits,
            std::future::pending(),
        ));
        let client = reqwest::Client::new();
        let mut rng = rand_chacha::ChaCha12Rng::seed_from_u64(0);
        let mut points: Vec<ServePoint> = Vec::new();
        for &concurrency in &args.concurrency {
            let prompts: Vec<Vec<u32>> = (0..concurrency * args.requests_per_client)
                .map(|_| {
                    (0..args.prompt_tokens)
                        .map(|_| rng.random_range(0..vocab as u32))
                        .collect()
                })
                .collect();
            let load = Load {
                client: &client,
                base: &base,
                args,
                prompts: &prompts,
                concurrency,
            };
            points.extend(load.run(&methods).await?);
        }
        anyhow::Ok(points)
    })?;
    report(args, threads, &points)
}

/// One concurrency level's requests against the running server.
struct Load<'a> {
    client: &'a reqwest::Client,
    base: &'a str,
    args: &'a BenchArgs,
    /// `[concurrency * requests_per_client]`; client `c` sends its own slice in order.
    prompts: &'a [Vec<u32>],
    concurrency: usize,
}

impl Load<'_> {
    /// Each method in turn after a warm-up request of each: its point, throughput as a ratio
    /// to plain decoding at the same concurrency.
    async fn run(&self, methods: &[(String, Value)]) -> Result<Vec<ServePoint>> {
        let new_tokens = self.args.new_tokens;
        for (_, method) in methods {
            request(self.client, self.base, &self.prompts[0], new_tokens, method).await?;
        }
        let mut points: Vec<ServePoint> = Vec::new();
        for (label, method) in methods {
            let start = Instant::now();
            let all = self.clients(method).await?;
            let wall = start.elapsed().as_secs_f64();
            let baseline = points.first().map(|p| p.output_tokens_per_s);
            points.push(self.point(label, &all, wall, baseline));
        }
        Ok(points)
    }

    /// Every client's requests with `method` (the `speculative` extension), the clients
    /// concurrent.
    async fn clients(&self, method: &Value) -> Result<Vec<Timing>> {
        let per_client = self.args.requests_per_client;
        let per_client =
            futures_util::future::join_all((0..self.concurrency).map(|c| async move {
                let mut own = Vec::new();
                for prompt in &self.prompts[c * per_client..(c + 1) * per_client] {
                    own.push(
                        request(self.client, self.base, prompt, self.args.new_tokens, method)
                            .await?,
                    );
                }
                anyhow::Ok(own)
            }))
            .await;
        Ok(per_client
            .into_iter()
            .collect::<Result<Vec<_>>>()?
            .into_iter()
            .flatten()
            .collect())
    }

    fn point(&self, method: &str, all: &[Timing], wall: f64, none: Option<f64>) -> ServePoint {
        let tokens: usize = all.iter().map(|t| t.tokens).sum();
        let ttft: Vec<f64> = all.iter().map(|t| t.ttft * 1e3).collect();
        let gaps: Vec<f64> = all
            .iter()
            .flat_map(|t| t.gaps.iter().map(|g| g * 1e3))
            .collect();
        let e2e: Vec<f64> = all.iter().map(|t| t.e2e * 1e3).collect();
        let throughput = tokens as f64 / wall;
        ServePoint {
            method: method.into(),
            concurrency: self.concurrency,
            requests: all.len(),
            output_tokens_per_s: throughput,
            requests_per_s: all.len() as f64 / wall,
            ttft_ms_p50: percentile(&ttft, 0.5),
            ttft_ms_p90: percentile(&ttft, 0.9),
            inter_token_ms_p50: percentile(&gaps, 0.5),
            e2e_ms_p50: percentile(&e2e, 0.5),
            e2e_ms_p90: percentile(&e2e, 0.9),
            mean_accept_length: all.iter().map(|t| t.tau).sum::<f64>() / all.len().max(1) as f64,
            throughput_vs_none: throughput / none.unwrap_or(throughput),
        }
    }
}

/// The table on stderr, the JSON on stdout (and in `--json`).
fn report(args: &BenchArgs, threads: usize, points: &[ServePoint]) -> Result<()> {
    eprintln!(
        "grove bench --serve | model {} | threads {threads} | {} prompt + {} new tokens | {} requests per client",
        args.model.model_dir().display(),
        args.prompt_tokens,
        args.new_tokens,
        args.requests_per_client
    );
    eprintln!("  method       conc  reqs    tok/s  x none   req/s  ttft p50/p90 ms   itl p50 ms  e2e p50/p90 ms   tau");
    for p in points {
        eprintln!(
            "  {:<12} {:>4} {:>5} {:>8.1} {:>7.2} {:>7.2} {:>7.1}/{:<7.1} {:>10.2} {:>8.1}/{:<8.1} {:>5.2}",
            p.method, p.concurrency, p.requests, p.output_tokens_per_s, p.throughput_vs_none,
            p.requests_per_s, p.ttft_ms_p50, p.ttft_ms_p90, p.inter_token_ms_p50, p.e2e_ms_p50,
            p.e2e_ms_p90, p.mean_accept_length
        );
    }
    let report = json!({"threads": threads, "prompt_tokens": args.prompt_tokens,
                        "new_tokens": args.new_tokens, "serve": points});
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&report)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    println!("{report}");
    Ok(())
}

/// One streaming completion of exactly `new_tokens` tokens with `method` (the `speculative`
/// extension).
async fn request(
    client: &reqwest::Client,
    base: &str,
    prompt: &[u32],
    new_tokens: usize,
    method: &Value,
) -> Result<Timing> {
    let body = json!({
        "model": "bench", "prompt": prompt, "max_tokens": new_tokens, "temperature": 0,
        "ignore_eos": true, "stream": true, "return_token_ids": true,
        "stream_options": {"include_usage": true}, "speculative": method,
    });
    let start = Instant::now();
    let response = client
        .post(format!("{base}/v1/completions"))
        .json(&body)
        .send()
        .await?;
    if !response.status().is_success() {
        anyhow::bail!("{}: {}", response.status(), response.text().await?);
    }
    let mut timing = Timing::default();
    let mut last: Option<Duration> = None;
    let mut buffer = String::new();
    let mut chunks = response.bytes_stream();
    while let Some(chunk) = chunks.next().await {
        buffer.push_str(&String::from_utf8_lossy(&chunk?));
        while let Some(end) = buffer.find("\n\n") {
            let event: String = buffer.drain(..end + 2).collect();
            let Some(data) = event.trim().strip_prefix("data: ") else {
                continue;
            };
            if data == "[DONE]" {
                continue;
            }
            let value: Value = serde_json::from_str(data)?;
            if let Some(tokens) = value["choices"]
                .get(0)
                .and_then(|c| c["token_ids"].as_array())
            {
                let now = start.elapsed();
                match last {
                    None => timing.ttft = now.as_secs_f64(),
                    Some(previous) => timing.gaps.push((now - previous).as_secs_f64()),
                }
                last = Some(now);
                timing.tokens += tokens.len();
            }
            if let Some(tau) = value["usage"]["speculative"]["mean_accept_length"].as_f64() {
                timing.tau = tau;
            }
        }
    }
    timing.e2e = start.elapsed().as_secs_f64();
    Ok(timing)
}
