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

use std::sync::atomic::{AtomicU8, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use hdrhistogram::Histogram;
use homeserver_protocol::{BodyHash, Keypair};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::header::{ACCEPT, HOST, HeaderValue};
use hyper::{Method, Request, StatusCode};
use serde_json::{Value, json};
use tokio::sync::watch;
use tokio::time::{Instant, sleep, sleep_until, timeout_at};

use crate::driver::{ConnectError, RunError, Sender, connect, exchange, report};
use crate::scenario::{signed_request, unix_secs, value_bytes};
use crate::summary::{MAX_TRACKED_US, Tally, format_ms};
use crate::target::Target;

/// Where write `j` is stored (the events carry it back).
const WRITE_PREFIX: &str = "/pub/bench/fanout/w";
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

/// The path of write `j`.
pub fn write_path(j: usize) -> String {
    format!("{WRITE_PREFIX}{j}")
}

/// The write number of an event's path (as in its URL: without the leading `/`).
pub fn write_index(url_path: &str) -> Option<usize> {
    let digits = url_path.strip_prefix(&WRITE_PREFIX[1..])?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// How one event counted for a subscriber.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Seen {
    /// The first delivery of this write.
    First(usize),
    /// This write was delivered before.
    Repeat,
    /// Not a write of this run to this subscriber's user.
    Foreign,
}

/// One subscriber's view of its stream: it must get every committed write of its user
/// exactly once, with increasing cursors.
#[derive(Debug)]
pub struct StreamCheck {
    user: usize,
    users: usize,
    /// Deliveries of each write of this user (write `j` at `j / users`), saturating.
    counts: Vec<u8>,
    /// Highest cursor seen (cursors start at 1).
    last_cursor: u64,
    events: u64,
    out_of_order: u64,
    foreign: u64,
}

/// The checks of one or more subscribers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CheckCounts {
    /// Events received, of any kind.
    pub events: u64,
    /// Committed writes (2xx) of the subscriber's user that never arrived.
    pub missing: u64,
    /// Extra deliveries of a write already delivered.
    pub duplicates: u64,
    /// First deliveries whose cursor was not above every cursor before it.
    pub out_of_order: u64,
    /// Events for another user, for no write of this run, or for a refused write.
    pub unexpected: u64,
}

impl std::ops::AddAssign for CheckCounts {
    fn add_assign(&mut self, other: Self) {
        self.events += other.events;
        self.missing += other.missing;
        self.duplicates += other.duplicates;
        self.out_of_order += other.out_of_order;
        self.unexpected += other.unexpected;
    }
}

impl StreamCheck {
    /// A subscriber of `user` (of `users`), in a run of `writes` writes.
    pub fn new(user: usize, users: usize, writes: usize) -> Self {
        let users = users.max(1);
        let mine = writes.saturating_sub(user).div_ceil(users);
        Self {
            user,
            users,
            counts: vec![0; mine],
            last_cursor: 0,
            events: 0,
            out_of_order: 0,
            foreign: 0,
        }
    }

    /// Records one event: `write` is the write number its path names (None when it
    /// names none, or belongs to another user).
    pub fn record(&mut self, write: Option<usize>, cursor: u64) -> Seen {
        self.events += 1;
        let slot = write
            .filter(|j| j % self.users == self.user)
            .and_then(|j| self.counts.get_mut(j / self.users).map(|slot| (j, slot)));
        let Some((j, slot)) = slot else {
            self.foreign += 1;
            return Seen::Foreign;
        };
        let first = *slot == 0;
        *slot = slot.saturating_add(1);
        if !first {
            return Seen::Repeat;
        }
        if cursor <= self.last_cursor {
            self.out_of_order += 1;
        }
        self.last_cursor = self.last_cursor.max(cursor);
        Seen::First(j)
    }

