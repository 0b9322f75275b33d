//! The event fan-out benchmark: N live `/events-stream` subscribers, W signed PUTs at a
//! fixed rate, and how long each event takes to reach each subscriber.
//!
//! Timeline, all inside one `--timeout` (when it passes, the run stops and reports what
//! it has, marked `timed_out`):
//! 1. set-up: U writer users sign up;
//! 2. subscriptions: subscriber `i` follows user `i % U` with
//!    `GET /events-stream?user=<z32>&live=true`, each on its own HTTP/1.1 connection,
//!    opened at `--connect-rate` per second; the run waits until every one has its 200
//!    headers (and, with a metrics URL, until `hs_event_stream_subscribers` says so);
//! 3. idle: ~2 s with nothing to deliver; the server's `VmRSS` before step 2 and now
//!    gives its memory per idle subscriber;
//! 4. writes: write `j` goes to user `j % U` at `/pub/bench/fanout/w<j>`, due at
//!    `j / rate` s (open loop over `--writer-connections` connections: a write is late
//!    only when every connection is busy). The instant each PUT is sent is stored by
//!    write number, which the event's path carries;
//! 5. drain: until every open subscriber has every committed write of its user (or no
//!    delivery arrives for a while).
//!
//! Each subscriber reads body frames as they come, stamps a frame once on arrival, and
//! for the first delivery of each write records arrival − send. Latencies go into a few
//! histogram shards (one lock per frame, not per event: with 2 runtime threads the locks
//! are nearly never contended), merged at the end; one histogram per subscriber would
//! cost ~160 KiB each, 1.6 GB for 10,000. Each subscriber also checks its own stream
//! ([`StreamCheck`]): every committed write of its user exactly once, cursors increasing.

mod check;
mod process;
mod report;
mod scrape;

