//! What `pk` writes: JSON or text on standard output, sizes and times for people,
//! progress bars (only on a terminal), and the check that keeps binary values off a
//! terminal.

use std::io::Write;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};
use pk_client::Progress;
use serde::Serialize;

use super::CliError;

/// Values at least this large get a progress bar (on a terminal).
pub const PROGRESS_MIN_BYTES: u64 = 1024 * 1024;

/// How much of a value is looked at to decide whether it is text.
pub const TEXT_SNIFF_BYTES: usize = 8 * 1024;

/// Writes `text` to standard output and flushes it.
pub fn print(text: &str) -> Result<(), CliError> {
    let mut stdout = std::io::stdout().lock();
    stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
        .map_err(|e| CliError::io("cannot write to standard output", e))
}

/// One JSON value on one line of standard output.
pub fn print_json(value: &impl Serialize) -> Result<(), CliError> {
    let mut line = serde_json::to_string(value)
        .map_err(|e| CliError::io("cannot write to standard output", std::io::Error::other(e)))?;
    line.push('\n');
    print(&line)
}

/// `1536` → `1.5 KiB`; bytes below 1 KiB stay exact.
pub fn human_size(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

/// Unix seconds as `YYYY-MM-DD HH:MM:SS` (UTC); a time no calendar can show (a server's
/// wild value) as `@SECONDS`.
pub fn utc_time(unix: i64) -> String {
    chrono::DateTime::from_timestamp(unix, 0).map_or_else(
        || format!("@{unix}"),
        |t| t.format("%Y-%m-%d %H:%M:%S").to_string(),
    )
}

/// Whether the start of a value looks like text a terminal can show: valid UTF-8 (a
/// character cut off at the end of the sample is fine) without NUL or other control
/// characters except tab, newline, carriage return, form feed and escape.
pub fn looks_like_text(sample: &[u8], complete: bool) -> bool {
    let text = match std::str::from_utf8(sample) {
        Ok(text) => text,
        // Cut off in the middle of a character by the sample's end.
        Err(e) if !complete && e.error_len().is_none() => {
            match sample.get(..e.valid_up_to()).map(std::str::from_utf8) {
                Some(Ok(text)) => text,
                _ => return false,
            }
        }
        Err(_) => return false,
    };
    !text
        .chars()
        .any(|c| c.is_control() && !matches!(c, '\t' | '\n' | '\r' | '\x0c' | '\x1b'))
}

/// Progress bars for transfers, when they are wanted (standard error is a terminal,
/// not turned off, not JSON output).
#[derive(Debug, Clone, Copy)]
pub struct Bars {
    pub enabled: bool,
}

impl Bars {
    /// A bar for a transfer of `len` bytes named `label`, when it is large enough.
    pub fn for_transfer(&self, label: &str, len: Option<u64>) -> Option<ProgressBar> {
        let len = len.filter(|&l| self.enabled && l >= PROGRESS_MIN_BYTES)?;
        let bar = ProgressBar::new(len);
        if let Ok(style) = ProgressStyle::with_template(
            "{msg} {wide_bar} {bytes}/{total_bytes} {bytes_per_sec} {eta}",
        ) {
            bar.set_style(style);
        }
        bar.set_message(label.to_owned());
        bar.enable_steady_tick(Duration::from_millis(200));
        Some(bar)
    }
}

/// The client-side progress callback that moves `bar`.
pub fn progress_of(bar: &Option<ProgressBar>) -> Option<Progress> {
    let bar = bar.clone()?;
    Some(std::sync::Arc::new(move |done: u64| bar.set_position(done)))
}

/// Removes a finished bar from the screen.
pub fn finish(bar: Option<ProgressBar>) {
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_for_people() {
        assert_eq!(human_size(0), "0 B");
        assert_eq!(human_size(1023), "1023 B");
        assert_eq!(human_size(1024), "1.0 KiB");
        assert_eq!(human_size(1536), "1.5 KiB");
        assert_eq!(human_size(100 * 1024 * 1024), "100.0 MiB");
        assert_eq!(human_size(u64::MAX), "16.0 EiB");
    }

    #[test]
    fn utc_times() {
        assert_eq!(utc_time(0), "1970-01-01 00:00:00");
        assert_eq!(utc_time(1_700_000_000), "2023-11-14 22:13:20");
        assert_eq!(utc_time(951_782_400), "2000-02-29 00:00:00");
        assert_eq!(utc_time(-1), "1969-12-31 23:59:59");
        assert_eq!(utc_time(i64::MAX), format!("@{}", i64::MAX));
        // Checked against httpdate, which formats the same instant independently.
        for t in [1_234_567_890i64, 4_102_444_799, 1_583_020_800] {
            let http =
                httpdate::fmt_http_date(std::time::UNIX_EPOCH + Duration::from_secs(t as u64));
            let ours = utc_time(t);
            let time = &ours[11..];
            assert!(http.contains(time), "{http} vs {ours}");
            assert!(http.contains(&ours[..4]), "{http} vs {ours}");
        }
    }

    #[test]
    fn text_or_binary() {
        assert!(looks_like_text(b"hello world\n", true));
        assert!(looks_like_text(
            "grüße\tund \x1b[1mfett\x1b[0m\r\n".as_bytes(),
            true
        ));
        assert!(looks_like_text(b"", true));
        assert!(!looks_like_text(b"PK\x03\x04\x00\x00", true));
        assert!(!looks_like_text(b"\xff\xd8\xff\xe0 jpeg", true));
        assert!(!looks_like_text(b"bell\x07", true));
        // A multi-byte character cut by the sample's end is still text...
        let cut = &"aé".as_bytes()[..2];
        assert!(looks_like_text(cut, false));
        // ...but not when that is the whole value.
        assert!(!looks_like_text(cut, true));
    }
}
