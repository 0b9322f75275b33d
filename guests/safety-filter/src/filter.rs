//! Wordlist matching, as plain Rust (no WIT types) so it is tested on the host.
//!
//! Both the text and every term are reduced to a *skeleton*: folded (case, accents,
//! fullwidth and mathematical forms, Cyrillic/Greek look-alikes; see `text_fold`), read
//! as leetspeak (`fr33 m0n3y` → `free money`) and split into words. Then:
//!
//! - Runs of one-letter words with single separators are joined: `f r e e`, `f.r.e.e`
//!   → `free`. A wider gap (two spaces, a line break) ends a run, so
//!   `f r e e  m 0 n e y` reads `free money`.
//! - The words are concatenated and a term matches only from the start of a word to the
//!   end of a word. Inside a word never matches: `classic`, `assessment` and
//!   `Scunthorpe` do not contain a match for a term `ass` or `cunt`. Multi-word terms
//!   match across any separators (`free-money`, `free   money`), and so do words split
//!   by spaces (`fr ee`).
//! - A letter may be stretched: `scaaaam` matches `scam`. Only stretches to three or
//!   more count, so that the term `god` does not match `good`.
//! - A term's last word may be inflected: an ending from `inflections` (default `s es
//!   ed d ing er ers ies y ic ish`) may follow it, also after a doubled last letter
//!   (`idiots`, `scammers`, `scamming`, `crappy`, `moronic`). Anything else after it is
//!   another word (`scampi`, `assess` stay clean).

use text_fold::{Options, config_bool, config_items, config_lines, tokenize};

const SKELETON: Options = Options {
    leet: true,
    keep: &[],
};

/// One term found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Match {
    pub term: String,
    pub list: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Verdict {
    pub matches: Vec<Match>,
    pub blocked: bool,
}

/// A wordlist term: as written, and its skeleton as runs of (letter, count).
#[derive(Debug, Clone)]
struct Term {
    written: String,
    runs: Vec<(char, usize)>,
}

#[derive(Debug, Clone)]
struct Wordlist {
    name: String,
    terms: Vec<Term>,
}

/// The filter's settings, read once from the slot's config:
/// - `enabled` (default true): when false, nothing is checked and nothing blocked.
/// - `blockOnMatch` (default true): block text with a match; when false, matches are
///   still reported. A value that is not a boolean counts as true (fail closed).
/// - `lists`: the names of the active lists; default every configured list.
/// - `list.<name>`: the terms of list `<name>`, one a line, `#` comments.
#[derive(Debug, Clone)]
pub struct Filter {
    enabled: bool,
    block_on_match: bool,
    lists: Vec<Wordlist>,
    /// Endings a term's last word may take, as skeletons.
    inflections: Vec<Vec<char>>,
}

/// The endings a term may take when `inflections` is not configured.
const INFLECTIONS: &str = "s es ed d ing er ers ies y ic ish";

impl Filter {
    /// Reads the settings through `get`; `keys` lists every config key (used to find
    /// the lists when `lists` is not set).
    pub fn from_config(
        get: impl Fn(&str) -> Option<String>,
        keys: impl Fn() -> Vec<String>,
    ) -> Self {
        let flag = |key: &str| {
            get(key)
                .map(|v| config_bool(&v).unwrap_or(true))
                .unwrap_or(true)
        };
        let names: Vec<String> = match get("lists") {
            Some(value) => config_items(&value).map(str::to_owned).collect(),
            None => keys()
                .into_iter()
                .filter_map(|k| k.strip_prefix("list.").map(str::to_owned))
                .collect(),
        };
        let lists = names
            .into_iter()
            .filter_map(|name| {
                let text = get(&format!("list.{name}"))?;
                let terms = config_lines(&text).filter_map(Term::new).collect();
                Some(Wordlist { name, terms })
            })
            .collect();
        let inflections = get("inflections")
            .unwrap_or_else(|| INFLECTIONS.to_owned())
            .split_whitespace()
            .flat_map(|e| e.split(','))
            .map(|e| skeleton(e).chars().collect::<Vec<char>>())
            .filter(|e| !e.is_empty())
            .collect();
        Self {
            enabled: flag("enabled"),
            block_on_match: flag("blockOnMatch"),
            lists,
            inflections,
        }
    }