use std::sync::atomic::{AtomicU8, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use hdrhistogram::Histogram;
use homeserver_protocol::query::StreamQuery;
use homeserver_protocol::{BodyHash, Keypair};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::header::{ACCEPT, HOST, HeaderValue};
use hyper::{Method, Request, StatusCode};
use tokio::sync::watch;
use tokio::time::{Instant, sleep, sleep_until, timeout_at};

use crate::driver::{ConnectError, RunError, Sender, connect, exchange, report};
use crate::scenario::{signed_request, unix_secs, value_bytes};
use crate::summary::Tally;
use crate::target::Target;

pub use check::{CheckCounts, Seen, StreamCheck, write_index, write_path};
use process::{process_cpu, read_rss};
pub use report::FanoutSummary;
use report::{latency_histogram, quantile};
pub use scrape::metric_value;
use scrape::wait_for_server_count;

/// Sign-up must finish within this.
const SETUP_TIMEOUT: Duration = Duration::from_secs(30);
/// Waiting for the metrics endpoint to count the subscriptions gives up after this.
const METRICS_WAIT: Duration = Duration::from_secs(30);
/// Quiet time before the idle memory reading.
const IDLE_SETTLE: Duration = Duration::from_secs(2);
/// The drain ends when no new delivery arrived for this long.
const DRAIN_STALL: Duration = Duration::from_secs(10);
/// How often the coordinator looks at the shared counters.
const POLL: Duration = Duration::from_millis(20);
/// Pause after a writer failed to connect.
const RECONNECT_PAUSE: Duration = Duration::from_millis(20);
/// Delivery-latency histogram shards.
const SHARDS: usize = 64;

/// What happened to a write (index = write number).
mod write_state {
    pub const NOT_SENT: u8 = 0;
    pub const IN_FLIGHT: u8 = 1;
    /// 2xx: committed, so every subscriber of its user must get its event.
    pub const OK: u8 = 2;
    /// Another status: not committed, no event may come.
    pub const REFUSED: u8 = 3;
    /// Sent, no answer (transport error, time-out): an event may or may not come.
    pub const UNKNOWN: u8 = 4;
}

#[derive(Clone, Debug)]
pub struct FanoutConfig {
    pub target: Target,
    /// The server's metrics listener, to read `hs_event_stream_subscribers`.
    pub metrics: Option<Target>,
    pub subscribers: usize,
    pub users: usize,
    pub writes: usize,
    /// Writes per second.
    pub rate: f64,
    /// Subscriptions opened per second.
    pub connect_rate: f64,
    pub writer_connections: usize,
    pub value_bytes: usize,
    /// The server's process id, to read its resident memory.
    pub server_pid: Option<u32>,
    pub timeout: Duration,
}

#[derive(Debug)]
struct User {
    keypair: Keypair,
    z32: String,
    stream_uri: String,
}

/// What the tasks of a run share.
#[derive(Debug)]
struct Shared {
    target: Target,
    host: HeaderValue,
    users: Vec<User>,
    writes: usize,
    /// The origin of `sent_ns` and of arrival stamps.
    t0: Instant,
    /// Per write: nanoseconds after `t0` its PUT was sent, plus one (0: not sent).
    sent_ns: Vec<AtomicU64>,
    state: Vec<AtomicU8>,
    shards: Vec<Mutex<Histogram<u64>>>,
    /// Streams open now, and opened ever (per user too); subscriptions that failed.
    open: AtomicUsize,
    opened: AtomicUsize,
    opened_per_user: Vec<AtomicUsize>,
    failed: AtomicUsize,
    /// First deliveries so far (drain progress).
    first_deliveries: AtomicU64,
    printed: AtomicUsize,
}

impl Shared {
    fn since_t0_ns(&self, t: Instant) -> u64 {
        u64::try_from(t.saturating_duration_since(self.t0).as_nanos()).unwrap_or(u64::MAX - 1)
    }
}

/// Runs the whole benchmark (see the module docs).
pub async fn run(config: FanoutConfig) -> Result<FanoutSummary, RunError> {
    let start = Instant::now();
    let deadline = start + config.timeout;
    let users = (0..config.users.max(1))
        .map(|_| {
            let keypair = Keypair::random();
            let z32 = keypair.public_key().to_z32();
            let query = StreamQuery::new()
                .user(keypair.public_key())
                .live(true)
                .to_query()
                .unwrap_or_default();
            User {
                stream_uri: format!("/events-stream?{query}"),
                keypair,
                z32,
            }
        })
        .collect::<Vec<_>>();
    let shared = Arc::new(Shared {
        host: HeaderValue::try_from(config.target.authority.as_str())
            .map_err(hyper::http::Error::from)?,
        target: config.target.clone(),
        opened_per_user: users.iter().map(|_| AtomicUsize::new(0)).collect(),
        users,
        writes: config.writes,
        t0: start,
        sent_ns: (0..config.writes).map(|_| AtomicU64::new(0)).collect(),
        state: (0..config.writes)
            .map(|_| AtomicU8::new(write_state::NOT_SENT))
            .collect(),
        shards: (0..SHARDS)
            .map(|_| Mutex::new(latency_histogram()))
            .collect(),
        open: AtomicUsize::new(0),
        opened: AtomicUsize::new(0),
        failed: AtomicUsize::new(0),
        first_deliveries: AtomicU64::new(0),
        printed: AtomicUsize::new(0),
    });

    timeout_at(deadline.min(start + SETUP_TIMEOUT), sign_up(&shared))
        .await
        .map_err(|_| RunError::SetupTimeout(SETUP_TIMEOUT))??;
    eprintln!("hs-load fanout: {} user(s) signed up", shared.users.len());

    let rss_before = config
        .server_pid
        .and_then(|pid| read_rss(pid, "before subscriptions"));
    let mut timed_out = false;

    // ---- subscriptions ----
    let (stop_tx, stop_rx) = watch::channel(false);
    let open_from = Instant::now();
    let subscribers: Vec<_> = (0..config.subscribers)
        .map(|i| {
            let at = open_from + Duration::from_secs_f64(i as f64 / config.connect_rate);
            tokio::spawn(subscriber(shared.clone(), i, at, stop_rx.clone()))
        })
        .collect();
    while shared.opened.load(Ordering::Relaxed) + shared.failed.load(Ordering::Relaxed)
        < config.subscribers
    {
        if Instant::now() >= deadline {
            timed_out = true;
            break;
        }
        sleep(POLL).await;
    }
    let opened = shared.opened.load(Ordering::Relaxed);
    let mut server_subscribers = None;
    if config.subscribers > 0 {
        if let Some(metrics) = &config.metrics {
            let until = deadline.min(Instant::now() + METRICS_WAIT);
            server_subscribers = wait_for_server_count(metrics, opened as u64, until).await;
        }
        eprintln!(
            "hs-load fanout: {opened}/{} subscriptions open in {:.1} s ({} failed; server reports {})",
            config.subscribers,
            open_from.elapsed().as_secs_f64(),
            shared.failed.load(Ordering::Relaxed),
            server_subscribers.map_or("-".into(), |n| n.to_string()),
        );
    }

    // ---- idle ----
    if config.subscribers > 0 && !timed_out {
        timed_out = timeout_at(deadline, sleep(IDLE_SETTLE)).await.is_err();
    }
    let open_idle = shared.open.load(Ordering::Relaxed);
    let rss_idle = config
        .server_pid
        .and_then(|pid| read_rss(pid, "with the subscriptions idle"));

    // ---- writes ----
    let cpu_from = (
        config.server_pid.and_then(|pid| process_cpu(Some(pid))),
        process_cpu(None),
    );
    let mut put = Tally::new();
    let mut first_sent: Option<Instant> = None;
    let mut last_done: Option<Instant> = None;
    if !timed_out {
        eprintln!(
            "hs-load fanout: {} writes at {}/s over {} connection(s)",
            config.writes,
            config.rate,
            config.writer_connections.min(config.writes)
        );
        let next = Arc::new(AtomicUsize::new(0));
        let writes_from = Instant::now();
        let writers: Vec<_> = (0..config.writer_connections.min(config.writes))
            .map(|_| {
                tokio::spawn(writer(
                    shared.clone(),
                    next.clone(),
                    writes_from,
                    config.rate,
                    value_bytes(config.value_bytes),
                    deadline,
                ))
            })
            .collect();
        for task in writers {
            let w = task.await??;
            put.merge(&w.tally);
            timed_out |= w.timed_out;
            first_sent = match (first_sent, w.first_sent) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            last_done = last_done.max(w.last_done);
        }
    }
    let state_of = |j: usize| shared.state[j].load(Ordering::Relaxed);

    // ---- drain ----
    let expected: u64 = {
        let mut ok_per_user = vec![0u64; shared.users.len()];
        for j in 0..config.writes {
            if state_of(j) == write_state::OK {
                ok_per_user[j % shared.users.len()] += 1;
            }
        }
        ok_per_user
            .iter()
            .zip(&shared.opened_per_user)
            .map(|(ok, n)| ok * n.load(Ordering::Relaxed) as u64)
            .sum()
    };
    if config.subscribers > 0 && !timed_out {
        let mut seen = shared.first_deliveries.load(Ordering::Relaxed);
        let mut progress_at = Instant::now();
        while seen < expected {
            let now = Instant::now();
            if now >= deadline {
                timed_out = true;
                break;
            }
            if now - progress_at >= DRAIN_STALL {
                eprintln!(
                    "hs-load fanout: no delivery for {DRAIN_STALL:?}; {seen}/{expected} arrived"
                );
                break;
            }
            sleep(POLL).await;
            let now_seen = shared.first_deliveries.load(Ordering::Relaxed);
            if now_seen != seen {
                seen = now_seen;
                progress_at = Instant::now();
            }
        }
    }

    let cpu_used =
        |from: Option<Duration>, pid: Option<u32>| Some(process_cpu(pid)?.saturating_sub(from?));
    let server_cpu = config
        .server_pid
        .and_then(|pid| cpu_used(cpu_from.0, Some(pid)));
    let loadgen_cpu = cpu_used(cpu_from.1, None);

    // ---- stop and merge ----
    let _ = stop_tx.send(true);
    let mut check = CheckCounts::default();
    let mut streams_ended = 0;
    let mut server_error_events = 0;
    for task in subscribers {
        let s = task.await?;
        if s.opened {
            check += s.check.finish(state_of);
            streams_ended += u64::from(s.ended_early);
            server_error_events += s.server_errors;
        }
    }
    let mut delivered = latency_histogram();
    for shard in &shared.shards {
        let shard = shard.lock().unwrap_or_else(|p| p.into_inner());
        // Same bounds on both sides, so adding cannot fail.
        let _ = delivered.add(&*shard);
    }
    let put_h = &put.latency_us;
    let sent_count = (0..config.writes)
        .filter(|&j| state_of(j) != write_state::NOT_SENT)
        .count() as u64;
    Ok(FanoutSummary {
        subscribers: config.subscribers,
        users: shared.users.len(),
        opened,
        subscribe_errors: shared.failed.load(Ordering::Relaxed),
        open_idle,
        server_subscribers,
        rss_before,
        rss_idle,
        writes: config.writes,
        writes_sent: sent_count,
        writes_ok: (0..config.writes)
            .filter(|&j| state_of(j) == write_state::OK)
            .count() as u64,
        write_errors: put.errors(),
        write_window: match (first_sent, last_done) {
            (Some(a), Some(b)) => b.saturating_duration_since(a),
            _ => Duration::ZERO,
        },
        put_p50_us: quantile(put_h, 0.50),
        put_p99_us: quantile(put_h, 0.99),
        put_max_us: if put_h.is_empty() { 0 } else { put_h.max() },
        expected,
        deliveries: delivered.len(),
        p50_us: quantile(&delivered, 0.50),
        p90_us: quantile(&delivered, 0.90),
        p99_us: quantile(&delivered, 0.99),
        max_us: if delivered.is_empty() {
            0
        } else {
            delivered.max()
        },
        check,
        streams_ended,
        server_error_events,
        server_cpu,
        loadgen_cpu,
        timed_out,
        elapsed: start.elapsed(),
    })
}

/// Signs every user up, on one connection.
async fn sign_up(shared: &Shared) -> Result<(), RunError> {
    let mut sender = connect(&shared.target).await.map_err(|e| match e {
        ConnectError::Io(cause) => RunError::Connect {
            addr: shared.target.addr,
            cause,
        },
        ConnectError::Http(e) => RunError::Http(e),
    })?;
    for user in &shared.users {
        let request = signed_request(
            &user.keypair,
            &shared.host,
            Method::POST,
            "/signup",
            Bytes::new(),
            &BodyHash::empty(),
            unix_secs(),
        )?;
        sender.ready().await?;
        let outcome = exchange(&mut sender, request).await?;
        if !outcome.status.is_success() {
            return Err(RunError::SetupStatus {
                method: "POST".into(),
                path: "/signup".into(),
                status: outcome.status,
                body: outcome.body_excerpt,
            });
        }
    }
    Ok(())
}

#[derive(Debug)]
struct SubscriberOutcome {
    opened: bool,
    ended_early: bool,
    server_errors: u64,
    check: StreamCheck,
}

/// Opens one live subscription: its sender (kept so the connection stays up) and body.
async fn open_stream(shared: &Shared, user: &User) -> Result<(Sender, Incoming), String> {
    let mut sender = connect(&shared.target)
        .await
        .map_err(|e| format!("connect to {}: {e}", shared.target.addr))?;
    let request = Request::get(user.stream_uri.as_str())
        .header(HOST, shared.host.clone())
        .header(ACCEPT, "text/event-stream")
        .body(Full::new(Bytes::new()))
        .map_err(|e| e.to_string())?;
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| format!("GET /events-stream: {e}"))?;
    let status = response.status();
    if status != StatusCode::OK {
        let body = match timeout_at(Instant::now() + SETUP_TIMEOUT, response.collect()).await {
            Ok(Ok(body)) => String::from_utf8_lossy(&body.to_bytes()).into_owned(),
            _ => String::new(),
        };
        return Err(format!("GET /events-stream answered {status}: {body}"));
    }
    Ok((sender, response.into_body()))
}

