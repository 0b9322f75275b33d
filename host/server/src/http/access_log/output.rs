//! How access lines reach stdout in the server process: a tracing layer of their own
//! instead of the fmt layer. The fmt layer formats each field through a visitor, the
//! timestamp and ANSI styles through `fmt::Display`, and writes each line with its own
//! `write` under stdout's lock: ~5 µs of a public GET's ~31 (docs/BENCHMARKS.md "Access
//! log"). Here a line is written straight into a shared buffer in the same shape (the
//! text line or the JSON object the fmt layer would print), and a thread of its own
//! writes the buffer out: one system call per batch, a line waits at most
//! [`GATHER`]. Nothing is dropped: past [`MAX_PENDING`] bytes a request waits for the
//! writer. The other log lines keep the fmt layer (`init` in main).

use std::fmt::Write as _;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime};

use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::layer::{Context, Layer};

use super::TARGET;
use crate::config::LogFormat;

/// How long the writer lets lines gather once one is waiting.
const GATHER: Duration = Duration::from_millis(2);
/// Bytes waiting past which a request waits for the writer (stdout blocked).
const MAX_PENDING: usize = 8 << 20;

/// The layer writing `access` events; every other target passes through untouched.
pub struct AccessLayer {
    format: LogFormat,
    shared: Arc<Shared>,
}

/// Writes what is still waiting and stops the writer when dropped (keep it to the end of
/// main).
pub struct Guard {
    shared: Arc<Shared>,
    writer: Option<JoinHandle<()>>,
}

#[derive(Default)]
struct Shared {
    pending: Mutex<Pending>,
    /// A line arrived in an empty buffer, or the guard closed it.
    arrived: Condvar,
    /// The writer took the buffer (for requests waiting on a full one).
    taken: Condvar,
}

#[derive(Default)]
struct Pending {
    bytes: Vec<u8>,
    closed: bool,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Pending> {
        self.pending.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The layer and its writer thread, writing to `out` (stdout in the server).
pub fn layer(
    format: LogFormat,
    out: impl std::io::Write + Send + 'static,
) -> std::io::Result<(AccessLayer, Guard)> {
    let shared = Arc::new(Shared::default());
    let writer = std::thread::Builder::new()
        .name("access-log".into())
        .spawn({
            let shared = shared.clone();
            move || write_out(&shared, out)
        })?;
    Ok((
        AccessLayer {
            format,
            shared: shared.clone(),
        },
        Guard {
            shared,
            writer: Some(writer),
        },
    ))
}

fn write_out(shared: &Shared, mut out: impl std::io::Write) {
    let mut batch = Vec::new();
    loop {
        let mut pending = shared.lock();
        while pending.bytes.is_empty() && !pending.closed {
            pending = shared
                .arrived
                .wait(pending)
                .unwrap_or_else(PoisonError::into_inner);
        }
        if pending.bytes.is_empty() {
            return; // closed, and everything written
        }
        let closing = pending.closed;
        drop(pending);
        if !closing {
            std::thread::sleep(GATHER);
        }
        {
            let mut pending = shared.lock();
            std::mem::swap(&mut batch, &mut pending.bytes);
        }
        shared.taken.notify_all();
        // Nowhere else to report a failed write of the log itself.
        let _ = out.write_all(&batch).and_then(|()| out.flush());
        batch.clear();
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        self.shared.lock().closed = true;
        self.shared.arrived.notify_one();
        if let Some(writer) = self.writer.take() {
            let _ = writer.join();
        }
    }
}

impl<S: Subscriber> Layer<S> for AccessLayer {
    fn on_event(&self, event: &Event<'_>, _: Context<'_, S>) {
        if event.metadata().target() != TARGET {
            return;
        }
        let mut line = String::with_capacity(320);
        let now = humantime::format_rfc3339_micros(SystemTime::now());
        match self.format {
            LogFormat::Text => {
                let _ = write!(line, "{now} {:>5} {TARGET}:", event.metadata().level());
                event.record(&mut TextFields(&mut line));
            }
            LogFormat::Json => {
                let _ = write!(
                    line,
                    "{{\"timestamp\":\"{now}\",\"level\":\"{}\",\"fields\":{{",
                    event.metadata().level()
                );
                let mut fields = JsonFields {
                    line: &mut line,
                    first: true,
                };
                event.record(&mut fields);
                let _ = write!(line, "}},\"target\":\"{TARGET}\"}}");
            }
        }
        line.push('\n');
        let mut pending = self.shared.lock();
        while pending.bytes.len() > MAX_PENDING && !pending.closed {
            pending = self
                .shared
                .taken
                .wait(pending)
                .unwrap_or_else(PoisonError::into_inner);
        }
        if pending.closed {
            // After the guard (connections cut at shutdown): written here, at once.
            drop(pending);
            let _ = std::io::Write::write_all(&mut std::io::stdout(), line.as_bytes());
            return;
        }
        let was_empty = pending.bytes.is_empty();
        pending.bytes.extend_from_slice(line.as_bytes());
        drop(pending);
        // Only the first line of a batch wakes the writer (a system call); the others
        // join it while it gathers.
        if was_empty {
            self.shared.arrived.notify_one();
        }
    }
}

/// ` name=value` per field, as the fmt layer writes them: strings quoted and escaped
/// (`Debug`), `%`-fields and numbers as they display.
struct TextFields<'a>(&'a mut String);

impl Visit for TextFields<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        let _ = write!(self.0, " {}={value:?}", field.name());
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        let _ = write!(self.0, " {}={value}", field.name());
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        let _ = write!(self.0, " {}={value}", field.name());
    }
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        let _ = write!(self.0, " {}={value:?}", field.name());
    }
}

