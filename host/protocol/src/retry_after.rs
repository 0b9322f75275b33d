//! The `Retry-After` header (RFC 9110 §10.2.3), read one way by the client library and the
//! bot's providers: delta-seconds (`120`) or an HTTP date (`Fri, 31 Dec 1999 23:59:59
//! GMT`), the latter as the time left until then (zero when it has passed).

use std::time::{Duration, SystemTime};

/// How long `value` asks to wait, counted from `now`; `None` when it is neither form.
pub fn parse_retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let value = value.trim();
    if let Ok(secs) = value.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_forms_are_read() {
        let now = httpdate::parse_http_date("Sun, 06 Nov 1994 08:49:37 GMT").unwrap();
        let wait = |v| parse_retry_after(v, now);
        assert_eq!(wait("120"), Some(Duration::from_secs(120)));
        assert_eq!(wait(" 0 "), Some(Duration::ZERO));
        assert_eq!(
            wait("Sun, 06 Nov 1994 08:50:07 GMT"),
            Some(Duration::from_secs(30))
        );
        assert_eq!(wait("Sun, 06 Nov 1994 08:00:00 GMT"), Some(Duration::ZERO));
        for bad in ["", "-1", "1.5", "soon", "Sun, 06 Nov 1994"] {
            assert_eq!(wait(bad), None, "{bad}");
        }
    }
}
