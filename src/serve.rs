//! The accept loop: every connection served by hyper with a header-read timeout (which
//! `axum::serve` cannot set: it gives hyper no timer), at most `--max-connections` open
//! at once, and drained gracefully on shutdown.
//!
//! The header-read timeout runs whenever a connection waits for a request's head: from
//! its opening, from the first byte of each request, and while a kept-alive connection
//! sits idle after an answer. A client that opens connections and sends half a request
//! line, or nothing, is closed when it runs out; so is an idle keep-alive connection.

use crate::metrics::Metrics;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

/// What bounds the server's connections (`--header-read-timeout`, `--max-connections`).
#[derive(Clone, Copy, Debug)]
pub struct ConnectionLimits {
    pub header_read_timeout: Duration,
    pub max_connections: usize,
}

/// How often an HTTP/2 connection is pinged, and how long a ping may go unanswered
/// before the connection is closed: HTTP/2 has no header-read timeout, so a peer that
/// went away is found this way.
const H2_KEEP_ALIVE: Duration = Duration::from_secs(20);

/// Serves `router` on `listener` until `shutdown` resolves; then accepts nothing more and
/// waits for every open connection to finish its requests and close.
pub async fn serve(
    listener: TcpListener,
    router: axum::Router,
    limits: ConnectionLimits,
    metrics: Arc<Metrics>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) {
    let mut builder = Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout);
    builder
        .http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(H2_KEEP_ALIVE)
        .keep_alive_timeout(H2_KEEP_ALIVE);
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    // Created now, so the series is exported (at 0) before the first refusal.
    let refused = metrics
        .connections_refused
        .with_label_values(&["max_connections"]);
    let graceful = GracefulShutdown::new();
    tokio::pin!(shutdown);
    loop {
        let (stream, _peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of file descriptors and the like: pause rather than spin.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            // Closing at once answers the client quickly and keeps the listen backlog
            // free, where waiting would let a flood of idle sockets queue everyone.
            refused.inc();
            drop(stream);
            continue;
        };
        let _ = stream.set_nodelay(true);
        let service = TowerToHyperService::new(router.clone());
        let builder = builder.clone();
        let watcher = graceful.watcher();
        let open = metrics.connections_open.clone();
        open.inc();
        tokio::spawn(async move {
            // hyper's auto builder reads the first bytes to tell HTTP/1 from HTTP/2
            // without a timer: a client that sends nothing would be held for ever.
            let told = tokio::time::timeout(limits.header_read_timeout, protocol_is_known(&stream));
            if matches!(told.await, Ok(true)) {
                let connection =
                    builder.serve_connection_with_upgrades(TokioIo::new(stream), service);
                // Errors here are the client's (reset, timed out, malformed): nothing to
                // answer, and hyper has closed the connection.
                if let Err(e) = watcher.watch(connection.into_owned()).await {
                    tracing::debug!(error = %e, "connection ended");
                }
            }
            open.dec();
            drop(slot);
        });
    }
    drop(listener);
    graceful.shutdown().await;
}

/// HTTP/2's connection preface, which a client that speaks it without upgrade sends first.
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Waits until the connection's first bytes tell HTTP/1 from HTTP/2 (they differ from
/// the preface, or hold all of it); false when the client closes first.
async fn protocol_is_known(stream: &tokio::net::TcpStream) -> bool {
    let mut first = [0u8; H2_PREFACE.len()];
    loop {
        match stream.peek(&mut first).await {
            Ok(0) | Err(_) => return false,
            Ok(n) if n == first.len() || first[..n] != H2_PREFACE[..n] => return true,
            // A part of the preface: peek again once more may have arrived.
            Ok(_) => tokio::time::sleep(Duration::from_millis(5)).await,
        }
    }
}
