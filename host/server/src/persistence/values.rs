//! A value's bytes wherever they live ([`Stored`]): written while a body streams in, and
//! read back.
//!
//! Why small values live in their entry's row: a value in the blob store costs a file,
//! its fsync and its folder's fsync on every PUT (local disk), or a request (S3), on top
//! of the metadata commit; a value in the row rides on the commit that a PUT makes
//! anyway, which group commit shares between concurrent writes. Large values stay in the
//! blob store, where they stream and do not bloat the database.

use bytes::{Bytes, BytesMut};
use futures_util::StreamExt;
use futures_util::stream::BoxStream;

use super::blobs::{BlobError, BlobStore, BlobWriter};
use super::metadata::Stored;

/// Largest `storage.inline_max_bytes` accepted: a row is read whole with its entry.
pub const MAX_INLINE_BYTES: u64 = 1024 * 1024;

/// Receives a new value's bytes: in memory while they fit under the inline limit, in a
/// new blob of the user's from the first byte past it (or from the start, when the body
/// declared a length over the limit). Finish it to learn where the value went, or abort
/// it to drop what was written.
pub struct ValueWriter {
    blobs: BlobStore,
    user: String,
    inline_max: u64,
    state: State,
}

enum State {
    Memory(BytesMut),
    // Boxed: a blob's writer is large beside the few bytes of a small value.
    Blob {
        key: String,
        writer: Box<BlobWriter>,
    },
}

impl ValueWriter {
    /// `declared_len`: the body's length when it is known beforehand.
    pub fn new(blobs: &BlobStore, user: &str, inline_max: u64, declared_len: Option<u64>) -> Self {
        let state = match declared_len {
            // 0: every value in the blob store, the empty one too.
            _ if inline_max == 0 => new_blob(blobs, user),
            Some(len) if len > inline_max => new_blob(blobs, user),
            // At most the limit is held, whatever the body declared.
            len => State::Memory(BytesMut::with_capacity(
                usize::try_from(len.unwrap_or(0).min(inline_max)).unwrap_or(0),
            )),
        };
        Self {
            blobs: blobs.clone(),
            user: user.to_owned(),
            inline_max,
            state,
        }
    }

    pub async fn write(&mut self, chunk: Bytes) -> Result<(), BlobError> {
        match &mut self.state {
            State::Blob { writer, .. } => writer.write(chunk).await,
            State::Memory(held) if (held.len() + chunk.len()) as u64 <= self.inline_max => {
                held.extend_from_slice(&chunk);
                Ok(())
            }
            State::Memory(held) => {
                // Past the limit: what was held goes first into a new blob.
                let held = std::mem::take(held).freeze();
                self.state = new_blob(&self.blobs, &self.user);
                let State::Blob { writer, .. } = &mut self.state else {
                    unreachable!("the state was just set to a blob")
                };
                if !held.is_empty() {
                    writer.write(held).await?;
                }
                writer.write(chunk).await
            }
        }
    }

    /// Completes the value: a blob is durable once this returns; an inline value
    /// becomes durable with the commit of its entry.
    pub async fn finish(self) -> Result<Stored, BlobError> {
        match self.state {
            State::Memory(held) => Ok(Stored::Inline(held.freeze())),
            State::Blob { key, writer } => {
                writer.finish().await?;
                Ok(Stored::Blob(key))
            }
        }
    }

    pub async fn abort(self) {
        if let State::Blob { writer, .. } = self.state {
            writer.abort().await;
        }
    }
}

fn new_blob(blobs: &BlobStore, user: &str) -> State {
    let key = BlobStore::new_key(user);
    let writer = Box::new(blobs.writer(&key));
    State::Blob { key, writer }
}

/// A value's bytes as read: whole when they were in memory already (an inline value),
/// otherwise streamed.
pub enum ValueBytes {
    /// All of it; a response can send it as one body without a stream around it.
    Whole(Bytes),
    Stream(BoxStream<'static, Result<Bytes, BlobError>>),
}

impl ValueBytes {
    pub fn into_stream(self) -> BoxStream<'static, Result<Bytes, BlobError>> {
        match self {
            ValueBytes::Whole(bytes) => {
                futures_util::stream::once(async move { Ok(bytes) }).boxed()
            }
            ValueBytes::Stream(stream) => stream,
        }
    }
}

