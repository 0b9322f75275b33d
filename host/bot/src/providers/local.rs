//! What the bot does without an AI model: split text into sentences, and summarize a
//! thread extractively (the sentences whose words the thread repeats most, in their
//! order), so it answers mentions with no keys and no network.

use std::collections::{HashMap, HashSet};

/// Words too common to say what a text is about.
const STOP_WORDS: &[&str] = &[
    "a", "about", "after", "all", "also", "am", "an", "and", "any", "are", "as", "at", "be",
    "because", "been", "but", "by", "can", "could", "did", "do", "does", "for", "from", "had",
    "has", "have", "he", "her", "here", "his", "how", "i", "if", "in", "into", "is", "it", "its",
    "just", "like", "me", "more", "my", "no", "not", "of", "on", "one", "or", "our", "out", "she",
    "so", "some", "than", "that", "the", "their", "them", "then", "there", "these", "they", "this",
    "to", "too", "up", "us", "very", "was", "we", "were", "what", "when", "which", "who", "will",
    "with", "would", "you", "your",
];

/// The sentences of `text`: split after `.`, `!`, `?` (and line breaks), trimmed.
pub fn sentences(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current = String::new();
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\n' {
            push_sentence(&mut out, &mut current);
            continue;
        }
        current.push(c);
        if matches!(c, '.' | '!' | '?')
            && chars.peek().is_none_or(|n| n.is_whitespace())
            && !ends_with_abbreviation(&current)
        {
            push_sentence(&mut out, &mut current);
        }
    }
    push_sentence(&mut out, &mut current);
    out
}

fn push_sentence(out: &mut Vec<String>, current: &mut String) {
    let s = current.trim();
    if !s.is_empty() {
        out.push(s.to_owned());
    }
    current.clear();
}

fn ends_with_abbreviation(text: &str) -> bool {
    let last = text.split_whitespace().last().unwrap_or("").to_lowercase();
    matches!(
        last.as_str(),
        "e.g." | "i.e." | "etc." | "vs." | "mr." | "mrs." | "dr." | "st."
    )
}

fn words(text: &str) -> impl Iterator<Item = String> + '_ {
    text.split(|c: char| !c.is_alphanumeric() && c != '\'')
        .map(|w| w.trim_matches('\'').to_lowercase())
        .filter(|w| w.chars().count() > 2 && !STOP_WORDS.contains(&w.as_str()))
}

/// Up to `n` sentences of `texts` that best stand for the whole, in their order.
///
/// A sentence scores the mean thread-wide frequency of its content words, so sentences
/// about what the thread keeps coming back to win; very short sentences and near
/// repeats of a chosen one are left out.
pub fn extractive_summary(texts: &[String], n: usize) -> Vec<String> {
    let all: Vec<String> = texts.iter().flat_map(|t| sentences(t)).collect();
    let mut frequency: HashMap<String, f64> = HashMap::new();
    for sentence in &all {
        for word in words(sentence).collect::<HashSet<_>>() {
            *frequency.entry(word).or_default() += 1.0;
        }
    }
    let mut scored: Vec<(usize, f64)> = all
        .iter()
        .enumerate()
        .filter_map(|(i, s)| {
            let ws: Vec<String> = words(s).collect();
            if ws.len() < 3 {
                return None;
            }
            let score = ws.iter().map(|w| frequency[w]).sum::<f64>() / ws.len() as f64;
            Some((i, score))
        })
        .collect();
    scored.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    let mut chosen: Vec<usize> = Vec::new();
    for (i, _) in scored {
        if chosen.len() == n {
            break;
        }
        let mine: HashSet<String> = words(&all[i]).collect();
        let repeat = chosen.iter().any(|&j| {
            let theirs: HashSet<String> = words(&all[j]).collect();
            let shared = mine.intersection(&theirs).count();
            shared * 10 >= mine.len().min(theirs.len()) * 8
        });
        if !repeat {
            chosen.push(i);
        }
    }
    if chosen.is_empty() {
        // Nothing long enough: the first sentences as they are.
        return all.into_iter().take(n).collect();
    }
    chosen.sort_unstable();
    chosen.into_iter().map(|i| all[i].clone()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sentences_split_at_ends_not_abbreviations() {
        assert_eq!(
            sentences("Rust is fast. It is safe, e.g. no data races! Is it easy?\nNot always"),
            [
                "Rust is fast.",
                "It is safe, e.g. no data races!",
                "Is it easy?",
                "Not always"
            ]
        );
        assert_eq!(sentences("version 1.5 is out."), ["version 1.5 is out."]);
    }

    #[test]
    fn the_summary_keeps_what_the_thread_is_about() {
        let thread = vec![
            "The new bridge opens on Monday. Traffic downtown should ease after the bridge opens."
                .to_owned(),
            "I had pizza for lunch.".to_owned(),
            "The bridge cost twice the budget, but the bridge carries trains too.".to_owned(),
            "Weather is nice.".to_owned(),
        ];
        let summary = extractive_summary(&thread, 3);
        assert!(summary.len() <= 3);
        assert!(summary.iter().all(|s| s.contains("bridge")), "{summary:?}");
        assert!(!summary.iter().any(|s| s.contains("pizza")));
    }

    #[test]
    fn short_threads_still_get_an_answer() {
        assert_eq!(extractive_summary(&["ok".to_owned()], 3), ["ok"]);
        assert!(extractive_summary(&[], 3).is_empty());
    }
}
