//! How access lines reach stdout in the server process: a tracing layer of their own
//! instead of the fmt layer. The fmt layer formats each field through a visitor, the
//! timestamp and ANSI styles through `fmt::Display`, and writes each line with its own
//! `write` under stdout's lock: ~5 µs of a public GET's ~31 (docs/BENCHMARKS.md "Access
//! log"). Here a line is written straight into a shared buffer in the same shape (the
//! text line or the JSON object the fmt layer would print), and a thread of its own
//! writes the buffer out: one system call per batch, a line waits at most
//! [`GATHER`]. Nothing is dropped: past [`MAX_PENDING`] bytes a request waits for the
//! writer. The other log lines keep the fmt layer (`init` in main).
//!
//! In the server the request lines skip tracing's dispatch as well
//! ([`AccessLayer::take_lines_directly`]): a line is written from its fields
//! ([`Fields`]) straight into the buffer, the same text, without an event passing the
//! filter and every layer and its fields a visitor (a third of the log's cost:
//! docs/BENCHMARKS.md "Access lines without an event"). Whether the target is wanted is
//! still asked of the filter, once per request (`AccessLog::start`). Elsewhere (a test's
//! subscriber, a library user's) a line is an `access` event as before.

use std::fmt::{Display, Write as _};
use std::net::IpAddr;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, PoisonError};
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
    text: String,
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
    let mut batch = String::new();
    loop {
        let mut pending = shared.lock();
        while pending.text.is_empty() && !pending.closed {
            pending = shared
                .arrived
                .wait(pending)
                .unwrap_or_else(PoisonError::into_inner);
        }
        if pending.text.is_empty() {
            return; // closed, and everything written
        }
        let closing = pending.closed;
        drop(pending);
        if !closing {
            std::thread::sleep(GATHER);
        }
        {
            let mut pending = shared.lock();
            std::mem::swap(&mut batch, &mut pending.text);
        }
        shared.taken.notify_all();
        // Nowhere else to report a failed write of the log itself.
        let _ = out.write_all(batch.as_bytes()).and_then(|()| out.flush());
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

thread_local! {
    /// Where a thread formats its lines before they join the buffer: formatted outside
    /// the buffer's lock (a panic in a field's `Display` cannot leave half a line in
    /// it, nor can a line logged while formatting wait on the lock it holds), without
    /// an allocation per line.
    static LINE: std::cell::RefCell<String> = const { std::cell::RefCell::new(String::new()) };
}

impl Shared {
    /// Appends one line, `write` writing it (without its `\n`); waits while the buffer
    /// is full.
    fn append(&self, write: impl FnOnce(&mut String)) {
        let mut write = Some(write);
        let _ = LINE.try_with(|cell| {
            if let Ok(mut line) = cell.try_borrow_mut()
                && let Some(write) = write.take()
            {
                line.clear();
                write(&mut line);
                self.push(&line);
            }
        });
        // Not written there: a line logged while another is formatted on this thread,
        // or at the thread's exit.
        if let Some(write) = write {
            let mut line = String::new();
            write(&mut line);
            self.push(&line);
        }
    }

    /// Adds `line` and its `\n` to the buffer.
    fn push(&self, line: &str) {
        let mut pending = self.lock();
        while pending.text.len() > MAX_PENDING && !pending.closed {
            pending = self
                .taken
                .wait(pending)
                .unwrap_or_else(PoisonError::into_inner);
        }
        if pending.closed {
            // After the guard (connections cut at shutdown): written here, at once.
            drop(pending);
            let _ =
                std::io::Write::write_all(&mut std::io::stdout(), format!("{line}\n").as_bytes());
            return;
        }
        let was_empty = pending.text.is_empty();
        pending.text.push_str(line);
        pending.text.push('\n');
        drop(pending);
        // Only the first line of a batch wakes the writer (a system call); the others
        // join it while it gathers.
        if was_empty {
            self.arrived.notify_one();
        }
    }
}

/// Where the request lines go when they skip tracing's dispatch (set once, by
/// [`AccessLayer::take_lines_directly`]).
static DIRECT: OnceLock<Direct> = OnceLock::new();

/// The sink of the request lines written without an event.
pub struct Direct {
    format: LogFormat,
    shared: Arc<Shared>,
}

impl Direct {
    /// Writes the line of `fields`: the text the event of the same fields would give.
    pub fn write(&self, fields: &Fields<'_>) {
        let now = humantime::format_rfc3339_micros(SystemTime::now());
        self.shared.append(|line| match self.format {
            LogFormat::Text => {
                let _ = write!(line, "{now}  INFO {TARGET}:");
                fields.write_text(line);
            }
            LogFormat::Json => {
                let _ = write!(
                    line,
                    "{{\"timestamp\":\"{now}\",\"level\":\"INFO\",\"fields\":{{"
                );
                fields.write_json(line);
                let _ = write!(line, "}},\"target\":\"{TARGET}\"}}");
            }
        });
    }
}

/// The sink of the request lines, once the server's layer took them.
pub fn direct() -> Option<&'static Direct> {
    DIRECT.get()
}

