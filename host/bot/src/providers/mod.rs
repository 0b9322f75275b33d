//! The outside services the workers and the router call: an AI model ([`AiModel`],
//! OpenAI-compatible chat completions in [`openai`]) and web search ([`SearchApi`],
//! Brave, Tavily and SearXNG in [`search`]); [`local`] is what the bot does with
//! neither (an extractive summary, sentence splitting).

pub mod local;
pub mod openai;
pub mod search;

use async_trait::async_trait;

/// One chat turn.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChatMessage {
    pub role: &'static str,
    pub content: String,
}

impl ChatMessage {
    pub fn system(content: impl Into<String>) -> Self {
        Self {
            role: "system",
            content: content.into(),
        }
    }

    pub fn user(content: impl Into<String>) -> Self {
        Self {
            role: "user",
            content: content.into(),
        }
    }
}

/// What the model answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChatAnswer {
    pub text: String,
    /// Tokens the call used (prompt and answer), from the API's `usage`.
    pub tokens: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum ProviderError {
    #[error("{provider} is rate limiting (retry in {retry_after_secs} s)")]
    RateLimited {
        provider: String,
        retry_after_secs: u64,
    },
    #[error("{provider} failed: {message}")]
    Failed { provider: String, message: String },
    #[error("{provider} answered something unusable: {message}")]
    Invalid { provider: String, message: String },
}

/// A chat model.
#[async_trait]
pub trait AiModel: Send + Sync {
    /// The provider's name, for metrics and logs (`aiProvider`).
    fn name(&self) -> &str;

    /// One completion; `json` asks for a JSON object answer.
    async fn complete(
        &self,
        messages: &[ChatMessage],
        max_tokens: u32,
        json: bool,
    ) -> Result<ChatAnswer, ProviderError>;
}

/// One web search result.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SearchResult {
    pub title: String,
    pub url: String,
    pub snippet: String,
}

/// A web search API.
#[async_trait]
pub trait SearchApi: Send + Sync {
    fn name(&self) -> &str;

    async fn search(&self, query: &str, count: usize) -> Result<Vec<SearchResult>, ProviderError>;
}

/// Text from users inside a prompt: fenced, so the model reads it as data, never as
/// instructions (a fence inside the text is defused).
pub fn fenced(label: &str, text: &str) -> String {
    let text = text.replace("```", "'''");
    format!("<<<{label}\n{text}\n{label}>>>")
}
