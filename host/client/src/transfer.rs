//! Whole values between the homeserver and local files, with their content hashes
//! checked.
//!
//! The server names every value by its BLAKE3 hash (standard base64 with padding): the
//! `ETag` of a GET or HEAD (quoted), `content_hash` in listings and events. A download
//! is streamed into a temporary file next to its destination while it is hashed, and
//! renamed into place only when the hash is the announced one, so a damaged or cut-off
//! transfer never replaces a good file. Uploads need no second check: every write
//! declares its body's SHA-256 (`Content-Digest`) and the server refuses a body that
//! does not match.

use std::io::Read;
use std::path::{Path, PathBuf};

use futures_util::StreamExt;
use homeserver_protocol::PublicKey;
use homeserver_protocol::event::encode_content_hash;
use tokio::io::{AsyncWrite, AsyncWriteExt};

use crate::client::{PkClient, Progress};
use crate::error::ClientError;
use crate::response::GetResponse;

/// Read size when hashing local files.
const CHUNK: usize = 64 * 1024;

/// The content hash inside an entity tag: `"abc="` and `W/"abc="` give `abc=`.
pub fn content_hash_of_etag(etag: &str) -> &str {
    let etag = etag.trim();
    etag.strip_prefix("W/").unwrap_or(etag).trim_matches('"')
}

/// The content hash (base64 BLAKE3, as the server writes it) of `bytes`.
pub fn content_hash_of(bytes: &[u8]) -> String {
    encode_content_hash(blake3::hash(bytes).as_bytes())
}

/// Hashes a value fed in pieces, giving its content hash as the server writes it.
#[derive(Default)]
pub struct ContentHasher(blake3::Hasher);

impl std::fmt::Debug for ContentHasher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ContentHasher")
    }
}

impl ContentHasher {
    pub fn update(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }

    /// The content hash of everything fed so far.
    pub fn finish(&self) -> String {
        encode_content_hash(self.0.finalize().as_bytes())
    }
}

/// The content hash and size of a local file, read in chunks (blocking; see
/// [`local_content_hash`] from async code).
pub fn file_content_hash(path: &Path) -> std::io::Result<(String, u64)> {
    let mut file = std::fs::File::open(path)?;
    let mut hasher = blake3::Hasher::new();
    let mut buf = vec![0u8; CHUNK];
    let mut len = 0u64;
    loop {
        let n = file.read(&mut buf)?;
        let Some(chunk) = buf.get(..n).filter(|c| !c.is_empty()) else {
            break;
        };
        hasher.update(chunk);
        len += n as u64;
    }
    Ok((encode_content_hash(hasher.finalize().as_bytes()), len))
}

/// [`file_content_hash`] on a blocking thread.
pub async fn local_content_hash(path: &Path) -> Result<(String, u64), ClientError> {
    let owned = path.to_owned();
    let shown = path.display().to_string();
    tokio::task::spawn_blocking(move || file_content_hash(&owned))
        .await
        .map_err(|e| ClientError::io(format!("cannot read {shown}"), std::io::Error::other(e)))?
        .map_err(|e| ClientError::io(format!("cannot read {shown}"), e))
}

/// A value that was read in full and whose hash was checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Downloaded {
    /// Bytes written.
    pub size: u64,
    /// The value's content hash (base64 BLAKE3).
    pub content_hash: String,
    /// Whether the server announced a hash to check against (it always does; a proxy
    /// that drops the `ETag` leaves nothing to compare).
    pub verified: bool,
}

/// How [`PkClient::download`] treats its destination.
#[derive(Clone, Default)]
pub struct DownloadOptions {
    /// Replace an existing file (otherwise [`ClientError::DestinationExists`]).
    pub overwrite: bool,
    /// Told the number of bytes received so far.
    pub progress: Option<Progress>,
}

impl std::fmt::Debug for DownloadOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DownloadOptions")
            .field("overwrite", &self.overwrite)
            .field("progress", &self.progress.is_some())
            .finish()
    }
}