    /// The verdict, given what became of each write (a `write_state` value).
    pub fn finish(&self, state_of: impl Fn(usize) -> u8) -> CheckCounts {
        let mut c = CheckCounts {
            events: self.events,
            out_of_order: self.out_of_order,
            unexpected: self.foreign,
            ..CheckCounts::default()
        };
        for (k, &n) in self.counts.iter().enumerate() {
            let n = u64::from(n);
            c.duplicates += n.saturating_sub(1);
            match state_of(k * self.users + self.user) {
                write_state::OK if n == 0 => c.missing += 1,
                write_state::REFUSED | write_state::NOT_SENT => c.unexpected += n.min(1),
                _ => {}
            }
        }
        c
    }
}

/// `hs_event_stream_subscribers` (or any unlabelled sample) from a Prometheus text page.
pub fn metric_value(page: &str, name: &str) -> Option<f64> {
    page.lines()
        .filter(|line| !line.starts_with('#'))
        .find_map(|line| {
            let mut parts = line.split_whitespace();
            (parts.next()? == name).then(|| parts.next()?.parse().ok())?
        })
}

/// `VmRSS` in bytes, from the text of `/proc/<pid>/status`.
pub fn vm_rss_bytes(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let mut parts = line["VmRSS:".len()..].split_whitespace();
    let value: u64 = parts.next()?.parse().ok()?;
    match parts.next() {
        Some("kB") | None => Some(value * 1024),
        Some(_) => None,
    }
}

/// The server's resident memory; says on stderr which process it read (a wrong pid, such
/// as the shell that started the server, shows here).
fn read_rss(pid: u32, when: &str) -> Option<u64> {
    match std::fs::read_to_string(format!("/proc/{pid}/status")) {
        Ok(text) => {
            let name = text
                .lines()
                .find_map(|l| l.strip_prefix("Name:"))
                .map_or("?", str::trim);
            let rss = vm_rss_bytes(&text);
            eprintln!(
                "hs-load fanout: server pid {pid} ({name}) VmRSS {when}: {:.1} MiB",
                rss.unwrap_or(0) as f64 / (1 << 20) as f64
            );
            rss
        }
        Err(error) => {
            eprintln!("hs-load fanout: cannot read /proc/{pid}/status: {error}");
            None
        }
    }
}

/// User + system CPU time in clock ticks, from the text of `/proc/<pid>/stat` (all
/// threads of the process).
pub fn cpu_ticks(stat: &str) -> Option<u64> {
    // The command name (field 2) is in parentheses and may hold spaces: count from the
    // last `)`. utime and stime are fields 14 and 15 of the file.
    let mut fields = stat
        .get(stat.rfind(')')? + 1..)?
        .split_whitespace()
        .skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(utime + stime)
}

fn ticks_per_sec() -> u64 {
    #[cfg(unix)]
    {
        use nix::unistd::{SysconfVar, sysconf};
        sysconf(SysconfVar::CLK_TCK)
            .ok()
            .flatten()
            .and_then(|t| u64::try_from(t).ok())
            .filter(|t| *t > 0)
            .unwrap_or(100)
    }
    #[cfg(not(unix))]
    {
        100
    }
}

/// CPU time a process (`None`: this one) has used so far.
fn process_cpu(pid: Option<u32>) -> Option<Duration> {
    let path = pid.map_or_else(|| "/proc/self/stat".into(), |p| format!("/proc/{p}/stat"));
    let ticks = cpu_ticks(&std::fs::read_to_string(path).ok()?)?;
    Some(Duration::from_secs_f64(
        ticks as f64 / ticks_per_sec() as f64,
    ))
}

