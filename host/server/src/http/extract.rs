//! Reading what the routes need from a request: the signed target, the credentials,
//! the Pubky-Host and the client's address. Malformed credentials are answered here (401), before any service
//! runs.

use std::borrow::Cow;
use std::net::IpAddr;

use axum::http::request::Parts;
use axum::http::{HeaderMap, Method, Uri, header};
use homeserver_protocol::wire::{PUBKY_HOST_HEADER, PUBKY_HOST_QUERY};
use homeserver_protocol::{AuthHeader, BodyHash, CONTENT_DIGEST_HEADER, ErrorCode, PublicKey};

use super::error::ApiError;
use crate::service::auth::{Credentials, Signed, SignedTarget};

/// The client's address as the rate limits see it (a trusted proxy's
/// `X-Forwarded-For`, else the peer), for handlers with per-address limits of their own.
#[derive(Debug, Clone, Copy)]
pub struct ClientIp(pub IpAddr);

/// The parts of a request the storage routes use.
#[derive(Debug)]
pub struct RequestInfo<'a> {
    pub method: Method,
    /// Path plus `?query` exactly as sent: what a signature covers.
    pub target: &'a str,
    pub credentials: Credentials,
    pub host: Option<PublicKey>,
    /// The body's SHA-256 as declared in `Content-Digest`, if sent.
    pub declared_body: Option<BodyHash>,
}

impl RequestInfo<'_> {
    pub fn signed_target(&self) -> SignedTarget<'_> {
        SignedTarget {
            method: self.method.as_str(),
            target: self.target,
        }
    }
}

/// The request target as sent: origin-form path and query. (A proxy's absolute-form URI
/// is reduced to the same, so signatures still verify.)
pub fn target_of(uri: &Uri) -> &str {
    uri.path_and_query()
        .map_or_else(|| uri.path(), |pq| pq.as_str())
}

/// A request's credentials, classified once by the client API's first layer
/// ([`classify`], in `client_server::middleware`) and read from the request's
/// extensions by rate limiting and the handlers ([`credentials_of`]).
#[derive(Debug, Clone)]
pub struct Classified(pub Result<Credentials, ApiError>);

/// Parses the credentials and proves a signature now when it can be (a bodiless request,
/// or one whose body's SHA-256 is declared in `Content-Digest`): the services' checks
/// then reuse the proof. A signature that fails here is checked again, and refused, by
/// the service, which words the error.
pub fn classify(parts: &Parts) -> Classified {
    Classified(
        credentials(&parts.headers).map(|credentials| match credentials {
            Credentials::Signed(mut signed) => {
                let body = if matches!(parts.method, Method::GET | Method::HEAD | Method::DELETE) {
                    Some(BodyHash::empty())
                } else {
                    declared_body(&parts.headers).ok().flatten()
                };
                if let Some(body) = body {
                    let _ = signed.prove(parts.method.as_str(), target_of(&parts.uri), &body);
                }
                Credentials::Signed(signed)
            }
            other => other,
        }),
    )
}

/// The request's credentials: as [`classify`] found them, or parsed now for a request
/// that did not pass that layer.
pub fn credentials_of(
    extensions: &axum::http::Extensions,
    headers: &HeaderMap,
) -> Result<Credentials, ApiError> {
    match extensions.get::<Classified>() {
        Some(Classified(credentials)) => credentials.clone(),
        None => credentials(headers),
    }
}

pub fn credentials(headers: &HeaderMap) -> Result<Credentials, ApiError> {
    let Some(value) = headers.get(header::AUTHORIZATION) else {
        return Ok(Credentials::None);
    };
    let invalid = |m: String| ApiError::new(ErrorCode::InvalidSignature, m);
    let value = value
        .to_str()
        .map_err(|_| invalid("Authorization header is not ASCII".into()))?;
    if let Some(token) = value.strip_prefix("Bearer ") {
        return Ok(Credentials::Session(token.trim().to_owned()));
    }
    AuthHeader::parse(value)
        .map(|h| Credentials::Signed(Box::new(Signed::new(h))))
        .map_err(|e| invalid(e.to_string()))
}

/// The body's SHA-256 that `Content-Digest` declares, if the header is there.
pub fn declared_body(headers: &HeaderMap) -> Result<Option<BodyHash>, ApiError> {
    let Some(value) = headers.get(CONTENT_DIGEST_HEADER) else {
        return Ok(None);
    };
    let value = value
        .to_str()
        .map_err(|_| ApiError::new(ErrorCode::BadRequest, "Content-Digest is not ASCII"))?;
    BodyHash::from_content_digest(value)
        .map(Some)
        .map_err(|e| ApiError::new(ErrorCode::BadRequest, e.to_string()))
}

pub fn host(headers: &HeaderMap, uri: &Uri) -> Result<Option<PublicKey>, ApiError> {
    let raw = match headers.get(PUBKY_HOST_HEADER) {
        Some(v) => Some(Cow::Borrowed(
            v.to_str()
                .map_err(|_| bad_host("Pubky-Host header is not ASCII".into()))?
                .trim(),
        )),
        None => uri.query().and_then(|q| {
            url_query_pairs(q)
                .find(|(k, _)| k == PUBKY_HOST_QUERY)
                .map(|(_, v)| Cow::Owned(v))
        }),
    };
    raw.map(|s| {
        s.parse::<PublicKey>()
            .map_err(|e| bad_host(format!("invalid Pubky-Host: {e}")))
    })
    .transpose()
}

fn bad_host(m: String) -> ApiError {
    ApiError::new(ErrorCode::BadRequest, m)
}

/// Decoded `key=value` pairs of a query string.
pub fn url_query_pairs(query: &str) -> impl Iterator<Item = (String, String)> + '_ {
    form_urlencoded::parse(query.as_bytes()).map(|(k, v)| (k.into_owned(), v.into_owned()))
}

pub fn request_info(parts: &Parts) -> Result<RequestInfo<'_>, ApiError> {
    Ok(RequestInfo {
        method: parts.method.clone(),
        target: target_of(&parts.uri),
        credentials: credentials_of(&parts.extensions, &parts.headers)?,
        host: host(&parts.headers, &parts.uri)?,
        declared_body: declared_body(&parts.headers)?,
    })
}

/// One path parameter (`{token}`, `{public_key}`) as text. Axum's own `Path` answers a
/// parameter that is not UTF-8 (`%FF`) with a plain-text 400; this one answers the
/// JSON error every other refusal uses.
pub struct PathParam(pub String);

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for PathParam {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        axum::extract::Path::<String>::from_request_parts(parts, state)
            .await
            .map(|axum::extract::Path(text)| PathParam(text))
            .map_err(|e| {
                ApiError::new(
                    ErrorCode::BadRequest,
                    format!("invalid URL: {}", e.body_text()),
                )
            })
    }
}
