//! Routes of the storage API: `GET`/`HEAD`/`PUT`/`DELETE /pub/...`. A path ending in `/`
//! is a listing (GET only). HTTP concerns live here (headers, conditional requests,
//! streaming bodies); the rules are in `service::storage`.

use std::io::Write;

use axum::Json;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use futures_util::TryStreamExt;
use homeserver_protocol::event::{ENCODED_CONTENT_HASH_LEN, encode_content_hash_into};
use homeserver_protocol::wire::ListResult;
use homeserver_protocol::{ErrorCode, StoragePath};

use super::AppState;
use crate::http::error::ApiError;
use crate::http::extract::request_info;
use crate::persistence::ValueBytes;
use crate::service::access::WriteMethod;
use crate::service::auth::ReadAccess;
use crate::service::storage::{BodyError, Entry, ListOptions};
use homeserver_protocol::query::ListQuery;

/// Whether `path` is the storage API's (`/pub...`, `/private...`): the client API's
/// service ([`super::middleware::Observed`]) sends these to [`serve`] without asking the
/// router, whose fixed routes never match them (a GET of a value is most of the
/// traffic, and the router's match, boxed route and boxed handler future were ~5% of
/// a public GET's time in the server: docs/BENCHMARKS.md "Storage paths without the
/// router").
pub fn is_storage_path(path: &str) -> bool {
    path.starts_with("/pub") || path.starts_with("/private")
}

/// A storage request: the answer, or the JSON error.
pub async fn serve(app: AppState, request: Request) -> Response {
    match dispatch(app, request).await {
        Ok(response) => response,
        Err(e) => e.into_response(),
    }
}

/// Every request no route took: a JSON 404 (or a storage path, should one reach the
/// router).
pub async fn handle(State(app): State<AppState>, request: Request) -> Response {
    serve(app, request).await
}

async fn dispatch(app: AppState, request: Request) -> Result<Response, ApiError> {
    let raw_path = request.uri().path();
    if !is_storage_path(raw_path) {
        return Err(ApiError::not_found_route());
    }
    // The one canonical path (`%2F` read as `/`) is all that services, policies, quotas,
    // events and listings see; only the signature check reads the target as sent.
    let path = StoragePath::from_request_path(raw_path)
        .map_err(|e| ApiError::new(ErrorCode::InvalidPath, e.to_string()))?;
    let (parts, body) = request.into_parts();
    match parts.method {
        Method::GET | Method::HEAD => read(app, parts, path).await,
        // Boxed: a PUT's future (the body's streaming and hashing) is the largest here,
        // and without the box every GET's future would be as large and be copied at
        // each await (docs/BENCHMARKS.md "Smaller request futures").
        Method::PUT => Box::pin(put(app, parts, path, body)).await,
        Method::DELETE => delete(app, parts, path).await,
        _ => Err(ApiError::new(
            ErrorCode::MethodNotAllowed,
            format!(
                "{} is not allowed here; use GET, HEAD, PUT or DELETE",
                parts.method
            ),
        )),
    }
}

fn entry_path_only(path: &StoragePath) -> Result<(), ApiError> {
    if path.is_listing() {
        return Err(ApiError::new(
            ErrorCode::InvalidPath,
            "a path ending in / names a listing; PUT and DELETE need an entry path",
        ));
    }
    Ok(())
}

async fn read(app: AppState, parts: Parts, path: StoragePath) -> Result<Response, ApiError> {
    let info = request_info(&parts)?;
    let access = app
        .access
        .read(
            &info.credentials,
            info.host.as_ref(),
            &info.signed_target(),
            &path,
            parts.method == Method::HEAD,
        )
        .await?;
    let space = access.space();
    if path.is_listing() {
        let options = list_options(&parts.uri)?;
        let page = match &access {
            ReadAccess::Owner(_) => app.storage.list(space, &path, options, None).await?,
            ReadAccess::Public(_) => {
                let filter = app.access.public_filter();
                app.storage
                    .list(space, &path, options, Some(&filter))
                    .await?
            }
            ReadAccess::PublicHiddenListing(_) => ListResult {
                entries: Vec::new(),
                cursor: None,
                has_more: false,
            },
        };
        return Ok(Json(page).into_response());
    }
    let entry = app.storage.entry(space, &path).await?;
    let etag = etag(&entry);
    if not_modified(&parts.headers, &etag) {
        let mut response = StatusCode::NOT_MODIFIED.into_response();
        entry_headers(response.headers_mut(), &entry, etag);
        return Ok(response);
    }
    if parts.method == Method::HEAD {
        let mut response = StatusCode::OK.into_response();
        entry_headers(response.headers_mut(), &entry, etag);
        response
            .headers_mut()
            .insert(header::CONTENT_LENGTH, HeaderValue::from(entry.size()));
        return Ok(response);
    }
    let opened_hash = *entry.content_hash();
    let (entry, bytes) = app.storage.open(space, &path, entry).await?;
    // An overwrite between the read of the entry and the open: the newer one is sent.
    let etag = match entry.content_hash() == &opened_hash {
        true => etag,
        false => self::etag(&entry),
    };
    let body = match bytes {
        ValueBytes::Whole(bytes) => Body::from(bytes),
        ValueBytes::Stream(stream) => Body::from_stream(stream),
    };
    let mut response = Response::new(body);
    entry_headers(response.headers_mut(), &entry, etag);
    response
        .headers_mut()
        .insert(header::CONTENT_LENGTH, HeaderValue::from(entry.size()));
    Ok(response)
}