/// `"name":value` per field, as the fmt layer's JSON writes them: numbers and booleans
/// as such, everything else a JSON string.
struct JsonFields<'a> {
    line: &'a mut String,
    first: bool,
}

impl JsonFields<'_> {
    fn name(&mut self, field: &Field) {
        if !self.first {
            self.line.push(',');
        }
        self.first = false;
        json_string(self.line, field.name());
        self.line.push(':');
    }
}

impl Visit for JsonFields<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.name(field);
        json_string(self.line, value);
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.name(field);
        let _ = write!(self.line, "{value}");
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.name(field);
        let _ = write!(self.line, "{value}");
    }
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.name(field);
        json_string(self.line, &format!("{value:?}"));
    }
}

/// `text` as a JSON string (quotes, backslashes and control characters escaped).
fn json_string(line: &mut String, text: &str) {
    line.push('"');
    for c in text.chars() {
        match c {
            '"' => line.push_str("\\\""),
            '\\' => line.push_str("\\\\"),
            '\n' => line.push_str("\\n"),
            '\r' => line.push_str("\\r"),
            '\t' => line.push_str("\\t"),
            c if u32::from(c) < 0x20 => {
                let _ = write!(line, "\\u{:04x}", u32::from(c));
            }
            c => line.push(c),
        }
    }
    line.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex as StdMutex;
    use tracing_subscriber::layer::SubscriberExt;

    /// A writer the tests read back.
    #[derive(Clone, Default)]
    struct Captured(Arc<StdMutex<Vec<u8>>>);

    impl std::io::Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn one_event() {
        tracing::info!(
            target: TARGET,
            listener = %"http",
            request_id = %"id-1",
            method = %"GET",
            path = "/pub/a \"b\"\n",
            status = 200u16,
            bytes_in = 0u64,
            bytes_out = 1024u64,
            caller = %"key",
            key = Some(tracing::field::display("abc")),
            aborted = None::<bool>,
            client = %"127.0.0.1",
        );
        tracing::info!(target: "elsewhere", "not an access line");
    }

    /// What this layer writes and what tracing-subscriber's fmt layer writes for the
    /// same event, timestamps aside.
    fn both(format: LogFormat) -> (String, String) {
        let ours = Captured::default();
        let (layer, guard) = layer(format, ours.clone()).unwrap();
        tracing::subscriber::with_default(tracing_subscriber::registry().with(layer), one_event);
        drop(guard);
        let theirs = Captured::default();
        let writer = theirs.clone();
        let fmt = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_env_filter(format!("{TARGET}=info"))
            .with_writer(move || writer.clone());
        match format {
            LogFormat::Text => tracing::subscriber::with_default(fmt.finish(), one_event),
            LogFormat::Json => tracing::subscriber::with_default(fmt.json().finish(), one_event),
        }
        let text = |c: Captured| String::from_utf8(c.0.lock().unwrap().clone()).unwrap();
        (text(ours), text(theirs))
    }

    #[test]
    fn text_lines_are_the_fmt_layers_lines() {
        let (ours, theirs) = both(LogFormat::Text);
        assert_eq!(ours.lines().count(), 1, "{ours}");
        // After the timestamp (27 characters).
        assert_eq!(ours[27..], theirs[27..]);
    }

    #[test]
    fn json_lines_are_the_fmt_layers_objects() {
        let (ours, theirs) = both(LogFormat::Json);
        let parse = |s: &str| -> serde_json::Value { serde_json::from_str(s.trim()).unwrap() };
        let (mut ours, mut theirs) = (parse(&ours), parse(&theirs));
        for v in [&mut ours, &mut theirs] {
            assert!(v["timestamp"].is_string());
            v["timestamp"] = serde_json::Value::Null;
        }
        assert_eq!(ours, theirs);
    }

    #[test]
    fn a_dropped_guard_has_written_every_line() {
        let out = Captured::default();
        let (layer, guard) = layer(LogFormat::Text, out.clone()).unwrap();
        tracing::subscriber::with_default(tracing_subscriber::registry().with(layer), || {
            for _ in 0..1000 {
                one_event();
            }
        });
        drop(guard);
        assert_eq!(out.0.lock().unwrap().split(|b| *b == b'\n').count(), 1001);
    }
}
