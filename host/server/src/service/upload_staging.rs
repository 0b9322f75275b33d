//! Memory for uploads whose signature is not proven yet.
//!
//! A signed PUT's signature covers its body. When the client declares the body's SHA-256
//! up front (`Content-Digest`), the signature is checked before any byte is read and the
//! body streams straight into the blob store. Without it, the body must be read before
//! anyone knows whether the signer is who the header says: such bodies are held in
//! memory, never written to disk, so a forger cannot make the server write. The memory
//! all of them may hold at once is bounded; past it, unproven uploads get 503 with a
//! message saying how to avoid the wait (declare the digest).

use std::sync::Arc;

use bytes::Bytes;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::ServiceError;

/// The shared budget of memory for unproven upload bodies.
#[derive(Clone)]
pub struct UploadStaging {
    budget: Arc<Semaphore>,
    total: usize,
}

impl UploadStaging {
    pub fn new(bytes: usize) -> Self {
        let total = bytes.min(Semaphore::MAX_PERMITS);
        Self {
            budget: Arc::new(Semaphore::new(total)),
            total,
        }
    }

    /// An empty staged body drawing on this budget.
    pub fn stage(&self) -> StagedBody {
        StagedBody {
            staging: self.clone(),
            chunks: Vec::new(),
            permit: None,
        }
    }

    /// Bytes in use now.
    pub fn in_use(&self) -> usize {
        self.total - self.budget.available_permits()
    }
}

/// An unproven body held in memory; its memory returns to the budget when dropped.
pub struct StagedBody {
    staging: UploadStaging,
    chunks: Vec<Bytes>,
    permit: Option<OwnedSemaphorePermit>,
}

impl StagedBody {
    pub fn push(&mut self, chunk: Bytes) -> Result<(), ServiceError> {
        let n = u32::try_from(chunk.len()).map_err(|_| busy())?;
        let more = self
            .staging
            .budget
            .clone()
            .try_acquire_many_owned(n)
            .map_err(|_| busy())?;
        match &mut self.permit {
            Some(held) => held.merge(more),
            None => self.permit = Some(more),
        }
        self.chunks.push(chunk);
        Ok(())
    }

    /// The chunks, in order; the memory stays reserved until `self` is dropped.
    pub fn chunks(&self) -> &[Bytes] {
        &self.chunks
    }
}

fn busy() -> ServiceError {
    ServiceError::Busy(
        "too many uploads are waiting for their signature to be checked; retry, or declare \
         the body's SHA-256 in a Content-Digest header (sha-256=:<base64>:) so the upload \
         streams without waiting"
            .into(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_bounds_all_staged_bodies_together_and_returns_on_drop() {
        let staging = UploadStaging::new(10);
        let mut a = staging.stage();
        a.push(Bytes::from_static(b"123456")).unwrap();
        let mut b = staging.stage();
        assert!(matches!(
            b.push(Bytes::from_static(b"12345")),
            Err(ServiceError::Busy(_))
        ));
        b.push(Bytes::from_static(b"1234")).unwrap();
        assert_eq!(staging.in_use(), 10);
        drop(a);
        assert_eq!(staging.in_use(), 4);
        assert_eq!(b.chunks().len(), 1);
    }
}
