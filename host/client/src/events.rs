//! Events: the feed of every user's changes (`GET /events/`, JSON pages) and per-user
//! event streams (`GET /events-stream`, Server-Sent Events).
//!
//! The wire format is the protocol's [`Event`]: a feed page is an [`EventPage`], and
//! every SSE event is turned into an [`Event`] by [`Event::from_sse`]. SSE framing
//! (fields, comment lines used as keep-alives, line endings, events split across
//! chunks) is left to the `eventsource-stream` crate. Neither endpoint needs
//! credentials and no key is required; a client that has a key signs its requests
//! anyway, so they count against the key's rate limit rather than its IP address's
//! (the anonymous limit is the smaller one).
//!
//! A stream ends after its first error: a transport failure, a malformed event, or the
//! server's final `error` event ([`ClientError::StreamFailed`]). Resume with
//! [`StreamRequest::user_after`] from the last cursor received.

use std::future::ready;

use eventsource_stream::{EventStreamError, Eventsource};
use futures_util::{Stream, StreamExt};
use homeserver_protocol::event::{Event, EventPage};
use homeserver_protocol::query::FeedQuery;
use reqwest::Method;
use reqwest::header::{ACCEPT, CONTENT_TYPE};

use crate::client::{PkClient, json};
use crate::error::ClientError;
use crate::target::RequestTarget;

/// Path of the JSON feed of every user's events.
pub const FEED_PATH: &str = "/events/";

/// Path of the per-user event stream.
pub const STREAM_PATH: &str = "/events-stream";

/// Name of the SSE event a server sends when a stream fails after it has started.
pub const ERROR_EVENT: &str = "error";

/// Media type of an SSE answer.
const EVENT_STREAM: &str = "text/event-stream";

/// What `GET /events-stream` should deliver: the protocol's [`StreamQuery`] (users
/// with optional cursors, `live`, `reverse`, `limit`, `path`; built with `new`, `user`,
/// `user_after`, ...). Its path filter is checked before sending; the other rules are
/// the server's, so its message is what is shown.
///
/// ```
/// # use pk_client::{Keypair, StreamRequest};
/// let (alice, bob) = (Keypair::random().public_key(), Keypair::random().public_key());
/// let request = StreamRequest::new()
///     .user(alice)
///     .user_after(bob, 42)
///     .path("/pub/app/")
///     .live(true);
/// assert_eq!(request.users.len(), 2);
/// ```
///
/// [`StreamQuery`]: homeserver_protocol::query::StreamQuery
pub use homeserver_protocol::query::StreamQuery as StreamRequest;

/// Query of `GET /events/`.
pub fn feed_query(cursor: u64, limit: Option<u32>) -> String {
    FeedQuery { cursor, limit }.to_query()
}

impl PkClient {
    /// `GET /events/?cursor=N[&limit=L]`: up to `limit` events of all users with a cursor
    /// greater than `cursor`, oldest first (the server's default page size is 100, its
    /// maximum 1000). Page on with the returned [`EventPage::cursor`]; an empty page means
    /// the end of the history so far.
    pub async fn events(&self, cursor: u64, limit: Option<u32>) -> Result<EventPage, ClientError> {
        let query = feed_query(cursor, limit);
        let target = RequestTarget::new(self.base_url(), FEED_PATH, Some(&query));
        let auth = self.optional_signature();
        json(self.send(Method::GET, &target, auth, None, &[]).await?).await
    }

    /// `GET /events-stream`: the events `request` asks for, as they arrive.
    ///
    /// A refused request (a bad key, a limit out of range, live with reverse, …) fails
    /// here with [`ClientError::Api`] before any event. The stream then yields events
    /// until the server closes it (the history is complete, or the limit is reached) or
    /// the first error, which is its last item. A live stream stays open until dropped;
    /// the client sets no overall timeout on it (unless one was configured on the HTTP
    /// client given to [`PkClient::with_http_client`]).
    pub async fn stream(
        &self,
        request: StreamRequest,
    ) -> Result<impl Stream<Item = Result<Event, ClientError>> + Send + Unpin + 'static, ClientError>
    {
        let query = request.to_query()?;
        let target = RequestTarget::new(self.base_url(), STREAM_PATH, Some(&query));
        let auth = self.optional_signature();
        let accept = [(ACCEPT, EVENT_STREAM.to_owned())];
        let response = self.send(Method::GET, &target, auth, None, &accept).await?;
        let content_type = response
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default();
        if !content_type.to_ascii_lowercase().starts_with(EVENT_STREAM) {
            return Err(ClientError::InvalidResponse(format!(
                "expected {EVENT_STREAM}, got content type {content_type:?}"
            )));
        }
        Ok(parse_sse(response.bytes_stream()))
    }
}

