//! Serving one listener: accept, complete the TLS handshake on a TLS listener, register the connection (at most `max_connections`,
//! the longest-idle giving way at the limit), serve HTTP/1.1 and HTTP/2, and on shutdown
//! stop accepting, then let open connections finish.
//!
//! Every connection runs under deadlines, so a client can hold one only while it is
//! using it: the first complete request head must arrive within `header_read_timeout`
//! of the accept (this covers the protocol preface, which hyper reads with no timeout,
//! and an HTTP/2 connection that sends its preface and settings but no request); later
//! HTTP/1 heads have the same limit (hyper's header timeout); and a connection with no
//! request in flight for `idle_timeout` is closed (HTTP/2 also pings its peer). A
//! connection told to close that does not finish within [`CLOSE_GRACE`] is dropped.

mod connections;
mod parse_error_body;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::response::Response;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower::{Service, ServiceExt};

use crate::http::access_log::{AccessLog, LoggedBody};
use crate::service::caller;

pub use connections::PerIpLimit;
use connections::{Admitted, Connections, TrackedBody};
use parse_error_body::{Dispatched, ParseErrorBody};

/// How long shutdown waits for open connections before giving up on them.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a connection told to close (idle, evicted) may take to finish.
const CLOSE_GRACE: Duration = Duration::from_secs(5);
/// HTTP/2: streams one connection may have open at once.
const H2_MAX_CONCURRENT_STREAMS: u32 = 128;
/// HTTP/2: the largest header list a request may send.
const H2_MAX_HEADER_LIST_BYTES: u32 = 64 * 1024;
/// HTTP/2: how long a ping may go unanswered before the connection is closed.
const H2_PING_TIMEOUT: Duration = Duration::from_secs(20);

/// The deadlines and limits of a listener's connections.
#[derive(Debug, Clone)]
pub struct ConnectionLimits {
    /// From accept to the first complete request head, and for each later HTTP/1 head.
    pub header_read_timeout: Duration,
    /// A connection with no request in flight for this long is closed.
    pub idle_timeout: Duration,
    /// Open connections at most.
    pub max_connections: usize,
    /// Open connections one client address may hold.
    pub per_ip: PerIpLimit,
}

/// What a listener answers requests with: an axum `Router`, or a service around one
/// (the client API's, `client_server::ClientApi`). Cloned once per request, so a clone
/// should be a few reference counts.
pub trait Routes:
    Service<hyper::Request<Body>, Response = Response, Error = Infallible, Future: Send + 'static>
    + Clone
    + Send
    + Sync
    + 'static
{
}

impl<S> Routes for S where
    S: Service<
            hyper::Request<Body>,
            Response = Response,
            Error = Infallible,
            Future: Send + 'static,
        > + Clone
        + Send
        + Sync
        + 'static
{
}

/// Whether a listener speaks TLS.
#[derive(Clone)]
pub enum Transport {
    Plain,
    Tls(Arc<rustls::ServerConfig>),
}

