//! The HTTP listener: HTTP/1.1 connections over the router, with the limits a server facing
//! the open network needs. A connection that does not send a complete request head in time (a
//! new one, or a kept-alive one between requests) is closed: idle sockets, half-sent headers
//! and slowloris clients no longer pile up until the descriptors run out. Past a cap of open
//! connections, new ones are closed at once, and the shedding is logged.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};

use crate::metrics;

/// How long a connection may wait for a request head, and how many may be open.
#[derive(Debug, Clone, Copy)]
pub struct ConnectionLimits {
    /// The longest a connection may go without a complete request head: from its opening to
    /// its first request's head, and between requests on a kept-alive connection (uvicorn's
    /// `--timeout-keep-alive`). Requests being answered are never cut by it.
    pub keep_alive: Duration,
    /// Open connections at most; past it a new connection is closed as soon as it is accepted.
    pub max_connections: usize,
}

impl ConnectionLimits {
    /// Descriptors kept back from the connection cap for the model files, logs and the
    /// process's own needs.
    pub const RESERVED_DESCRIPTORS: usize = 64;

    /// The default cap: the process's descriptor limit (`ulimit -n`) less
    /// [`Self::RESERVED_DESCRIPTORS`], at least 16; 1024 where the limit cannot be read.
    pub fn default_max_connections() -> usize {
        open_files_limit().map_or(1024, |limit| {
            limit.saturating_sub(Self::RESERVED_DESCRIPTORS).max(16)
        })
    }
}

/// The soft limit on open files, from `/proc/self/limits` (Linux).
fn open_files_limit() -> Option<usize> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line["Max open files".len()..]
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Logs shed connections at most once per interval, with how many were shed since.
struct ShedLog {
    shed: AtomicU64,
    last: std::sync::Mutex<Option<Instant>>,
}

impl ShedLog {
    const INTERVAL: Duration = Duration::from_secs(5);

    fn record(&self, cap: usize) {
        metrics::connection_shed();
        let shed = self.shed.fetch_add(1, Ordering::Relaxed) + 1;
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        if last.is_none_or(|at| at.elapsed() >= Self::INTERVAL) {
            *last = Some(Instant::now());
            self.shed.store(0, Ordering::Relaxed);
            tracing::warn!(
                cap,
                shed,
                "connection cap reached: closing new connections (--max-connections)"
            );
        }
    }
}

/// Serves `router` on `listener` until `shutdown` resolves; then stops accepting, lets every
/// connection finish the request it is answering (idle ones close at once), and returns
/// when all are closed.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: ConnectionLimits,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let (stop_sender, stop) = watch::channel(false);
    tokio::spawn(async move {
        shutdown.await;
        let _ = stop_sender.send(true);
    });
    let permits = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let shed = ShedLog {
        shed: AtomicU64::new(0),
        last: std::sync::Mutex::new(None),
    };
    let mut stopping = stop.clone();
    loop {
        let (stream, _) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    // Out of descriptors (EMFILE) or a connection reset before it was taken:
                    // wait a little rather than spin on the error.
                    tracing::warn!(%error, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = stopped(&mut stopping) => break,
        };
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            drop(stream);
            shed.record(limits.max_connections);
            continue;
        };
        // Streamed events are small writes: without TCP_NODELAY, Nagle's algorithm holds each
        // one until the client's (delayed, ~40 ms) ACK of the previous one arrives.
        if let Err(error) = stream.set_nodelay(true) {
            tracing::debug!(%error, "TCP_NODELAY not set");
        }
        let service = TowerToHyperService::new(router.clone());
        let mut stop = stop.clone();
        tokio::spawn(async move {
            metrics::connection_opened();
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder
                .timer(TokioTimer::new())
                .header_read_timeout(limits.keep_alive)
                .keep_alive(true);
            let connection = builder.serve_connection(TokioIo::new(stream), service);
            let mut connection = std::pin::pin!(connection);
            let mut stopping = false;
            loop {
                tokio::select! {
                    result = connection.as_mut() => {
                        if let Err(error) = result {
                            tracing::debug!(%error, "connection ended");
                        }
                        break;
                    }
                    () = stopped(&mut stop), if !stopping => {
                        stopping = true;
                        connection.as_mut().graceful_shutdown();
                    }
                }
            }
            metrics::connection_closed();
            drop(permit);
        });
    }
    drop(listener);
    // Every connection task holds a permit until it ends.
    let _ = permits
        .acquire_many(limits.max_connections.max(1) as u32)
        .await;
    Ok(())
}

/// Resolves once the shutdown signal is set (or its sender is gone).
async fn stopped(stop: &mut watch::Receiver<bool>) {
    // The guard `wait_for` returns is not `Send`: dropped here, not held in a select.
    let _ = stop.wait_for(|&stop| stop).await;
}
