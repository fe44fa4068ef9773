//! The listener's limits (issue 26, item 3): a connection that sends no complete request head
//! within the keep-alive timeout (idle from the start, half-sent headers, a slowloris client,
//! idle between requests) is closed; requests being answered are not; past the connection
//! cap new connections are closed at once and counted in `/metrics`.

mod common;

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::*;
use grove_server::ConnectionLimits;

fn server(keep_alive_ms: u64, max_connections: usize) -> TestServer {
    let limits = ConnectionLimits {
        keep_alive: Duration::from_millis(keep_alive_ms),
        max_connections,
    };
    TestServer::start_with(golden_served(), config("golden", 4, 2048, 4, 8), limits)
}

fn connect(server: &TestServer) -> TcpStream {
    let stream = TcpStream::connect(server.base.trim_start_matches("http://")).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    stream
}

/// Reads until the server closes the connection; returns what it sent and when it closed.
fn read_until_closed(stream: &mut TcpStream) -> (String, Instant) {
    let mut received = Vec::new();
    let mut buffer = [0u8; 4096];
    loop {
        match stream.read(&mut buffer) {
            Ok(0) => break,
            Ok(n) => received.extend_from_slice(&buffer[..n]),
            Err(e) if e.kind() == ErrorKind::ConnectionReset => break,
            Err(e) => panic!("the server kept the connection open: {e}"),
        }
    }
    (
        String::from_utf8_lossy(&received).into_owned(),
        Instant::now(),
    )
}

#[test]
fn idle_half_sent_and_slow_headers_are_cut_at_the_timeout() {
    let server = server(700, 64);
    // Nothing sent at all.
    let mut idle = connect(&server);
    // Half a request head, never finished.
    let mut partial = connect(&server);
    partial
        .write_all(b"POST /v1/completions HTTP/1.1\r\nHost: grove\r\nContent-Ty")
        .unwrap();
    let opened = Instant::now();
    for stream in [&mut idle, &mut partial] {
        let (_, closed) = read_until_closed(stream);
        let after = closed - opened;
        assert!(after < Duration::from_secs(5), "closed after {after:?}");
    }
    // A slowloris client: a byte every 200 ms keeps the socket busy, never completes the head.
    let mut slow = connect(&server);
    let opened = Instant::now();
    let mut cut = false;
    for byte in b"GET /health HTTP/1.1\r\nHost: grove\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa" {
        if slow.write_all(&[*byte]).is_err() {
            cut = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
        if opened.elapsed() > Duration::from_secs(4) {
            break;
        }
    }
    let (sent, closed) = read_until_closed(&mut slow);
    assert!(cut || closed - opened < Duration::from_secs(6));
    assert!(!sent.contains("200 OK"), "{sent}");
}

#[test]
fn a_kept_alive_connection_is_closed_when_idle_and_answers_in_between() {
    let server = server(700, 64);
    let mut stream = connect(&server);
    for _ in 0..2 {
        stream
            .write_all(b"GET /health HTTP/1.1\r\nHost: grove\r\n\r\n")
            .unwrap();
        let mut head = [0u8; 12];
        stream.read_exact(&mut head).unwrap();
        assert_eq!(&head, b"HTTP/1.1 200");
        // Within the timeout the connection stays usable.
        std::thread::sleep(Duration::from_millis(200));
        let mut rest = [0u8; 4096];
        let _ = stream.set_read_timeout(Some(Duration::from_millis(50)));
        let _ = stream.read(&mut rest);
        stream
            .set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
    }
    let idle_from = Instant::now();
    let (_, closed) = read_until_closed(&mut stream);
    let after = closed - idle_from;
    assert!(after < Duration::from_secs(5), "closed after {after:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_longer_than_the_timeout_is_answered() {
    let timeout = Duration::from_millis(100);
    let server = server(timeout.as_millis() as u64, 64);
    // The stream must outlive the timeout (tokens, keep-alive pings) on a fast machine too:
    // 200 tokens were generated and read within a 300 ms timeout on a Zen 5, so the test
    // proved nothing there. 1000 (the golden model's context is 1024) took 0.37 s there,
    // 3.7 timeouts, and the client reads slowly until three timeouts have passed.
    let body = serde_json::json!({
        "model": "golden", "prompt": [1, 2, 3], "max_tokens": 1000, "temperature": 0,
        "ignore_eos": true, "stream": true,
    });
    let started = Instant::now();
    let response = server
        .client
        .post(format!("{}/v1/completions", server.base))
        .json(&body)
        .send()
        .await
        .unwrap();
    // Read slowly: the connection must stay open while the response is still being written.
    let mut response = response;
    let mut text = String::new();
    let mut chunks_after_timeout = 0;
    while let Some(chunk) = response.chunk().await.unwrap() {
        text.push_str(&String::from_utf8_lossy(&chunk));
        if started.elapsed() > timeout {
            chunks_after_timeout += 1;
        }
        if started.elapsed() < 3 * timeout {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
    assert!(
        chunks_after_timeout > 0,
        "the whole response came within the timeout"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_cap_new_connections_are_closed_and_counted() {
    let server = server(30_000, 3);
    let held: Vec<TcpStream> = (0..3).map(|_| connect(&server)).collect();
    std::thread::sleep(Duration::from_millis(200));
    let mut extra = connect(&server);
    let _ = extra.write_all(b"GET /health HTTP/1.1\r\nHost: grove\r\n\r\n");
    let (sent, _) = read_until_closed(&mut extra);
    assert!(
        sent.is_empty(),
        "a connection past the cap was answered: {sent}"
    );
    drop(held);
    // The held connections' slots come back once the server sees them closed.
    let mut metrics = String::new();
    for _ in 0..100 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        if let Ok(response) = server
            .client
            .get(format!("{}/metrics", server.base))
            .send()
            .await
        {
            metrics = response.text().await.unwrap();
            break;
        }
    }
    let shed = metrics
        .lines()
        .find(|l| l.starts_with("grove_connections_shed_total"))
        .unwrap_or_else(|| panic!("no shed counter in {metrics}"));
    let count: f64 = shed.split_whitespace().last().unwrap().parse().unwrap();
    assert!(count >= 1.0, "{shed}");
}