    /// Checks one text.
    pub fn check(&self, text: &str) -> Verdict {
        if !self.enabled {
            return Verdict::default();
        }
        let haystack = Haystack::new(text);
        let mut found: Vec<(usize, Match)> = Vec::new();
        for list in &self.lists {
            for term in &list.terms {
                if let Some(at) = haystack.find(&term.runs, &self.inflections) {
                    let m = Match {
                        term: term.written.clone(),
                        list: list.name.clone(),
                    };
                    if !found.iter().any(|(_, f)| *f == m) {
                        found.push((at, m));
                    }
                }
            }
        }
        found.sort_by_key(|(at, _)| *at);
        let matches: Vec<Match> = found.into_iter().map(|(_, m)| m).collect();
        Verdict {
            blocked: self.block_on_match && !matches.is_empty(),
            matches,
        }
    }
}

/// A text's skeleton (see the module): its words, read, concatenated.
fn skeleton(text: &str) -> String {
    tokenize(text, SKELETON)
        .into_iter()
        .map(|t| t.text)
        .collect()
}

impl Term {
    fn new(written: &str) -> Option<Self> {
        let runs = run_lengths(&skeleton(written));
        (!runs.is_empty()).then(|| Self {
            written: written.to_owned(),
            runs,
        })
    }
}

fn run_lengths(s: &str) -> Vec<(char, usize)> {
    let mut runs: Vec<(char, usize)> = Vec::new();
    for c in s.chars() {
        match runs.last_mut() {
            Some((last, n)) if *last == c => *n += 1,
            _ => runs.push((c, 1)),
        }
    }
    runs
}

/// The text's skeleton: its words concatenated, with the positions where words start
/// and end.
struct Haystack {
    chars: Vec<char>,
    /// `boundary[i]`: a word starts or ends at `i` (length `chars.len() + 1`).
    boundary: Vec<bool>,
}

impl Haystack {
    fn new(text: &str) -> Self {
        let tokens = tokenize(text, SKELETON);
        let mut words: Vec<String> = Vec::with_capacity(tokens.len());
        let mut i = 0;
        while i < tokens.len() {
            // Join `f r e e` / `f.r.e.e`: one-letter words with one separator between.
            let mut j = i + 1;
            if tokens[i].is_single_char() {
                while j < tokens.len()
                    && tokens[j].is_single_char()
                    && tokens[j].gap == 1
                    && !tokens[j].gap_has_newline
                {
                    j += 1;
                }
            }
            words.push(tokens[i..j].iter().map(|t| t.text.as_str()).collect());
            i = j;
        }
        let mut chars = Vec::new();
        let mut boundary = vec![true];
        for word in &words {
            for c in word.chars() {
                chars.push(c);
                boundary.push(false);
            }
            if let Some(last) = boundary.last_mut() {
                *last = true;
            }
        }
        Self { chars, boundary }
    }

    /// Where the term `runs` first matches, from a word start to a word end (or an
    /// inflection ending there).
    fn find(&self, runs: &[(char, usize)], inflections: &[Vec<char>]) -> Option<usize> {
        let first = runs.first()?.0;
        (0..self.chars.len())
            .filter(|&p| self.boundary[p] && self.chars[p] == first)
            .find(|&p| self.matches_at(runs, p, inflections))
    }

    /// Whether the word goes on from `at` to its end with one of `inflections` (after
    /// an optional doubling of `last`, the term's last letter).
    fn inflected_end(&self, at: usize, last: char, inflections: &[Vec<char>]) -> bool {
        let Some(len) = (at..self.chars.len()).position(|i| self.boundary[i + 1]) else {
            return false;
        };
        let rest = &self.chars[at..=at + len];
        let undoubled = rest.strip_prefix(&[last]).unwrap_or(rest);
        inflections
            .iter()
            .any(|e| e.as_slice() == rest || e.as_slice() == undoubled)
    }

