//! Character folding: maps the many ways to write a Latin letter (case, accents,
//! fullwidth and mathematical forms, ligatures, Cyrillic and Greek look-alikes) to plain
//! lower-case ASCII, and drops invisible characters.
//!
//! This is "NFKC-ish": a hand-written table of the compatibility forms and confusables
//! people use to dodge word filters, instead of the full Unicode tables, which would
//! triple the size of a guest. Characters it does not know are lower-cased and kept.

/// Appends the folded form of `c` to `out` (zero, one or several characters).
pub fn fold_char(c: char, out: &mut String) {
    if c.is_ascii() {
        out.push(c.to_ascii_lowercase());
        return;
    }
    if is_invisible(c) {
        return;
    }
    if c.is_whitespace() {
        out.push(' ');
        return;
    }
    // Look-alikes are matched before lower-casing: upper-case Greek `Η` looks like `H`,
    // its lower-case form `η` like `n`.
    if let Some(s) = upper_confusable(c) {
        out.push_str(s);
        return;
    }
    if let Some(s) = compatibility(c) {
        out.push_str(s);
        return;
    }
    for lower in c.to_lowercase() {
        if let Some(s) = compatibility(lower) {
            out.push_str(s);
        } else if let Some(s) = lower_confusable(lower) {
            out.push_str(s);
        } else {
            out.push(lower);
        }
    }
}

/// Folds a whole text; see [`fold_char`].
pub fn fold(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        fold_char(c, &mut out);
    }
    out
}

/// Zero-width and formatting characters and combining marks: dropped, so that
/// `fr\u{200B}ee` and `fre\u{301}e` both read `free`.
fn is_invisible(c: char) -> bool {
    matches!(c,
        '\u{00AD}' | '\u{034F}' | '\u{180E}' | '\u{200B}'..='\u{200F}' | '\u{2060}'..='\u{2064}'
        | '\u{FEFF}' | '\u{0300}'..='\u{036F}' | '\u{1AB0}'..='\u{1AFF}' | '\u{1DC0}'..='\u{1DFF}'
        | '\u{20D0}'..='\u{20FF}' | '\u{FE00}'..='\u{FE0F}' | '\u{FE20}'..='\u{FE2F}')
}

const LETTERS: &[&str] = &[
    "a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k", "l", "m", "n", "o", "p", "q", "r", "s",
    "t", "u", "v", "w", "x", "y", "z",
];
const DIGITS: &[&str] = &["0", "1", "2", "3", "4", "5", "6", "7", "8", "9"];

fn letter(index: u32) -> Option<&'static str> {
    LETTERS.get(index as usize).copied()
}

fn digit(index: u32) -> Option<&'static str> {
    DIGITS.get(index as usize).copied()
}

