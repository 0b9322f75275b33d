//! Keyword heuristics, as plain Rust (no WIT types) so they are tested on the host.
//!
//! Text and keywords go through the same reading: folded (case, accents, look-alike
//! characters), leetspeak read as letters (`t1;dr`, `f4ct ch3ck`), spaced-out letters
//! joined (`s u m m a r y`), split into words; `?` and clause punctuation (`,` `.` `!`
//! `:`) are tokens of their own, so the keyword `source?` needs the question mark while
//! `open source` does not trigger it. Quoted text (`he typed "fact check"`) is left out.
//!
//! A keyword found in the text counts only when it is *asked for*:
//! - a keyword ending in `?` is a question, hence a request (`is this true?`);
//! - otherwise the word after it must fit a request (the end, punctuation, or a word
//!   like `this`, `the`, `please`, `for`, `of`: `summarize this thread`), not a noun it
//!   describes (`the recap episode`, `my TL;DR habit`, `the fact check team`), and the
//!   keyword must open its clause (`recap please`, `bot, summarize`), follow a request
//!   word (`can you`, `please`, `give me`, `need a`), be followed by one (`a recap would
//!   help`, `tl;dr anyone?`), or stand almost alone (`@bot tl;dr`);
//! - and it must not be negated: a negation (`don't`, `no need to`, `not`, `never`,
//!   `skip`, `nobody asked for`...) shortly before it in the same clause, with only
//!   small words between, cancels it (`please don't recap this`).
//!
//! Asked-for keywords of exactly one action: that action, with confidence
//! `confidence-base` plus `confidence-step` for each further distinct keyword of it, at
//! most `confidence-max`. Of both actions: ambiguous, listing them (the bot asks its AI
//! classifier). None (no keyword, or only described, quoted or negated ones):
//! ambiguous with an empty list, which the bot reads as "no request".
//!
//! The word lists (negations, request words, fillers, followers) have English defaults
//! with a few German, Spanish, French, Italian and Dutch words; the slot's config may
//! replace each (`words.negations`, `words.requests`, `words.fillers`,
//! `words.followers`, `words.strong-followers`, `words.transparent`, `words.praise`),
//! one word a line. Two more rules: a keyword right after praise (`nice summary`) is a
//! reaction, and one followed by a colon (`TL;DR: I moved`) is a label, unless a
//! question follows.

use text_fold::{Options, config_lines, tokenize};

const READING: Options = Options {
    leet: true,
    keep: &['?', ',', '.', '!', ':'],
};

/// Tokens that end a clause (and `?`, which also belongs to question keywords).
const BREAKS: &[&str] = &[",", ".", "!", ":", "?"];

const NEGATIONS: &str = "don dont doesn didn not no never without stop skip nobody noone \
    nicht kein keine nunca pas jamais niet geen";
const REQUESTS: &str = "please pls plz can could would will give need want like love get \
    anyone someone somebody bot abot help mind what whats bitte kannst kann por favor stp \
    svp per favore graag";
const FILLERS: &str = "hey hi hello yo oh ok okay so and but then now just quick short \
    please pls plz bot abot also well";
const FOLLOWERS: &str = "this that it these those the thread threads here now everything all \
    for of above below bot abot me us again in on quick asap anyone someone up or and mess \
    claim claims post posts discussion replies please pls plz would needed bitte das esto \
    stp svp per por graag favor what how why who whether if to tbh imo lol though thx \
    thanks ty haha";
const STRONG_FOLLOWERS: &str = "would please pls plz needed asap anyone bitte stp svp graag";
const PRAISE: &str = "nice great good awesome cool thanks thank helpful excellent amazing \
    perfect solid";
const TRANSPARENT: &str = "a an the to for need needed want asking ask asked any my this that \
    it please pls just me us another of t do";

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
    /// Asked-for keywords of several actions (listed), or none (empty).
    Ambiguous(Vec<String>),
}

#[derive(Debug, Clone)]
struct Keyword {
    written: String,
    words: Vec<String>,
    question: bool,
}

/// Word lists, each word as the reading makes it.
#[derive(Debug, Clone)]
struct Words {
    negations: Vec<String>,
    requests: Vec<String>,
    fillers: Vec<String>,
    followers: Vec<String>,
    strong_followers: Vec<String>,
    transparent: Vec<String>,
    praise: Vec<String>,
}