/// One subscriber: waits for its turn, opens its stream, reads it until told to stop.
async fn subscriber(
    shared: Arc<Shared>,
    index: usize,
    at: Instant,
    mut stop: watch::Receiver<bool>,
) -> SubscriberOutcome {
    let user_index = index % shared.users.len();
    let user = &shared.users[user_index];
    let mut out = SubscriberOutcome {
        opened: false,
        ended_early: false,
        server_errors: 0,
        check: StreamCheck::new(user_index, shared.users.len(), shared.writes),
    };
    let opened = tokio::select! {
        _ = stop.wait_for(|stop| *stop) => return out,
        opened = async {
            sleep_until(at).await;
            open_stream(&shared, user).await
        } => opened,
    };
    let (_sender, mut body) = match opened {
        Ok(stream) => stream,
        Err(error) => {
            shared.failed.fetch_add(1, Ordering::Relaxed);
            report(&shared.printed, || format!("subscriber {index}: {error}"));
            return out;
        }
    };
    out.opened = true;
    shared.opened_per_user[user_index].fetch_add(1, Ordering::Relaxed);
    shared.open.fetch_add(1, Ordering::Relaxed);
    shared.opened.fetch_add(1, Ordering::Relaxed);

    let shard = &shared.shards[index % SHARDS];
    let mut parser = crate::sse::SseParser::new();
    let mut latencies_us: Vec<u64> = Vec::new();
    loop {
        let frame = tokio::select! {
            biased;
            _ = stop.wait_for(|stop| *stop) => break,
            frame = body.frame() => frame,
        };
        let frame = match frame {
            Some(Ok(frame)) => frame,
            Some(Err(error)) => {
                out.ended_early = true;
                report(&shared.printed, || format!("subscriber {index}: {error}"));
                break;
            }
            None => {
                out.ended_early = true;
                report(&shared.printed, || {
                    format!("subscriber {index}: the server ended the stream")
                });
                break;
            }
        };
        let Some(data) = frame.data_ref() else {
            continue;
        };
        // One stamp per frame: every event in it arrived at the same time.
        let arrived_ns = shared.since_t0_ns(Instant::now());
        let mut first = 0;
        parser.feed(data, |name, data| {
            if name == "error" {
                out.server_errors += 1;
                return;
            }
            let (write, cursor) = match crate::sse::parse_delivery(data) {
                Some(d) if name == "PUT" && d.user == user.z32 => (write_index(d.path), d.cursor),
                Some(d) => (None, d.cursor),
                None => (None, 0),
            };
            if let Seen::First(j) = out.check.record(write, cursor) {
                first += 1;
                let sent = shared.sent_ns[j].load(Ordering::Acquire);
                if sent > 0 {
                    latencies_us.push(arrived_ns.saturating_sub(sent - 1) / 1000);
                }
            }
        });
        if !latencies_us.is_empty() {
            let mut h = shard.lock().unwrap_or_else(|p| p.into_inner());
            for &us in &latencies_us {
                h.saturating_record(us.max(1));
            }
            drop(h);
            latencies_us.clear();
        }
        if first > 0 {
            shared.first_deliveries.fetch_add(first, Ordering::Relaxed);
        }
    }
    shared.open.fetch_sub(1, Ordering::Relaxed);
    out
}