/// Compatibility forms that stand for ASCII letters and digits.
fn compatibility(c: char) -> Option<&'static str> {
    let cp = c as u32;
    match cp {
        // Fullwidth ASCII: `ｆｒｅｅ`. Upper-case letters land on A-Z and are lowered.
        0xFF01..=0xFF5E => {
            let ascii = (cp - 0xFEE0) as u8;
            let lower = ascii.to_ascii_lowercase();
            match lower {
                b'a'..=b'z' => letter(u32::from(lower - b'a')),
                b'0'..=b'9' => digit(u32::from(lower - b'0')),
                _ => Some(" "),
            }
        }
        0x3000 => Some(" "),
        // Mathematical alphanumerics: 13 alphabets of A-Z a-z (𝐟𝐫𝐞𝐞, 𝓯𝓻𝓮𝓮, ...).
        0x1D400..=0x1D6A3 => letter((cp - 0x1D400) % 52 % 26),
        0x1D7CE..=0x1D7FF => digit((cp - 0x1D7CE) % 10),
        // Circled, parenthesized, squared and regional-indicator letters.
        0x24B6..=0x24CF => letter(cp - 0x24B6),
        0x24D0..=0x24E9 => letter(cp - 0x24D0),
        0x249C..=0x24B5 => letter(cp - 0x249C),
        0x1F130..=0x1F149 => letter(cp - 0x1F130),
        0x1F150..=0x1F169 => letter(cp - 0x1F150),
        0x1F170..=0x1F189 => letter(cp - 0x1F170),
        0x1F1E6..=0x1F1FF => letter(cp - 0x1F1E6),
        // Circled and super/subscript digits.
        0x2460..=0x2468 => digit(cp - 0x2460 + 1),
        0x2070 => Some("0"),
        0x00B9 => Some("1"),
        0x00B2 => Some("2"),
        0x00B3 => Some("3"),
        0x2074..=0x2079 => digit(cp - 0x2074 + 4),
        0x2080..=0x2089 => digit(cp - 0x2080),
        0x2071 => Some("i"),
        0x207F => Some("n"),
        // Ligatures and letters written as two.
        0xFB00 => Some("ff"),
        0xFB01 => Some("fi"),
        0xFB02 => Some("fl"),
        0xFB03 => Some("ffi"),
        0xFB04 => Some("ffl"),
        0xFB05 | 0xFB06 => Some("st"),
        0x2113 => Some("l"),
        // Latin-1 and Latin Extended-A letters with diacritics.
        0x00C0..=0x017F => latin_base(cp),
        _ => None,
    }
}

/// The base letter(s) of a Latin-1 / Latin Extended-A letter.
fn latin_base(cp: u32) -> Option<&'static str> {
    const TABLE: &[(u32, u32, &str)] = &[
        (0x00C0, 0x00C5, "a"),
        (0x00C6, 0x00C6, "ae"),
        (0x00C7, 0x00C7, "c"),
        (0x00C8, 0x00CB, "e"),
        (0x00CC, 0x00CF, "i"),
        (0x00D0, 0x00D0, "d"),
        (0x00D1, 0x00D1, "n"),
        (0x00D2, 0x00D6, "o"),
        (0x00D8, 0x00D8, "o"),
        (0x00D9, 0x00DC, "u"),
        (0x00DD, 0x00DD, "y"),
        (0x00DE, 0x00DE, "th"),
        (0x00DF, 0x00DF, "ss"),
        (0x00E0, 0x00E5, "a"),
        (0x00E6, 0x00E6, "ae"),
        (0x00E7, 0x00E7, "c"),
        (0x00E8, 0x00EB, "e"),
        (0x00EC, 0x00EF, "i"),
        (0x00F0, 0x00F0, "d"),
        (0x00F1, 0x00F1, "n"),
        (0x00F2, 0x00F6, "o"),
        (0x00F8, 0x00F8, "o"),
        (0x00F9, 0x00FC, "u"),
        (0x00FD, 0x00FD, "y"),
        (0x00FE, 0x00FE, "th"),
        (0x00FF, 0x00FF, "y"),
        (0x0100, 0x0105, "a"),
        (0x0106, 0x010D, "c"),
        (0x010E, 0x0111, "d"),
        (0x0112, 0x011B, "e"),
        (0x011C, 0x0123, "g"),
        (0x0124, 0x0127, "h"),
        (0x0128, 0x0131, "i"),
        (0x0132, 0x0133, "ij"),
        (0x0134, 0x0135, "j"),
        (0x0136, 0x0138, "k"),
        (0x0139, 0x0142, "l"),
        (0x0143, 0x014B, "n"),
        (0x014C, 0x0151, "o"),
        (0x0152, 0x0153, "oe"),
        (0x0154, 0x0159, "r"),
        (0x015A, 0x0161, "s"),
        (0x0162, 0x0167, "t"),
        (0x0168, 0x0173, "u"),
        (0x0174, 0x0175, "w"),
        (0x0176, 0x0178, "y"),
        (0x0179, 0x017E, "z"),
        (0x017F, 0x017F, "s"),
    ];
    TABLE
        .iter()
        .find(|(start, end, _)| (*start..=*end).contains(&cp))
        .map(|(_, _, base)| *base)
}

