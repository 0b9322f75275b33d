//! Web search APIs, each a base URL and a key:
//! - Brave: `GET {base}/res/v1/web/search?q=&count=` with `X-Subscription-Token`;
//!   answer `{"web": {"results": [{"title", "url", "description"}]}}`.
//! - Tavily: `POST {base}/search` `{"query", "max_results"}` with `Authorization:
//!   Bearer`; answer `{"results": [{"title", "url", "content"}]}`.
//! - SearXNG: `GET {base}/search?q=&format=json`; answer `{"results": [{"title", "url",
//!   "content"}]}`.

use std::time::Duration;

use async_trait::async_trait;
use reqwest::StatusCode;
use serde::Deserialize;

use super::{ProviderError, SearchApi, SearchResult};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SearchKind {
    Brave,
    Tavily,
    Searxng,
}

pub struct WebSearch {
    kind: SearchKind,
    http: reqwest::Client,
    base: String,
    api_key: String,
}

#[derive(Debug, Deserialize)]
struct BraveAnswer {
    #[serde(default)]
    web: Option<BraveWeb>,
}

#[derive(Debug, Deserialize)]
struct BraveWeb {
    #[serde(default)]
    results: Vec<BraveResult>,
}

#[derive(Debug, Deserialize)]
struct BraveResult {
    title: String,
    url: String,
    #[serde(default)]
    description: String,
}

/// Tavily's and SearXNG's shape.
#[derive(Debug, Deserialize)]
struct ResultsAnswer {
    #[serde(default)]
    results: Vec<ContentResult>,
}

#[derive(Debug, Deserialize)]
struct ContentResult {
    #[serde(default)]
    title: String,
    url: String,
    #[serde(default)]
    content: String,
}

impl WebSearch {
    /// `kind` is "brave", "tavily" or "searxng"; an empty `base` is the provider's own.
    pub fn new(kind: &str, base: &str, api_key: &str, timeout: Duration) -> Option<Self> {
        let (kind, default_base) = match kind {
            "brave" => (SearchKind::Brave, "https://api.search.brave.com"),
            "tavily" => (SearchKind::Tavily, "https://api.tavily.com"),
            "searxng" => (SearchKind::Searxng, ""),
            _ => return None,
        };
        let base = if base.is_empty() { default_base } else { base };
        Some(Self {
            kind,
            http: reqwest::Client::builder()
                .timeout(timeout)
                .build()
                .unwrap_or_default(),
            base: base.trim_end_matches('/').to_owned(),
            api_key: api_key.to_owned(),
        })
    }

    fn failed(&self, message: impl Into<String>) -> ProviderError {
        ProviderError::Failed {
            provider: self.name().to_owned(),
            message: message.into(),
        }
    }
}

#[async_trait]
impl SearchApi for WebSearch {
    fn name(&self) -> &str {
        match self.kind {
            SearchKind::Brave => "brave",
            SearchKind::Tavily => "tavily",
            SearchKind::Searxng => "searxng",
        }
    }

    async fn search(&self, query: &str, count: usize) -> Result<Vec<SearchResult>, ProviderError> {
        let request = match self.kind {
            SearchKind::Brave => self
                .http
                .get(format!("{}/res/v1/web/search", self.base))
                .query(&[("q", query), ("count", &count.to_string())])
                .header("X-Subscription-Token", &self.api_key)
                .header("Accept", "application/json"),
            SearchKind::Tavily => self
                .http
                .post(format!("{}/search", self.base))
                .bearer_auth(&self.api_key)
                .json(&serde_json::json!({"query": query, "max_results": count})),
            SearchKind::Searxng => self
                .http
                .get(format!("{}/search", self.base))
                .query(&[("q", query), ("format", "json")]),
        };
        let response = request
            .send()
            .await
            .map_err(|e| self.failed(e.to_string()))?;
        match response.status() {
            StatusCode::TOO_MANY_REQUESTS => {
                let retry_after_secs = super::retry_after_secs(response.headers()).unwrap_or(10);
                return Err(ProviderError::RateLimited {
                    provider: self.name().to_owned(),
                    retry_after_secs,
                });
            }
            status if status.is_client_error() && status != StatusCode::REQUEST_TIMEOUT => {
                return Err(ProviderError::Invalid {
                    provider: self.name().to_owned(),
                    message: status.to_string(),
                });
            }
            status if !status.is_success() => return Err(self.failed(status.to_string())),
            _ => {}
        }
        let body = response
            .bytes()
            .await
            .map_err(|e| self.failed(e.to_string()))?;
        let invalid = |e: serde_json::Error| ProviderError::Invalid {
            provider: self.name().to_owned(),
            message: e.to_string(),
        };
        let mut results: Vec<SearchResult> = match self.kind {
            SearchKind::Brave => serde_json::from_slice::<BraveAnswer>(&body)
                .map_err(invalid)?
                .web
                .map(|w| w.results)
                .unwrap_or_default()
                .into_iter()
                .map(|r| SearchResult {
                    title: r.title,
                    url: r.url,
                    snippet: r.description,
                })
                .collect(),
            SearchKind::Tavily | SearchKind::Searxng => {
                serde_json::from_slice::<ResultsAnswer>(&body)
                    .map_err(invalid)?
                    .results
                    .into_iter()
                    .map(|r| SearchResult {
                        title: r.title,
                        url: r.url,
                        snippet: r.content,
                    })
                    .collect()
            }
        };
        results.retain(|r| r.url.starts_with("http://") || r.url.starts_with("https://"));
        results.truncate(count);
        Ok(results)
    }
}
