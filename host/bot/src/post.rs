//! What counts as mentioning the bot in a post, and (re-exported from the client
//! library's `app` module) pubky.app posts, ids and URIs.

use homeserver_protocol::PublicKey;
pub use pk_client::app::{
    MAX_SHORT_POST_CHARS, POSTS_PREFIX, PostUri, PubkyAppPost, decode_post_id, now_micros, post_id,
};

/// What counts as naming the bot in a post.
#[derive(Debug, Clone)]
pub struct MentionMatcher {
    needles: Vec<String>,
}

impl MentionMatcher {
    /// `pk:<z32>`, `pubky<z32>` (how pubky.app writes a user mention) and the handles.
    pub fn new(bot: &PublicKey, handles: &[String]) -> Self {
        let z32 = bot.to_z32();
        let mut needles = vec![format!("pk:{z32}"), format!("pubky{z32}")];
        needles.extend(
            handles
                .iter()
                .map(|h| h.trim().to_ascii_lowercase())
                .filter(|h| !h.is_empty()),
        );
        Self { needles }
    }

    /// Where the bot is named in `content`: byte ranges of `content` itself. Matching
    /// ignores ASCII case only, which keeps every byte where it is (full Unicode
    /// lower-casing can change lengths: `İ` grows a byte); a handle counts only as a
    /// whole word.
    fn ranges(&self, content: &str) -> Vec<std::ops::Range<usize>> {
        let lower = content.to_ascii_lowercase();
        let word = |c: Option<char>| c.is_some_and(|c| c.is_alphanumeric() || c == '_');
        let mut found: Vec<std::ops::Range<usize>> = self
            .needles
            .iter()
            .flat_map(|needle| {
                lower
                    .match_indices(needle.as_str())
                    .map(|(at, _)| at..at + needle.len())
                    .collect::<Vec<_>>()
            })
            .filter(|r| {
                !word(lower[..r.start].chars().next_back()) && !word(lower[r.end..].chars().next())
            })
            .collect();
        found.sort_by_key(|r| r.start);
        found
    }

    /// Whether `content` names the bot.
    pub fn mentions(&self, content: &str) -> bool {
        !self.ranges(content).is_empty()
    }

    /// `content` without the mentions of the bot (what the classifier should read).
    pub fn strip(&self, content: &str) -> String {
        let mut text = String::with_capacity(content.len());
        let mut from = 0;
        for range in self.ranges(content) {
            if range.start >= from {
                text.push_str(&content[from..range.start]);
                text.push(' ');
                from = range.end;
            }
        }
        text.push_str(&content[from..]);
        text.split_whitespace().collect::<Vec<_>>().join(" ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use homeserver_protocol::Keypair;

    #[test]
    fn mentions_are_the_key_or_a_whole_handle() {
        let bot = Keypair::random().public_key();
        let m = MentionMatcher::new(&bot, &["@FactBot".into()]);
        let z = bot.to_z32();
        assert!(m.mentions(&format!("tl;dr pk:{z} please")));
        assert!(m.mentions(&format!("hey pubky{z}!")));
        assert!(m.mentions("ask @factbot, it knows"));
        assert!(!m.mentions("ask @factbotter"));
        assert!(!m.mentions(&format!("pk:{}", Keypair::random().public_key().to_z32())));
        assert_eq!(m.strip(&format!("tl;dr pk:{z} please")), "tl;dr please");
        assert_eq!(m.strip(&format!("pk:{z} tl;dr pk:{z}")), "tl;dr");
    }

    /// Lower-casing can change lengths (`İ` is two bytes, its lower case three): the
    /// ranges must stay those of the text itself.
    #[test]
    fn text_whose_case_changes_length_is_handled() {
        let bot = Keypair::random().public_key();
        let m = MentionMatcher::new(&bot, &["@bot".into()]);
        let z = bot.to_z32();
        for text in [
            format!("İ tl;dr pk:{z}"),
            format!("İİİİİİİİ pk:{z} ẞ @BOT Ω"),
            format!("ﬁ pk:{z}"),
        ] {
            assert!(m.mentions(&text), "{text}");
            let stripped = m.strip(&text);
            assert!(!stripped.contains("pk:"), "{stripped}");
        }
    }
}
