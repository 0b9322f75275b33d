//! A request id for every request, client and admin: kept from the client's
//! `X-Request-Id` when it sends a plausible one (at most 64 of `A-Z a-z 0-9 . _ -`;
//! anything else is replaced, so a client cannot write arbitrary text into the log),
//! otherwise a new UUID; echoed in the response's `X-Request-Id`, and the field `id` of
//! a `request` span that the log lines of the request's own task carry, so a 500 a
//! client reports can be found in the log. The span covers the handler; a response
//! body that streams afterwards logs without it unless it names the id itself (the event
//! stream's failure warning has a `request_id` field), and so does work handed to a
//! spawned task (deleting replaced blobs).
//!
//! One layer of its own rather than tower-http's three (`SetRequestId`,
//! `PropagateRequestId`, `Trace`) and a map for the plausibility check: on a router each
//! layer costs every request a clone of the route and a boxed future, and the four cost
//! a public GET ~5 µs of its ~15 µs of server CPU; this one costs about 2 µs
//! (docs/BENCHMARKS.md "Request ids").
//!
//! On the client API the same layer applies CORS ([`crate::http::cors`]): it answers
//! preflights before anything else runs and adds the CORS headers to every answer, so
//! CORS costs no layer of its own.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::Router;
use axum::http::{HeaderName, HeaderValue, Request};
use axum::response::Response;
use tower::{Layer, Service};
use tracing::Instrument;

use crate::http::cors::{self, Admission, Cors};

pub const REQUEST_ID_HEADER: HeaderName = HeaderName::from_static("x-request-id");

/// Longest client-chosen id kept.
const MAX_CLIENT_ID: usize = 64;

/// Wraps `router` (outermost, so the id exists before anything else runs).
pub fn with_request_ids(router: Router) -> Router {
    router.layer(RequestIdLayer::default())
}

/// Gives each request its id and span (and applies CORS when it has rules); see the
/// module's documentation.
#[derive(Debug, Clone, Default)]
pub struct RequestIdLayer {
    cors: Option<Arc<Cors>>,
}

impl RequestIdLayer {
    /// Ids, and the CORS rules `cors`.
    pub fn with_cors(cors: Cors) -> Self {
        Self {
            cors: Some(Arc::new(cors)),
        }
    }
}

impl<S> Layer<S> for RequestIdLayer {
    type Service = RequestIds<S>;

    fn layer(&self, inner: S) -> RequestIds<S> {
        RequestIds {
            inner,
            cors: self.cors.clone(),
        }
    }
}

/// The service of [`RequestIdLayer`].
#[derive(Debug, Clone)]
pub struct RequestIds<S> {
    inner: S,
    cors: Option<Arc<Cors>>,
}

impl<S, B> Service<Request<B>> for RequestIds<S>
where
    S: Service<Request<B>, Response = Response>,
    S::Future: Send + 'static,
{
    type Response = Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: Request<B>) -> Self::Future {
        let id = match request.headers().get(REQUEST_ID_HEADER) {
            Some(given) if plausible(given) => given.clone(),
            _ => {
                let made = new_id();
                request
                    .headers_mut()
                    .insert(REQUEST_ID_HEADER, made.clone());
                made
            }
        };
        // `None`: no CORS here; `Some(allow)`: CORS, with the answer's allowed origin.
        let cors = match self.cors.as_deref() {
            None => None,
            Some(rules) => match rules.admit(request.method(), request.headers()) {
                Admission::Pass(allow) => Some(allow),
                Admission::Preflight(mut answer) => {
                    answer.headers_mut().insert(REQUEST_ID_HEADER, id);
                    return Box::pin(async move { Ok(answer) });
                }
            },
        };
        let span = request_span(&request, &id);
        // Not entered for the call: the services here only make their future, whose
        // polls (where the work and its logging happen) run in the span. Each entry
        // and exit passes every layer of the subscriber.
        let response = self.inner.call(request);
        Box::pin(
            async move {
                let mut response = response.await?;
                let headers = response.headers_mut();
                headers.insert(REQUEST_ID_HEADER, id);
                if let Some(allow) = cors {
                    cors::decorate(headers, allow);
                }
                Ok(response)
            }
            .instrument(span),
        )
    }
}

/// A client's id worth keeping: short, and nothing that could fake a log line.
fn plausible(id: &HeaderValue) -> bool {
    let bytes = id.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= MAX_CLIENT_ID
        && bytes
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// A new random (v4) UUID, hyphenated.
fn new_id() -> HeaderValue {
    let mut text = [0u8; uuid::fmt::Hyphenated::LENGTH];
    uuid::Uuid::new_v4().hyphenated().encode_lower(&mut text);
    // Owned by one allocation that its clones (the request's header, the answer's)
    // share; a value copied from a slice allocates again at its first clone.
    HeaderValue::from_maybe_shared(bytes::Bytes::from_owner(text))
        .expect("a hyphenated UUID is a valid header value")
}

fn request_span<B>(request: &Request<B>, id: &HeaderValue) -> tracing::Span {
    let id = id.to_str().unwrap_or("");
    // At ERROR level so that the span exists whatever the log filter lets through
    // (`RUST_LOG=warn` still tags its warnings with the id); it prints nothing itself.
    // The id is written plainly (a kept id is checked above; a made one is a UUID); the
    // path stays quoted and escaped, since a URI path may hold `"` and `}`.
    tracing::error_span!(
        "request",
        id = %id,
        method = %request.method(),
        path = request.uri().path()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_short_plain_ids_are_kept() {
        for kept in ["trace-me-42", "a.b_c-D9", &"x".repeat(64)] {
            assert!(plausible(&HeaderValue::from_str(kept).unwrap()), "{kept}");
        }
        for replaced in ["", "a b", "id\"=\"other", "é", &"x".repeat(65)] {
            let value = HeaderValue::from_bytes(replaced.as_bytes()).unwrap();
            assert!(!plausible(&value), "{replaced}");
        }
    }

    /// A log line written while a request is handled names the request's span.
    #[test]
    fn log_lines_of_a_request_carry_its_id() {
        let captured = hs_testkit::CapturedLog::default();
        let writer = captured.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_env_filter("warn")
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .finish();
        let router = with_request_ids(Router::new().route(
            "/x",
            axum::routing::get(|| async {
                tracing::warn!("inside the handler");
            }),
        ));
        let request = Request::get("/x?q=1")
            .header(REQUEST_ID_HEADER, "trace-me-7")
            .body(axum::body::Body::empty())
            .unwrap();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let response = tracing::subscriber::with_default(subscriber, || {
            runtime.block_on(Service::call(&mut router.clone(), request))
        })
        .unwrap();
        assert_eq!(response.headers()[REQUEST_ID_HEADER], "trace-me-7");
        let log = captured.text();
        assert!(
            log.contains(r#"request{id=trace-me-7 method=GET path="/x"}"#)
                && log.contains("inside the handler"),
            "{log}"
        );
    }

    #[test]
    fn made_ids_are_uuids() {
        let id = new_id();
        let text = id.to_str().unwrap();
        assert_eq!(text.len(), 36);
        assert!(uuid::Uuid::parse_str(text).is_ok(), "{text}");
        assert_ne!(new_id(), id);
    }
}
