//! Keyword heuristics, as plain Rust (no WIT types) so they are tested on the host.
//!
//! Text and keywords are folded (case, accents, look-alike characters) and split into
//! words; `?` counts as a word of its own, so the keyword `source?` needs the question
//! mark while `open source` does not trigger it. A keyword matches when its words
//! appear consecutively in the text (`fact check`, `fact-check` and `FACT CHECK` all
//! match the keyword `fact check`; `tl;dr` matches `TL;DR`).
//!
//! Keywords of exactly one action: that action, with confidence `confidence-base`
//! plus `confidence-step` for each further distinct keyword, at most `confidence-max`.
//! Keywords of both actions, or none: ambiguous (the bot then asks its AI classifier).

use text_fold::{Options, config_lines, words};

const WORDS: Options = Options {
    leet: false,
    keep: &['?'],
};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Summary,
    Factcheck,
}

impl Action {
    pub const ALL: [Action; 2] = [Action::Summary, Action::Factcheck];

    pub fn name(self) -> &'static str {
        match self {
            Action::Summary => "summary",
            Action::Factcheck => "factcheck",
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    Classified {
        action: Action,
        confidence: f32,
        matched: Vec<String>,
    },
    /// Keywords of several actions (listed), or none.
    Ambiguous(Vec<String>),
}

#[derive(Debug, Clone)]
struct Keyword {
    written: String,
    words: Vec<String>,
}

/// The keyword tables and thresholds, read once from the slot's config:
/// `keywords.summary` and `keywords.factcheck` (one keyword a line, `#` comments) and
/// the numbers `confidence-base` (0.75), `confidence-step` (0.1), `confidence-max` (0.95).
#[derive(Debug, Clone)]
pub struct Classifier {
    tables: Vec<(Action, Vec<Keyword>)>,
    base: f32,
    step: f32,
    max: f32,
}

impl Classifier {
    pub fn from_config(get: impl Fn(&str) -> Option<String>) -> Self {
        let number = |key: &str, default: f32| {
            get(key)
                .and_then(|v| v.trim().parse::<f32>().ok())
                .filter(|v| v.is_finite())
                .map_or(default, |v| v.clamp(0.0, 1.0))
        };
        let tables = Action::ALL
            .iter()
            .map(|&action| {
                let text = get(&format!("keywords.{}", action.name())).unwrap_or_default();
                let keywords = config_lines(&text)
                    .map(|line| Keyword {
                        written: line.to_owned(),
                        words: words(line, WORDS),
                    })
                    .filter(|k| !k.words.is_empty())
                    .collect();
                (action, keywords)
            })
            .collect();
        Self {
            tables,
            base: number("confidence-base", 0.75),
            step: number("confidence-step", 0.1),
            max: number("confidence-max", 0.95),
        }
    }

    pub fn classify(&self, text: &str) -> Outcome {
        let text_words = words(text, WORDS);
        let mut hits: Vec<(Action, Vec<String>)> = Vec::new();
        for (action, keywords) in &self.tables {
            let mut matched: Vec<String> = Vec::new();
            let mut seen: Vec<&[String]> = Vec::new();
            for keyword in keywords {
                // `fact check` and `fact-check` are the same words: count them once.
                if contains(&text_words, &keyword.words)
                    && !seen.contains(&keyword.words.as_slice())
                {
                    seen.push(&keyword.words);
                    matched.push(keyword.written.clone());
                }
            }
            if !matched.is_empty() {
                hits.push((*action, matched));
            }
        }
        match hits.len() {
            1 => {
                let (action, matched) = hits.remove(0);
                let extra = matched.len().saturating_sub(1) as f32;
                Outcome::Classified {
                    action,
                    confidence: (self.base + self.step * extra).min(self.max),
                    matched,
                }
            }
            _ => Outcome::Ambiguous(hits.into_iter().flat_map(|(_, m)| m).collect()),
        }
    }
}

/// Whether `needle` appears as consecutive words in `haystack`.
fn contains(haystack: &[String], needle: &[String]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;
    use golden::{Case, Slot};

    fn classifier() -> Classifier {
        Classifier::from_config(|key| match key {
            "keywords.summary" => Some("summary\ntl;dr\ntldr\n# comment\nrecap".into()),
            "keywords.factcheck" => Some("fact check\nsource?\nis this true?".into()),
            _ => None,
        })
    }

    #[test]
    fn single_action() {
        let c = classifier();
        match c.classify("TL;DR please, recap!") {
            Outcome::Classified {
                action,
                confidence,
                matched,
            } => {
                assert_eq!(action, Action::Summary);
                assert_eq!(matched, ["tl;dr", "recap"]);
                assert!((confidence - 0.85).abs() < 1e-6);
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            c.classify("Fact-check this. Source?"),
            Outcome::Classified {
                action: Action::Factcheck,
                ..
            }
        ));
    }

    #[test]
    fn question_mark_matters() {
        let c = classifier();
        assert_eq!(c.classify("open source rocks"), Outcome::Ambiguous(vec![]));
        assert_eq!(c.classify("is this true"), Outcome::Ambiguous(vec![]));
    }

    #[test]
    fn both_or_none_is_ambiguous() {
        let c = classifier();
        assert_eq!(
            c.classify("summary and fact check"),
            Outcome::Ambiguous(vec!["summary".into(), "fact check".into()])
        );
        assert_eq!(c.classify("hello"), Outcome::Ambiguous(vec![]));
    }

    /// The golden cases in testdata/guests/intent-classifier, natively.
    #[test]
    fn golden_cases() {
        let cases = golden::cases(Slot::IntentClassifier);
        assert!(cases.len() >= 10);
        for Case {
            name,
            config,
            input,
            expect,
        } in cases
        {
            let c = Classifier::from_config(|k| config.get(k).cloned());
            let outcome = c.classify(input["text"].as_str().expect("text"));
            let (action, matched) = match &outcome {
                Outcome::Classified {
                    action, matched, ..
                } => (action.name(), matched.clone()),
                Outcome::Ambiguous(matched) => ("ambiguous", matched.clone()),
            };
            assert_eq!(
                action,
                expect["action"].as_str().expect("action"),
                "{name}: {outcome:?}"
            );
            if let Some(want) = expect["matched"].as_array() {
                let want: Vec<&str> = want.iter().filter_map(|v| v.as_str()).collect();
                assert_eq!(matched, want, "{name}");
            }
        }
    }
}