/// Upper-case Greek and Cyrillic letters that look like Latin capitals.
fn upper_confusable(c: char) -> Option<&'static str> {
    Some(match c {
        'Α' | 'А' | 'Ά' => "a",
        'Β' | 'В' => "b",
        'Ε' | 'Е' | 'Έ' | 'Ё' => "e",
        'Ζ' => "z",
        'Η' | 'Н' | 'Ή' => "h",
        'Ι' | 'І' | 'Ί' | 'Ї' | 'Ӏ' => "i",
        'Ј' => "j",
        'Κ' | 'К' => "k",
        'Μ' | 'М' => "m",
        'Ν' => "n",
        'Ο' | 'О' | 'Ό' => "o",
        'Ρ' | 'Р' => "p",
        'Ѕ' => "s",
        'Τ' | 'Т' => "t",
        'Υ' | 'У' | 'Ү' | 'Ύ' => "y",
        'Χ' | 'Х' => "x",
        'С' => "c",
        _ => return None,
    })
}

/// Lower-case Greek and Cyrillic letters that look like Latin small letters.
fn lower_confusable(c: char) -> Option<&'static str> {
    Some(match c {
        'α' | 'ά' | 'а' => "a",
        'в' | 'β' | 'ь' => "b",
        'с' | 'ϲ' => "c",
        'ԁ' => "d",
        'ε' | 'έ' | 'е' | 'ё' => "e",
        'һ' => "h",
        'ι' | 'ί' | 'ϊ' | 'ΐ' | 'і' | 'ї' => "i",
        'ј' | 'ϳ' => "j",
        'κ' | 'к' => "k",
        'ӏ' => "l",
        'м' => "m",
        'η' | 'ή' | 'п' => "n",
        'ο' | 'ό' | 'о' | 'σ' => "o",
        'ρ' | 'р' => "p",
        'ԛ' => "q",
        'ѕ' | 'ς' => "s",
        'τ' | 'т' => "t",
        'υ' | 'ύ' | 'ϋ' | 'μ' => "u",
        'ν' => "v",
        'ω' | 'ώ' | 'ԝ' => "w",
        'χ' | 'х' => "x",
        'у' | 'γ' | 'ү' => "y",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ascii_is_lowered() {
        assert_eq!(fold("Free MONEY 42!"), "free money 42!");
    }

    #[test]
    fn compatibility_forms() {
        assert_eq!(fold("ｆｒｅｅ　ＭＯＮＥＹ"), "free money");
        assert_eq!(fold("𝐟𝐫𝐞𝐞 𝓶𝓸𝓷𝓮𝔂"), "free money");
        assert_eq!(fold("ⓕⓡⓔⓔ"), "free");
        assert_eq!(fold("ﬁne"), "fine");
        assert_eq!(fold("Straße"), "strasse");
        assert_eq!(fold("x²"), "x2");
    }

    #[test]
    fn accents_and_combining_marks() {
        assert_eq!(fold("Frée Mönéy"), "free money");
        assert_eq!(fold("fre\u{301}e"), "free");
        assert_eq!(fold("ŁÓDŹ"), "lodz");
    }

    #[test]
    fn confusables() {
        // Cyrillic а, е, о, р, с and Greek ο, ν.
        assert_eq!(fold("frее"), "free");
        assert_eq!(fold("sсаm"), "scam");
        assert_eq!(fold("ΜΟΝΕΥ"), "money");
        assert_eq!(fold("mοney"), "money");
    }

    #[test]
    fn invisible_characters_are_dropped() {
        assert_eq!(fold("fr\u{200B}e\u{FEFF}e"), "free");
        assert_eq!(fold("a\u{00A0}b"), "a b");
    }

    #[test]
    fn other_scripts_are_kept() {
        assert_eq!(fold("日本語"), "日本語");
    }
}
