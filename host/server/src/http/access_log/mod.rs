//! The access log: one line per request on the client and admin listeners, under the
//! tracing target `access`, written when the response body ends (a large GET or an
//! event stream logs its real byte count and duration, and `aborted` when the client
//! left before the end). Fields: `listener`, `request_id`, `method`, `path`, `status`,
//! `bytes_in` (request body bytes the server read), `bytes_out`, `duration_us`,
//! `caller` (`anonymous`, `key` or `session`, from [`crate::service::caller`]), `key`
//! (the signer or the session's owner), `client` (after `rate_limit.trusted_proxies`).
//!
//! The probes (`/health`, `/ready`) are not logged. Secrets never reach it: no header is logged; a query parameter whose name contains
//! `token` keeps its name but not its value, and so does the token in the path of the
//! signup-token check.
//!
//! It lives where connections are served (`serve`), which already wraps every response
//! body: the log costs no extra allocation per request beyond the path it keeps
//! (docs/BENCHMARKS.md "Access log").

use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Instant;

use axum::http::header::CONTENT_LENGTH;
use axum::http::{HeaderValue, Method, Request, Response, Uri};
use bytes::Buf;
use http_body::{Body, Frame, SizeHint};

use crate::http::extract::ClientIp;
use crate::http::rate_limit::client_ip;
use crate::http::request_id::REQUEST_ID_HEADER;
use crate::service::caller::ProvenCaller;

pub mod output;

/// The tracing target of access lines (route or filter them by it, e.g.
/// `RUST_LOG=info,access=off`).
pub const TARGET: &str = "access";

/// The access log of one listener.
#[derive(Debug, Clone)]
pub struct AccessLog {
    listener: &'static str,
    /// Peers whose `X-Forwarded-For` names the client (`rate_limit.trusted_proxies`).
    trusted_proxies: Arc<[IpAddr]>,
}

impl AccessLog {
    pub fn new(listener: &'static str, trusted_proxies: &[IpAddr]) -> Self {
        Self {
            listener,
            trusted_proxies: trusted_proxies.into(),
        }
    }

    /// Starts the record of `request` from `peer`, when access lines are wanted (the
    /// filter may drop the target), and leaves the client's address in its extensions
    /// for the rate limits. `None`: nothing to log.
    pub fn start<B>(&self, request: &mut Request<B>, peer: SocketAddr) -> Option<Started> {
        // The probes are left out: a balancer probing every 100 ms would drown the log.
        if matches!(request.uri().path(), "/health" | "/ready")
            || !tracing::enabled!(target: TARGET, tracing::Level::INFO)
        {
            return None;
        }
        let client = client_ip(&self.trusted_proxies, peer, request.headers());
        request.extensions_mut().insert(ClientIp(client));
        Some(Started {
            listener: self.listener,
            at: Instant::now(),
            method: request.method().clone(),
            uri: request.uri().clone(),
            client,
            bytes_in: None,
        })
    }
}

/// A request being served, as the log will tell it.
#[derive(Debug)]
pub struct Started {
    listener: &'static str,
    at: Instant,
    method: Method,
    uri: Uri,
    client: IpAddr,
    /// Counted by [`CountedBody`]; `None` for a request without a body.
    bytes_in: Option<Arc<AtomicU64>>,
}

impl Started {
    /// Wraps the request body so the bytes the server reads are counted (a body known
    /// to be empty is left alone).
    pub fn count_body<B: Body>(&mut self, body: B) -> CountedBody<B> {
        let counter = (!body.is_end_stream()).then(|| Arc::new(AtomicU64::new(0)));
        self.bytes_in.clone_from(&counter);
        CountedBody {
            inner: body,
            counter,
        }
    }

    /// The response is ready: its body logs the line when it ends.
    pub fn respond<B: Body>(
        self,
        response: Response<B>,
        caller: ProvenCaller,
    ) -> Response<LoggedBody<B>> {
        let status = response.status().as_u16();
        let request_id = response.headers().get(REQUEST_ID_HEADER).cloned();
        // What hyper frames the body by: a streamed value's header, or the body's size.
        let length = response
            .headers()
            .get(CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok()?.parse().ok())
            .or_else(|| response.body().size_hint().exact());
        response.map(|body| LoggedBody {
            line: Some(Line {
                started: self,
                status,
                request_id,
                caller,
                bytes_out: 0,
                length,
                // An empty body (a HEAD, a 204) is never polled.
                ended: body.is_end_stream(),
            }),
            inner: body,
        })
    }
}

/// A request body that counts what is read of it.
#[derive(Debug)]
pub struct CountedBody<B> {
    inner: B,
    counter: Option<Arc<AtomicU64>>,
}

