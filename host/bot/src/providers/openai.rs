//! An OpenAI-compatible chat-completions client (`POST {base}/chat/completions`):
//! OpenAI, Groq, OpenRouter, Ollama, vLLM and llama.cpp all speak it. Request:
//! `{"model", "messages": [{"role", "content"}], "max_tokens", "temperature",
//! "response_format"?}`; answer: `{"choices": [{"message": {"content"}}], "usage":
//! {"total_tokens"}}`. A JSON answer is asked for with `{"type": "json_object"}` (what
//! every one of them understands), or with `{"type": "json_schema", "json_schema":
//! {"name", "schema"}}` when the operator sets `ai.json_mode = "json_schema"` (the
//! provider then constrains its decoding to the schema).

use std::time::Duration;

use async_trait::async_trait;
use reqwest::StatusCode;
use serde::Deserialize;
use serde_json::json;

use super::{AiModel, ChatAnswer, ChatMessage, ProviderError};

pub struct OpenAiCompatible {
    http: reqwest::Client,
    endpoint: String,
    api_key: String,
    model: String,
    name: String,
    /// Send the answer's JSON Schema (`json_schema`) rather than `json_object`.
    send_schema: bool,
}

#[derive(Debug, Deserialize)]
struct Completion {
    choices: Vec<Choice>,
    #[serde(default)]
    usage: Option<Usage>,
}

#[derive(Debug, Deserialize)]
struct Choice {
    message: AnswerMessage,
}

#[derive(Debug, Deserialize)]
struct AnswerMessage {
    #[serde(default)]
    content: Option<String>,
}

#[derive(Debug, Deserialize)]
struct Usage {
    #[serde(default)]
    total_tokens: u64,
}

impl OpenAiCompatible {
    /// A client of the API at `base` (e.g. `https://api.openai.com/v1`).
    pub fn new(base: &str, api_key: &str, model: &str, timeout: Duration) -> Self {
        let host = url::Url::parse(base)
            .ok()
            .and_then(|u| u.host_str().map(str::to_owned))
            .unwrap_or_else(|| "openai-compatible".into());
        Self {
            http: reqwest::Client::builder()
                .timeout(timeout)
                .build()
                .unwrap_or_default(),
            endpoint: format!("{}/chat/completions", base.trim_end_matches('/')),
            api_key: api_key.to_owned(),
            model: model.to_owned(),
            name: host,
            send_schema: false,
        }
    }

    /// Asks for JSON answers with their schema (`json_schema`) rather than
    /// `json_object`.
    pub fn sending_schemas(mut self, yes: bool) -> Self {
        self.send_schema = yes;
        self
    }

    fn failed(&self, message: impl Into<String>) -> ProviderError {
        ProviderError::Failed {
            provider: self.name.clone(),
            message: message.into(),
        }
    }
}

#[async_trait]
impl AiModel for OpenAiCompatible {
    fn name(&self) -> &str {
        &self.name
    }

    async fn complete(
        &self,
        messages: &[ChatMessage],
        max_tokens: u32,
        json: Option<&'static super::AnswerSchema>,
    ) -> Result<ChatAnswer, ProviderError> {
        let mut body = json!({
            "model": self.model,
            "messages": messages
                .iter()
                .map(|m| json!({"role": m.role, "content": m.content}))
                .collect::<Vec<_>>(),
            "max_tokens": max_tokens,
            "temperature": 0.2,
        });
        match json {
            Some(schema) if self.send_schema => {
                body["response_format"] = json!({
                    "type": "json_schema",
                    "json_schema": {"name": schema.name, "schema": *schema.schema, "strict": false},
                });
            }
            Some(_) => body["response_format"] = json!({"type": "json_object"}),
            None => {}
        }
        let mut request = self.http.post(&self.endpoint).json(&body);
        if !self.api_key.is_empty() {
            request = request.bearer_auth(&self.api_key);
        }
        let response = request
            .send()
            .await
            .map_err(|e| self.failed(e.to_string()))?;
        match response.status() {
            StatusCode::TOO_MANY_REQUESTS => {
                let retry_after_secs = super::retry_after_secs(response.headers()).unwrap_or(10);
                return Err(ProviderError::RateLimited {
                    provider: self.name.clone(),
                    retry_after_secs,
                });
            }
            // A client error (a wrong key, a bad model name) will not pass on a retry;
            // a request timeout (408) may.
            status if status.is_client_error() && status != StatusCode::REQUEST_TIMEOUT => {
                let text = response.text().await.unwrap_or_default();
                return Err(ProviderError::Invalid {
                    provider: self.name.clone(),
                    message: format!("{status}: {}", text.chars().take(200).collect::<String>()),
                });
            }
            status if !status.is_success() => {
                let text = response.text().await.unwrap_or_default();
                return Err(self.failed(format!(
                    "{status}: {}",
                    text.chars().take(200).collect::<String>()
                )));
            }
            _ => {}
        }
        // The body cut off (a reset, the timeout) may pass; a body that is not the
        // API's format will not.
        let body = response
            .bytes()
            .await
            .map_err(|e| self.failed(format!("reading the answer: {e}")))?;
        let completion: Completion =
            serde_json::from_slice(&body).map_err(|e| ProviderError::Invalid {
                provider: self.name.clone(),
                message: e.to_string(),
            })?;
        let text = completion
            .choices
            .into_iter()
            .next()
            .and_then(|c| c.message.content)
            .ok_or_else(|| ProviderError::Invalid {
                provider: self.name.clone(),
                message: "no answer in choices".into(),
            })?;
        Ok(ChatAnswer {
            text,
            tokens: completion.usage.map_or(0, |u| u.total_tokens),
            provider: self.name.clone(),
        })
    }
}