/// The keyword tables, word lists and thresholds, read once from the slot's config:
/// `keywords.summary` and `keywords.factcheck` (one keyword a line, `#` comments), the
/// `words.*` lists and the numbers `confidence-base` (0.75), `confidence-step` (0.1),
/// `confidence-max` (0.95).
#[derive(Debug, Clone)]
pub struct Classifier {
    tables: Vec<(Action, Vec<Keyword>)>,
    words: Words,
    base: f32,
    step: f32,
    max: f32,
}

/// Where a keyword was found, and what became of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reading {
    Asked,
    Mentioned,
    Negated,
}

impl Classifier {
    pub fn from_config(get: impl Fn(&str) -> Option<String>) -> Self {
        let number = |key: &str, default: f32| {
            get(key)
                .and_then(|v| v.trim().parse::<f32>().ok())
                .filter(|v| v.is_finite())
                .map_or(default, |v| v.clamp(0.0, 1.0))
        };
        let list = |key: &str, default: &str| -> Vec<String> {
            let text = get(key)
                .unwrap_or_else(|| default.split_whitespace().collect::<Vec<_>>().join("\n"));
            config_lines(&text)
                .flat_map(|line| read(line).into_iter())
                .collect()
        };
        let tables = Action::ALL
            .iter()
            .map(|&action| {
                let text = get(&format!("keywords.{}", action.name())).unwrap_or_default();
                let keywords = config_lines(&text)
                    .map(|line| {
                        // `*` (a gap) is read as a word of its own.
                        let words: Vec<String> = line
                            .split('*')
                            .map(read)
                            .collect::<Vec<_>>()
                            .join(&["*".to_owned()][..]);
                        Keyword {
                            written: line.to_owned(),
                            question: words.last().is_some_and(|w| w == "?"),
                            words,
                        }
                    })
                    .filter(|k| !k.words.is_empty())
                    .collect();
                (action, keywords)
            })
            .collect();
        Self {
            tables,
            words: Words {
                negations: list("words.negations", NEGATIONS),
                requests: list("words.requests", REQUESTS),
                fillers: list("words.fillers", FILLERS),
                followers: list("words.followers", FOLLOWERS),
                strong_followers: list("words.strong-followers", STRONG_FOLLOWERS),
                transparent: list("words.transparent", TRANSPARENT),
                praise: list("words.praise", PRAISE),
            },
            base: number("confidence-base", 0.75),
            step: number("confidence-step", 0.1),
            max: number("confidence-max", 0.95),
        }
    }

    pub fn classify(&self, text: &str) -> Outcome {
        let tokens = read(&without_quotes(text));
        let mut asked: Vec<(Action, Vec<String>)> = Vec::new();
        for (action, keywords) in &self.tables {
            let mut found: Vec<(&Keyword, usize, usize)> = Vec::new();
            for keyword in keywords {
                for at in 0..tokens.len() {
                    if let Some(end) = match_at(&tokens, at, &keyword.words) {
                        found.push((keyword, at, end));
                    }
                }
            }
            // A keyword found inside another's match is that one (`source` in `source?`).
            let spans: Vec<(usize, usize)> = found.iter().map(|(_, a, e)| (*a, *e)).collect();
            let readings: Vec<(&Keyword, Reading)> = found
                .iter()
                .filter(|(_, a, e)| {
                    !spans
                        .iter()
                        .any(|(b, f)| b <= a && e <= f && (b, f) != (a, e))
                })
                .map(|(keyword, at, end)| (*keyword, self.reading(&tokens, *at, *end, keyword)))
                .collect();
            if !readings.iter().any(|(_, r)| *r == Reading::Asked) {
                continue;
            }
            // Asked for once: every other use of this action's keywords that is not
            // negated supports it (`summarize or summarise`).
            let mut matched: Vec<String> = Vec::new();
            let mut seen: Vec<&[String]> = Vec::new();
            for (keyword, reading) in readings {
                // `fact check` and `fact-check` are the same words: count them once.
                if reading != Reading::Negated && !seen.contains(&keyword.words.as_slice()) {
                    seen.push(&keyword.words);
                    matched.push(keyword.written.clone());
                }
            }
            asked.push((*action, matched));
        }
        match asked.len() {
            1 => {
                let (action, matched) = asked.remove(0);
                let extra = matched.len().saturating_sub(1) as f32;
                Outcome::Classified {
                    action,
                    confidence: (self.base + self.step * extra).min(self.max),
                    matched,
                }
            }
            _ => Outcome::Ambiguous(asked.into_iter().flat_map(|(_, m)| m).collect()),
        }
    }

