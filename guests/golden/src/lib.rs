//! Host-only helper for the guests' native tests: reads the golden cases of a slot from
//! `testdata/guests/<slot>/cases.jsonl` and the slot's data the way the host passes it
//! through the `config` import (from `policies/policies.toml` and the files it names).
//! host/runtime runs the same cases through the real Wasm runtime.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::Value;

/// The three slots.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Slot {
    CapabilityPolicy,
    SafetyFilter,
    IntentClassifier,
}

impl Slot {
    pub fn name(self) -> &'static str {
        match self {
            Slot::CapabilityPolicy => "capability-policy",
            Slot::SafetyFilter => "safety-filter",
            Slot::IntentClassifier => "intent-classifier",
        }
    }
}

/// One golden case: the slot's config (defaults from policies/ with the case's
/// overrides), the input and the expected answer, as JSON.
#[derive(Debug, Clone)]
pub struct Case {
    pub name: String,
    pub config: BTreeMap<String, String>,
    pub input: Value,
    pub expect: Value,
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A TOML config value as the host passes it: strings as they are, booleans and numbers
/// in their TOML spelling, arrays one item a line.
pub fn config_value(value: &toml::Value) -> String {
    match value {
        toml::Value::String(s) => s.clone(),
        toml::Value::Array(items) => items
            .iter()
            .map(config_value)
            .collect::<Vec<_>>()
            .join("\n"),
        other => other.to_string(),
    }
}

/// The config the default `policies/` gives `slot`.
pub fn slot_config(slot: Slot) -> BTreeMap<String, String> {
    let dir = repo_root().join("policies");
    let text = std::fs::read_to_string(dir.join("policies.toml")).expect("read policies.toml");
    let doc: toml::Table = text.parse().expect("parse policies.toml");
    let mut config = BTreeMap::new();
    let Some(section) = doc.get(slot.name()).and_then(toml::Value::as_table) else {
        return config;
    };
    if let Some(values) = section.get("config").and_then(toml::Value::as_table) {
        for (key, value) in values {
            config.insert(key.clone(), config_value(value));
        }
    }
    if let Some(files) = section.get("files").and_then(toml::Value::as_table) {
        for (key, file) in files {
            let file = file.as_str().expect("file names are strings");
            let text = std::fs::read_to_string(dir.join(file)).expect("read slot data file");
            config.insert(key.clone(), text);
        }
    }
    config
}

/// A JSON config override as the host passes it (same rules as [`config_value`]).
pub fn json_config_value(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        Value::Array(items) => items
            .iter()
            .map(json_config_value)
            .collect::<Vec<_>>()
            .join("\n"),
        other => other.to_string(),
    }
}

/// The golden cases of `slot`. Lines that are blank or start with `#` are skipped.
pub fn cases(slot: Slot) -> Vec<Case> {
    let path = repo_root()
        .join("testdata/guests")
        .join(slot.name())
        .join("cases.jsonl");
    let text = std::fs::read_to_string(&path).expect("read cases.jsonl");
    let defaults = slot_config(slot);
    text.lines()
        .enumerate()
        .filter(|(_, line)| !line.trim().is_empty() && !line.trim_start().starts_with('#'))
        .map(|(n, line)| {
            let mut case: Value = serde_json::from_str(line)
                .unwrap_or_else(|e| panic!("{}:{}: {e}", path.display(), n + 1));
            let mut config = defaults.clone();
            if let Some(overrides) = case.get("config").and_then(Value::as_object) {
                for (key, value) in overrides {
                    config.insert(key.clone(), json_config_value(value));
                }
            }
            Case {
                name: case["name"].as_str().unwrap_or("unnamed").to_owned(),
                config,
                input: case["input"].take(),
                expect: case["expect"].take(),
            }
        })
        .collect()
}
