//! Tokenizing folded text into words, optionally reading leetspeak.

use crate::fold::fold_char;

/// How to tokenize.
#[derive(Debug, Clone, Copy, Default)]
pub struct Options {
    /// Read leetspeak: `0`→o, `1`→i, `3`→e, `4`→a, `5`→s, `7`→t, `@`→a, `$`→s. `l` is
    /// read as `i` too, because `1` stands for either and both sides of a comparison go
    /// through the same mapping (a "skeleton").
    pub leet: bool,
    /// Punctuation kept as a one-character token instead of separating words, e.g. `?`
    /// so that the keyword `source?` differs from the word `source`.
    pub keep: &'static [char],
}

/// One word, and what separated it from the previous one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Token {
    pub text: String,
    /// How many separator characters stood before this token (0 for the first token
    /// and for a kept punctuation token glued to a word).
    pub gap: usize,
    /// Whether that gap held a line break.
    pub gap_has_newline: bool,
}

impl Token {
    /// True for a token of exactly one character.
    pub fn is_single_char(&self) -> bool {
        let mut chars = self.text.chars();
        chars.next().is_some() && chars.next().is_none()
    }
}

/// Maps a folded character to its leetspeak reading.
pub fn leet(c: char) -> char {
    match c {
        '0' => 'o',
        '1' | 'l' => 'i',
        '3' => 'e',
        '4' | '@' => 'a',
        '5' | '$' => 's',
        '7' => 't',
        other => other,
    }
}

/// Folds `text` (see [`crate::fold`]) and splits it into words. Word characters are
/// letters and digits (plus `@` and `$` with `leet`); everything else separates words,
/// except the characters in `options.keep`.
pub fn tokenize(text: &str, options: Options) -> Vec<Token> {
    let mut tokens = Vec::new();
    let mut current = String::new();
    let mut gap = 0usize;
    let mut gap_has_newline = false;
    let mut folded = String::new();

    for raw in text.chars() {
        folded.clear();
        // A newline folds to a space; remember it first.
        let is_newline = raw == '\n' || raw == '\r';
        fold_char(raw, &mut folded);
        for c in folded.chars() {
            let word_char = c.is_alphanumeric() || (options.leet && (c == '@' || c == '$'));
            if word_char {
                current.push(if options.leet { leet(c) } else { c });
            } else if options.keep.contains(&c) {
                flush(&mut current, &mut gap, &mut gap_has_newline, &mut tokens);
                tokens.push(Token {
                    text: c.to_string(),
                    gap,
                    gap_has_newline,
                });
                gap = 0;
                gap_has_newline = false;
            } else {
                flush(&mut current, &mut gap, &mut gap_has_newline, &mut tokens);
                gap += 1;
                gap_has_newline |= is_newline;
            }
        }
    }
    flush(&mut current, &mut gap, &mut gap_has_newline, &mut tokens);
    tokens
}

/// Ends the word being collected, if any.
fn flush(current: &mut String, gap: &mut usize, newline: &mut bool, tokens: &mut Vec<Token>) {
    if !current.is_empty() {
        tokens.push(Token {
            text: std::mem::take(current),
            gap: *gap,
            gap_has_newline: *newline,
        });
        *gap = 0;
        *newline = false;
    }
}

/// The words of `text` as plain strings.
pub fn words(text: &str, options: Options) -> Vec<String> {
    tokenize(text, options)
        .into_iter()
        .map(|t| t.text)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const LEET: Options = Options {
        leet: true,
        keep: &[],
    };

    #[test]
    fn splits_on_punctuation_and_space() {
        assert_eq!(
            words("Hello, world! tl;dr", Options::default()),
            ["hello", "world", "tl", "dr"]
        );
    }

    #[test]
    fn keeps_selected_punctuation() {
        let opts = Options {
            leet: false,
            keep: &['?'],
        };
        assert_eq!(words("Source? yes", opts), ["source", "?", "yes"]);
    }

    #[test]
    fn reads_leetspeak() {
        assert_eq!(words("fr33 m0n3y $c@m", LEET), ["free", "money", "scam"]);
        assert_eq!(words("1337 h4x0r", LEET), ["ieet", "haxor"]);
        assert_eq!(words("leet", LEET), ["ieet"]);
    }

    #[test]
    fn records_gaps() {
        let t = tokenize("f r  e\nx", LEET);
        let gaps: Vec<_> = t.iter().map(|t| (t.gap, t.gap_has_newline)).collect();
        assert_eq!(gaps, [(0, false), (1, false), (2, false), (1, true)]);
    }
}