/// Turns the bytes of an `/events-stream` body into events; the stream ends after its
/// first error. Keep-alive comments are skipped; an `event: error` (the server failed
/// mid-stream) is [`ClientError::StreamFailed`]; an event whose `id` is not its cursor
/// is malformed. Anything that reads the stream (the CLI, the bot, the server's own
/// tests) parses it here.
pub fn parse_sse<S, B>(
    body: S,
) -> impl Stream<Item = Result<Event, ClientError>> + Send + Unpin + 'static
where
    S: Stream<Item = Result<B, reqwest::Error>> + Send + 'static,
    B: AsRef<[u8]>,
{
    let events = body
        .eventsource()
        .map(to_event)
        .scan(false, |failed, item| {
            if *failed {
                return ready(None);
            }
            *failed = item.is_err();
            ready(Some(item))
        });
    Box::pin(events)
}

/// One parsed SSE event (or framing failure) as an [`Event`] or the error it stands for.
fn to_event(
    item: Result<eventsource_stream::Event, EventStreamError<reqwest::Error>>,
) -> Result<Event, ClientError> {
    let sse = item.map_err(|e| match e {
        EventStreamError::Transport(e) => ClientError::Transport(e),
        EventStreamError::Utf8(e) => {
            ClientError::InvalidResponse(format!("the event stream is not UTF-8: {e}"))
        }
        EventStreamError::Parser(e) => {
            ClientError::InvalidResponse(format!("malformed event stream: {e}"))
        }
    })?;
    if sse.event == ERROR_EVENT {
        return Err(ClientError::StreamFailed { message: sse.data });
    }
    let event = Event::from_sse(&sse.event, &sse.data)
        .map_err(|source| ClientError::InvalidEvent { source })?;
    if !sse.id.is_empty() && sse.id != event.cursor.to_string() {
        return Err(ClientError::InvalidResponse(format!(
            "event id {} is not its cursor {}",
            sse.id, event.cursor
        )));
    }
    Ok(event)
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use futures_util::TryStreamExt;
    use homeserver_protocol::Keypair;
    use homeserver_protocol::PublicKey;
    use homeserver_protocol::event::{EventKind, EventParseError, encode_content_hash};
    use url::form_urlencoded;

    use super::*;

    fn key(seed: u8) -> PublicKey {
        Keypair::from_seed(&[seed; 32]).public_key()
    }

    fn decoded(query: &str) -> Vec<(String, String)> {
        form_urlencoded::parse(query.as_bytes())
            .into_owned()
            .collect()
    }

    #[test]
    fn users_repeat_in_order_with_their_cursors() {
        let (a, b, c) = (key(1), key(2), key(3));
        let request = StreamRequest::new()
            .user(a)
            .user_after(b, 42)
            .user_after(c, 0);
        let query = request.to_query().unwrap();
        assert_eq!(
            query,
            format!(
                "user={}&user={}%3A42&user={}%3A0",
                a.to_z32(),
                b.to_z32(),
                c.to_z32()
            )
        );
        // What the server decodes.
        assert_eq!(
            decoded(&query),
            vec![
                ("user".into(), a.to_z32()),
                ("user".into(), format!("{}:42", b.to_z32())),
                ("user".into(), format!("{}:0", c.to_z32())),
            ]
        );
    }

    #[test]
    fn options_follow_the_users() {
        let a = key(1);
        let query = StreamRequest::new()
            .user(a)
            .limit(10)
            .live(true)
            .reverse(true)
            .path("pub/app/")
            .to_query()
            .unwrap();
        assert_eq!(
            query,
            format!(
                "user={}&limit=10&live=true&reverse=true&path=%2Fpub%2Fapp%2F",
                a.to_z32()
            )
        );
        // Defaults add nothing; out-of-range values are sent for the server to judge.
        assert_eq!(
            StreamRequest::new().user(a).to_query().unwrap(),
            format!("user={}", a.to_z32())
        );
        assert_eq!(StreamRequest::new().limit(0).to_query().unwrap(), "limit=0");
    }

    #[test]
    fn path_filter_is_checked_before_sending() {
        for bad in ["/etc/", "/pub/a b", "/pub/../x"] {
            let err = ClientError::from(
                StreamRequest::new()
                    .user(key(1))
                    .path(bad)
                    .to_query()
                    .unwrap_err(),
            );
            assert!(
                matches!(err, ClientError::InvalidPath { .. }),
                "{bad}: {err:?}"
            );
        }
        let query = StreamRequest::new()
            .path("/pub/a.b-c_d")
            .to_query()
            .unwrap();
        assert_eq!(
            decoded(&query),
            vec![("path".into(), "/pub/a.b-c_d".into())]
        );
    }

    #[test]
    fn feed_query_shape() {
        assert_eq!(feed_query(0, None), "cursor=0");
        assert_eq!(feed_query(17, Some(1000)), "cursor=17&limit=1000");
    }

    fn put(cursor: u64) -> Event {
        Event {
            kind: EventKind::Put,
            url: format!("pk://{}/pub/a", key(1).to_z32()),
            cursor,
            content_hash: Some(encode_content_hash(&[cursor as u8; 32])),
        }
    }

    fn del(cursor: u64) -> Event {
        Event {
            kind: EventKind::Del,
            content_hash: None,
            ..put(cursor)
        }
    }

    /// The SSE text the server writes for `event` (axum's framing: one `data:` per line).
    fn framed(event: &Event) -> String {
        let mut out = format!("event: {}\nid: {}\n", event.kind, event.cursor);
        for line in event.sse_data().lines() {
            out.push_str(&format!("data: {line}\n"));
        }
        out.push('\n');
        out
    }

    async fn parse_chunks(chunks: Vec<Vec<u8>>) -> Vec<Result<Event, ClientError>> {
        let body = futures_util::stream::iter(
            chunks
                .into_iter()
                .map(|c| Ok::<_, reqwest::Error>(Bytes::from(c))),
        );
        parse_sse(body).collect().await
    }

    #[tokio::test]
    async fn an_event_whose_id_is_not_its_cursor_is_malformed() {
        let text = framed(&put(7)).replace("id: 7", "id: 8");
        let got = parse_chunks(vec![text.into_bytes()]).await;
        assert!(
            matches!(&got[..], [Err(ClientError::InvalidResponse(m))] if m.contains("id 8")),
            "{got:?}"
        );
    }

    #[tokio::test]
    async fn events_survive_any_chunking() {
        let events = [put(1), del(2), put(3)];
        let mut text = String::from(": keep-alive\n\n");
        for (i, e) in events.iter().enumerate() {
            text.push_str(&framed(e));
            if i == 0 {
                text.push_str(":\n\n");
            }
        }
        let bytes = text.into_bytes();
        for size in [1, 2, 7, 64, bytes.len()] {
            let chunks = bytes.chunks(size).map(<[u8]>::to_vec).collect();
            let got: Result<Vec<Event>, _> = parse_chunks(chunks).await.into_iter().collect();
            assert_eq!(got.unwrap(), events, "chunk size {size}");
        }
        // CRLF line endings are SSE too.
        let crlf = framed(&put(9)).replace('\n', "\r\n").into_bytes();
        let got = parse_chunks(vec![crlf]).await;
        assert_eq!(
            got.into_iter().collect::<Result<Vec<_>, _>>().unwrap(),
            [put(9)]
        );
    }

    #[tokio::test]
    async fn error_event_ends_the_stream() {
        let text = format!(
            "{}event: error\ndata: the event stream failed on the server\n\n{}",
            framed(&put(1)),
            framed(&put(2))
        );
        let got = parse_chunks(vec![text.into_bytes()]).await;
        assert_eq!(got.len(), 2, "{got:?}");
        assert_eq!(got[0].as_ref().unwrap(), &put(1));
        assert!(
            matches!(&got[1], Err(ClientError::StreamFailed { message })
                if message == "the event stream failed on the server"),
            "{:?}",
            got[1]
        );
    }

    #[tokio::test]
    async fn malformed_events_are_typed_errors() {
        let cases = [
            (
                "event: PUT\ndata: pk://a/pub/x\n\n",
                EventParseError::Missing("cursor"),
            ),
            (
                "event: MOVE\ndata: pk://a/pub/x\ndata: cursor: 1\n\n",
                EventParseError::Kind("MOVE".into()),
            ),
            // No event name: SSE calls it `message`, which is no event type of ours.
            (
                "data: pk://a/pub/x\ndata: cursor: 1\n\n",
                EventParseError::Kind("message".into()),
            ),
            (
                "event: DEL\ndata: pk://a/pub/x\ndata: cursor: x\n\n",
                EventParseError::Cursor,
            ),
        ];
        for (text, expected) in cases {
            let got = parse_chunks(vec![text.as_bytes().to_vec()]).await;
            assert!(
                matches!(&got[..], [Err(ClientError::InvalidEvent { source })] if *source == expected),
                "{text:?}: {got:?}"
            );
        }
        let got = parse_chunks(vec![b"event: PUT\ndata: \xff\n\n".to_vec()]).await;
        assert!(
            matches!(&got[..], [Err(ClientError::InvalidResponse(_))]),
            "{got:?}"
        );
    }

    #[tokio::test]
    async fn an_empty_body_is_an_empty_stream() {
        assert!(parse_chunks(vec![]).await.is_empty());
        // An event cut off before its blank line is not delivered.
        let cut = framed(&put(1));
        let cut = cut.trim_end();
        let got: Vec<Event> = parse_sse(futures_util::stream::iter([Ok::<_, reqwest::Error>(
            Bytes::from(cut.to_owned()),
        )]))
        .try_collect()
        .await
        .unwrap();
        assert!(got.is_empty());
    }
}