/// Opens a value's bytes; `size` is the size its entry records.
pub async fn read_value(
    blobs: &BlobStore,
    stored: &Stored,
    size: u64,
) -> Result<ValueBytes, BlobError> {
    match stored {
        Stored::Blob(key) => blobs.get(key, size).await.map(ValueBytes::Stream),
        Stored::Inline(bytes) if bytes.len() as u64 == size => Ok(ValueBytes::Whole(bytes.clone())),
        Stored::Inline(bytes) => Err(BlobError::Damaged(format!(
            "an inline value has {} bytes, its entry says {size}",
            bytes.len()
        ))),
    }
}

#[cfg(test)]
mod tests {
    use futures_util::TryStreamExt;

    use super::*;

    async fn store() -> (tempfile::TempDir, BlobStore) {
        let dir = tempfile::tempdir().expect("temp dir");
        let url = crate::persistence::BlobsUrl::File(dir.path().to_owned());
        let blobs =
            BlobStore::open(&url, &Default::default(), &Default::default()).expect("blob store");
        (dir, blobs)
    }

    async fn write(blobs: &BlobStore, chunks: &[&[u8]], declared: Option<u64>) -> Stored {
        let mut writer = ValueWriter::new(blobs, "u", 8, declared);
        for chunk in chunks {
            writer
                .write(Bytes::copy_from_slice(chunk))
                .await
                .expect("write");
        }
        writer.finish().await.expect("finish")
    }

    async fn read(blobs: &BlobStore, stored: &Stored, size: u64) -> Vec<u8> {
        let chunks: Vec<Bytes> = read_value(blobs, stored, size)
            .await
            .expect("open")
            .into_stream()
            .try_collect()
            .await
            .expect("read");
        chunks.concat()
    }

    #[tokio::test]
    async fn values_up_to_the_limit_stay_in_memory_and_larger_ones_go_to_a_blob() {
        let (_dir, blobs) = store().await;
        // Up to the limit, in pieces, with or without a declared length: inline.
        let small = write(&blobs, &[b"abcd", b"efgh"], None).await;
        assert_eq!(small, Stored::Inline(Bytes::from_static(b"abcdefgh")));
        assert_eq!(
            write(&blobs, &[], Some(0)).await,
            Stored::Inline(Bytes::new())
        );
        // One byte over, found while streaming: what was held goes first into the blob.
        let spilled = write(&blobs, &[b"abcd", b"efgh", b"i"], None).await;
        let key = spilled.blob_key().expect("a blob").to_owned();
        assert_eq!(read(&blobs, &spilled, 9).await, b"abcdefghi");
        assert_eq!(blobs.size_of(&key).await.expect("head"), Some(9));
        // Declared over the limit: a blob from the first byte.
        let declared = write(&blobs, &[b"0123456789"], Some(10)).await;
        assert!(declared.blob_key().is_some());
        assert_eq!(read(&blobs, &small, 8).await, b"abcdefgh");
    }

    #[tokio::test]
    async fn an_inline_value_of_the_wrong_size_is_an_error_not_a_short_body() {
        let (_dir, blobs) = store().await;
        let stored = Stored::Inline(Bytes::from_static(b"abc"));
        let error = read_value(&blobs, &stored, 4).await.err().expect("refused");
        assert!(error.to_string().contains("3 bytes"), "{error}");
    }

    #[tokio::test]
    async fn an_aborted_spill_leaves_no_blob() {
        let (_dir, blobs) = store().await;
        let mut writer = ValueWriter::new(&blobs, "u", 2, None);
        writer
            .write(Bytes::from_static(b"abc"))
            .await
            .expect("write");
        writer.abort().await;
        let left: Vec<_> = blobs.list(None).try_collect().await.expect("list");
        assert!(left.is_empty(), "{left:?}");
    }
}
