//! The timed run: set-up, then N keep-alive HTTP/1.1 connections sending back to back.
//!
//! Each connection is its own task with its own `hyper::client::conn::http1` handshake
//! over a `TcpStream` (no pool), so the number of connections the server sees is exact.
//!
//! Timeline: `start .. start+warmup` is warm-up (responses not counted), then the
//! measured window of `duration`. A response counts when it *completes* inside the window;
//! requests still in flight when the window ends are dropped with their connection, so
//! the run stops on time and requests/s is exactly `count / duration`. A request that
//! started during warm-up but ends in the window is counted with its full latency.

use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1;
use hyper::{Request, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::time::{Instant, timeout, timeout_at};

use crate::scenario::{RequestStream, Scenario, Workload};
use crate::summary::{Summary, Tally};
use crate::target::Target;

/// How many failed requests are printed to stderr (the rest are only counted).
const PRINTED_FAILURES: usize = 5;
/// How much of a failed response's body is printed.
const PRINTED_BODY_BYTES: usize = 512;
/// Set-up requests (sign up, store the value) must finish within this.
const SETUP_TIMEOUT: Duration = Duration::from_secs(30);
/// Pause after a failed connect, so a dead server doesn't turn into a busy loop.
const RECONNECT_PAUSE: Duration = Duration::from_millis(20);

#[derive(Clone, Debug)]
pub struct RunConfig {
    pub target: Target,
    /// Other instances sharing `target`'s stores: connection i goes to the i-th of
    /// `target` and these, round-robin.
    pub also: Vec<Target>,
    pub scenario: Scenario,
    pub connections: usize,
    pub warmup: Duration,
    pub duration: Duration,
}

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("could not build a request: {0}")]
    Request(#[from] hyper::http::Error),
    #[error("set-up: cannot reach {addr}: {cause}")]
    Connect {
        addr: std::net::SocketAddr,
        cause: std::io::Error,
    },
    #[error("set-up: {0}")]
    Http(#[from] hyper::Error),
    #[error("set-up: {method} {path} answered {status}: {body}")]
    SetupStatus {
        method: String,
        path: String,
        status: StatusCode,
        body: String,
    },
    #[error("set-up did not finish within {0:?}")]
    SetupTimeout(Duration),
    #[error("a connection task failed: {0}")]
    Join(#[from] tokio::task::JoinError),
}

/// Runs set-up, then the timed section; returns the merged figures.
pub async fn run(config: RunConfig) -> Result<Summary, RunError> {
    let workload = Arc::new(Workload::new(config.scenario, &config.target.authority)?);
    timeout(SETUP_TIMEOUT, setup(&config.target, &workload))
        .await
        .map_err(|_| RunError::SetupTimeout(SETUP_TIMEOUT))??;

    let start = Instant::now();
    let window = Window {
        from: start + config.warmup,
        until: start + config.warmup + config.duration,
    };
    let printed = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = (0..config.connections)
        .map(|connection| {
            let requests = RequestStream::new(workload.clone(), connection);
            let target = match connection % (config.also.len() + 1) {
                0 => config.target.clone(),
                i => config.also[i - 1].clone(),
            };
            tokio::spawn(connection_loop(target, requests, window, printed.clone()))
        })
        .collect();

    let mut total = Tally::new();
    for task in tasks {
        total.merge(&task.await??);
    }
    Ok(Summary::new(
        config.scenario.name(),
        config.connections,
        config.duration,
        &total,
    ))
}

/// A scenario's workload with its set-up done on `target` (signed up, value stored,
/// session minted): what another client (wrk) needs to load the same server.
pub async fn prepared(target: &Target, scenario: Scenario) -> Result<Workload, RunError> {
    let workload = Workload::new(scenario, &target.authority)?;
    timeout(SETUP_TIMEOUT, setup(target, &workload))
        .await
        .map_err(|_| RunError::SetupTimeout(SETUP_TIMEOUT))??;
    Ok(workload)
}

/// Checks the server is reachable, then sends the set-up requests on one connection;
/// any non-2xx answer aborts the run.
async fn setup(target: &Target, workload: &Workload) -> Result<(), RunError> {
    let requests = workload.setup_requests()?;
    // Connect even when there is nothing to set up: a dead server fails fast and clearly.
    let mut sender = connect(target).await.map_err(|e| match e {
        ConnectError::Io(cause) => RunError::Connect {
            addr: target.addr,
            cause,
        },
        ConnectError::Http(e) => RunError::Http(e),
    })?;
    for request in requests {
        let (method, path) = (request.method().to_string(), request.uri().to_string());
        sender.ready().await?;
        let outcome = exchange(&mut sender, request).await?;
        if !outcome.status.is_success() {
            return Err(RunError::SetupStatus {
                method,
                path,
                status: outcome.status,
                body: outcome.body_excerpt,
            });
        }
    }
    if let Some(request) = workload.session_request()? {
        sender.ready().await?;
        let response = sender.send_request(request).await?;
        let status = response.status();
        let body = response.into_body().collect().await?.to_bytes();
        let text = String::from_utf8_lossy(&body).into_owned();
        let token = serde_json::from_slice::<serde_json::Value>(&body)
            .ok()
            .and_then(|v| v["token"].as_str().map(str::to_owned));
        match token {
            Some(token) if status.is_success() => workload.set_session_token(&token)?,
            _ => {
                return Err(RunError::SetupStatus {
                    method: "POST".into(),
                    path: "/auth/session".into(),
                    status,
                    body: text,
                });
            }
        }
    }
    Ok(())
}

#[derive(Clone, Copy, Debug)]
struct Window {
    from: Instant,
    until: Instant,
}

impl Window {
    fn contains(&self, t: Instant) -> bool {
        t >= self.from && t < self.until
    }
}

/// One connection's life: (re)connect, send back to back until the window ends.
async fn connection_loop(
    target: Target,
    mut requests: RequestStream,
    window: Window,
    printed: Arc<AtomicUsize>,
) -> Result<Tally, RunError> {
    let mut tally = Tally::new();
    'connect: while Instant::now() < window.until {
        let mut sender = match timeout_at(window.until, connect(&target)).await {
            Err(_) => break,
            Ok(Ok(sender)) => sender,
            Ok(Err(error)) => {
                if window.contains(Instant::now()) {
                    tally.record_connect_error();
                }
                report(&printed, || format!("connect to {}: {error}", target.addr));
                tokio::time::sleep_until((Instant::now() + RECONNECT_PAUSE).min(window.until))
                    .await;
                continue;
            }
        };
        loop {
            // A connection the server closed between requests (keep-alive limit) is not
            // a failed request: reconnect.
            match timeout_at(window.until, sender.ready()).await {
                Err(_) => break 'connect,
                Ok(Err(_)) => continue 'connect,
                Ok(Ok(())) => {}
            }
            let request = requests.next_request()?;
            let (method, path) = (request.method().clone(), request.uri().clone());
            let sent = Instant::now();
            let result = timeout_at(window.until, exchange(&mut sender, request)).await;
            let done = Instant::now();
            match result {
                Err(_) => break 'connect, // window over with this request in flight
                Ok(Err(error)) => {
                    if window.contains(done) {
                        tally.record_transport_error();
                    }
                    report(&printed, || format!("{method} {path}: {error}"));
                    continue 'connect;
                }
                Ok(Ok(outcome)) => {
                    if window.contains(done) {
                        tally.record_response(outcome.status.as_u16(), done - sent);
                    }
                    if !outcome.status.is_success() {
                        report(&printed, || {
                            format!(
                                "{method} {path}: {} {}",
                                outcome.status, outcome.body_excerpt
                            )
                        });
                    }
                }
            }
        }
    }
    Ok(tally)
}

/// Prints one failure to stderr, unless enough have been printed already.
pub(crate) fn report(printed: &AtomicUsize, message: impl FnOnce() -> String) {
    let n = printed.fetch_add(1, Ordering::Relaxed);
    if n < PRINTED_FAILURES {
        eprintln!("hs-load: failure: {}", message());
    } else if n == PRINTED_FAILURES {
        eprintln!("hs-load: further failures are counted, not printed");
    }
}

#[derive(Debug)]
pub(crate) enum ConnectError {
    Io(std::io::Error),
    Http(hyper::Error),
}

impl std::fmt::Display for ConnectError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ConnectError::Io(e) => e.fmt(f),
            ConnectError::Http(e) => e.fmt(f),
        }
    }
}

