//! Answers of entry reads: [`GetResponse`] streams a value without holding it in memory,
//! [`EntryMeta`] is what the headers of a GET or HEAD say about the entry.

use std::time::SystemTime;

use bytes::Bytes;
use futures_util::{Stream, StreamExt, TryStreamExt};
use reqwest::Response;
use reqwest::header::{CONTENT_LENGTH, ETAG, HeaderMap, LAST_MODIFIED};
use tokio::io::{AsyncWrite, AsyncWriteExt};

use crate::error::ClientError;

/// Metadata of an entry, from the response headers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntryMeta {
    /// Size of the value in bytes.
    pub content_length: Option<u64>,
    /// The entity tag as sent (the content hash, possibly quoted); pass it back to
    /// [`PkClient::get_if_none_match`](crate::PkClient::get_if_none_match).
    pub etag: Option<String>,
    /// Last update time.
    pub last_modified: Option<SystemTime>,
}

impl EntryMeta {
    pub fn from_headers(headers: &HeaderMap) -> Self {
        let text = |name| headers.get(name).and_then(|v| v.to_str().ok());
        Self {
            content_length: text(CONTENT_LENGTH).and_then(|v| v.parse().ok()),
            etag: text(ETAG).map(str::to_owned),
            last_modified: text(LAST_MODIFIED).and_then(|v| httpdate::parse_http_date(v).ok()),
        }
    }
}

/// A successful GET of an entry whose body has not been read yet.
#[derive(Debug)]
pub struct GetResponse {
    meta: EntryMeta,
    response: Response,
}

impl GetResponse {
    pub(crate) fn new(response: Response) -> Self {
        Self {
            meta: EntryMeta::from_headers(response.headers()),
            response,
        }
    }

    pub fn meta(&self) -> &EntryMeta {
        &self.meta
    }

    /// The body as a stream of chunks.
    pub fn into_stream(self) -> impl Stream<Item = Result<Bytes, ClientError>> + Send {
        self.response.bytes_stream().map_err(ClientError::Transport)
    }

    /// The whole body in memory. Prefer [`write_to`](Self::write_to) for large values.
    pub async fn bytes(self) -> Result<Bytes, ClientError> {
        Ok(self.response.bytes().await?)
    }

    /// Streams the body into `out` chunk by chunk and flushes it; returns the byte count.
    pub async fn write_to<W>(self, out: &mut W) -> Result<u64, ClientError>
    where
        W: AsyncWrite + Unpin + ?Sized,
    {
        let mut written = 0u64;
        let mut stream = self.response.bytes_stream();
        while let Some(chunk) = stream.next().await {
            let chunk = chunk?;
            out.write_all(&chunk)
                .await
                .map_err(|e| ClientError::io("cannot write the value", e))?;
            written += chunk.len() as u64;
        }
        out.flush()
            .await
            .map_err(|e| ClientError::io("cannot write the value", e))?;
        Ok(written)
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use reqwest::header::HeaderValue;

    use super::*;

    #[test]
    fn meta_from_headers() {
        let mut h = HeaderMap::new();
        h.insert(CONTENT_LENGTH, HeaderValue::from_static("11"));
        h.insert(ETAG, HeaderValue::from_static("\"q83vEjRWeJA=\""));
        h.insert(
            LAST_MODIFIED,
            HeaderValue::from_static("Tue, 14 Nov 2023 22:13:20 GMT"),
        );
        let meta = EntryMeta::from_headers(&h);
        assert_eq!(meta.content_length, Some(11));
        assert_eq!(meta.etag.as_deref(), Some("\"q83vEjRWeJA=\""));
        assert_eq!(
            meta.last_modified,
            Some(UNIX_EPOCH + Duration::from_secs(1_700_000_000))
        );
        assert_eq!(
            EntryMeta::from_headers(&HeaderMap::new()),
            EntryMeta {
                content_length: None,
                etag: None,
                last_modified: None
            }
        );
    }
}
