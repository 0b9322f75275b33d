//! Reading `/events-stream`: an incremental Server-Sent Events parser and the few fields
//! of an event the fan-out benchmark needs.
//!
//! A body arrives in frames cut anywhere (mid-line, mid-field, between `\r` and `\n`), so
//! [`SseParser`] keeps the unfinished line between calls and hands over each complete
//! event as its name and its `data` lines joined by `\n` (the form
//! `homeserver_protocol::event::Event::from_sse` takes). Comments (`:` lines, the
//! server's keep-alives) are skipped; `id` and `retry` are not needed here. Its buffers
//! are reused, so a long stream allocates nothing per event.
//!
//! [`parse_delivery`] then takes only the resource URL (first data line) and the
//! `cursor: N` line: ten thousand subscribers parse millions of events on the cores the
//! server also uses, so the client does no more than that.

use homeserver_protocol::event::RESOURCE_SCHEME;

/// Longest line, and longest `data` of one event, kept: an event with a longer one is
/// dropped (so a broken stream cannot make the client buffer without bound).
const MAX_LINE_BYTES: usize = 64 * 1024;

/// Incremental SSE parser (the event-stream format of the HTML standard, without
/// `retry` and `id` handling).
#[derive(Debug, Default)]
pub struct SseParser {
    /// The unfinished line carried over from the previous chunk.
    line: Vec<u8>,
    /// The previous chunk ended with `\r`: a `\n` starting the next one is part of it.
    after_cr: bool,
    /// A line longer than [`MAX_LINE_BYTES`] is being skipped.
    overlong: bool,
    event: Vec<u8>,
    data: Vec<u8>,
    has_data: bool,
    /// The current event lost a line (too long): it is dropped when dispatched.
    damaged: bool,
}

impl SseParser {
    pub fn new() -> Self {
        Self::default()
    }

    /// Parses one chunk of the body; calls `on_event(name, data)` for every event it
    /// completes (`name` is `message` when the event has no `event:` field).
    pub fn feed(&mut self, mut chunk: &[u8], mut on_event: impl FnMut(&str, &str)) {
        if self.after_cr {
            self.after_cr = false;
            if let Some(rest) = chunk.strip_prefix(b"\n") {
                chunk = rest;
            }
        }
        while let Some(end) = chunk.iter().position(|b| *b == b'\n' || *b == b'\r') {
            let (line, rest) = chunk.split_at(end);
            let rest = match rest {
                [b'\r', b'\n', tail @ ..] => tail,
                [b'\r'] => {
                    self.after_cr = true;
                    &[]
                }
                [_, tail @ ..] => tail,
                [] => &[],
            };
            if self.line.is_empty() && !self.overlong {
                self.line_done(line, &mut on_event);
            } else {
                self.push_partial(line);
                let whole = std::mem::take(&mut self.line);
                let overlong = std::mem::replace(&mut self.overlong, false);
                if overlong {
                    self.damaged = true;
                } else {
                    self.line_done(&whole, &mut on_event);
                }
                // Keep the allocation for the next partial line.
                self.line = whole;
                self.line.clear();
            }
            chunk = rest;
        }
        self.push_partial(chunk);
    }

    fn push_partial(&mut self, bytes: &[u8]) {
        if self.overlong || bytes.is_empty() {
            return;
        }
        if self.line.len() + bytes.len() > MAX_LINE_BYTES {
            self.overlong = true;
            self.line.clear();
        } else {
            self.line.extend_from_slice(bytes);
        }
    }

    fn line_done(&mut self, line: &[u8], on_event: &mut impl FnMut(&str, &str)) {
        if line.is_empty() {
            self.dispatch(on_event);
            return;
        }
        if line[0] == b':' {
            return; // comment (keep-alive)
        }
        if line.len() > MAX_LINE_BYTES {
            self.damaged = true;
            return;
        }
        let (field, value) = match line.iter().position(|b| *b == b':') {
            Some(colon) => {
                let value = &line[colon + 1..];
                (&line[..colon], value.strip_prefix(b" ").unwrap_or(value))
            }
            None => (line, &[][..]),
        };
        match field {
            b"event" => {
                self.event.clear();
                self.event.extend_from_slice(value);
            }
            b"data" => {
                if self.data.len() + value.len() >= MAX_LINE_BYTES {
                    self.damaged = true;
                    return;
                }
                if self.has_data {
                    self.data.push(b'\n');
                }
                self.data.extend_from_slice(value);
                self.has_data = true;
            }
            _ => {} // id, retry, unknown fields
        }
    }

    fn dispatch(&mut self, on_event: &mut impl FnMut(&str, &str)) {
        if self.has_data && !self.damaged {
            let name = match std::str::from_utf8(&self.event) {
                Ok("") => "message",
                Ok(name) => name,
                Err(_) => "",
            };
            // Not UTF-8: hand over what there is; the caller will not recognise it.
            let data = String::from_utf8_lossy(&self.data);
            on_event(name, &data);
        }
        self.event.clear();
        self.data.clear();
        self.has_data = false;
        self.damaged = false;
    }
}

/// The fields of an event the benchmark checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Delivery<'a> {
    /// The z32 key of the user the event belongs to.
    pub user: &'a str,
    /// The path, without its leading `/` (as in the URL: `pub/...`).
    pub path: &'a str,
    pub cursor: u64,
}

