//! What the public may see of the paths a listing or an event stream would show: a
//! handle on the capability policy's public answers ([`PublicFilter`]), handed by
//! access control to the services that page through paths, so they leave hidden paths
//! out *before* they count a page or take its cursor (a cursor is a path, and a page
//! filtered afterwards would name a hidden one).

use std::sync::Arc;

use futures_util::future::BoxFuture;

use super::ServiceError;

type Ask = dyn Fn(Vec<(String, String)>) -> BoxFuture<'static, Result<Vec<bool>, ServiceError>>
    + Send
    + Sync;

/// Answers, for `(user, path)` pairs, whether the public may read each (asked as a GET;
/// a path ending in `/` as a listing), in one visit to the policy per batch.
#[derive(Clone)]
pub struct PublicFilter {
    ask: Arc<Ask>,
    generation: Arc<dyn Fn() -> u64 + Send + Sync>,
}

impl PublicFilter {
    /// `generation` names the policy that answers now (0: none): an answer remembered
    /// with it holds while it stays the same.
    pub fn new(ask: Arc<Ask>, generation: Arc<dyn Fn() -> u64 + Send + Sync>) -> Self {
        Self { ask, generation }
    }

    /// Which policy answers now (0: none; then nothing is to be remembered).
    pub fn generation(&self) -> u64 {
        (self.generation)()
    }

    /// One answer per item, in order.
    pub async fn visible(&self, items: Vec<(String, String)>) -> Result<Vec<bool>, ServiceError> {
        if items.is_empty() {
            return Ok(Vec::new());
        }
        let count = items.len();
        let answers = (self.ask)(items).await?;
        if answers.len() != count {
            return Err(ServiceError::Internal(format!(
                "the policy answered {} of {count} questions",
                answers.len()
            )));
        }
        Ok(answers)
    }
}

impl std::fmt::Debug for PublicFilter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PublicFilter")
    }
}