impl AccessLayer {
    /// Has request lines written straight to this layer's buffer rather than sent as
    /// events (see the module's documentation). For the process's one access log (its
    /// `main`); the first call wins.
    pub fn take_lines_directly(&self) {
        let _ = DIRECT.set(self.direct());
    }

    fn direct(&self) -> Direct {
        Direct {
            format: self.format,
            shared: self.shared.clone(),
        }
    }
}

/// The fields of one request's line, in the order the line gives them.
#[derive(Clone, Copy)]
pub struct Fields<'a> {
    pub listener: &'a str,
    pub request_id: &'a str,
    pub method: &'a str,
    pub path: &'a str,
    pub status: u16,
    pub bytes_in: u64,
    pub bytes_out: u64,
    pub duration_us: u64,
    pub caller: &'a str,
    /// Left out when `None`, as tracing leaves out an empty field.
    pub key: Option<&'a dyn Display>,
    pub client: IpAddr,
    /// Given only when true.
    pub aborted: bool,
}

impl Fields<'_> {
    /// The `access` event of these fields (where lines are events).
    pub fn emit(&self) {
        tracing::info!(
            target: TARGET,
            listener = %self.listener,
            request_id = %self.request_id,
            method = %self.method,
            path = self.path,
            status = self.status,
            bytes_in = self.bytes_in,
            bytes_out = self.bytes_out,
            duration_us = self.duration_us,
            caller = %self.caller,
            key = self.key.map(tracing::field::display),
            client = %self.client,
            aborted = self.aborted.then_some(true),
        );
    }

    /// As [`TextFields`] writes the event's fields. Written piece by piece rather than
    /// through `format_args!`: on a public GET the formatting machinery was most of
    /// the line's cost.
    fn write_text(&self, line: &mut String) {
        for (name, value) in [
            (" listener=", self.listener),
            (" request_id=", self.request_id),
            (" method=", self.method),
        ] {
            line.push_str(name);
            line.push_str(value);
        }
        line.push_str(" path=");
        debug_str(line, self.path);
        for (name, value) in [
            (" status=", u64::from(self.status)),
            (" bytes_in=", self.bytes_in),
            (" bytes_out=", self.bytes_out),
            (" duration_us=", self.duration_us),
        ] {
            line.push_str(name);
            line.push_str(itoa::Buffer::new().format(value));
        }
        line.push_str(" caller=");
        line.push_str(self.caller);
        if let Some(key) = self.key {
            let _ = write!(line, " key={key}");
        }
        line.push_str(" client=");
        write_ip(line, self.client);
        if self.aborted {
            line.push_str(" aborted=true");
        }
    }

    /// As [`JsonFields`] writes the event's fields.
    fn write_json(&self, line: &mut String) {
        for (name, value) in [
            ("\"listener\":", self.listener),
            (",\"request_id\":", self.request_id),
            (",\"method\":", self.method),
            (",\"path\":", self.path),
        ] {
            line.push_str(name);
            json_string(line, value);
        }
        for (name, value) in [
            (",\"status\":", u64::from(self.status)),
            (",\"bytes_in\":", self.bytes_in),
            (",\"bytes_out\":", self.bytes_out),
            (",\"duration_us\":", self.duration_us),
        ] {
            line.push_str(name);
            line.push_str(itoa::Buffer::new().format(value));
        }
        line.push_str(",\"caller\":");
        json_string(line, self.caller);
        if let Some(key) = self.key {
            line.push_str(",\"key\":\"");
            let _ = write!(JsonEscaped(line), "{key}");
            line.push('"');
        }
        line.push_str(",\"client\":\"");
        write_ip(line, self.client); // digits, dots and colons: nothing to escape
        line.push('"');
        if self.aborted {
            line.push_str(",\"aborted\":true");
        }
    }
}

/// `text` as `{:?}` writes it: quoted, escaped. Printable ASCII without quotes and
/// backslashes (every ordinary path) is the text itself between quotes.
fn debug_str(line: &mut String, text: &str) {
    if text
        .bytes()
        .all(|b| (0x20..0x7f).contains(&b) && b != b'"' && b != b'\\')
    {
        line.push('"');
        line.push_str(text);
        line.push('"');
    } else {
        let _ = write!(line, "{text:?}");
    }
}

/// `ip` as it displays (an IPv4 address octet by octet, without the formatter).
fn write_ip(line: &mut String, ip: IpAddr) {
    match ip {
        IpAddr::V4(v4) => {
            for (i, octet) in v4.octets().into_iter().enumerate() {
                if i > 0 {
                    line.push('.');
                }
                line.push_str(itoa::Buffer::new().format(octet));
            }
        }
        IpAddr::V6(v6) => {
            let _ = write!(line, "{v6}");
        }
    }
}

