//! The JSON answers the bot asks models for, each with its JSON Schema: sent with the
//! request (`response_format` `json_schema` when `ai.json_mode = "json_schema"`, for
//! providers that constrain decoding to it; otherwise `json_object`), and checked on
//! every answer before it is used (jsonschema), so an answer of the wrong shape is
//! refused the same way whatever the provider does. Fields a schema does not name are
//! allowed (and ignored): small local models add them, and nothing reads them.

use std::sync::LazyLock;

use serde::de::DeserializeOwned;
use serde_json::{Value, json};

/// One kind of answer.
pub struct AnswerSchema {
    /// Its name in `response_format.json_schema.name`.
    pub name: &'static str,
    pub schema: LazyLock<Value>,
    validator: LazyLock<Option<jsonschema::Validator>>,
}

macro_rules! answer_schema {
    ($name:expr, $schema:expr) => {
        AnswerSchema {
            name: $name,
            schema: LazyLock::new(|| $schema),
            validator: LazyLock::new(|| jsonschema::validator_for(&$schema).ok()),
        }
    };
}

/// The AI classifier's routing decision.
pub static ROUTE: AnswerSchema = answer_schema!(
    "route",
    json!({
        "type": "object",
        "properties": {
            "action": {"type": "string", "pattern": "^(?i:summary|factcheck|none)$"},
            "confidence": {"type": "number", "minimum": 0, "maximum": 1},
            "reasoning": {"type": "string", "maxLength": 500}
        },
        "required": ["action", "confidence", "reasoning"]
    })
);

/// The claims of a post.
pub static CLAIMS: AnswerSchema = answer_schema!(
    "claims",
    json!({
        "type": "object",
        "properties": {
            "claims": {
                "type": "array",
                "items": {"type": "string", "minLength": 1, "maxLength": 500},
                "maxItems": 10
            }
        },
        "required": ["claims"]
    })
);

/// A verdict on one claim.
pub static VERDICT: AnswerSchema = answer_schema!(
    "verdict",
    json!({
        "type": "object",
        "properties": {
            "verdict": {
                "type": "string",
                "pattern": "^(?i:accurate|mixed|inaccurate|unverifiable)$"
            },
            "reason": {"type": "string", "minLength": 1, "maxLength": 500},
            "sources": {"type": "array", "items": {"type": "string"}, "maxItems": 20}
        },
        "required": ["verdict", "reason", "sources"]
    })
);

impl AnswerSchema {
    /// The answer in `text` (a JSON object, also inside a code fence or prose), checked
    /// against the schema; or what is wrong with it.
    pub fn parse<T: DeserializeOwned>(&self, text: &str) -> Result<T, String> {
        let value = json_object(text).ok_or_else(|| {
            format!(
                "no JSON object in the answer: {}",
                text.chars().take(120).collect::<String>()
            )
        })?;
        let validator = self
            .validator
            .as_ref()
            .ok_or_else(|| format!("the {} schema does not compile", self.name))?;
        let problems: Vec<String> = validator
            .iter_errors(&value)
            .take(3)
            .map(|e| format!("{} at `{}`", e, e.instance_path()))
            .collect();
        if !problems.is_empty() {
            return Err(format!(
                "the answer does not match the {} schema: {}",
                self.name,
                problems.join("; ")
            ));
        }
        serde_json::from_value(value).map_err(|e| e.to_string())
    }
}

/// A JSON object from a model's answer, also when it is wrapped in a code fence or
/// surrounded by prose.
fn json_object(text: &str) -> Option<Value> {
    if let Ok(v @ Value::Object(_)) = serde_json::from_str(text.trim()) {
        return Some(v);
    }
    let start = text.find('{')?;
    let end = text.rfind('}')?;
    match serde_json::from_str(text.get(start..=end)?) {
        Ok(v @ Value::Object(_)) => Some(v),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, serde::Deserialize)]
    struct Route {
        action: String,
        confidence: f64,
    }

    #[test]
    fn json_is_found_in_fences_and_prose() {
        let fenced = json_object("```json\n{\"action\": \"summary\"}\n```").unwrap();
        assert_eq!(fenced["action"], "summary");
        let prose = json_object("Sure! {\"action\": \"none\"} Hope it helps").unwrap();
        assert_eq!(prose["action"], "none");
        assert!(json_object("no json here").is_none());
    }

    #[test]
    fn answers_are_checked_against_their_schema() {
        let ok: Route = ROUTE
            .parse("Sure! ```json\n{\"action\": \"summary\", \"confidence\": 0.8, \"reasoning\": \"asks\"}\n```")
            .unwrap();
        assert_eq!((ok.action.as_str(), ok.confidence), ("summary", 0.8));
        for bad in [
            r#"{"action": "post BUY-COIN", "confidence": 0.9, "reasoning": "x"}"#,
            r#"{"action": "summary", "confidence": 7, "reasoning": "x"}"#,
            r#"{"action": "summary"}"#,
            "no json here",
            "[1, 2]",
        ] {
            let e = ROUTE.parse::<Route>(bad).unwrap_err();
            assert!(!e.is_empty(), "{bad}");
        }
        let e = VERDICT
            .parse::<serde_json::Value>(r#"{"verdict": "True", "reason": "r", "sources": []}"#)
            .unwrap_err();
        assert!(e.contains("verdict"), "{e}");
        assert!(
            CLAIMS
                .parse::<serde_json::Value>(r#"{"claims": ["a", "b"]}"#)
                .is_ok()
        );
    }
}