impl GetResponse {
    /// Streams the body into `out`, hashing it on the way, and checks the hash against
    /// the `ETag` once the body is complete: [`ClientError::HashMismatch`] then means
    /// `out` got a damaged value (discard it).
    pub async fn write_verified<W>(
        self,
        path: &str,
        out: &mut W,
        progress: Option<&Progress>,
    ) -> Result<Downloaded, ClientError>
    where
        W: AsyncWrite + Unpin + ?Sized,
    {
        let expected = self
            .meta()
            .etag
            .as_deref()
            .map(|e| content_hash_of_etag(e).to_owned());
        let mut hasher = blake3::Hasher::new();
        let mut size = 0u64;
        let mut stream = self.into_stream();
        while let Some(chunk) = stream.next().await {
            let chunk = chunk?;
            hasher.update(&chunk);
            out.write_all(&chunk)
                .await
                .map_err(|e| ClientError::io("cannot write the value", e))?;
            size += chunk.len() as u64;
            if let Some(progress) = progress {
                progress(size);
            }
        }
        out.flush()
            .await
            .map_err(|e| ClientError::io("cannot write the value", e))?;
        let actual = encode_content_hash(hasher.finalize().as_bytes());
        match expected {
            Some(expected) if expected != actual => Err(ClientError::HashMismatch {
                path: path.to_owned(),
                expected,
                actual,
            }),
            expected => Ok(Downloaded {
                size,
                content_hash: actual,
                verified: expected.is_some(),
            }),
        }
    }
}

impl PkClient {
    /// `GET path` into the local file `dest`, verified against the content hash: the
    /// value goes to a temporary file in `dest`'s folder first and is renamed into place
    /// only when complete and intact. `host` as for [`get`](Self::get).
    ///
    /// The destination is checked before anything is sent, and again at the rename
    /// (another process may create it meanwhile); a failed read leaves it untouched.
    pub async fn download(
        &self,
        path: &str,
        host: Option<PublicKey>,
        dest: &Path,
        options: DownloadOptions,
    ) -> Result<Downloaded, ClientError> {
        if !options.overwrite && dest.exists() {
            return Err(ClientError::DestinationExists {
                path: dest.to_owned(),
            });
        }
        self.get(path, host)
            .await?
            .save_verified(path, dest, options)
            .await
    }
}

impl GetResponse {
    /// Saves the value to `dest` as [`PkClient::download`] does (temporary file, hash
    /// check, rename), for a GET whose headers the caller looked at first (e.g. for the
    /// size of a progress bar). `path` names the entry in errors.
    pub async fn save_verified(
        self,
        path: &str,
        dest: &Path,
        options: DownloadOptions,
    ) -> Result<Downloaded, ClientError> {
        let shown = dest.display().to_string();
        let dir = match dest.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_owned(),
            _ => PathBuf::from("."),
        };
        let temp = tempfile::Builder::new()
            .prefix(".pk-download-")
            .tempfile_in(&dir)
            .map_err(|e| ClientError::io(format!("cannot create a file next to {shown}"), e))?;
        let (std_file, temp_path) = temp.into_parts();
        let mut file = tokio::fs::File::from_std(std_file);
        // `temp_path` removes the temporary file when dropped, on every early return.
        let downloaded = self
            .write_verified(path, &mut file, options.progress.as_ref())
            .await?;
        file.sync_all()
            .await
            .map_err(|e| ClientError::io(format!("cannot write {shown}"), e))?;
        drop(file);
        let persisted = if options.overwrite {
            temp_path.persist(dest).map_err(|e| e.error)
        } else {
            temp_path.persist_noclobber(dest).map_err(|e| e.error)
        };
        persisted.map_err(|e| {
            if e.kind() == std::io::ErrorKind::AlreadyExists {
                ClientError::DestinationExists {
                    path: dest.to_owned(),
                }
            } else {
                ClientError::io(format!("cannot write {shown}"), e)
            }
        })?;
        Ok(downloaded)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn etags_give_their_hash() {
        assert_eq!(content_hash_of_etag("\"q83vEjRWeJA=\""), "q83vEjRWeJA=");
        assert_eq!(content_hash_of_etag("W/\"abc=\""), "abc=");
        assert_eq!(content_hash_of_etag("abc="), "abc=");
    }

    #[test]
    fn file_hash_is_the_servers_hash() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let data: Vec<u8> = (0..200_000u32).map(|i| (i % 253) as u8).collect();
        std::fs::write(&path, &data).unwrap();
        let (hash, len) = file_content_hash(&path).unwrap();
        assert_eq!(len, data.len() as u64);
        assert_eq!(hash, content_hash_of(&data));
        assert_eq!(
            hash,
            encode_content_hash(blake3::hash(&data).as_bytes()),
            "standard base64 of the BLAKE3 digest"
        );
        // The empty value.
        let empty = dir.path().join("e");
        std::fs::write(&empty, b"").unwrap();
        assert_eq!(
            file_content_hash(&empty).unwrap(),
            (content_hash_of(b""), 0)
        );
    }
}
