//! The wall clock, read one way by every crate: time since the Unix epoch (zero for a
//! clock set before 1970, the largest value past what the type holds).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Time since the Unix epoch.
pub fn since_epoch() -> Duration {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or(Duration::ZERO)
}

/// Whole seconds since the Unix epoch.
pub fn unix_secs() -> u64 {
    since_epoch().as_secs()
}

/// Whole seconds since the Unix epoch, as the stores keep times.
pub fn unix_secs_i64() -> i64 {
    i64::try_from(unix_secs()).unwrap_or(i64::MAX)
}

/// Milliseconds since the Unix epoch.
pub fn unix_millis() -> i64 {
    i64::try_from(since_epoch().as_millis()).unwrap_or(i64::MAX)
}

/// Microseconds since the Unix epoch.
pub fn unix_micros() -> i64 {
    i64::try_from(since_epoch().as_micros()).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_units_agree() {
        let secs = unix_secs_i64();
        let millis = unix_millis();
        let micros = unix_micros();
        assert!(secs > 1_700_000_000);
        assert!((millis / 1000 - secs).abs() <= 1);
        assert!((micros / 1_000_000 - secs).abs() <= 1);
        assert_eq!(i64::try_from(unix_secs()).unwrap() / 10, secs / 10);
    }
}
