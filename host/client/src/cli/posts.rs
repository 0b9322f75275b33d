//! `pk post` and `pk replies`: pubky.app posts (short ones), the network's social app.
//! A post goes to `/pub/pubky.app/posts/<id>` with a time-sortable id; a reply names
//! its parent's `pubky://` URI.

use std::time::{Duration, Instant};

use pk_client::app::{
    MAX_SHORT_POST_CHARS, POSTS_PREFIX, PostUri, PubkyAppPost, now_micros, post_id,
};
use pk_client::{ListOptions, PublicKey};
use serde_json::json;

use super::output::{print, print_json};
use super::{CliError, Context};

/// `pk post TEXT [--reply-to URI]`: publishes a short post and prints its URI.
pub async fn post(ctx: &Context, text: &str, reply_to: Option<&str>) -> Result<(), CliError> {
    if text.trim().is_empty() {
        return Err(CliError::Usage("a post needs some text".into()));
    }
    if text.chars().count() > MAX_SHORT_POST_CHARS {
        return Err(CliError::Usage(format!(
            "a short post holds at most {MAX_SHORT_POST_CHARS} characters, this one has {}",
            text.chars().count()
        )));
    }
    let parent = reply_to
        .map(|uri| {
            PostUri::parse(uri).ok_or_else(|| {
                CliError::Usage(format!(
                    "--reply-to wants a post URI like pubky://<key>/pub/pubky.app/posts/<id>, got `{uri}`"
                ))
            })
        })
        .transpose()?;
    let client = ctx.signing_client()?;
    let Some(author) = client.public_key() else {
        return Err(CliError::MissingKey);
    };
    let uri = PostUri::new(author, post_id(now_micros()));
    let value = PubkyAppPost {
        content: text.to_owned(),
        kind: "short".into(),
        parent: parent.map(|p| p.to_string()),
    };
    let body = serde_json::to_vec(&value).map_err(|e| CliError::Usage(e.to_string()))?;
    client.put_bytes(&uri.path(), body).await?;
    if ctx.json {
        return print_json(&json!({"uri": uri.to_string(), "post": value}));
    }
    print(&format!("{uri}\n"))
}

/// `pk replies URI --user Z32 [--wait SECONDS]`: the posts of `user` that reply to
/// `uri`, oldest first (waiting up to `wait` for a first one).
pub async fn replies(ctx: &Context, uri: &str, user: PublicKey, wait: u64) -> Result<(), CliError> {
    let parent = PostUri::parse(uri)
        .ok_or_else(|| {
            CliError::Usage(format!(
                "wants a post URI like pubky://<key>/pub/pubky.app/posts/<id>, got `{uri}`"
            ))
        })?
        .to_string();
    let client = ctx.reading_client(Some(user))?;
    let deadline = Instant::now() + Duration::from_secs(wait);
    loop {
        let entries = match client
            .list_all(POSTS_PREFIX, ListOptions::default(), Some(user))
            .await
        {
            Ok(entries) => entries,
            Err(e) if e.is_not_found() => Vec::new(),
            Err(e) => return Err(e.into()),
        };
        let mut found = Vec::new();
        // Newest last; a reply is newer than its parent, so scan from the end.
        for entry in entries.iter().rev().take(200) {
            let Ok(bytes) = client.get_bytes(&entry.path, Some(user)).await else {
                continue;
            };
            let Ok(post) = serde_json::from_slice::<PubkyAppPost>(&bytes) else {
                continue;
            };
            if post.parent.as_deref() == Some(parent.as_str()) {
                let id = entry.path.rsplit('/').next().unwrap_or_default();
                found.push((PostUri::new(user, id), post));
            }
        }
        found.reverse();
        if !found.is_empty() || Instant::now() >= deadline {
            if ctx.json {
                let list: Vec<_> = found
                    .iter()
                    .map(|(uri, post)| json!({"uri": uri.to_string(), "post": post}))
                    .collect();
                return print_json(&list);
            }
            if found.is_empty() {
                return Err(CliError::NotFound(format!(
                    "no reply by {user} to {parent}"
                )));
            }
            let text: String = found
                .iter()
                .map(|(uri, post)| format!("{uri}\n{}\n\n", post.content))
                .collect();
            return print(&text);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