impl<B: Body + Unpin> Body for CountedBody<B>
where
    B::Data: Buf,
{
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if let (Poll::Ready(Some(Ok(frame))), Some(counter)) = (&polled, &self.counter)
            && let Some(data) = frame.data_ref()
        {
            counter.fetch_add(data.remaining() as u64, Ordering::Relaxed);
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

/// What the line says once the body ends.
#[derive(Debug)]
struct Line {
    started: Started,
    status: u16,
    request_id: Option<HeaderValue>,
    caller: ProvenCaller,
    bytes_out: u64,
    /// The body's length when known (hyper stops polling once it sent that much).
    length: Option<u64>,
    /// The body reached its end (else the client left, or the stream broke, first).
    ended: bool,
}

impl Line {
    fn write(&self) {
        let started = &self.started;
        let path = logged_target(&started.uri);
        let fields = output::Fields {
            listener: started.listener,
            request_id: self
                .request_id
                .as_ref()
                .and_then(|v| v.to_str().ok())
                .unwrap_or(""),
            method: started.method.as_str(),
            path: &path,
            status: self.status,
            bytes_in: started
                .bytes_in
                .as_ref()
                .map_or(0, |n| n.load(Ordering::Relaxed)),
            bytes_out: self.bytes_out,
            duration_us: u64::try_from(started.at.elapsed().as_micros()).unwrap_or(u64::MAX),
            caller: self.caller.kind(),
            key: self.caller.key().map(|key| key as &dyn std::fmt::Display),
            client: started.client,
            aborted: !self.ended && self.length != Some(self.bytes_out),
        };
        match output::direct() {
            Some(direct) => direct.write(&fields),
            None => fields.emit(),
        }
    }
}

/// A response body that logs its request's line when it is dropped (hyper drops it
/// when it is sent, or when the connection ends first).
#[derive(Debug)]
pub struct LoggedBody<B> {
    inner: B,
    line: Option<Line>,
}

impl<B> LoggedBody<B> {
    /// A body of a request that is not logged.
    pub fn unlogged(inner: B) -> Self {
        Self { inner, line: None }
    }
}

impl<B: Body + Unpin> Body for LoggedBody<B>
where
    B::Data: Buf,
{
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = &mut *self;
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        if let Some(line) = &mut this.line {
            match &polled {
                Poll::Ready(Some(Ok(frame))) => {
                    if let Some(data) = frame.data_ref() {
                        line.bytes_out += data.remaining() as u64;
                    }
                    // hyper stops polling a body that says it has ended (a 1 KiB value).
                    line.ended |= this.inner.is_end_stream();
                }
                Poll::Ready(None) => line.ended = true,
                _ => {}
            }
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

impl<B> Drop for LoggedBody<B> {
    fn drop(&mut self) {
        if let Some(line) = &self.line {
            line.write();
        }
    }
}

/// The path and query as logged: a `token` parameter's value and the token of
/// `/signup_tokens/{token}` replaced by `****`. Borrowed when there is nothing to hide.
fn logged_target(uri: &Uri) -> std::borrow::Cow<'_, str> {
    use std::borrow::Cow;
    let path = uri.path();
    let path: Cow<'_, str> = match path.strip_prefix(SIGNUP_TOKENS) {
        Some(token) if !token.is_empty() => Cow::Owned(format!("{SIGNUP_TOKENS}{HIDDEN}")),
        _ => Cow::Borrowed(path),
    };
    let Some(query) = uri.query() else {
        return path;
    };
    let mut out = String::with_capacity(path.len() + 1 + query.len());
    out.push_str(&path);
    out.push('?');
    for (i, pair) in query.split('&').enumerate() {
        if i > 0 {
            out.push('&');
        }
        let (name, _) = pair.split_once('=').unwrap_or((pair, ""));
        // As the server reads it (`signup%5Ftoken` is `signup_token`).
        let secret = form_urlencoded::parse(name.as_bytes())
            .next()
            .is_some_and(|(name, _)| name.to_ascii_lowercase().contains("token"));
        if secret {
            out.push_str(name);
            out.push('=');
            out.push_str(HIDDEN);
        } else {
            out.push_str(pair);
        }
    }
    Cow::Owned(out)
}

const SIGNUP_TOKENS: &str = "/signup_tokens/";
const HIDDEN: &str = "****";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_in_the_target_are_hidden() {
        for (sent, logged) in [
            ("/pub/a.txt", "/pub/a.txt"),
            ("/pub/?limit=5&cursor=x", "/pub/?limit=5&cursor=x"),
            (
                "/signup?signup_token=ABCD-EFGH-JKMN",
                "/signup?signup_token=****",
            ),
            (
                "/signup?signup%5Ftoken=ABCD-EFGH-JKMN&x=1",
                "/signup?signup%5Ftoken=****&x=1",
            ),
            ("/signup?SIGNUP_TOKEN=ABCD", "/signup?SIGNUP_TOKEN=****"),
            ("/signup_tokens/ABCD-EFGH-JKMN", "/signup_tokens/****"),
            ("/signup_tokens/", "/signup_tokens/"),
            ("/events/?cursor=3&&limit", "/events/?cursor=3&&limit"),
        ] {
            let uri: Uri = sent.parse().unwrap();
            assert_eq!(logged_target(&uri), logged, "{sent}");
        }
    }
}