#[allow(clippy::too_many_arguments)]
pub async fn serve<R: Routes>(
    name: &'static str,
    listener: TcpListener,
    transport: Transport,
    router: R,
    stop: CancellationToken,
    limits: ConnectionLimits,
    open_connections: prometheus::IntGauge,
    access_log: Option<AccessLog>,
) {
    let tls = match transport {
        Transport::Plain => None,
        Transport::Tls(config) => Some(tokio_rustls::TlsAcceptor::from(config)),
    };
    let registry = Connections::new(
        limits.max_connections,
        limits.per_ip.clone(),
        open_connections,
        &stop,
    );
    let tracker = TaskTracker::new();
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout);
    builder
        .http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(limits.idle_timeout / 2)
        .keep_alive_timeout(H2_PING_TIMEOUT)
        .max_concurrent_streams(H2_MAX_CONCURRENT_STREAMS)
        .max_header_list_size(H2_MAX_HEADER_LIST_BYTES);
    let mut refused_logged = Instant::now() - Duration::from_secs(60);
    loop {
        let (tcp, peer) = tokio::select! {
            _ = stop.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(pair) => pair,
                Err(e) => {
                    // Out of file descriptors and the like: back off instead of spinning.
                    tracing::warn!(listener = name, error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let Some(admitted) = registry.admit(peer.ip()) else {
            // Every connection (of this address, or of all) is busy with a request:
            // refuse this one (dropping it closes it) rather than exceed the limit.
            if refused_logged.elapsed() > Duration::from_secs(10) {
                refused_logged = Instant::now();
                tracing::warn!(
                    listener = name,
                    max_connections = limits.max_connections,
                    max_connections_per_ip = limits.per_ip.max,
                    %peer,
                    "connection limit reached with every connection busy; refusing new ones"
                );
            }
            continue;
        };
        // Without it a response written in parts (headers, then a streamed body) waits
        // ~40 ms for the peer's delayed ACK.
        let _ = tcp.set_nodelay(true);
        let connection = Connection {
            name,
            peer,
            router: router.clone(),
            access_log: access_log.clone(),
            builder: builder.clone(),
            admitted,
            limits: limits.clone(),
            stop: stop.clone(),
            opened: Instant::now(),
        };
        match &tls {
            None => {
                tracker.spawn(connection.serve(tcp));
            }
            Some(acceptor) => {
                let acceptor = acceptor.clone();
                tracker.spawn(async move {
                    // The handshake counts against the first request's deadline.
                    let deadline = connection.limits.header_read_timeout;
                    match tokio::time::timeout(deadline, acceptor.accept(tcp)).await {
                        Ok(Ok(stream)) => connection.serve(stream).await,
                        Ok(Err(e)) => {
                            tracing::debug!(listener = name, %peer, error = %e, "TLS handshake failed");
                        }
                        Err(_) => {
                            tracing::debug!(listener = name, %peer, "TLS handshake not done in time");
                        }
                    }
                });
            }
        }
    }
    drop(listener);
    tracker.close();
    if tokio::time::timeout(DRAIN_TIMEOUT, tracker.wait())
        .await
        .is_err()
    {
        tracing::warn!(
            listener = name,
            "connections still open after {DRAIN_TIMEOUT:?}; closing"
        );
    }
}

/// One accepted connection and what serving it needs.
struct Connection<R> {
    name: &'static str,
    peer: SocketAddr,
    router: R,
    access_log: Option<AccessLog>,
    builder: auto::Builder<TokioExecutor>,
    admitted: Admitted,
    limits: ConnectionLimits,
    stop: CancellationToken,
    opened: Instant,
}

impl<R: Routes> Connection<R> {
    async fn serve<I>(self, io: I)
    where
        I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let Connection {
            name,
            peer,
            router,
            access_log,
            builder,
            admitted,
            limits,
            stop,
            opened,
        } = self;
        let state = admitted.state.clone();
        let dispatched = Dispatched::default();
        let service = {
            let state = state.clone();
            let dispatched = dispatched.clone();
            hyper::service::service_fn(move |mut request: hyper::Request<Incoming>| {
                dispatched.store(true, Ordering::Release);
                let in_flight = state.request_started();
                request
                    .extensions_mut()
                    .insert(ConnectInfo::<SocketAddr>(peer));
                let mut logged = access_log
                    .as_ref()
                    .and_then(|log| log.start(&mut request, peer));
                let request = match &mut logged {
                    Some(started) => request.map(|body| Body::new(started.count_body(body))),
                    None => request.map(Body::new),
                };
                // The caller slot the services fill in, read back for the log.
                let response = caller::scope(router.clone().oneshot(request));
                async move {
                    let mut response = std::pin::pin!(response);
                    let answer = response
                        .as_mut()
                        .await
                        .unwrap_or_else(|e: Infallible| match e {});
                    let answer = match logged {
                        Some(started) => {
                            let caller = response
                                .as_mut()
                                .take_value()
                                .map(std::cell::Cell::into_inner)
                                .unwrap_or_default();
                            started.respond(answer, caller)
                        }
                        None => answer.map(LoggedBody::unlogged),
                    };
                    Ok::<_, Infallible>(answer.map(|body| TrackedBody::new(body, in_flight)))
                }
            })
        };
        let io = TokioIo::new(ParseErrorBody::new(io, dispatched));
        let connection = builder.serve_connection_with_upgrades(io, service);
        tokio::pin!(connection);

        let mut closing: Option<tokio::time::Instant> = None;
        loop {
            // The next moment a deadline may have passed. While a request is in flight
            // (an event stream, an upload) no idle deadline runs: look again one idle
            // period later, not in a busy loop.
            let check_in = if state.served() == 0 {
                limits.header_read_timeout.saturating_sub(opened.elapsed())
            } else if !state.is_idle() {
                limits.idle_timeout
            } else {
                limits.idle_timeout.saturating_sub(state.idle_for())
            }
            .max(Duration::from_millis(10));
            tokio::select! {
                // The connection first: it is what wakes this task, request by request.
                biased;
                result = connection.as_mut() => {
                    if let Err(e) = result {
                        tracing::debug!(listener = name, %peer, error = %e, "connection ended with an error");
                    }
                    break;
                }
                // Evicted, or the listener stops (one token: `Connections`).
                _ = state.told_to_close().cancelled(), if closing.is_none() => {
                    if stop.is_cancelled() {
                        connection.as_mut().graceful_shutdown();
                        closing = Some(tokio::time::Instant::now() + DRAIN_TIMEOUT);
                        continue;
                    }
                    if state.served() == 0 {
                        break; // never spoke: nothing to finish
                    }
                    connection.as_mut().graceful_shutdown();
                    closing = Some(tokio::time::Instant::now() + CLOSE_GRACE);
                }
                _ = tokio::time::sleep(check_in), if closing.is_none() => {
                    if state.served() == 0 && opened.elapsed() >= limits.header_read_timeout {
                        tracing::debug!(listener = name, %peer, "no request head in time; closing");
                        break;
                    }
                    if state.served() > 0 && state.is_idle() && state.idle_for() >= limits.idle_timeout {
                        connection.as_mut().graceful_shutdown();
                        closing = Some(tokio::time::Instant::now() + CLOSE_GRACE);
                    }
                }
                _ = sleep_until_or_never(closing) => {
                    tracing::debug!(listener = name, %peer, "connection did not close in time; dropping it");
                    break;
                }
            }
        }
        drop(admitted);
    }
}

async fn sleep_until_or_never(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
