//! Text normalization shared by the safety-filter and intent-classifier guests: folding
//! look-alike characters to plain lower-case ASCII ([`fold`]) and splitting text into
//! words ([`tokens`]). Plain Rust without WIT, so it is tested on the host.

pub mod fold;
pub mod tokens;

pub use fold::{fold, fold_char};
pub use tokens::{Options, Token, tokenize, words};

/// Splits a config value holding a list: one item a line (or comma separated), `#`
/// starts a comment, blank items are skipped, surrounding whitespace is trimmed.
pub fn config_items(value: &str) -> impl Iterator<Item = &str> {
    value
        .lines()
        .map(|line| line.split_once('#').map_or(line, |(before, _)| before))
        .flat_map(|line| line.split(','))
        .map(str::trim)
        .filter(|item| !item.is_empty())
}

/// Splits a config value holding one entry a line (entries may contain commas, e.g. a
/// wordlist term): `#` starts a comment, blank lines are skipped, whitespace trimmed.
pub fn config_lines(value: &str) -> impl Iterator<Item = &str> {
    value
        .lines()
        .map(|line| line.split_once('#').map_or(line, |(before, _)| before))
        .map(str::trim)
        .filter(|line| !line.is_empty())
}

/// Reads a boolean config value; `None` for anything but true/false/yes/no/on/off/1/0.
pub fn config_bool(value: &str) -> Option<bool> {
    match value.trim().to_ascii_lowercase().as_str() {
        "true" | "yes" | "on" | "1" => Some(true),
        "false" | "no" | "off" | "0" => Some(false),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_lists() {
        let items: Vec<_> = config_items("a, b\n# comment\n c # trailing\n\n").collect();
        assert_eq!(items, ["a", "b", "c"]);
        let lines: Vec<_> = config_lines("free money\nis this true? # q\n").collect();
        assert_eq!(lines, ["free money", "is this true?"]);
        assert_eq!(config_bool(" TRUE "), Some(true));
        assert_eq!(config_bool("maybe"), None);
    }
}