#[derive(Debug)]
struct WriterOutcome {
    tally: Tally,
    /// Stopped by the run's deadline with writes left.
    timed_out: bool,
    first_sent: Option<Instant>,
    last_done: Option<Instant>,
}

/// Makes sure `conn` holds a connection ready for a request.
async fn ready(conn: &mut Option<Sender>, target: &Target) -> Result<(), ConnectError> {
    let usable = match conn.as_mut() {
        Some(sender) => sender.ready().await.is_ok(),
        None => false,
    };
    if !usable {
        *conn = None;
        let mut sender = connect(target).await?;
        sender.ready().await.map_err(ConnectError::Http)?;
        *conn = Some(sender);
    }
    Ok(())
}

/// One writer connection: takes the next write number, waits until it is due, sends it.
async fn writer(
    shared: Arc<Shared>,
    next: Arc<AtomicUsize>,
    from: Instant,
    rate: f64,
    value: Bytes,
    deadline: Instant,
) -> Result<WriterOutcome, RunError> {
    let hash = BodyHash::of(&value);
    let mut out = WriterOutcome {
        tally: Tally::new(),
        timed_out: false,
        first_sent: None,
        last_done: None,
    };
    let mut conn: Option<Sender> = None;
    loop {
        let j = next.fetch_add(1, Ordering::Relaxed);
        if j >= shared.writes {
            break;
        }
        let due = from + Duration::from_secs_f64(j as f64 / rate);
        if due >= deadline {
            out.timed_out = true;
            break;
        }
        sleep_until(due).await;
        match timeout_at(deadline, ready(&mut conn, &shared.target)).await {
            Err(_) => {
                out.timed_out = true;
                break;
            }
            Ok(Ok(())) => {}
            Ok(Err(error)) => {
                out.tally.record_connect_error();
                report(&shared.printed, || {
                    format!("write {j}: connect to {}: {error}", shared.target.addr)
                });
                sleep(RECONNECT_PAUSE).await;
                continue;
            }
        }
        let Some(sender) = conn.as_mut() else {
            continue;
        };
        let user = &shared.users[j % shared.users.len()];
        let path = write_path(j);
        let request = signed_request(
            &user.keypair,
            &shared.host,
            Method::PUT,
            &path,
            value.clone(),
            &hash,
            unix_secs(),
        )?;
        let sent = Instant::now();
        shared.sent_ns[j].store(shared.since_t0_ns(sent) + 1, Ordering::Release);
        shared.state[j].store(write_state::IN_FLIGHT, Ordering::Release);
        out.first_sent.get_or_insert(sent);
        let result = timeout_at(deadline, exchange(sender, request)).await;
        let done = Instant::now();
        match result {
            Err(_) => {
                shared.state[j].store(write_state::UNKNOWN, Ordering::Release);
                out.tally.record_transport_error();
                out.timed_out = true;
                break;
            }
            Ok(Err(error)) => {
                shared.state[j].store(write_state::UNKNOWN, Ordering::Release);
                out.tally.record_transport_error();
                conn = None;
                report(&shared.printed, || format!("PUT {path}: {error}"));
            }
            Ok(Ok(outcome)) => {
                out.tally
                    .record_response(outcome.status.as_u16(), done - sent);
                out.last_done = Some(done);
                if outcome.status.is_success() {
                    shared.state[j].store(write_state::OK, Ordering::Release);
                } else {
                    shared.state[j].store(write_state::REFUSED, Ordering::Release);
                    report(&shared.printed, || {
                        format!("PUT {path}: {} {}", outcome.status, outcome.body_excerpt)
                    });
                }
            }
        }
    }
    Ok(out)
}
