//! `Connection: close` on answers given before the request body was read.
//!
//! Many refusals come before the body (413 on a declared length, 403, 429, 401 on a
//! stale signature): reading a body only to throw it away would let anyone make the
//! server read large uploads. hyper then cannot reuse the HTTP/1 connection (the unread
//! body is still on the wire) and closes it after the answer, but without saying so, so a
//! client that sends its next request on it sees the connection fail. Saying
//! `Connection: close` lets clients open a new connection instead.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};

use axum::body::Body;
use axum::extract::Request;
use axum::http::{HeaderValue, Version, header};
use axum::response::Response;
use bytes::Bytes;
use http_body::{Frame, SizeHint};

/// Watches `request`'s body when leaving it unread would keep hyper from reusing the
/// connection (an HTTP/1 request with a body); give the answer to the watch's
/// [`UnreadWatch::close_if_unread`].
pub fn watch(request: Request) -> (Request, Option<UnreadWatch>) {
    let http1 = matches!(request.version(), Version::HTTP_10 | Version::HTTP_11);
    let has_body = request.headers().contains_key(header::TRANSFER_ENCODING)
        || request
            .headers()
            .get(header::CONTENT_LENGTH)
            .is_some_and(|v| v.as_bytes() != b"0");
    if !(http1 && has_body) {
        return (request, None);
    }
    let finished = Arc::new(AtomicBool::new(false));
    let request = request.map(|body| {
        Body::new(WatchedBody {
            inner: body,
            finished: finished.clone(),
        })
    });
    (request, Some(UnreadWatch { finished }))
}

/// Whether a watched request body was read to its end.
pub struct UnreadWatch {
    finished: Arc<AtomicBool>,
}

impl UnreadWatch {
    /// Says `Connection: close` on `response` when the body was not read to its end.
    pub fn close_if_unread(self, response: &mut Response) {
        if !self.finished.load(Ordering::Acquire) {
            response
                .headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
    }
}

/// A request body that records when it was read to its end.
struct WatchedBody {
    inner: Body,
    finished: Arc<AtomicBool>,
}

impl http_body::Body for WatchedBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if matches!(polled, Poll::Ready(None)) || self.inner.is_end_stream() {
            self.finished.store(true, Ordering::Release);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