    /// How the keyword found at `at..end` is used.
    fn reading(&self, tokens: &[String], at: usize, end: usize, keyword: &Keyword) -> Reading {
        if self.negated(tokens, at) {
            return Reading::Negated;
        }
        if keyword.question {
            return Reading::Asked;
        }
        let w = &self.words;
        // Praise right before (`nice summary`) is a reaction to one, not a request.
        if at > 0 && w.praise.contains(&tokens[at - 1]) {
            return Reading::Mentioned;
        }
        let follower = tokens.get(end);
        // A label (`TL;DR: I moved to Berlin`, `summary: we won`) unless a question
        // follows (`fact check: did this happen?`).
        if follower.is_some_and(|f| f == ":") && !tokens[end..].iter().any(|t| t == "?") {
            return Reading::Mentioned;
        }
        // A request word soon after in the clause (`tl;dr version please`).
        let strong = tokens[end..]
            .iter()
            .take_while(|t| !is_break(t) || *t == "?")
            .take(4)
            .any(|t| t == "?" || w.strong_followers.contains(t));
        let follower_fits = follower.is_none_or(|f| is_break(f) || w.followers.contains(f));
        if !follower_fits && !strong {
            return Reading::Mentioned;
        }
        let clause = clause_before(tokens, at);
        let opens = clause.iter().all(|t| w.fillers.contains(t));
        let after_request = clause.iter().rev().take(5).any(|t| w.requests.contains(t));
        let words_outside = tokens
            .iter()
            .enumerate()
            .filter(|(i, t)| (*i < at || *i >= end) && !is_break(t))
            .count();
        if strong || opens || after_request || words_outside <= 2 {
            Reading::Asked
        } else {
            Reading::Mentioned
        }
    }

    /// A negation shortly before `at` in its clause, with only small words between.
    fn negated(&self, tokens: &[String], at: usize) -> bool {
        for t in clause_before(tokens, at).iter().rev().take(5) {
            if self.words.negations.contains(t) {
                return true;
            }
            if !self.words.transparent.contains(t) {
                return false;
            }
        }
        false
    }
}

/// Most words a `*` in a keyword stands for.
const GAP: usize = 6;

/// Where `pattern` matching from `at` ends, if it does: words must be equal, and `*`
/// stands for up to [`GAP`] words of the same clause (`is * true?` matches `is this
/// actually true?`).
fn match_at(tokens: &[String], at: usize, pattern: &[String]) -> Option<usize> {
    let Some((first, rest)) = pattern.split_first() else {
        return Some(at);
    };
    if first == "*" {
        return (0..=GAP).find_map(|skip| {
            let skipped = tokens.get(at..at + skip)?;
            if skipped.iter().any(|t| is_break(t)) {
                return None;
            }
            match_at(tokens, at + skip, rest)
        });
    }
    (tokens.get(at) == Some(first))
        .then(|| match_at(tokens, at + 1, rest))
        .flatten()
}

fn is_break(token: &str) -> bool {
    BREAKS.contains(&token)
}

/// The tokens of the clause before `at` (back to the previous clause break).
fn clause_before(tokens: &[String], at: usize) -> &[String] {
    let start = tokens[..at]
        .iter()
        .rposition(|t| is_break(t))
        .map_or(0, |i| i + 1);
    &tokens[start..at]
}

/// The reading of `text`: folded, leetspeak read, spaced-out letters joined, split.
fn read(text: &str) -> Vec<String> {
    let tokens = tokenize(text, READING);
    let mut out = Vec::with_capacity(tokens.len());
    let mut i = 0;
    while i < tokens.len() {
        // `s u m m a r y`: three or more one-letter words with one space between.
        let letter = |t: &text_fold::Token| t.is_single_char() && !is_break(&t.text);
        let mut j = i + 1;
        if letter(&tokens[i]) {
            while j < tokens.len()
                && letter(&tokens[j])
                && tokens[j].gap == 1
                && !tokens[j].gap_has_newline
            {
                j += 1;
            }
            if j - i < 3 {
                j = i + 1;
            }
        }
        out.push(tokens[i..j].iter().map(|t| t.text.as_str()).collect());
        i = j;
    }
    out
}

