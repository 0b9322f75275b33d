//! A request id for every request, client and admin: kept from the client's
//! `X-Request-Id` when it sends a plausible one (at most 64 of `A-Z a-z 0-9 . _ -`;
//! anything else is replaced, so a client cannot write arbitrary text into the log),
//! otherwise a new UUID; echoed in the response's `X-Request-Id`, and the field `id` of
//! a `request` span that the log lines of the request's own task carry, so a 500 a
//! client reports can be found in the log. (Work a request hands to a spawned task,
//! such as deleting replaced blobs, logs without it.)

use axum::Router;
use axum::http::{HeaderName, Request};
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};
use tower_http::trace::TraceLayer;

pub const REQUEST_ID_HEADER: HeaderName = HeaderName::from_static("x-request-id");

/// Longest client-chosen id kept.
const MAX_CLIENT_ID: usize = 64;

/// Wraps `router` (outermost, so the id exists before anything else runs).
pub fn with_request_ids(router: Router) -> Router {
    router
        .layer(
            // The span only: requests are counted by metrics, not logged one by one.
            TraceLayer::new_for_http()
                .make_span_with(request_span)
                .on_request(())
                .on_response(())
                .on_body_chunk(())
                .on_eos(())
                .on_failure(()),
        )
        .layer(PropagateRequestIdLayer::new(REQUEST_ID_HEADER))
        .layer(SetRequestIdLayer::new(REQUEST_ID_HEADER, MakeRequestUuid))
        .layer(axum::middleware::map_request(drop_implausible_id))
}

/// Removes a client's `X-Request-Id` that is not a plausible id (a new one is made).
async fn drop_implausible_id<B>(mut request: Request<B>) -> Request<B> {
    let plausible = request.headers().get(REQUEST_ID_HEADER).is_none_or(|v| {
        let bytes = v.as_bytes();
        !bytes.is_empty()
            && bytes.len() <= MAX_CLIENT_ID
            && bytes
                .iter()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
    });
    if !plausible {
        request.headers_mut().remove(REQUEST_ID_HEADER);
    }
    request
}

fn request_span<B>(request: &Request<B>) -> tracing::Span {
    let id = request
        .headers()
        .get(REQUEST_ID_HEADER)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    // At ERROR level so that the span exists whatever the log filter lets through
    // (`RUST_LOG=warn` still tags its warnings with the id); it prints nothing itself.
    tracing::error_span!(
        "request",
        id,
        method = %request.method(),
        path = request.uri().path()
    )
}
