//! Buffers for reading and writing local blobs, used again and again.
//!
//! A large GET reads its file in chunks of [`CHUNK_BYTES`] that become the response's
//! body frames. A fresh allocation of that size is fresh pages from the kernel: each
//! 4 KiB page faulted in and zeroed on first touch, then given back when hyper drops the
//! frame, for every chunk of every response (most of the server's own CPU in a 1 MiB
//! GET, measured in docs/BENCHMARKS.md). A chunk here is `Bytes` whose owner hands its
//! buffer back to a small pool when the last reference goes, so the next read lands in
//! pages already mapped. The pool keeps at most [`KEPT`] buffers (8.1 MiB): memory stays
//! bounded whatever the number of readers; past that, buffers are freed as before. Writes
//! of large blobs fill the same buffers before they go to the disk (`direct_writes`).

use std::sync::{Arc, Mutex};

use bytes::Bytes;

/// Bytes read from a local blob at a time when streaming it out.
pub const CHUNK_BYTES: usize = 256 * 1024;
/// A buffer's capacity: a chunk, and room to start it at a 4 KiB boundary (what a
/// direct write of a blob needs, `direct_writes`; malloc's large blocks start 16 bytes
/// past one).
pub const BUFFER_BYTES: usize = CHUNK_BYTES + 4096;
/// Buffers the pool keeps, at most (32 of 260 KiB: 8.1 MiB).
const KEPT: usize = 32;

/// The free buffers, each of capacity [`BUFFER_BYTES`].
#[derive(Default)]
pub struct ReadBuffers {
    free: Mutex<Vec<Vec<u8>>>,
}

impl ReadBuffers {
    /// The process's pool (blob stores of one process share it).
    pub fn shared() -> Arc<Self> {
        static SHARED: std::sync::OnceLock<Arc<ReadBuffers>> = std::sync::OnceLock::new();
        SHARED.get_or_init(Arc::default).clone()
    }

    /// An empty buffer of capacity [`BUFFER_BYTES`]: a kept one when there is one.
    pub fn take(&self) -> Vec<u8> {
        let kept = self.free.lock().unwrap_or_else(|e| e.into_inner()).pop();
        kept.unwrap_or_else(|| Vec::with_capacity(BUFFER_BYTES))
    }

    /// `buffer`'s bytes as `Bytes` that give the buffer back to the pool when dropped.
    pub fn freeze(self: &Arc<Self>, buffer: Vec<u8>) -> Bytes {
        Bytes::from_owner(Chunk {
            buffer,
            pool: self.clone(),
        })
    }

    /// Keeps `buffer` for a later [`ReadBuffers::take`] (if it is of the pool's size and
    /// the pool is not full).
    pub fn give_back(&self, mut buffer: Vec<u8>) {
        if buffer.capacity() != BUFFER_BYTES {
            return; // grown or shrunk by a read: not ours to keep
        }
        buffer.clear();
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        if free.len() < KEPT {
            free.push(buffer);
        }
    }

    /// Buffers kept now.
    #[cfg(test)]
    fn kept(&self) -> usize {
        self.free.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

/// A chunk's owner: its buffer goes back to the pool with the last `Bytes` of it.
struct Chunk {
    buffer: Vec<u8>,
    pool: Arc<ReadBuffers>,
}

impl AsRef<[u8]> for Chunk {
    fn as_ref(&self) -> &[u8] {
        &self.buffer
    }
}

impl Drop for Chunk {
    fn drop(&mut self) {
        self.pool.give_back(std::mem::take(&mut self.buffer));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chunk_gives_its_buffer_back_when_its_last_bytes_go() {
        let pool = Arc::new(ReadBuffers::default());
        let mut buffer = pool.take();
        buffer.extend_from_slice(b"value");
        let address = buffer.as_ptr();
        let chunk = pool.freeze(buffer);
        let slice = chunk.slice(1..3);
        drop(chunk);
        assert_eq!(pool.kept(), 0, "a slice still holds it");
        assert_eq!(&slice[..], b"al");
        drop(slice);
        assert_eq!(pool.kept(), 1);
        let again = pool.take();
        assert_eq!(again.as_ptr(), address, "the same memory is read into next");
        assert!(again.is_empty() && again.capacity() == BUFFER_BYTES);
    }

    #[test]
    fn a_whole_chunk_read_leaves_the_buffer_its_size() {
        // How blobs reads a chunk: `read_to_end` of at most CHUNK_BYTES must not grow
        // the buffer (a grown one would not go back to the pool).
        use std::io::Read as _;
        let pool = Arc::new(ReadBuffers::default());
        let source = vec![7u8; 2 * CHUNK_BYTES];
        for want in [CHUNK_BYTES, 100] {
            let mut buffer = pool.take();
            let read = (&source[..])
                .take(want as u64)
                .read_to_end(&mut buffer)
                .expect("read");
            assert_eq!(read, want);
            assert_eq!(buffer.capacity(), BUFFER_BYTES);
            drop(pool.freeze(buffer));
            assert_eq!(pool.kept(), 1);
        }
    }

    #[test]
    fn the_pool_keeps_a_bounded_number_of_buffers() {
        let pool = Arc::new(ReadBuffers::default());
        let chunks: Vec<Bytes> = (0..KEPT + 10).map(|_| pool.freeze(pool.take())).collect();
        drop(chunks);
        assert_eq!(pool.kept(), KEPT);
        // A buffer of another size (a read made it grow) is not kept.
        let mut grown = pool.take();
        grown.reserve(BUFFER_BYTES + 1);
        drop(pool.freeze(grown));
        assert_eq!(pool.kept(), KEPT - 1);
    }
}