/// Reads the URL (`pk://<user>/<path>`, the first line) and the `cursor: N` line of an
/// event's data; `None` when either is missing or malformed.
pub fn parse_delivery(data: &str) -> Option<Delivery<'_>> {
    let mut lines = data.split('\n');
    let url = lines.next()?.strip_prefix(RESOURCE_SCHEME)?;
    let (user, path) = url.split_once('/')?;
    let cursor = lines
        .find_map(|line| line.strip_prefix("cursor: "))?
        .parse()
        .ok()?;
    Some(Delivery { user, path, cursor })
}

#[cfg(test)]
mod tests {
    use homeserver_protocol::event::{Event, EventKind, encode_content_hash, resource_url};

    use super::*;

    /// Every event of `input`, fed in one piece.
    fn events(input: &[u8]) -> Vec<(String, String)> {
        let mut out = Vec::new();
        SseParser::new().feed(input, |n, d| out.push((n.to_owned(), d.to_owned())));
        out
    }

    /// Like `events`, feeding the input cut at every split point in `cuts`.
    fn events_in_pieces(input: &[u8], cuts: &[usize]) -> Vec<(String, String)> {
        let mut out = Vec::new();
        let mut parser = SseParser::new();
        let mut from = 0;
        for &cut in cuts.iter().chain(std::iter::once(&input.len())) {
            parser.feed(&input[from..cut], |n, d| {
                out.push((n.to_owned(), d.to_owned()))
            });
            from = cut;
        }
        out
    }

    fn put_event(cursor: u64) -> Event {
        Event {
            kind: EventKind::Put,
            url: resource_url(
                "o1ke7cn9ozy7d9fw5kuncfy6q4mgfyqqa3ztgy1s8wdaftdtcj5o",
                "/pub/a/w7",
            ),
            cursor,
            content_hash: Some(encode_content_hash(&[9; 32])),
        }
    }

    /// The bytes the server writes for an event (axum's `Event`: one `data:` line per
    /// line of the data, a blank line at the end).
    fn wire(e: &Event) -> String {
        let mut s = format!("event: {}\nid: {}\n", e.kind, e.cursor);
        for line in e.sse_data().lines() {
            s.push_str(&format!("data: {line}\n"));
        }
        s.push('\n');
        s
    }

    #[test]
    fn parses_the_servers_events_and_skips_keep_alives() {
        let (a, b) = (put_event(41), put_event(42));
        let input = format!(":\n\n{}: keep-alive\n\n{}", wire(&a), wire(&b));
        let got = events(input.as_bytes());
        assert_eq!(got.len(), 2);
        for ((name, data), expected) in got.iter().zip([&a, &b]) {
            assert_eq!(name, "PUT");
            // The same text the protocol crate parses.
            assert_eq!(&Event::from_sse(name, data).unwrap(), expected);
            assert_eq!(
                parse_delivery(data),
                Some(Delivery {
                    user: "o1ke7cn9ozy7d9fw5kuncfy6q4mgfyqqa3ztgy1s8wdaftdtcj5o",
                    path: "pub/a/w7",
                    cursor: expected.cursor,
                })
            );
        }
    }

    #[test]
    fn any_split_gives_the_same_events() {
        let input = format!("{}:\n\n{}", wire(&put_event(1)), wire(&put_event(2))).replace(
            "id: 2\n",
            "id: 2\r\n", // a CRLF line too, so a cut can fall between \r and \n
        );
        let whole = events(input.as_bytes());
        assert_eq!(whole.len(), 2);
        for cut in 0..=input.len() {
            assert_eq!(
                events_in_pieces(input.as_bytes(), &[cut]),
                whole,
                "cut {cut}"
            );
        }
        let every_byte: Vec<usize> = (1..input.len()).collect();
        assert_eq!(events_in_pieces(input.as_bytes(), &every_byte), whole);
    }

    #[test]
    fn follows_the_sse_line_rules() {
        // CR, LF and CRLF line ends; no space after the colon; a field without a colon;
        // no `event` field (name `message`); events without data are not dispatched.
        let input = b"event: PUT\rdata:a\r\ndata: b\n\nevent: x\n\ndata\n\ndata: z\n\n";
        assert_eq!(
            events(input),
            vec![
                ("PUT".into(), "a\nb".into()),
                ("message".into(), String::new()),
                ("message".into(), "z".into()),
            ]
        );
        // An unfinished event is not dispatched.
        assert!(events(b"event: PUT\ndata: a\n").is_empty());
    }

    #[test]
    fn an_overlong_line_drops_its_event_only() {
        let long = "x".repeat(MAX_LINE_BYTES + 10);
        let input = format!("data: {long}\n\ndata: ok\n\n");
        let bytes = input.as_bytes();
        let expected = vec![("message".to_owned(), "ok".to_owned())];
        assert_eq!(events(bytes), expected);
        assert_eq!(
            events_in_pieces(bytes, &[10, 40_000, 65_550, 65_553]),
            expected
        );
    }

    #[test]
    fn delivery_needs_a_url_and_a_cursor() {
        assert_eq!(
            parse_delivery("pk://u/pub/x\ncursor: 5"),
            Some(Delivery {
                user: "u",
                path: "pub/x",
                cursor: 5
            })
        );
        assert_eq!(parse_delivery("pk://u/pub/x"), None);
        assert_eq!(parse_delivery("pk://u/pub/x\ncursor: -1"), None);
        assert_eq!(parse_delivery("http://u/pub/x\ncursor: 5"), None);
        assert_eq!(parse_delivery("pk://u\ncursor: 5"), None);
        assert_eq!(parse_delivery(""), None);
    }
}