pub(crate) type Sender = http1::SendRequest<Full<Bytes>>;

/// Opens one HTTP/1.1 connection; its driver runs as its own task and ends when the
/// sender is dropped or the peer closes.
pub(crate) async fn connect(target: &Target) -> Result<Sender, ConnectError> {
    let stream = TcpStream::connect(target.addr)
        .await
        .map_err(ConnectError::Io)?;
    stream.set_nodelay(true).map_err(ConnectError::Io)?;
    let (sender, connection) = http1::handshake(TokioIo::new(stream))
        .await
        .map_err(ConnectError::Http)?;
    tokio::spawn(async move {
        // Errors here surface on the sender side as well; nothing more to do.
        let _ = connection.await;
    });
    Ok(sender)
}

#[derive(Debug)]
pub(crate) struct Outcome {
    pub(crate) status: StatusCode,
    /// The start of the body, kept only for non-2xx answers (to print them).
    pub(crate) body_excerpt: String,
}

/// Sends one request and reads the whole response body (dropping it as it arrives).
pub(crate) async fn exchange(
    sender: &mut Sender,
    request: Request<Full<Bytes>>,
) -> Result<Outcome, hyper::Error> {
    let response = sender.send_request(request).await?;
    let status = response.status();
    let mut body = response.into_body();
    let mut excerpt = Vec::new();
    while let Some(frame) = body.frame().await {
        let frame = frame?;
        if !status.is_success()
            && let Some(data) = frame.data_ref()
        {
            let room = PRINTED_BODY_BYTES.saturating_sub(excerpt.len());
            excerpt.extend_from_slice(&data[..data.len().min(room)]);
        }
    }
    let mut body_excerpt = String::from_utf8_lossy(&excerpt).into_owned();
    if excerpt.len() == PRINTED_BODY_BYTES {
        let _ = write!(body_excerpt, "…");
    }
    Ok(Outcome {
        status,
        body_excerpt,
    })
}
