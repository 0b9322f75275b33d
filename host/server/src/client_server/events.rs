//! `GET /events/` (JSON feed of every event) and `GET /events-stream` (SSE per user).
//! Every bad request is answered with a 400 JSON error before any stream starts.

use std::convert::Infallible;
use std::net::IpAddr;
use std::time::Duration;

use axum::Json;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use bytes::{Bytes, BytesMut};
use futures_util::StreamExt;
use homeserver_protocol::ErrorCode;
use homeserver_protocol::event::EventPage;
use homeserver_protocol::query::{FeedQuery, StreamQuery};

use super::AppState;
use crate::http::error::ApiError;
use crate::http::extract::ClientIp;
use crate::http::request_id::REQUEST_ID_HEADER;
use crate::service::events::{Subscription, to_wire};

/// Idle streams get a comment line this often, so proxies keep them open.
const KEEP_ALIVE: Duration = Duration::from_secs(15);

fn bad(message: impl Into<String>) -> ApiError {
    ApiError::new(ErrorCode::BadRequest, message)
}

pub async fn feed(State(app): State<AppState>, request: Request) -> Response {
    match feed_page(&app, request.uri().clone()).await {
        Ok(page) => Json(page).into_response(),
        Err(e) => e.into_response(),
    }
}

async fn feed_page(app: &AppState, uri: axum::http::Uri) -> Result<EventPage, ApiError> {
    let query = FeedQuery::parse(uri.query().unwrap_or("")).map_err(|e| bad(e.to_string()))?;
    let (cursor, limit) = (query.cursor, query.limit_or_default());
    let (events, next) = app
        .events
        .public_feed(cursor, limit, &app.access.public_filter())
        .await?;
    Ok(EventPage {
        events: events.iter().map(to_wire).collect(),
        cursor: next,
    })
}

pub async fn stream(State(app): State<AppState>, request: Request) -> Response {
    let subscription = match parse_subscription(&request) {
        Ok(s) => s,
        Err(e) => return e.into_response(),
    };
    let ip = request
        .extensions()
        .get::<ClientIp>()
        .map_or(IpAddr::from([127, 0, 0, 1]), |c| c.0);
    let Some(slot) = app.stream_slots.acquire(ip) else {
        app.metrics.observe_rate_limited("event_streams");
        return ApiError::new(
            ErrorCode::RateLimitExceeded,
            format!(
                "{} event streams are open from your address already: close one first",
                app.stream_slots.per_ip()
            ),
        )
        .into_response();
    };
    // The stream is public: events of paths the policy hides from the public are left
    // out (before `limit` counts them).
    let mut subscription = subscription;
    subscription.visible = Some(app.access.public_filter());
    subscription.live_interval =
        Duration::from_millis(app.config.http.event_stream_write_interval_ms);
    let batches = match app.events.subscribe(subscription).await {
        Ok(b) => b,
        Err(e) => return ApiError::from(e).into_response(),
    };
    // One body chunk per batch (a subscriber that is behind gets what is ready in one
    // write), made of frames the hub serialized once for every subscriber; a comment
    // line when nothing was sent for a while keeps idle streams open through proxies.
    // Its first tick is at once: with body bytes right away, a proxy that holds the
    // response headers until it has body data to send with them (nginx 1.22 to HTTP/2
    // clients) passes the stream's start on at once, so a client (an EventSource's
    // `open`) does not wait up to 15 s to learn it is subscribed.
    let keep_alive = tokio::time::interval(KEEP_ALIVE);
    // The body streams after this handler has returned, outside the request's span: its
    // one warning names the request id itself (a header value carried along, not the
    // span kept alive for the stream's lifetime).
    let request_id = request.headers().get(REQUEST_ID_HEADER).cloned();
    // The slot goes back when the body is dropped (the client left, or shutdown).
    let body = futures_util::stream::unfold(
        (Box::pin(batches), keep_alive, slot, false, request_id),
        |(mut batches, mut keep_alive, slot, failed, request_id)| async move {
            // The error event was the last one: end the stream (the client resumes
            // from the last id it got).
            if failed {
                return None;
            }
            let mut failed = false;
            let chunk = tokio::select! {
                batch = batches.next() => match batch? {
                    Ok(events) => {
                        let mut chunk =
                            BytesMut::with_capacity(events.iter().map(|e| e.frame.len()).sum());
                        for event in &events {
                            chunk.extend_from_slice(&event.frame);
                        }
                        keep_alive.reset();
                        chunk.freeze()
                    }
                    Err(e) => {
                        // Headers are sent: say what happened in a final event, then end.
                        tracing::warn!(
                            request_id = request_id.as_ref().and_then(|v| v.to_str().ok()),
                            error = %e,
                            "event stream failed"
                        );
                        failed = true;
                        Bytes::from_static(STREAM_FAILED)
                    }
                },
                _ = keep_alive.tick() => Bytes::from_static(b":\n\n"),
            };
            Some((
                Ok::<_, Infallible>(chunk),
                (batches, keep_alive, slot, failed, request_id),
            ))
        },
    );
    (
        [
            (header::CONTENT_TYPE, "text/event-stream"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        Body::from_stream(body),
    )
        .into_response()
}

/// The last event of a stream that failed after its headers were sent.
const STREAM_FAILED: &[u8] =
    b"event: error\ndata: the event stream failed on the server; resume from the last id\n\n";

fn parse_subscription(request: &Request) -> Result<Subscription, ApiError> {
    let query =
        StreamQuery::parse(request.uri().query().unwrap_or("")).map_err(|e| bad(e.to_string()))?;
    let last_event_id = request
        .headers()
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    Ok(Subscription::from_query(query, last_event_id))
}
