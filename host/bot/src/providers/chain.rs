//! Retries and fallbacks around providers: each provider of a chain is tried with
//! `max_retries` retries (a 429 after its `Retry-After`, a 5xx or no answer after a
//! growing pause: 0.5 s, 1 s, 2 s...), then the next one. A 4xx other than 429, or an
//! answer that is not the API's format, goes to the next provider at once (it will not
//! get better by asking again), as does a `Retry-After` longer than `max_wait`. Every
//! call is reported to the [`CallLog`] (metrics and health), each under the name of
//! the provider that made it.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use super::{AiModel, ChatAnswer, ChatMessage, ProviderError, SearchApi, SearchResult};

/// Where calls are reported: (provider, the error if it failed, tokens used).
pub type CallLog = Arc<dyn Fn(&str, Option<&ProviderError>, u64) + Send + Sync>;

#[derive(Debug, Clone, Copy)]
pub struct Retry {
    pub retries: u32,
    pub max_wait: Duration,
    /// The first pause after a failure (doubling each time).
    pub base: Duration,
}

impl Retry {
    /// How long to wait before trying `error`'s provider again, or None to move on.
    fn wait(&self, attempt: u32, error: &ProviderError) -> Option<Duration> {
        if attempt >= self.retries {
            return None;
        }
        let backoff = self
            .base
            .saturating_mul(1 << attempt.min(16))
            .min(self.max_wait);
        match error {
            ProviderError::RateLimited {
                retry_after_secs, ..
            } => {
                let asked = Duration::from_secs(*retry_after_secs);
                (asked <= self.max_wait).then(|| asked.max(backoff))
            }
            ProviderError::Failed { .. } => Some(backoff),
            ProviderError::Invalid { .. } => None,
        }
    }
}

/// Tries `call` on each member in turn, with retries. If all fail: the last error
/// that may pass, if any did (an outage of the first provider is worth trying again
/// later even when a fallback then refuses), else the last error.
async fn first_success<M: ?Sized, T, F>(
    members: &[Arc<M>],
    retry: Retry,
    log: &CallLog,
    name: impl Fn(&M) -> &str,
    tokens: impl Fn(&T) -> u64,
    call: F,
) -> Result<(T, String), ProviderError>
where
    F: for<'a> Fn(&'a M) -> futures_util::future::BoxFuture<'a, Result<T, ProviderError>>,
{
    let mut last = None;
    let mut last_transient = None;
    for member in members {
        let provider = name(member).to_owned();
        let mut attempt = 0;
        loop {
            match call(member).await {
                Ok(answer) => {
                    log(&provider, None, tokens(&answer));
                    return Ok((answer, provider));
                }
                Err(e) => {
                    log(&provider, Some(&e), 0);
                    let wait = retry.wait(attempt, &e);
                    tracing::warn!(
                        aiProvider = %provider,
                        attempt = attempt + 1,
                        retryInMs = wait.map(|w| w.as_millis() as u64),
                        error = %e,
                        "provider call failed"
                    );
                    if e.is_transient() {
                        last_transient = Some(e);
                    } else {
                        last = Some(e);
                    }
                    match wait {
                        Some(wait) => tokio::time::sleep(wait).await,
                        None => break,
                    }
                    attempt += 1;
                }
            }
        }
    }
    Err(last_transient
        .or(last)
        .unwrap_or_else(|| ProviderError::Failed {
            provider: "none".into(),
            message: "no provider configured".into(),
        }))
}

/// AI models tried in order.
pub struct AiChain {
    members: Vec<Arc<dyn AiModel>>,
    retry: Retry,
    log: CallLog,
}

impl AiChain {
    pub fn new(members: Vec<Arc<dyn AiModel>>, retry: Retry, log: CallLog) -> Self {
        Self {
            members,
            retry,
            log,
        }
    }
}

#[async_trait]
impl AiModel for AiChain {
    /// The first provider's name (what health and logs show as the AI provider).
    fn name(&self) -> &str {
        self.members.first().map_or("none", |m| m.name())
    }

    async fn complete(
        &self,
        messages: &[ChatMessage],
        max_tokens: u32,
        json: Option<&'static super::AnswerSchema>,
    ) -> Result<ChatAnswer, ProviderError> {
        let (mut answer, provider) = first_success(
            &self.members,
            self.retry,
            &self.log,
            |m| m.name(),
            |a: &ChatAnswer| a.tokens,
            |m| Box::pin(m.complete(messages, max_tokens, json)),
        )
        .await?;
        answer.provider = provider;
        Ok(answer)
    }
}

/// Search APIs tried in order.
pub struct SearchChain {
    members: Vec<Arc<dyn SearchApi>>,
    retry: Retry,
    log: CallLog,
}

impl SearchChain {
    pub fn new(members: Vec<Arc<dyn SearchApi>>, retry: Retry, log: CallLog) -> Self {
        Self {
            members,
            retry,
            log,
        }
    }
}

