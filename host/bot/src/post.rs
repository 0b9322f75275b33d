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
                .map(|h| h.trim().to_lowercase())
                .filter(|h| !h.is_empty()),
        );
        Self { needles }
    }

    /// Whether `content` names the bot (a handle only as a whole word).
    pub fn mentions(&self, content: &str) -> bool {
        let lower = content.to_lowercase();
        self.needles.iter().any(|needle| {
            lower.match_indices(needle.as_str()).any(|(at, _)| {
                let before = lower[..at].chars().next_back();
                let after = lower[at + needle.len()..].chars().next();
                let word = |c: Option<char>| c.is_some_and(|c| c.is_alphanumeric() || c == '_');
                !word(before) && !word(after)
            })
        })
    }

    /// `content` without the mentions of the bot (what the classifier should read).
    pub fn strip(&self, content: &str) -> String {
        let mut text = content.to_owned();
        for needle in &self.needles {
            let lower = text.to_lowercase();
            if let Some(at) = lower.find(needle.as_str()) {
                text.replace_range(at..at + needle.len(), " ");
            }
        }
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
    }
}