    fn matches_at(&self, runs: &[(char, usize)], start: usize, inflections: &[Vec<char>]) -> bool {
        let mut i = start;
        for (k, &(c, n)) in runs.iter().enumerate() {
            let available = self.chars[i..].iter().take_while(|&&x| x == c).count();
            if k + 1 == runs.len() {
                // The last letter may stop before the end of its run in the text when a
                // word ends there (`ass sucks` is `asssucks` concatenated).
                return (n..=available)
                    .filter(|&len| stretch_ok(n, len))
                    .any(|len| {
                        self.boundary[i + len] || self.inflected_end(i + len, c, inflections)
                    });
            }
            if !stretch_ok(n, available) {
                return false;
            }
            i += available;
        }
        false
    }
}

/// A letter the term has `want` times may appear `have` times: exactly, or stretched
/// to three or more.
fn stretch_ok(want: usize, have: usize) -> bool {
    have == want || (have > want && have >= 3)
}

#[cfg(test)]
mod tests {
    use super::*;
    use golden::{Case, Slot};
    use std::collections::BTreeMap;

    fn filter(lists: &[(&str, &str)]) -> Filter {
        let config: BTreeMap<String, String> = lists
            .iter()
            .map(|(name, terms)| (format!("list.{name}"), (*terms).to_owned()))
            .collect();
        Filter::from_config(
            |k| config.get(k).cloned(),
            || config.keys().cloned().collect(),
        )
    }

    fn terms(f: &Filter, text: &str) -> Vec<String> {
        f.check(text).matches.into_iter().map(|m| m.term).collect()
    }

    #[test]
    fn evasions_are_caught() {
        let f = filter(&[
            ("spam", "free money\nscam\n# comment\n"),
            ("offensive", "ass"),
        ]);
        for text in [
            "FREE MONEY today",
            "fr33 m0n3y",
            "f r e e  m 0 n e y",
            "f.r.e.e m.o.n.e.y",
            "f r e e m o n e y",
            "ｆｒｅｅ ｍｏｎｅｙ",
            "frее mоnеy",
            "free-money",
            "free\u{200B}money",
            "fr ee money",
            "freeeee money",
        ] {
            assert_eq!(terms(&f, text), ["free money"], "{text:?}");
        }
        assert_eq!(terms(&f, "what a $c@m"), ["scam"]);
        assert_eq!(terms(&f, "scaaaam"), ["scam"]);
        assert_eq!(terms(&f, "you 4$$"), ["ass"]);
        assert_eq!(terms(&f, "a s s"), ["ass"]);
    }

    #[test]
    fn no_scunthorpe_false_positives() {
        let f = filter(&[("offensive", "ass\ncunt\ngod"), ("spam", "scam")]);
        for text in [
            "Scunthorpe United",
            "a classic assessment",
            "the bass player passes",
            "c l a s s i c",
            "scampi and scampers",
            "good",
        ] {
            assert!(
                terms(&f, text).is_empty(),
                "{text:?}: {:?}",
                terms(&f, text)
            );
        }
    }

    #[test]
    fn inflected_terms_are_caught() {
        let f = filter(&[
            ("offensive", "idiot\nmoron\ncrap"),
            ("spam", "scam\nclick here"),
        ]);
        for (text, term) in [
            ("idiots", "idiot"),
            ("moronic", "moron"),
            ("crappy", "crap"),
            ("scammers", "scam"),
            ("scamming", "scam"),
            ("sc4mmed", "scam"),
            ("click heres", "click here"),
        ] {
            assert_eq!(terms(&f, text), [term], "{text}");
        }
        for text in [
            "scampi",
            "scamper",
            "crappie",
            "idiomatic",
            "moroccan",
            "crapshoot",
        ] {
            assert!(terms(&f, text).is_empty(), "{text}: {:?}", terms(&f, text));
        }
    }