#[async_trait]
impl SearchApi for SearchChain {
    fn name(&self) -> &str {
        self.members.first().map_or("none", |m| m.name())
    }

    async fn search(&self, query: &str, count: usize) -> Result<Vec<SearchResult>, ProviderError> {
        let (results, _) = first_success(
            &self.members,
            self.retry,
            &self.log,
            |m| m.name(),
            |_: &Vec<SearchResult>| 0,
            |m| Box::pin(m.search(query, count)),
        )
        .await?;
        Ok(results)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;

    /// A model that fails with the given errors, then answers.
    struct Scripted {
        name: String,
        errors: Mutex<Vec<ProviderError>>,
        calls: AtomicU32,
    }

    #[async_trait]
    impl AiModel for Scripted {
        fn name(&self) -> &str {
            &self.name
        }

        async fn complete(
            &self,
            _: &[ChatMessage],
            _: u32,
            _: Option<&'static crate::providers::AnswerSchema>,
        ) -> Result<ChatAnswer, ProviderError> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            match self.errors.lock().unwrap().pop() {
                Some(e) => Err(e),
                None => Ok(ChatAnswer {
                    text: format!("from {}", self.name),
                    tokens: 7,
                    provider: String::new(),
                }),
            }
        }
    }

    fn model(name: &str, errors: Vec<ProviderError>) -> Arc<Scripted> {
        Arc::new(Scripted {
            name: name.into(),
            errors: Mutex::new(errors),
            calls: AtomicU32::new(0),
        })
    }

    fn failed(p: &str) -> ProviderError {
        ProviderError::Failed {
            provider: p.into(),
            message: "500".into(),
        }
    }

    const RETRY: Retry = Retry {
        retries: 2,
        max_wait: Duration::from_secs(5),
        base: Duration::from_millis(1),
    };

    fn log() -> (CallLog, Arc<Mutex<Vec<String>>>) {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s = seen.clone();
        let log: CallLog = Arc::new(move |p: &str, e: Option<&ProviderError>, t: u64| {
            s.lock().unwrap().push(format!(
                "{p}:{}:{t}",
                if e.is_some() { "error" } else { "ok" }
            ));
        });
        (log, seen)
    }

    #[tokio::test]
    async fn retries_then_answers_and_every_call_is_logged() {
        let a = model("a", vec![failed("a"), failed("a")]);
        let (log, seen) = log();
        let chain = AiChain::new(vec![a.clone()], RETRY, log);
        let answer = chain.complete(&[], 10, None).await.unwrap();
        assert_eq!(
            (answer.text.as_str(), answer.provider.as_str()),
            ("from a", "a")
        );
        assert_eq!(*seen.lock().unwrap(), ["a:error:0", "a:error:0", "a:ok:7"]);
    }

    #[tokio::test]
    async fn falls_back_after_the_retries_and_at_once_on_an_invalid_answer() {
        let a = model("a", vec![failed("a"), failed("a"), failed("a")]);
        let b = model(
            "b",
            vec![ProviderError::Invalid {
                provider: "b".into(),
                message: "not JSON".into(),
            }],
        );
        let c = model("c", vec![]);
        let (log, seen) = log();
        let chain = AiChain::new(vec![a.clone(), b.clone(), c.clone()], RETRY, log);
        let answer = chain.complete(&[], 10, None).await.unwrap();
        assert_eq!(answer.provider, "c");
        assert_eq!(a.calls.load(Ordering::SeqCst), 3, "1 + 2 retries");
        assert_eq!(
            b.calls.load(Ordering::SeqCst),
            1,
            "an invalid answer is not asked again"
        );
        assert_eq!(seen.lock().unwrap().last().unwrap(), "c:ok:7");
    }

    #[tokio::test]
    async fn an_outage_then_a_refusing_fallback_is_still_a_failure_that_may_pass() {
        let a = model("a", vec![failed("a"), failed("a"), failed("a")]);
        let b = model(
            "b",
            vec![ProviderError::Invalid {
                provider: "b".into(),
                message: "404 model not found".into(),
            }],
        );
        let (log, _) = log();
        let chain = AiChain::new(vec![a, b], RETRY, log);
        let e = chain.complete(&[], 10, None).await.unwrap_err();
        assert!(e.is_transient(), "{e}");
        assert!(e.to_string().starts_with("a failed"), "{e}");
    }

    #[tokio::test]
    async fn a_long_retry_after_moves_on_and_all_failing_gives_the_last_error() {
        let a = model(
            "a",
            vec![ProviderError::RateLimited {
                provider: "a".into(),
                retry_after_secs: 3600,
            }],
        );
        let b = model("b", vec![failed("b"), failed("b"), failed("b")]);
        let (log, _) = log();
        let chain = AiChain::new(vec![a.clone(), b], RETRY, log);
        let e = chain.complete(&[], 10, None).await.unwrap_err();
        assert!(e.to_string().starts_with("b failed"), "{e}");
        assert!(e.is_transient());
        assert_eq!(a.calls.load(Ordering::SeqCst), 1);
    }
}
