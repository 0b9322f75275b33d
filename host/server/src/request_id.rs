//! A request id for every request, client and admin: kept from the client's
//! `X-Request-Id` when it sends one, otherwise a new UUID; echoed in the response's
//! `X-Request-Id`, and the field `id` of a `request` span that every log line of the
//! request carries, so a 500 a client reports can be found in the log.

use axum::Router;
use axum::http::{HeaderName, Request};
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};
use tower_http::trace::TraceLayer;

pub const REQUEST_ID_HEADER: HeaderName = HeaderName::from_static("x-request-id");

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
}

fn request_span<B>(request: &Request<B>) -> tracing::Span {
    let id = request
        .headers()
        .get(REQUEST_ID_HEADER)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    tracing::info_span!(
        "request",
        id,
        method = %request.method(),
        path = request.uri().path()
    )
}