    #[test]
    fn settings() {
        let config: BTreeMap<String, String> = [
            ("list.spam", "scam"),
            ("list.other", "hello"),
            ("lists", "spam"),
            ("blockOnMatch", "false"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        let get = |k: &str| config.get(k).cloned();
        let keys = || config.keys().cloned().collect();
        let f = Filter::from_config(get, keys);
        let v = f.check("hello scam");
        assert!(!v.blocked);
        assert_eq!(
            v.matches,
            [Match {
                term: "scam".into(),
                list: "spam".into()
            }]
        );
        let disabled = Filter::from_config(
            |k| {
                if k == "enabled" {
                    Some("false".into())
                } else {
                    get(k)
                }
            },
            keys,
        );
        assert_eq!(disabled.check("scam"), Verdict::default());
        let garbled = Filter::from_config(
            |k| {
                if k == "blockOnMatch" {
                    Some("maybe".into())
                } else {
                    get(k)
                }
            },
            keys,
        );
        assert!(garbled.check("scam").blocked);
    }

    /// The golden cases in testdata/guests/safety-filter, natively.
    #[test]
    fn golden_cases() {
        let cases = golden::cases(Slot::SafetyFilter);
        assert!(cases.len() >= 10);
        for Case {
            name,
            config,
            input,
            expect,
        } in cases
        {
            let f = Filter::from_config(
                |k| config.get(k).cloned(),
                || config.keys().cloned().collect(),
            );
            let verdict = f.check(input["text"].as_str().expect("text"));
            assert_eq!(
                verdict.blocked,
                expect["blocked"].as_bool().expect("blocked"),
                "{name}: {verdict:?}"
            );
            if let Some(want) = expect["terms"].as_array() {
                let mut want: Vec<&str> = want.iter().filter_map(|v| v.as_str()).collect();
                let mut got: Vec<&str> = verdict.matches.iter().map(|m| m.term.as_str()).collect();
                want.sort_unstable();
                got.sort_unstable();
                assert_eq!(got, want, "{name}");
            }
        }
    }

    /// The evasion and clean sets (testdata/eval/safety-*.txt) with the shipped
    /// wordlists: at least 98% of the evasions caught, no clean post blocked.
    #[test]
    fn evaluation_sets() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let read = |p: &str| std::fs::read_to_string(root.join(p)).expect(p);
        let mut config: BTreeMap<String, String> = BTreeMap::new();
        for list in ["offensive", "spam", "political"] {
            config.insert(
                format!("list.{list}"),
                read(&format!("policies/wordlists/{list}.txt")),
            );
        }
        let f = Filter::from_config(
            |k| config.get(k).cloned(),
            || config.keys().cloned().collect(),
        );
        let lines = |p: &str| -> Vec<String> {
            read(p)
                .lines()
                .map(str::trim)
                .filter(|l| !l.is_empty() && !l.starts_with('#'))
                .map(str::to_owned)
                .collect()
        };
        let evasions = lines("testdata/eval/safety-evasion.txt");
        let missed: Vec<&String> = evasions.iter().filter(|t| !f.check(t).blocked).collect();
        let clean = lines("testdata/eval/safety-clean.txt");
        let blocked: Vec<(&String, Vec<String>)> = clean
            .iter()
            .map(|t| (t, f.check(t)))
            .filter(|(_, v)| v.blocked)
            .map(|(t, v)| (t, v.matches.into_iter().map(|m| m.term).collect()))
            .collect();
        println!(
            "evasions: {} of {} caught; clean posts: {} of {} blocked",
            evasions.len() - missed.len(),
            evasions.len(),
            blocked.len(),
            clean.len()
        );
        println!("missed: {missed:?}");
        println!("blocked: {blocked:?}");
        assert!(evasions.len() >= 100 && clean.len() >= 70);
        assert!(
            missed.len() * 50 <= evasions.len(),
            "recall under 98%: missed {missed:?}"
        );
        assert!(blocked.is_empty(), "clean posts blocked: {blocked:?}");
    }
}
