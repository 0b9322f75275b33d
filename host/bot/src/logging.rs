//! Structured logs as the spec writes them: one JSON object a line with `timestamp`
//! (RFC 3339, UTC), `level` (`error`, `warn`, `info`, `debug`), `message`, and the
//! event's context fields at the top level (`mentionId`, `actionType`, `durationMs`,
//! `aiProvider`, `tokensUsed`, ...). `format = "text"` gives tracing's usual lines.

use std::fmt;

use serde_json::{Map, Value};
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

use crate::config::LogFormat;

/// Installs the global subscriber (filter from RUST_LOG, default `info`).
pub fn init(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
    match format {
        LogFormat::Json => builder.event_format(SpecJson).init(),
        LogFormat::Text => builder.init(),
    }
}

/// The spec's JSON line.
pub struct SpecJson;

struct Fields(Map<String, Value>);

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.0
            .insert(field.name().to_owned(), Value::String(format!("{value:?}")));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0
            .insert(field.name().to_owned(), Value::String(value.to_owned()));
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.0.insert(field.name().to_owned(), value.into());
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.0.insert(field.name().to_owned(), value.into());
    }
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.0.insert(field.name().to_owned(), value.into());
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.0.insert(field.name().to_owned(), value.into());
    }
}

/// The spec's level names.
pub fn level_name(level: &Level) -> &'static str {
    match *level {
        Level::ERROR => "error",
        Level::WARN => "warn",
        Level::INFO => "info",
        // The spec has no trace level: finer lines count as debug.
        _ => "debug",
    }
}

/// The JSON object of one event (without the time, which `format_event` adds).
pub fn event_object(event: &Event<'_>) -> Map<String, Value> {
    let mut fields = Fields(Map::new());
    event.record(&mut fields);
    let mut object = Map::new();
    object.insert("level".into(), level_name(event.metadata().level()).into());
    object.insert(
        "message".into(),
        fields
            .0
            .remove("message")
            .unwrap_or(Value::String(String::new())),
    );
    object.insert("target".into(), event.metadata().target().into());
    object.extend(fields.0);
    object
}

impl<S, N> FormatEvent<S, N> for SpecJson
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        _ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let mut object = Map::new();
        object.insert("timestamp".into(), Value::String(rfc3339_now()));
        object.extend(event_object(event));
        writeln!(writer, "{}", Value::Object(object))
    }
}

/// Now as `YYYY-MM-DDTHH:MM:SS.mmmZ`.
fn rfc3339_now() -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let secs = now.as_secs();
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (y, m, d) = civil_from_days(days as i64);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        now.subsec_millis()
    )
}

/// Days since 1970-01-01 to (year, month, day), proleptic Gregorian (Howard Hinnant's
/// algorithm).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_are_civil() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(20_418), (2025, 11, 26));
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
    }

    #[test]
    fn lines_carry_the_spec_fields() {
        let sink = hs_testkit::CapturedLog::default();
        let writer = sink.clone();
        let subscriber = tracing_subscriber::fmt()
            .event_format(SpecJson)
            .with_writer(move || writer.clone())
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            tracing::warn!(
                mentionId = "a:b",
                actionType = "summary",
                durationMs = 12u64,
                "action done"
            );
        });
        let text = sink.text();
        let line: Value = serde_json::from_str(text.trim()).unwrap();
        assert_eq!(line["level"], "warn");
        assert_eq!(line["message"], "action done");
        assert_eq!(line["mentionId"], "a:b");
        assert_eq!(line["actionType"], "summary");
        assert_eq!(line["durationMs"], 12);
        assert!(line["timestamp"].as_str().unwrap().ends_with('Z'));
    }
}
