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

#[test]
fn the_openai_python_client_drives_grove_serve() {
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
    // The embedded default pair: DDTree with its trained drafter.
    let (_server, url) = start(&[
        "--speculative-algorithm",
        "ddtree",
        "--speculative-ddtree-budget",
        "6",
    ]);
    let script: PathBuf =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/openai_client.py");
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

/// The status code of `GET path` (HTTP/1.0, optionally with a bearer token).
fn get_status(url: &str, path: &str, key: Option<&str>) -> u16 {
    use std::io::{Read, Write};
    let address = url.trim_start_matches("http://");
    let mut stream = std::net::TcpStream::connect(address).unwrap();
    let auth = key.map_or(String::new(), |k| format!("Authorization: Bearer {k}\r\n"));
    write!(
        stream,
        "GET {path} HTTP/1.0\r\nHost: {address}\r\n{auth}\r\n"
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
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