/// The entry's `ETag`: its content hash as every wire format spells it (listings'
/// `content_hash`, events), quoted. Written on the stack: every GET answers with it.
fn etag(entry: &Entry) -> HeaderValue {
    let mut quoted = [b'"'; ENCODED_CONTENT_HASH_LEN + 2];
    let text = (&mut quoted[1..=ENCODED_CONTENT_HASH_LEN])
        .try_into()
        .expect("the slice is the encoding's length");
    encode_content_hash_into(entry.content_hash(), text);
    HeaderValue::from_bytes(&quoted).expect("quoted base64 is a valid header value")
}

/// `Last-Modified`: an IMF-fixdate, always 29 bytes, written on the stack.
fn last_modified(entry: &Entry) -> Option<HeaderValue> {
    let at = std::time::UNIX_EPOCH
        + std::time::Duration::from_secs(u64::try_from(entry.updated_at()).unwrap_or(0));
    let mut text = [0u8; 29];
    write!(&mut text[..], "{}", httpdate::HttpDate::from(at)).ok()?;
    HeaderValue::from_bytes(&text).ok()
}

fn entry_headers(headers: &mut HeaderMap, entry: &Entry, etag: HeaderValue) {
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    headers.insert(header::ETAG, etag);
    if let Some(v) = last_modified(entry) {
        headers.insert(header::LAST_MODIFIED, v);
    }
}

/// `If-None-Match` per RFC 9110: `*` or a list of (possibly weak) entity tags.
fn not_modified(headers: &HeaderMap, etag: &HeaderValue) -> bool {
    headers
        .get_all(header::IF_NONE_MATCH)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|tag| tag.trim())
        .any(|tag| {
            tag == "*" || tag.strip_prefix("W/").unwrap_or(tag).as_bytes() == etag.as_bytes()
        })
}

fn list_options(uri: &Uri) -> Result<ListOptions, ApiError> {
    let query = ListQuery::parse(uri.query().unwrap_or(""))
        .map_err(|e| ApiError::new(ErrorCode::BadRequest, e.to_string()))?;
    Ok(ListOptions {
        limit: query.limit,
        cursor: query.cursor,
        reverse: query.reverse,
        shallow: query.shallow,
    })
}

async fn put(
    app: AppState,
    parts: Parts,
    path: StoragePath,
    body: Body,
) -> Result<Response, ApiError> {
    entry_path_only(&path)?;
    let info = request_info(&parts)?;
    let declared_len = match parts.headers.get(header::CONTENT_LENGTH) {
        None => Ok(None),
        Some(v) => v
            .to_str()
            .ok()
            .and_then(|s| s.parse::<u64>().ok())
            .map(Some)
            .ok_or_else(|| ApiError::new(ErrorCode::BadRequest, "invalid Content-Length")),
    };
    let grant = app
        .access
        .write(
            &info.credentials,
            info.host.as_ref(),
            info.signed_target(),
            &path,
            WriteMethod::Put {
                size: declared_len.as_ref().ok().copied().flatten(),
            },
        )
        .await?;
    // Credentials first (401 before 400), as before the policy was told the size.
    let declared_len = declared_len?;
    let stream = body
        .into_data_stream()
        .map_err(|e| BodyError(e.to_string()));
    let result = app
        .storage
        .put(grant, &path, declared_len, info.declared_body, stream)
        .await?;
    Ok(Json(result).into_response())
}

async fn delete(app: AppState, parts: Parts, path: StoragePath) -> Result<Response, ApiError> {
    entry_path_only(&path)?;
    let info = request_info(&parts)?;
    let grant = app
        .access
        .write(
            &info.credentials,
            info.host.as_ref(),
            info.signed_target(),
            &path,
            WriteMethod::Delete,
        )
        .await?;
    let result = app.storage.delete(grant, &path).await?;
    Ok(Json(result).into_response())
}
