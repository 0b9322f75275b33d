//! Gives hyper's own answers to unparseable requests the API's JSON error shape.
//!
//! When hyper cannot parse a request head (a NUL or space in the target, headers over
//! its buffer, an impossible `Content-Length`), it answers by itself with a bodiless
//! `400`, `414` or `431` and closes the connection; no service ever sees the request and
//! hyper has no hook to shape that answer. This wrapper sits between hyper and the
//! socket: when the first bytes a connection writes are an HTTP/1 status line and no
//! request has reached the service yet, they can only be such an automatic answer, and
//! they are replaced by the same status with a JSON body and `Connection: close`.
//!
//! Only the first answer of a connection is looked at: after one request reached the
//! service, hyper's buffer may hold the end of a response when the next head fails, so
//! the bytes are passed through as they are (such a client already sent one valid request
//! and then garbage; it still gets the right status, without a body).

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};

use homeserver_protocol::{ErrorBody, ErrorCode};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Set once a request of the connection reached the service.
pub type Dispatched = Arc<AtomicBool>;

enum State {
    /// Nothing written yet: the next write decides.
    First,
    /// The replacement is being written; hyper's own bytes are dropped.
    Replacing {
        bytes: Vec<u8>,
        written: usize,
    },
    Passthrough,
}

pub struct ParseErrorBody<T> {
    inner: T,
    dispatched: Dispatched,
    state: State,
}

impl<T> ParseErrorBody<T> {
    pub fn new(inner: T, dispatched: Dispatched) -> Self {
        Self {
            inner,
            dispatched,
            state: State::First,
        }
    }
}

/// The status of an HTTP/1 response head hyper wrote by itself, if `buf` starts with one.
fn automatic_status(buf: &[u8]) -> Option<u16> {
    let rest = buf
        .strip_prefix(b"HTTP/1.1 ")
        .or_else(|| buf.strip_prefix(b"HTTP/1.0 "))?;
    let digits = rest.get(..3)?;
    std::str::from_utf8(digits).ok()?.parse().ok()
}

/// The full replacement response for an automatic answer with `status`.
fn replacement(status: u16) -> Vec<u8> {
    let (code, reason, message) = match status {
        414 => (
            ErrorCode::UriTooLong,
            "URI Too Long",
            "the request target is too long",
        ),
        431 => (
            ErrorCode::HeadersTooLarge,
            "Request Header Fields Too Large",
            "the request head is too large (or declares a length too large to handle)",
        ),
        _ => (
            ErrorCode::BadRequest,
            "Bad Request",
            "malformed HTTP request (request line, a header or Content-Length)",
        ),
    };
    let status = if code == ErrorCode::BadRequest {
        400
    } else {
        status
    };
    let body = serde_json::to_vec(&ErrorBody::new(code, message)).unwrap_or_default();
    let mut out = format!(
        "HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    out.extend_from_slice(&body);
    out
}

impl<T: AsyncWrite + Unpin> ParseErrorBody<T> {
    /// Decides on the first write; returns the bytes hyper is told were written when the
    /// write is swallowed.
    fn classify(&mut self, first: &[u8], total: usize) -> Option<usize> {
        if !matches!(self.state, State::First) || first.is_empty() {
            return None;
        }
        match automatic_status(first) {
            Some(status) if !self.dispatched.load(Ordering::Acquire) => {
                self.state = State::Replacing {
                    bytes: replacement(status),
                    written: 0,
                };
                Some(total)
            }
            _ => {
                self.state = State::Passthrough;
                None
            }
        }
    }

    /// Writes what is left of the replacement.
    fn drive_replacement(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while let State::Replacing { bytes, written } = &mut self.state {
            if *written == bytes.len() {
                return Poll::Ready(Ok(()));
            }
            let n =
                std::task::ready!(Pin::new(&mut self.inner).poll_write(cx, &bytes[*written..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            *written += n;
        }
        Poll::Ready(Ok(()))
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for ParseErrorBody<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for ParseErrorBody<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        if let Some(swallowed) = this.classify(buf, buf.len()) {
            // Start writing now; flush and shutdown finish it.
            let _ = this.drive_replacement(cx)?;
            return Poll::Ready(Ok(swallowed));
        }
        if matches!(this.state, State::Replacing { .. }) {
            return Poll::Ready(Ok(buf.len()));
        }
        Pin::new(&mut this.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        let total = bufs.iter().map(|b| b.len()).sum();
        let first = bufs
            .iter()
            .find(|b| !b.is_empty())
            .map_or(&[][..], |b| &b[..]);
        if let Some(swallowed) = this.classify(first, total) {
            let _ = this.drive_replacement(cx)?;
            return Poll::Ready(Ok(swallowed));
        }
        if matches!(this.state, State::Replacing { .. }) {
            return Poll::Ready(Ok(total));
        }
        Pin::new(&mut this.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        std::task::ready!(self.drive_replacement(cx))?;
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        std::task::ready!(self.drive_replacement(cx))?;
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn an_automatic_answer_becomes_json() {
        let (server, mut client) = tokio::io::duplex(4096);
        let mut wrapped = ParseErrorBody::new(server, Dispatched::default());
        wrapped
            .write_all(b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 0\r\n\r\n")
            .await
            .unwrap();
        wrapped.shutdown().await.unwrap();
        let mut out = String::new();
        client.read_to_string(&mut out).await.unwrap();
        assert!(out.starts_with("HTTP/1.1 431 "), "{out}");
        assert!(out.contains("connection: close\r\n"), "{out}");
        let body: ErrorBody = serde_json::from_str(out.split("\r\n\r\n").nth(1).unwrap()).unwrap();
        assert_eq!(body.error, ErrorCode::HeadersTooLarge);
    }

    #[tokio::test]
    async fn answers_after_a_dispatched_request_pass_through() {
        let (server, mut client) = tokio::io::duplex(4096);
        let dispatched = Dispatched::default();
        dispatched.store(true, Ordering::Release);
        let mut wrapped = ParseErrorBody::new(server, dispatched);
        let response = b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n";
        wrapped.write_all(response).await.unwrap();
        wrapped.shutdown().await.unwrap();
        let mut out = Vec::new();
        client.read_to_end(&mut out).await.unwrap();
        assert_eq!(out, response);
    }

    #[tokio::test]
    async fn http2_frames_pass_through() {
        let (server, mut client) = tokio::io::duplex(4096);
        let mut wrapped = ParseErrorBody::new(server, Dispatched::default());
        let settings = [0u8, 0, 0, 4, 0, 0, 0, 0, 0];
        wrapped.write_all(&settings).await.unwrap();
        wrapped.write_all(b"HTTP/1.1 400 x").await.unwrap();
        wrapped.shutdown().await.unwrap();
        let mut out = Vec::new();
        client.read_to_end(&mut out).await.unwrap();
        assert_eq!(&out[..9], &settings);
        assert_eq!(&out[9..], b"HTTP/1.1 400 x");
    }

    #[test]
    fn statuses_are_read_from_the_status_line() {
        assert_eq!(
            automatic_status(b"HTTP/1.1 414 URI Too Long\r\n"),
            Some(414)
        );
        assert_eq!(automatic_status(b"HTTP/1.0 400 Bad"), Some(400));
        assert_eq!(automatic_status(b"PRI * HTTP/2.0"), None);
        assert_eq!(automatic_status(b"HTTP/1.1 4"), None);
    }
}