/// `text` with quoted spans blanked out (a quoted keyword is talked about, not asked
/// for): "…", “…”, ‘…’, «…» and '…' (an apostrophe inside a word is not a quote).
fn without_quotes(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let close = match c {
            '"' => Some('"'),
            '“' => Some('”'),
            '‘' => Some('’'),
            '«' => Some('»'),
            '\'' if i == 0 || !chars[i - 1].is_alphanumeric() => Some('\''),
            _ => None,
        };
        if let Some(close) = close {
            let end = (i + 1..chars.len()).find(|&k| {
                chars[k] == close
                    && (close != '\'' || chars.get(k + 1).is_none_or(|n| !n.is_alphanumeric()))
            });
            if let Some(end) = end {
                out.push_str(" , ");
                i = end + 1;
                continue;
            }
        }
        out.push(c);
        i += 1;
    }
    out
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

    fn action(c: &Classifier, text: &str) -> &'static str {
        match c.classify(text) {
            Outcome::Classified { action, .. } => action.name(),
            Outcome::Ambiguous(m) if m.is_empty() => "none",
            Outcome::Ambiguous(_) => "ambiguous",
        }
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
        assert_eq!(action(&c, "Fact-check this. Source?"), "factcheck");
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

    #[test]
    fn negations_cancel_a_keyword() {
        let c = classifier();
        for text in [
            "please don't recap this",
            "no tl;dr needed",
            "I don't need a recap",
            "nobody asked for a summary",
            "do not fact check me",
            "skip the recap",
        ] {
            assert_eq!(action(&c, text), "none", "{text}");
        }
        assert_eq!(
            action(&c, "don't summarize, just fact check it"),
            "factcheck"
        );
        assert_eq!(
            action(&c, "no, recap it"),
            "summary",
            "a comma ends the negation"
        );
        assert_eq!(action(&c, "I did not read it, tl;dr"), "summary");
    }

    #[test]
    fn keywords_in_another_sense_do_not_count() {
        let c = classifier();
        for text in [
            "the recap episode aired yesterday",
            "my TL;DR habit is getting worse",
            "the fact check team works hard",
            "she wrote a great summary",
            "I read the summary of the book last year",
        ] {
            assert_eq!(action(&c, text), "none", "{text}");
        }
        for text in [
            "summary of this thread please",
            "can you recap this?",
            "a recap would be great",
            "tl;dr anyone?",
            "hey bot, summary",
        ] {
            assert_eq!(action(&c, text), "summary", "{text}");
        }
    }

    #[test]
    fn quotes_leet_and_spacing() {
        let c = classifier();
        assert_eq!(action(&c, "he literally typed 'fact check' lol"), "none");
        assert_eq!(action(&c, "people say \"tl;dr\" without reading"), "none");
        assert_eq!(action(&c, "don't you think so? 'tl;dr' please"), "none");
        assert_eq!(action(&c, "t1;dr pls"), "summary");
        assert_eq!(action(&c, "f4ct ch3ck this"), "factcheck");
        assert_eq!(action(&c, "s u m m a r y please"), "summary");
        assert_eq!(action(&c, "1s th1s tru3?"), "factcheck");
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

    /// The evaluation set (testdata/eval/intent.jsonl) with the shipped keyword tables
    /// (policies/keywords): the heuristic decides wrongly at most 1% of the time and
    /// leaves at most 10% to the AI classifier. `--nocapture` prints the misses.
    #[test]
    fn evaluation_set() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let read = |p: &str| std::fs::read_to_string(root.join(p)).expect(p);
        let summary = read("policies/keywords/summary.txt");
        let factcheck = read("policies/keywords/factcheck.txt");
        let c = Classifier::from_config(|key| match key {
            "keywords.summary" => Some(summary.clone()),
            "keywords.factcheck" => Some(factcheck.clone()),
            _ => None,
        });
        let (mut total, mut wrong, mut to_ai) = (0, 0, 0);
        let file =
            std::env::var("INTENT_EVAL").unwrap_or_else(|_| "testdata/eval/intent.jsonl".into());
        for line in read(&file).lines().filter(|l| l.starts_with('{')) {
            let case: serde_json::Value = serde_json::from_str(line).expect("json");
            let text = case["text"].as_str().expect("text");
            let label = case["label"].as_str().expect("label");
            total += 1;
            match action(&c, text) {
                "ambiguous" => {
                    to_ai += 1;
                    println!("to AI   [{label}] {text}");
                }
                got if got != label => {
                    wrong += 1;
                    println!("WRONG   [{label}, got {got}] {text}");
                }
                _ => {}
            }
        }
        println!("{total} mentions: {wrong} wrong, {to_ai} left to the AI classifier");
        assert!(total >= 200);
        assert!(wrong * 100 <= total, "{wrong} of {total} wrong");
        assert!(to_ai * 10 <= total, "{to_ai} of {total} sent to the AI");
    }
}
