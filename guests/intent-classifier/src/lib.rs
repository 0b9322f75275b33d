//! The default intent-classifier guest: the WIT glue around [`classifier`]. The keyword
//! tables and thresholds come from the slot's `config` (policies/keywords/*.txt).

mod classifier;

use std::sync::OnceLock;

use exports::homeserver::guest::intent::{Action, Classification, Guest, Outcome};
use homeserver::guest::config;

wit_bindgen::generate!({
    path: "../../wit",
    world: "intent-classifier",
});

/// Config never changes during an instance's life (see the WIT), so parse it once.
static CLASSIFIER: OnceLock<classifier::Classifier> = OnceLock::new();

struct IntentClassifier;

impl Guest for IntentClassifier {
    fn classify(text: String) -> Outcome {
        let classifier =
            CLASSIFIER.get_or_init(|| classifier::Classifier::from_config(config::get));
        match classifier.classify(&text) {
            classifier::Outcome::Classified {
                action,
                confidence,
                matched,
            } => Outcome::Classified(Classification {
                action: match action {
                    classifier::Action::Summary => Action::Summary,
                    classifier::Action::Factcheck => Action::Factcheck,
                },
                confidence,
                matched,
            }),
            classifier::Outcome::Ambiguous(matched) => Outcome::Ambiguous(matched),
        }
    }
}

export!(IntentClassifier);
