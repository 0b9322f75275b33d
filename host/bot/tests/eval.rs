//! The guests the bot uses, measured on the evaluation sets in `testdata/eval/` through
//! the real runtime (the compiled Wasm guests with the shipped `policies/`), as the bot
//! calls them. Prints the figures docs/BENCHMARKS.md reports
//! (`cargo test -p pkbot --test eval -- --nocapture`) and holds the targets:
//! - intent classifier, on `intent.jsonl`: wrong at most 1%, sent to the AI at most 10%;
//! - safety filter: at least 98% of `safety-evasion.txt` caught, none of
//!   `safety-clean.txt` blocked.
//!
//! The held-out intent sets are reported, not held to a target: they estimate how the
//! heuristic does on mentions its rules were not written against.

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};

use homeserver_runtime::{Intent, IntentAction, PolicyRuntime, RuntimeConfig};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn runtime() -> PolicyRuntime {
    PolicyRuntime::load(RuntimeConfig {
        policies_dir: repo().join("policies"),
        ..RuntimeConfig::default()
    })
    .unwrap()
}

/// (mentions, wrong, sent to the AI) for one labelled set, printing the misses.
fn intent_figures(runtime: &PolicyRuntime, file: &str) -> (usize, usize, usize) {
    let text = std::fs::read_to_string(repo().join("testdata/eval").join(file)).unwrap();
    let (mut total, mut wrong, mut to_ai) = (0, 0, 0);
    for line in text.lines().filter(|l| l.starts_with('{')) {
        let case: serde_json::Value = serde_json::from_str(line).unwrap();
        let (text, label) = (
            case["text"].as_str().unwrap(),
            case["label"].as_str().unwrap(),
        );
        total += 1;
        let decided = match runtime.classify(text) {
            Intent::Action {
                action: IntentAction::Summary,
                ..
            } => "summary",
            Intent::Action {
                action: IntentAction::Factcheck,
                ..
            } => "factcheck",
            Intent::Ambiguous { matched } if matched.is_empty() => "none",
            Intent::Ambiguous { .. } | Intent::Failed(_) => {
                to_ai += 1;
                println!("  {file}: to the AI [{label}] {text}");
                continue;
            }
        };
        if decided != label {
            wrong += 1;
            println!("  {file}: WRONG [{label}, decided {decided}] {text}");
        }
    }
    println!(
        "{file}: {total} mentions, {wrong} wrong ({:.1}%), {to_ai} sent to the AI classifier ({:.1}%)",
        100.0 * wrong as f64 / total as f64,
        100.0 * to_ai as f64 / total as f64
    );
    (total, wrong, to_ai)
}

#[test]
fn intent_classifier_on_the_evaluation_sets() {
    let runtime = runtime();
    let (total, wrong, to_ai) = intent_figures(&runtime, "intent.jsonl");
    assert!(total >= 200);
    assert!(wrong * 100 <= total, "wrong on more than 1%");
    assert!(to_ai * 10 <= total, "more than 10% sent to the AI");
    for held_out in [
        "intent-held-out.jsonl",
        "intent-held-out-2.jsonl",
        "intent-held-out-3.jsonl",
    ] {
        intent_figures(&runtime, held_out);
    }
}

#[test]
fn safety_filter_on_the_evasion_and_clean_sets() {
    let runtime = runtime();
    let lines = |file: &str| -> Vec<String> {
        std::fs::read_to_string(repo().join("testdata/eval").join(file))
            .unwrap()
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .map(str::to_owned)
            .collect()
    };
    let evasions = lines("safety-evasion.txt");
    let missed: Vec<&String> = evasions
        .iter()
        .filter(|t| !runtime.check_text(t).blocked)
        .collect();
    let clean = lines("safety-clean.txt");
    let blocked: Vec<&String> = clean
        .iter()
        .filter(|t| runtime.check_text(t).blocked)
        .collect();
    println!(
        "safety filter: {} of {} evasions caught ({:.1}% recall), {} of {} clean posts blocked; missed {missed:?}, blocked {blocked:?}",
        evasions.len() - missed.len(),
        evasions.len(),
        100.0 * (evasions.len() - missed.len()) as f64 / evasions.len() as f64,
        blocked.len(),
        clean.len()
    );
    assert!(missed.len() * 50 <= evasions.len(), "recall under 98%");
    assert!(blocked.is_empty(), "false positives");
}
