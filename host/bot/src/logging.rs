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
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_are_rfc3339_utc_with_millis() {
        let now = rfc3339_now();
        assert_eq!(now.len(), "2025-11-26T10:00:00.000Z".len(), "{now}");
        assert!(now.ends_with('Z') && now.as_bytes()[10] == b'T', "{now}");
        assert!(chrono::DateTime::parse_from_rfc3339(&now).is_ok(), "{now}");
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