impl<S: Subscriber> Layer<S> for AccessLayer {
    fn on_event(&self, event: &Event<'_>, _: Context<'_, S>) {
        if event.metadata().target() != TARGET {
            return;
        }
        let now = humantime::format_rfc3339_micros(SystemTime::now());
        let level = event.metadata().level();
        self.shared.append(|line| match self.format {
            LogFormat::Text => {
                let _ = write!(line, "{now} {level:>5} {TARGET}:");
                event.record(&mut TextFields(line));
            }
            LogFormat::Json => {
                let _ = write!(
                    line,
                    "{{\"timestamp\":\"{now}\",\"level\":\"{level}\",\"fields\":{{"
                );
                let mut fields = JsonFields { line, first: true };
                event.record(&mut fields);
                let _ = write!(line, "}},\"target\":\"{TARGET}\"}}");
            }
        });
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
        self.line.push('"');
        let _ = write!(JsonEscaped(self.line), "{value:?}");
        self.line.push('"');
    }
}

/// `text` as a JSON string (quotes, backslashes and control characters escaped).
fn json_string(line: &mut String, text: &str) {
    line.push('"');
    let _ = JsonEscaped(line).write_str(text);
    line.push('"');
}

/// Writes what it is given into a JSON string's inside, escaped (so any `Display`
/// value is written without a copy of its text first).
struct JsonEscaped<'a>(&'a mut String);

impl std::fmt::Write for JsonEscaped<'_> {
    fn write_str(&mut self, text: &str) -> std::fmt::Result {
        let line = &mut *self.0;
        if !text.bytes().any(|b| b < 0x20 || b == b'"' || b == b'\\') {
            line.push_str(text);
            return Ok(());
        }
        for c in text.chars() {
            match c {
                '"' => line.push_str("\\\""),
                '\\' => line.push_str("\\\\"),
                '\n' => line.push_str("\\n"),
                '\r' => line.push_str("\\r"),
                '\t' => line.push_str("\\t"),
                c if u32::from(c) < 0x20 => {
                    write!(line, "\\u{:04x}", u32::from(c))?;
                }
                c => line.push(c),
            }
        }
        Ok(())
    }
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

    /// What [`Direct`] writes for `fields` and what this layer writes for their event.
    fn direct_and_event(format: LogFormat, fields: &Fields<'_>) -> (String, String) {
        let text = |c: Captured| String::from_utf8(c.0.lock().unwrap().clone()).unwrap();
        let direct = Captured::default();
        let (sink, guard) = layer(format, direct.clone()).unwrap();
        sink.direct().write(fields);
        drop(guard);
        let event = Captured::default();
        let (sink, guard) = layer(format, event.clone()).unwrap();
        tracing::subscriber::with_default(tracing_subscriber::registry().with(sink), || {
            fields.emit()
        });
        drop(guard);
        (text(direct), text(event))
    }

    #[test]
    fn direct_lines_are_the_events_lines() {
        let key = homeserver_protocol::Keypair::random().public_key();
        let base = Fields {
            listener: "http",
            request_id: "0b6f5c2e-7d1c-4f43-9a57-2b1d7e0c9a11",
            method: "GET",
            path: "/pub/a \"b\"\n\\c\u{1}é?limit=5",
            status: 200,
            bytes_in: 0,
            bytes_out: 1024,
            duration_us: 87,
            caller: "anonymous",
            key: None,
            client: IpAddr::from([127, 0, 0, 1]),
            aborted: false,
        };
        let plain = Fields {
            path: "/pub/posts/0001.json",
            client: IpAddr::from([192, 168, 100, 255]),
            duration_us: 0,
            ..base
        };
        let signed = Fields {
            caller: "key",
            key: Some(&key),
            client: "2001:db8::7".parse().unwrap(),
            aborted: true,
            status: 500,
            ..base
        };
        for fields in [&base, &plain, &signed] {
            let (direct, event) = direct_and_event(LogFormat::Text, fields);
            assert_eq!(direct.lines().count(), 1, "{direct}");
            // After the timestamp (27 characters).
            assert_eq!(direct[27..], event[27..]);

            let (direct, event) = direct_and_event(LogFormat::Json, fields);
            let parse = |s: &str| -> serde_json::Value { serde_json::from_str(s.trim()).unwrap() };
            let (mut direct, mut event) = (parse(&direct), parse(&event));
            for v in [&mut direct, &mut event] {
                assert!(v["timestamp"].is_string());
                v["timestamp"] = serde_json::Value::Null;
            }
            assert_eq!(direct, event);
        }
        // And the event's line is the fmt layer's (the tests above), field by field.
        let (direct, _) = direct_and_event(LogFormat::Text, &signed);
        assert!(
            direct.contains(&format!(
                " caller=key key={key} client=2001:db8::7 aborted=true"
            )),
            "{direct}"
        );
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
