//! The event commands: `pk stream` (per-user Server-Sent Events, optionally live) and
//! `pk events` (the JSON feed of every user). Both print one line per event; a streamed
//! line is flushed as soon as its event arrives, so `pk stream --live` can be piped.
//! Neither needs a key; when one is configured the requests are signed, so they count
//! against the key's rate limit instead of the IP address's smaller anonymous one.

use std::io::Write;

use futures_util::StreamExt;
use homeserver_protocol::query::DEFAULT_FEED_LIMIT;
use pk_client::{Event, StreamRequest};

use super::args::{EventsArgs, StreamArgs, UserRef};
use super::{CliError, Context};

/// `pk stream USER[:CURSOR]... [--live] [--reverse] [--limit N] [--path P] [--cursor N]
/// [--json]`.
pub async fn stream(ctx: &Context, args: StreamArgs) -> Result<(), CliError> {
    let mut request = StreamRequest {
        users: Vec::with_capacity(args.users.len()),
        live: args.live,
        reverse: args.reverse,
        limit: args.limit,
        path: args.path,
    };
    let mut me = None;
    for user in args.users {
        let key = match user.user {
            UserRef::Key(key) => key,
            UserRef::Me => match me {
                Some(key) => key,
                None => *me.insert(ctx.keypair()?.public_key()),
            },
        };
        request.users.push((key, user.cursor.or(args.cursor)));
    }
    let mut events = ctx.optionally_signing_client()?.stream(request).await?;
    while let Some(event) = events.next().await {
        print_lines(&[event?], ctx.json)?;
    }
    Ok(())
}

/// `pk events [--cursor N] [--limit N] [--all] [--json]`.
pub async fn events(ctx: &Context, args: EventsArgs) -> Result<(), CliError> {
    let client = ctx.optionally_signing_client()?;
    let mut cursor = args.cursor;
    loop {
        let page = client.events(cursor, args.limit).await?;
        if page.events.is_empty() {
            return Ok(());
        }
        print_lines(&page.events, ctx.json)?;
        // A server that does not move forward would make --all loop for ever.
        if page.cursor <= cursor {
            return Err(pk_client::ClientError::InvalidResponse(format!(
                "the feed cursor did not advance past {cursor}"
            ))
            .into());
        }
        cursor = page.cursor;
        if !args.all {
            let full = page.events.len() >= args.limit.unwrap_or(DEFAULT_FEED_LIMIT) as usize;
            if full {
                eprintln!("next cursor: {cursor}");
            }
            return Ok(());
        }
    }
}

/// Writes the events' lines and flushes them.
fn print_lines(events: &[Event], json: bool) -> Result<(), CliError> {
    let mut text = String::new();
    for event in events {
        text.push_str(&event_line(event, json)?);
        text.push('\n');
    }
    let mut stdout = std::io::stdout().lock();
    stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
        .map_err(|e| CliError::io("cannot write the events", e))
}

/// `CURSOR KIND URL[ CONTENT_HASH]`, or the event as one line of JSON.
fn event_line(event: &Event, json: bool) -> Result<String, CliError> {
    if json {
        return serde_json::to_string(event)
            .map_err(|e| CliError::io("cannot write the events", std::io::Error::other(e)));
    }
    let mut line = format!("{} {} {}", event.cursor, event.kind, event.url);
    if let Some(hash) = &event.content_hash {
        line.push(' ');
        line.push_str(hash);
    }
    Ok(line)
}

#[cfg(test)]
mod tests {
    use pk_client::EventKind;

    use super::*;

    #[test]
    fn line_formats() {
        let put = Event {
            kind: EventKind::Put,
            url: "pk://abc/pub/x".into(),
            cursor: 12,
            content_hash: Some("q83vEjRWeJA=".into()),
        };
        assert_eq!(
            event_line(&put, false).unwrap(),
            "12 PUT pk://abc/pub/x q83vEjRWeJA="
        );
        let del = Event {
            kind: EventKind::Del,
            content_hash: None,
            ..put.clone()
        };
        assert_eq!(event_line(&del, false).unwrap(), "12 DEL pk://abc/pub/x");
        let json: serde_json::Value =
            serde_json::from_str(&event_line(&put, true).unwrap()).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"type": "PUT", "url": "pk://abc/pub/x", "cursor": 12,
                               "content_hash": "q83vEjRWeJA="})
        );
        assert_eq!(
            event_line(&del, true).unwrap(),
            r#"{"type":"DEL","url":"pk://abc/pub/x","cursor":12}"#
        );
    }
}
