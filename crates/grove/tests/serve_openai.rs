//! `grove serve` as users run it: the real binary on 127.0.0.1 at a free port, serving the
//! embedded default pair with DDTree, driven by the
//! official `openai` Python client (tests/python/openai_client.py). Skipped with a printed
//! reason when python3 or the `openai` package is missing, unless `GROVE_REQUIRE_OPENAI=1`
//! (CI sets it after installing the package).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

fn openai_available() -> bool {
    Command::new("python3")
        .args(["-c", "import openai"])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Kills the server when the test ends, passing or not.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `grove serve` on a free port and returns it with its base URL.
fn start(args: &[&str]) -> (Server, String) {
    start_with_env(args, &[])
}

/// [`start`] with environment variables set for the server.
fn start_with_env(args: &[&str], env: &[(&str, &str)]) -> (Server, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_grove"))
        .arg("serve")
        .args(["--port", "0", "--threads", "1"])
        .args(args)
        .envs(env.iter().copied())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting grove serve");
    let stderr = child.stderr.take().unwrap();
    let server = Server(child);
    let mut lines = BufReader::new(stderr).lines();
    let url = loop {
        let line = lines
            .next()
            .expect("grove serve exited before listening")
            .unwrap();
        eprintln!("{line}");
        if let Some((_, url)) = line.split_once("listening on ") {
            break url.trim().to_owned();
        }
    };
    // Keep draining the server's log so it never blocks on a full pipe.
    std::thread::spawn(move || lines.for_each(drop));
    (server, url)
}

/// Runs `tests/python/{script}` against `grove serve` started with `server_args`; skipped
/// without python3 and `openai` unless `GROVE_REQUIRE_OPENAI` is set.
fn run_client_script(script: &str, server_args: &[&str]) {
    if !openai_available() {
        assert!(
            std::env::var_os("GROVE_REQUIRE_OPENAI").is_none(),
            "GROVE_REQUIRE_OPENAI is set but `python3 -c 'import openai'` fails"
        );
        eprintln!(
            "skipped: python3 with the `openai` package is not installed (pip install openai)"
        );
        return;
    }
    let (_server, url) = start(server_args);
    let script: PathBuf = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/python")
        .join(script);
    let output = Command::new("python3")
        .arg(&script)
        .arg(&url)
        .output()
        .expect("running python3");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    eprintln!("{stdout}{stderr}");
    assert!(
        output.status.success(),
        "openai client checks failed:\n{stdout}\n{stderr}"
    );
    assert!(stdout.contains("checks passed"));
}

#[test]
fn the_openai_python_client_drives_grove_serve() {
    // The embedded default pair: DDTree with its trained drafter.
    run_client_script(
        "openai_client.py",
        &[
            "--speculative-algorithm",
            "ddtree",
            "--speculative-ddtree-budget",
            "6",
        ],
    );
}

/// The client reads a thinking model's answers: `--reasoning-parser` and
/// `--chat-template-kwargs` on the same binary.
#[test]
fn the_openai_python_client_reads_reasoning_content() {
    run_client_script(
        "openai_reasoning.py",
        &[
            "--reasoning-parser",
            "deepseek-r1",
            "--chat-template-kwargs",
            r#"{"enable_thinking": false}"#,
        ],
    );
}

/// The whole response to an HTTP/1.0 request (`body`: a JSON POST, else a GET).
fn http(url: &str, path: &str, key: Option<&str>, body: Option<&str>) -> String {
    use std::io::{Read, Write};
    let address = url.trim_start_matches("http://");
    let mut stream = std::net::TcpStream::connect(address).unwrap();
    let auth = key.map_or(String::new(), |k| format!("Authorization: Bearer {k}\r\n"));
    let head = match body {
        Some(body) => format!(
            "POST {path} HTTP/1.0\r\nHost: {address}\r\n{auth}Content-Type: application/json\r\n\
             Content-Length: {}\r\n\r\n{body}",
            body.len()
        ),
        None => format!("GET {path} HTTP/1.0\r\nHost: {address}\r\n{auth}\r\n"),
    };
    stream.write_all(head.as_bytes()).unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    response
}

/// The status code of `GET path` (optionally with a bearer token).
fn get_status(url: &str, path: &str, key: Option<&str>) -> u16 {
    let response = http(url, path, key, None);
    response.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// The API key can come from `GROVE_API_KEY` (a command line is visible in `ps`); `/health`
/// and `/metrics` stay open.
#[test]
fn the_api_key_is_read_from_the_environment() {
    let (_server, url) = start_with_env(&[], &[("GROVE_API_KEY", "sesame")]);
    assert_eq!(get_status(&url, "/v1/models", None), 401);
    assert_eq!(get_status(&url, "/v1/models", Some("wrong")), 401);
    assert_eq!(get_status(&url, "/v1/models", Some("sesame")), 200);
    assert_eq!(get_status(&url, "/health", None), 200);
    assert_eq!(get_status(&url, "/metrics", None), 200);
}

/// SIGTERM: the listener closes, requests that cannot finish within
/// `--timeout-graceful-shutdown` end with an error event and `[DONE]`, and the process exits 0.
#[test]
fn sigterm_ends_running_streams_cleanly_and_exits_zero() {
    // One request at a time, eight queued: far more than the one-second grace period holds.
    let (mut server, url) = start(&[
        "--timeout-graceful-shutdown",
        "1",
        "--max-running-requests",
        "1",
    ]);
    let long = r#"{"model": "grove-default", "prompt": "x", "max_tokens": 1000, "ignore_eos": true,
                  "stream": true}"#;
    let streams: Vec<_> = (0..8)
        .map(|_| {
            let url = url.clone();
            std::thread::spawn(move || http(&url, "/v1/completions", None, Some(long)))
        })
        .collect();
    // Every request is in before the signal (the listener closes with it).
    let waiting = |health: &str| -> u64 {
        let after = health.split("\"waiting\":").nth(1).unwrap_or("0");
        after
            .split(|c: char| !c.is_ascii_digit())
            .next()
            .unwrap()
            .parse()
            .unwrap_or(0)
    };
    let started = std::time::Instant::now();
    while waiting(&http(&url, "/health", None, None)) < 5 {
        assert!(
            started.elapsed().as_secs() < 30,
            "the requests never queued"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let pid = server.0.id().to_string();
    let killed = Command::new("kill").args(["-TERM", &pid]).status().unwrap();
    assert!(killed.success());
    let responses: Vec<String> = streams.into_iter().map(|s| s.join().unwrap()).collect();
    for response in &responses {
        assert!(response.trim_end().ends_with("data: [DONE]"), "{response}");
    }
    assert!(
        responses.iter().any(|r| r.contains("server_shutting_down")),
        "every request finished within the grace period"
    );
    let started = std::time::Instant::now();
    let status = loop {
        if let Some(status) = server.0.try_wait().unwrap() {
            break status;
        }
        assert!(started.elapsed().as_secs() < 10, "grove serve did not exit");
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    assert!(status.success(), "{status:?}");
}

/// Whether SGLang's model gateway is installed; prints why not.
fn gateway_available() -> bool {
    let ok = Command::new("python3")
        .args(["-c", "import sglang_router"])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        assert!(
            std::env::var_os("GROVE_REQUIRE_SGLANG_ROUTER").is_none(),
            "GROVE_REQUIRE_SGLANG_ROUTER is set but `python3 -c 'import sglang_router'` fails"
        );
        eprintln!("skipped: sglang-router is not installed (pip install sglang-router)");
    }
    ok
}

/// Two replicas behind sglang-router (issue 27): the gateway lists grove's model, spreads 16
/// concurrent requests (completions and chat, streamed and not) over both; with
/// `--policy cache_aware` the requests that share a long prefix land on one replica; after one
/// replica is killed the gateway answers 8 more from the other.
#[test]
fn two_replicas_serve_behind_sglang_router_and_fail_over() {
    if !gateway_available() {
        return;
    }
    let replica = || start(&["--max-running-requests", "4"]);
    let (first, first_url) = replica();
    let (second, second_url) = replica();
    let free_port = || {
        std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
            .to_string()
    };
    let gateway = |policy: &str| {
        // Each gateway also serves its own metrics: two must not share the default port.
        let (port, metrics_port) = (free_port(), free_port());
        let router = Server(
            Command::new("python3")
                .args(["-m", "sglang_router.launch_router", "--host", "127.0.0.1"])
                .args(["--port", &port, "--policy", policy])
                .args(["--prometheus-port", &metrics_port])
                .args(["--health-check-interval-secs", "1"])
                .args(["--health-failure-threshold", "1"])
                .arg("--worker-urls")
                .args([&first_url, &second_url])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("starting sglang-router"),
        );
        (router, format!("http://127.0.0.1:{port}"))
    };
    let (router, router_url) = gateway("round_robin");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/gateway.py");
    let phase = |args: &[&str]| {
        let output = Command::new("python3")
            .arg(&script)
            .args(args)
            .output()
            .expect("running python3");
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        eprintln!("{stdout}{}", String::from_utf8_lossy(&output.stderr));
        assert!(
            output.status.success() && stdout.contains("checks passed"),
            "{stdout}"
        );
    };
    phase(&["spread", &router_url, &first_url, &second_url]);
    let (cache_aware, cache_aware_url) = gateway("cache_aware");
    phase(&["affinity", &cache_aware_url, &first_url, &second_url]);
    drop(cache_aware);
    drop(second);
    phase(&["failover", &router_url]);
    drop((router, first));
}

/// The lookup corpus (`--speculative-ngram-capacity`): kept by default where requests draft by
/// lookup, not on a plain server, off with 0, and a capacity past its limit is refused by name.
#[test]
fn the_lookup_corpus_follows_its_flag() {
    let body = r#"{"model": "grove-default", "prompt": "def fib(n):", "max_tokens": 12}"#;
    for (args, capacity) in [
        (&["--speculative-algorithm", "ngram"][..], 1 << 20),
        (
            &[
                "--speculative-algorithm",
                "ngram",
                "--speculative-ngram-capacity",
                "0",
            ][..],
            0,
        ),
        (&["--speculative-ngram-capacity", "100"][..], 100),
        (&[][..], 0),
    ] {
        let kept = capacity > 0;
        let (_server, url) = start(args);
        let info = http(&url, "/server_info", None, None);
        assert!(
            info.contains(&format!("\"speculative_ngram_capacity\":{capacity}")),
            "{args:?}: {info}"
        );
        let response = http(&url, "/v1/completions", None, Some(body));
        assert!(response.starts_with("HTTP/1.0 200"), "{args:?}: {response}");
        // The gauges are written after the step that finished the request.
        let mut tokens = 0.0;
        for _ in 0..200 {
            let page = http(&url, "/metrics", None, None);
            tokens = page
                .lines()
                .find_map(|l| l.strip_prefix("grove_ngram_corpus_tokens "))
                .map_or(0.0, |v| v.trim().parse().unwrap());
            if tokens > 0.0 || !kept {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert_eq!(tokens > 0.0, kept, "{args:?}: {tokens} tokens kept");
    }
    let refused = Command::new(env!("CARGO_BIN_EXE_grove"))
        .args(["serve", "--port", "0", "--speculative-algorithm", "ngram"])
        .args(["--speculative-ngram-capacity", "4294967296"])
        .output()
        .expect("running grove serve");
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success());
    assert!(stderr.contains("speculative_ngram_capacity"), "{stderr}");
}

/// `--speculative-ngram-external-corpus-path`: a completion that the file's text holds drafts
/// from it (same text, more tokens a round); a line that is not a text, and a file past
/// `--speculative-ngram-external-corpus-max-tokens`, are refused at start by name.
#[test]
fn an_external_corpus_is_drafted_from_and_checked_at_start() {
    let prompt = "def fib(n):";
    let body = format!(
        r#"{{"model": "grove-default", "prompt": "{prompt}", "max_tokens": 48, "temperature": 0}}"#
    );
    let ngram = [
        "--speculative-algorithm",
        "ngram",
        "--speculative-ngram-capacity",
        "0",
    ];
    let complete = |args: &[&str]| {
        let (_server, url) = start(args);
        let response = http(&url, "/v1/completions", None, Some(&body));
        let json: serde_json::Value =
            serde_json::from_str(response.split("\r\n\r\n").nth(1).unwrap()).unwrap();
        let text = json["choices"][0]["text"].as_str().unwrap().to_owned();
        let tau = json["usage"]["speculative"]["mean_accept_length"]
            .as_f64()
            .unwrap();
        (text, tau)
    };
    let (text, tau) = complete(&ngram);
    let dir = std::env::temp_dir().join(format!("grove-corpus-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("corpus.jsonl");
    let line = serde_json::to_string(&format!("{prompt}{text}")).unwrap();
    std::fs::write(&path, format!("{line}\n{{\"text\": \"x = 1\"}}\n")).unwrap();
    let path_arg = path.to_str().unwrap();
    let corpus = ["--speculative-ngram-external-corpus-path", path_arg];
    let (again, tau_again) = complete(&[&ngram[..], &corpus[..]].concat());
    assert_eq!(again, text);
    assert!(
        tau_again > tau + 1.0,
        "tau {tau} without the corpus, {tau_again} with"
    );
    let refused = |args: &[&str]| {
        let output = Command::new(env!("CARGO_BIN_EXE_grove"))
            .args(["serve", "--port", "0"])
            .args(args)
            .output()
            .expect("running grove serve");
        assert!(!output.status.success());
        String::from_utf8_lossy(&output.stderr).into_owned()
    };
    let stderr = refused(
        &[
            &corpus[..],
            &["--speculative-ngram-external-corpus-max-tokens", "3"],
        ]
        .concat(),
    );
    assert!(
        stderr.contains("--speculative-ngram-external-corpus-max-tokens (3)"),
        "{stderr}"
    );
    std::fs::write(&path, "\"fine\"\n[1, 2]\n").unwrap();
    let stderr = refused(&corpus);
    assert!(stderr.contains("line 2"), "{stderr}");
    std::fs::remove_dir_all(&dir).unwrap();
}