fn latency_histogram() -> Histogram<u64> {
    // Bounds are constants that satisfy the constructor's preconditions.
    Histogram::new_with_bounds(1, MAX_TRACKED_US, 3).expect("valid histogram bounds")
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

/// The figures of one fan-out run.
#[derive(Clone, Debug, PartialEq)]
pub struct FanoutSummary {
    pub subscribers: usize,
    pub users: usize,
    /// Subscriptions that got their 200 headers.
    pub opened: usize,
    pub subscribe_errors: usize,
    /// The load generator's count of open subscriptions after the idle pause.
    pub open_idle: usize,
    /// `hs_event_stream_subscribers` once every subscription was open.
    pub server_subscribers: Option<u64>,
    /// The server's `VmRSS` before the subscriptions, and after them and the idle pause.
    pub rss_before: Option<u64>,
    pub rss_idle: Option<u64>,
    pub writes: usize,
    pub writes_sent: u64,
    pub writes_ok: u64,
    /// Non-2xx answers, writes without an answer, failed connects.
    pub write_errors: u64,
    /// From the first PUT sent to the last answer.
    pub write_window: Duration,
    pub put_p50_us: u64,
    pub put_p99_us: u64,
    pub put_max_us: u64,
    /// First deliveries the open subscribers should get (committed writes of their user).
    pub expected: u64,
    /// First deliveries that arrived, and the latency figures over them.
    pub deliveries: u64,
    pub p50_us: u64,
    pub p90_us: u64,
    pub p99_us: u64,
    pub max_us: u64,
    pub check: CheckCounts,
    /// Streams that ended (or failed) before the run stopped them.
    pub streams_ended: u64,
    /// `event: error` events (the server failed mid-stream).
    pub server_error_events: u64,
    /// CPU time the server and the load generator used from the first write to the end
    /// of the drain (who was busy: they share the cores).
    pub server_cpu: Option<Duration>,
    pub loadgen_cpu: Option<Duration>,
    pub timed_out: bool,
    pub elapsed: Duration,
}

fn quantile(h: &Histogram<u64>, q: f64) -> u64 {
    if h.is_empty() {
        0
    } else {
        h.value_at_quantile(q)
    }
}

impl FanoutSummary {
    /// Server memory per idle subscription: (idle RSS − RSS before) / opened.
    pub fn idle_bytes_per_subscriber(&self) -> Option<i64> {
        let (before, after) = (self.rss_before?, self.rss_idle?);
        let opened = i64::try_from(self.opened).ok().filter(|n| *n > 0)?;
        let growth = i64::try_from(after).ok()? - i64::try_from(before).ok()?;
        Some(growth / opened)
    }

    /// Committed writes per second of the write window.
    pub fn writes_per_sec(&self) -> f64 {
        let secs = self.write_window.as_secs_f64();
        if secs > 0.0 {
            self.writes_ok as f64 / secs
        } else {
            0.0
        }
    }

    /// Failed subscriptions, failed writes, streams lost early, server-side stream errors.
    pub fn errors(&self) -> u64 {
        self.subscribe_errors as u64
            + self.write_errors
            + self.streams_ended
            + self.server_error_events
    }

    /// Whether everything arrived as it should, in time and without errors.
    pub fn clean(&self) -> bool {
        !self.timed_out
            && self.errors() == 0
            && self.check.missing == 0
            && self.check.duplicates == 0
            && self.check.out_of_order == 0
            && self.check.unexpected == 0
            && self.writes_ok == self.writes as u64
            && self.opened == self.subscribers
    }

    /// One line, `key=value` separated by spaces; latencies in milliseconds, `-` for a
    /// figure not measured.
    pub fn line(&self) -> String {
        let opt = |v: Option<String>| v.unwrap_or_else(|| "-".into());
        format!(
            "scenario=fanout subscribers={} open={} server_subscribers={} users={} writes={} \
             writes_ok={} write/s={:.1} put_p50={}ms put_p99={}ms deliveries={} expected={} \
             p50={}ms p90={}ms p99={}ms max={}ms missing={} duplicates={} out_of_order={} \
             unexpected={} idle_bytes/sub={} server_cpu={}s loadgen_cpu={}s errors={} \
             timed_out={}",
            self.subscribers,
            self.open_idle,
            opt(self.server_subscribers.map(|n| n.to_string())),
            self.users,
            self.writes,
            self.writes_ok,
            self.writes_per_sec(),
            format_ms(self.put_p50_us),
            format_ms(self.put_p99_us),
            self.deliveries,
            self.expected,
            format_ms(self.p50_us),
            format_ms(self.p90_us),
            format_ms(self.p99_us),
            format_ms(self.max_us),
            self.check.missing,
            self.check.duplicates,
            self.check.out_of_order,
            self.check.unexpected,
            opt(self.idle_bytes_per_subscriber().map(|n| n.to_string())),
            opt(self.server_cpu.map(|d| format!("{:.2}", d.as_secs_f64()))),
            opt(self.loadgen_cpu.map(|d| format!("{:.2}", d.as_secs_f64()))),
            self.errors(),
            self.timed_out,
        )
    }

    /// The same figures as a JSON object (latencies in milliseconds, as numbers).
    pub fn to_json(&self) -> Value {
        let ms = |us: u64| us as f64 / 1000.0;
        json!({
            "scenario": "fanout",
            "subscribers": self.subscribers,
            "users": self.users,
            "opened": self.opened,
            "subscribe_errors": self.subscribe_errors,
            "open_idle": self.open_idle,
            "server_subscribers": self.server_subscribers,
            "server_rss_before_bytes": self.rss_before,
            "server_rss_idle_bytes": self.rss_idle,
            "idle_bytes_per_subscriber": self.idle_bytes_per_subscriber(),
            "writes": self.writes,
            "writes_sent": self.writes_sent,
            "writes_ok": self.writes_ok,
            "write_errors": self.write_errors,
            "write_window_s": self.write_window.as_secs_f64(),
            "writes_per_s": (self.writes_per_sec() * 10.0).round() / 10.0,
            "put_p50_ms": ms(self.put_p50_us),
            "put_p99_ms": ms(self.put_p99_us),
            "put_max_ms": ms(self.put_max_us),
            "expected_deliveries": self.expected,
            "deliveries": self.deliveries,
            "events_received": self.check.events,
            "p50_ms": ms(self.p50_us),
            "p90_ms": ms(self.p90_us),
            "p99_ms": ms(self.p99_us),
            "max_ms": ms(self.max_us),
            "missing": self.check.missing,
            "duplicates": self.check.duplicates,
            "out_of_order": self.check.out_of_order,
            "unexpected": self.check.unexpected,
            "streams_ended": self.streams_ended,
            "server_error_events": self.server_error_events,
            "server_cpu_s": self.server_cpu.map(|d| d.as_secs_f64()),
            "loadgen_cpu_s": self.loadgen_cpu.map(|d| d.as_secs_f64()),
            "errors": self.errors(),
            "timed_out": self.timed_out,
            "elapsed_s": self.elapsed.as_secs_f64(),
        })
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
            User {
                stream_uri: format!("/events-stream?user={z32}&live=true"),
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

/// Polls the metrics endpoint until it counts at least `want` subscribers (or `until`);
/// returns the last count read.
async fn wait_for_server_count(metrics: &Target, want: u64, until: Instant) -> Option<u64> {
    let mut last = None;
    loop {
        match timeout_at(until, fetch_text(metrics, "/metrics")).await {
            Err(_) => break,
            Ok(Err(error)) => eprintln!("hs-load fanout: reading metrics: {error}"),
            Ok(Ok(page)) => match metric_value(&page, "hs_event_stream_subscribers") {
                Some(n) => last = Some(n as u64),
                None => {
                    eprintln!("hs-load fanout: no hs_event_stream_subscribers in the metrics");
                    break;
                }
            },
        }
        if last.is_some_and(|n| n >= want) || Instant::now() + POLL * 10 >= until {
            break;
        }
        sleep(POLL * 10).await;
    }
    last
}

/// `GET path` on its own connection; the body as text when the answer is 200.
async fn fetch_text(target: &Target, path: &str) -> Result<String, String> {
    let mut sender = connect(target).await.map_err(|e| e.to_string())?;
    let request = Request::get(path)
        .header(HOST, target.authority.as_str())
        .body(Full::new(Bytes::new()))
        .map_err(|e| e.to_string())?;
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| e.to_string())?;
    let status = response.status();
    let body = response
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    if status != StatusCode::OK {
        return Err(format!("GET {path} answered {status}"));
    }
    Ok(String::from_utf8_lossy(&body).into_owned())
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_paths_round_trip() {
        assert_eq!(write_path(0), "/pub/bench/fanout/w0");
        for j in [0, 7, 1999, 123_456] {
            assert_eq!(write_index(&write_path(j)[1..]), Some(j));
        }
        for other in [
            "pub/bench/fanout/w",
            "pub/bench/fanout/wx",
            "pub/bench/fanout/w+1",
            "pub/bench/fanout/w1/2",
            "pub/bench/put-1k/c0-1",
            "/pub/bench/fanout/w1",
        ] {
            assert_eq!(write_index(other), None, "{other}");
        }
    }

    fn all(state: u8) -> impl Fn(usize) -> u8 {
        move |_| state
    }

    #[test]
    fn a_perfect_stream_counts_clean() {
        // 3 users, 10 writes: user 1 owns writes 1, 4, 7.
        let mut c = StreamCheck::new(1, 3, 10);
        assert_eq!(c.counts.len(), 3);
        assert_eq!(c.record(Some(1), 5), Seen::First(1));
        assert_eq!(c.record(Some(4), 9), Seen::First(4));
        assert_eq!(c.record(Some(7), 12), Seen::First(7));
        assert_eq!(
            c.finish(all(write_state::OK)),
            CheckCounts {
                events: 3,
                ..CheckCounts::default()
            }
        );
        // User 2 of 3 owns 2, 5, 8; user 0 owns 0, 3, 6, 9.
        assert_eq!(StreamCheck::new(2, 3, 10).counts.len(), 3);
        assert_eq!(StreamCheck::new(0, 3, 10).counts.len(), 4);
        assert_eq!(StreamCheck::new(5, 8, 3).counts.len(), 0);
    }

    #[test]
    fn counts_missing_duplicate_out_of_order_and_foreign() {
        let mut c = StreamCheck::new(0, 1, 6);
        assert_eq!(c.record(Some(0), 10), Seen::First(0));
        assert_eq!(c.record(Some(2), 12), Seen::First(2));
        assert_eq!(c.record(Some(2), 12), Seen::Repeat); // duplicate, not out of order
        assert_eq!(c.record(Some(1), 11), Seen::First(1)); // late: out of order
        assert_eq!(c.record(Some(0), 10), Seen::Repeat);
        assert_eq!(c.record(Some(6), 20), Seen::Foreign); // no such write
        assert_eq!(c.record(None, 21), Seen::Foreign); // another user or path
        assert_eq!(c.record(Some(3), 13), Seen::First(3)); // order resumes
        // Writes 4 and 5 never arrived.
        assert_eq!(
            c.finish(all(write_state::OK)),
            CheckCounts {
                events: 8,
                missing: 2,
                duplicates: 2,
                out_of_order: 1,
                unexpected: 2,
            }
        );
    }

    #[test]
    fn only_committed_writes_are_owed() {
        let mut c = StreamCheck::new(0, 2, 8); // writes 0, 2, 4, 6
        c.record(Some(0), 1);
        c.record(Some(4), 3); // write 4 was refused: its event should not exist
        c.record(Some(1), 2); // user 1's write
        let states = |j: usize| match j {
            0 => write_state::OK,
            2 => write_state::UNKNOWN, // no answer: owed nothing either way
            4 => write_state::REFUSED, // delivered anyway
            6 => write_state::NOT_SENT, // never sent
            _ => write_state::OK,
        };
        assert_eq!(
            c.finish(states),
            CheckCounts {
                events: 3,
                missing: 0,
                duplicates: 0,
                out_of_order: 0,
                unexpected: 2,
            }
        );
        let mut total = c.finish(states);
        total += c.finish(states);
        assert_eq!((total.events, total.unexpected), (6, 4));
    }

    #[test]
    fn duplicate_counts_saturate() {
        let mut c = StreamCheck::new(0, 1, 1);
        for _ in 0..300 {
            c.record(Some(0), 1);
        }
        assert_eq!(c.finish(all(write_state::OK)).duplicates, 254);
    }

    #[test]
    fn reads_metrics_and_proc_status() {
        let page = "# HELP hs_event_stream_subscribers Open /events-stream connections.\n\
                    # TYPE hs_event_stream_subscribers gauge\n\
                    hs_event_stream_subscribers_total 9\n\
                    hs_event_stream_subscribers 1000\n\
                    hs_users 3\n";
        assert_eq!(
            metric_value(page, "hs_event_stream_subscribers"),
            Some(1000.0)
        );
        assert_eq!(metric_value(page, "hs_users"), Some(3.0));
        assert_eq!(metric_value(page, "hs_missing"), None);

        let status = "Name:\thomeserver\nVmPeak:\t  99 kB\nVmRSS:\t   51234 kB\nThreads:\t4\n";
        assert_eq!(vm_rss_bytes(status), Some(51234 * 1024));
        assert_eq!(vm_rss_bytes("Name: x\n"), None);

        let stat = "6649 (home server) S 6648 6648 1 0 -1 4194560 7331 0 0 0 \
                    350 120 0 0 20 0 4 0 7190 1000 100 18446744073709551615";
        assert_eq!(cpu_ticks(stat), Some(470));
        assert_eq!(cpu_ticks("6649 (x) S 1 2"), None);
        assert!(process_cpu(None).is_some());
    }

    fn summary() -> FanoutSummary {
        FanoutSummary {
            subscribers: 10,
            users: 1,
            opened: 10,
            subscribe_errors: 0,
            open_idle: 10,
            server_subscribers: Some(10),
            rss_before: Some(1_000_000),
            rss_idle: Some(1_200_000),
            writes: 100,
            writes_sent: 100,
            writes_ok: 100,
            write_errors: 0,
            write_window: Duration::from_secs(2),
            put_p50_us: 1500,
            put_p99_us: 4000,
            put_max_us: 5000,
            expected: 1000,
            deliveries: 1000,
            p50_us: 2000,
            p90_us: 3000,
            p99_us: 4000,
            max_us: 9000,
            check: CheckCounts {
                events: 1000,
                ..CheckCounts::default()
            },
            streams_ended: 0,
            server_error_events: 0,
            server_cpu: Some(Duration::from_millis(1500)),
            loadgen_cpu: None,
            timed_out: false,
            elapsed: Duration::from_secs(5),
        }
    }

    #[test]
    fn summary_line_and_json() {
        let s = summary();
        assert!(s.clean());
        assert_eq!(s.idle_bytes_per_subscriber(), Some(20_000));
        assert_eq!(s.writes_per_sec(), 50.0);
        assert_eq!(
            s.line(),
            "scenario=fanout subscribers=10 open=10 server_subscribers=10 users=1 writes=100 \
             writes_ok=100 write/s=50.0 put_p50=1.500ms put_p99=4.000ms deliveries=1000 \
             expected=1000 p50=2.000ms p90=3.000ms p99=4.000ms max=9.000ms missing=0 \
             duplicates=0 out_of_order=0 unexpected=0 idle_bytes/sub=20000 \
             server_cpu=1.50s loadgen_cpu=-s errors=0 timed_out=false"
        );
        let j = s.to_json();
        assert_eq!(j["idle_bytes_per_subscriber"], 20_000);
        assert_eq!(j["writes_per_s"], 50.0);
        assert_eq!(j["p99_ms"], 4.0);
        assert_eq!(j["missing"], 0);
        assert_eq!(j["server_cpu_s"], 1.5);
        assert!(j["loadgen_cpu_s"].is_null());

        let mut none = summary();
        none.subscribers = 0;
        none.opened = 0;
        none.server_subscribers = None;
        assert_eq!(none.idle_bytes_per_subscriber(), None);
        assert!(none.line().contains("server_subscribers=- "));
        assert!(none.line().contains("idle_bytes/sub=- "));
        assert!(none.to_json()["idle_bytes_per_subscriber"].is_null());

        let mut lossy = summary();
        lossy.check.missing = 1;
        assert!(!lossy.clean());
        lossy.check.missing = 0;
        lossy.streams_ended = 1;
        assert_eq!(lossy.errors(), 1);
        assert!(!lossy.clean());
    }
}
