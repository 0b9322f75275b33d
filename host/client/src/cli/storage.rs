//! The commands that talk to the homeserver about single entries and the account:
//! `whoami`, `signup`, `session`, `put`, `get`, `stat`, `ls`, `rm`. Values are streamed
//! both ways; nothing here holds a whole value in memory.

use std::io::IsTerminal;
use std::path::Path;

use futures_util::StreamExt;
use pk_client::transfer::content_hash_of_etag;
use pk_client::{
    ClientError, DownloadOptions, EntryMeta, GetResponse, ListEntry, ListOptions, PublicKey,
};
use serde_json::json;
use tokio::io::AsyncWriteExt;

use super::args::LsArgs;
use super::output::{
    TEXT_SNIFF_BYTES, finish, human_size, looks_like_text, print, print_json, progress_of, utc_time,
};
use super::{CliError, Context};

/// `pk whoami`: key, homeserver, and the account's usage and quota.
pub async fn whoami(ctx: &Context) -> Result<(), CliError> {
    let client = ctx.signing_client()?;
    let public = client.public_key().map(|k| k.to_z32()).unwrap_or_default();
    let account = match client.account().await {
        Ok(account) => Some(account),
        // The key never signed up on this server.
        Err(e) if e.is_not_found() => None,
        Err(e) => return Err(e.into()),
    };
    let s = &ctx.settings;
    if ctx.json {
        return print_json(&json!({
            "public_key": public,
            "homeserver": client.base_url().as_str().trim_end_matches('/'),
            "profile": s.profile,
            "signed_up": account.is_some(),
            "account": account,
        }));
    }
    let mut text = format!(
        "public key   {public}\nhomeserver   {} (profile {})\n",
        client.base_url().as_str().trim_end_matches('/'),
        s.profile
    );
    match account {
        None => text.push_str("account      not signed up on this homeserver (`pk signup`)\n"),
        Some(a) => {
            text.push_str(&format!(
                "account      signed up {} UTC{}\n",
                utc_time(a.created_at),
                if a.disabled {
                    "; disabled by the operator (writes are refused)"
                } else {
                    ""
                }
            ));
            let usage = if a.quota_bytes == 0 {
                format!("{} used (no quota)", human_size(a.used_bytes))
            } else {
                format!(
                    "{} used of {} ({:.1}%)",
                    human_size(a.used_bytes),
                    human_size(a.quota_bytes),
                    a.used_bytes as f64 * 100.0 / a.quota_bytes as f64
                )
            };
            text.push_str(&format!(
                "storage      {usage}\nmax value    {}\n",
                human_size(a.max_value_bytes)
            ));
        }
    }
    print(&text)
}

/// `pk signup [--token T] [--publish]`.
pub async fn signup(ctx: &Context, token: Option<&str>, publish: bool) -> Result<(), CliError> {
    let client = ctx.signing_client()?;
    let status = client.signup_status(token).await?;
    let result = &status.result;
    // With --publish: the record naming this homeserver, for it to keep on the DHT
    // (`pk publish` also publishes it directly). A server without the endpoint is not
    // an error. Without: a second homeserver does not take over the user's record.
    let record = if publish {
        Some(hand_over_record(ctx, &client).await)
    } else {
        None
    };
    if ctx.json {
        return print_json(&json!({
            "public_key": result.public_key,
            "created_at": result.created_at,
            "created": status.created,
            "record_stored": record.as_ref().and_then(|r| r.as_ref().ok()),
        }));
    }
    match &record {
        Some(Err(e)) => {
            eprintln!(
                "note: the homeserver did not take your pkarr record ({e}); see `pk publish`"
            );
        }
        None if status.created => eprintln!(
            "note: to be found by your key on the network, make this homeserver your home \
             with `pk publish` (or sign up with --publish)"
        ),
        _ => {}
    }
    let server = client.base_url().as_str().trim_end_matches('/').to_owned();
    if status.created {
        print(&format!("signed up {} on {server}\n", result.public_key))
    } else {
        print(&format!(
            "already signed up: {} on {server} since {} UTC\n",
            result.public_key,
            utc_time(result.created_at)
        ))
    }
}

/// Signs the user's `_pubky` record naming the homeserver `client` talks to and hands
/// it to that homeserver; whether it was stored (false: it had it already).
async fn hand_over_record(ctx: &Context, client: &pk_client::PkClient) -> Result<bool, CliError> {
    let server = client.server_info().await?.public_key;
    let record = pk_client::pkarr::Resolver::user_record(&ctx.keypair()?, &server)?;
    Ok(client.store_record(&record).await?)
}

/// `pk session --cap C [--cap C...] [--ttl S]`.
pub async fn session(
    ctx: &Context,
    capabilities: &[String],
    ttl: Option<u64>,
) -> Result<(), CliError> {
    let created = ctx
        .signing_client()?
        .create_session(capabilities, ttl)
        .await?;
    if ctx.json {
        return print_json(&created);
    }
    print(&format!("{}\n", created.token))?;
    eprintln!(
        "expires at {} UTC ({} Unix seconds)",
        utc_time(created.expires_at),
        created.expires_at
    );
    Ok(())
}

/// `pk put PATH FILE|-`.
pub async fn put(ctx: &Context, path: &str, file: &Path) -> Result<(), CliError> {
    let client = ctx.signing_client()?;
    let result = if file == Path::new("-") {
        client.put_reader(path, tokio::io::stdin()).await?
    } else {
        let len = std::fs::metadata(file).ok().map(|m| m.len());
        let bar = ctx.bars.for_transfer(path, len);
        let result = client
            .put_file_with_progress(path, file, progress_of(&bar))
            .await;
        finish(bar);
        result?
    };
    if ctx.json {
        return print_json(&result);
    }
    eprintln!("stored {} ({} bytes)", result.path, result.size);
    Ok(())
}

/// `pk get PATH [--user Z32] [-o FILE] [--force]`.
pub async fn get(
    ctx: &Context,
    path: &str,
    user: Option<PublicKey>,
    out: Option<&Path>,
    force: bool,
) -> Result<(), CliError> {
    let out = out.filter(|o| *o != Path::new("-"));
    // Refuse before anything is sent: the file is there and may be the user's own.
    if let Some(file) = out
        && !force
        && file.exists()
    {
        return Err(CliError::Exists {
            path: file.to_owned(),
        });
    }
    let response = ctx.reading_client(user)?.get(path, user).await?;
    match out {
        None => to_stdout(path, response, force).await,
        Some(file) => {
            let bar = ctx.bars.for_transfer(path, response.meta().content_length);
            let options = DownloadOptions {
                overwrite: force,
                progress: progress_of(&bar),
            };
            let saved = response.save_verified(path, file, options).await;
            finish(bar);
            let saved = saved?;
            if ctx.json {
                return print_json(&json!({
                    "path": path,
                    "file": file,
                    "size": saved.size,
                    "content_hash": saved.content_hash,
                }));
            }
            eprintln!("saved {path} to {} ({} bytes)", file.display(), saved.size);
            Ok(())
        }
    }
}

/// Streams a value to standard output. To a terminal, a value that does not start
/// like text is refused unless `force`. The value is hashed on the way and checked
/// against its `ETag` at the end (a mismatch fails the command after the bytes went
/// out: the reader must not trust them).
async fn to_stdout(path: &str, response: GetResponse, force: bool) -> Result<(), CliError> {
    let guard_terminal = !force && std::io::stdout().is_terminal();
    let expected = response
        .meta()
        .etag
        .as_deref()
        .map(|e| content_hash_of_etag(e).to_owned());
    let size = response.meta().content_length;
    let mut stream = response.into_stream();
    let mut stdout = tokio::io::stdout();
    let mut hasher = pk_client::transfer::ContentHasher::default();
    let write_error = |e| CliError::io("cannot write to standard output", e);

    // The first few KiB, to decide whether the value is text.
    let mut head = Vec::new();
    let mut ended = false;
    while head.len() < TEXT_SNIFF_BYTES {
        match stream.next().await {
            Some(chunk) => head.extend_from_slice(&chunk?),
            None => {
                ended = true;
                break;
            }
        }
    }
    if guard_terminal && !looks_like_text(&head, ended) {
        return Err(CliError::BinaryToTerminal {
            path: path.to_owned(),
            size: size.map_or_else(|| "binary".to_owned(), human_size),
        });
    }
    hasher.update(&head);
    stdout.write_all(&head).await.map_err(write_error)?;
    while let Some(chunk) = stream.next().await {
        let chunk = chunk?;
        hasher.update(&chunk);
        stdout.write_all(&chunk).await.map_err(write_error)?;
    }
    stdout.flush().await.map_err(write_error)?;
    let actual = hasher.finish();
    if let Some(expected) = expected
        && expected != actual
    {
        return Err(ClientError::HashMismatch {
            path: path.to_owned(),
            expected,
            actual,
        }
        .into());
    }
    Ok(())
}

/// `pk stat PATH [--user Z32]`.
pub async fn stat(ctx: &Context, path: &str, user: Option<PublicKey>) -> Result<(), CliError> {
    let meta = match ctx.reading_client(user)?.head(path, user).await {
        Ok(meta) => meta,
        // A HEAD answer has no body to explain itself.
        Err(e) if e.is_not_found() => {
            return Err(CliError::NotFound(format!("no entry at {path}")));
        }
        Err(e) => return Err(e.into()),
    };
    let EntryMeta {
        content_length,
        etag,
        last_modified,
    } = meta;
    let hash = etag.as_deref().map(content_hash_of_etag);
    let updated = last_modified
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .and_then(|d| i64::try_from(d.as_secs()).ok());
    if ctx.json {
        return print_json(&json!({
            "path": path,
            "size": content_length,
            "content_hash": hash,
            "updated_at": updated,
        }));
    }
    let mut text = format!("path          {path}\n");
    if let Some(size) = content_length {
        text.push_str(&format!("size          {size} ({})\n", human_size(size)));
    }
    if let Some(hash) = hash {
        text.push_str(&format!("content hash  {hash} (BLAKE3, base64)\n"));
    }
    if let Some(updated) = updated {
        text.push_str(&format!("updated       {} UTC\n", utc_time(updated)));
    }
    print(&text)
}

/// `pk ls PATH/ [-l] [--limit N] [--cursor C] [--reverse] [--shallow] [--user Z32] [--all]`.
pub async fn ls(ctx: &Context, args: LsArgs) -> Result<(), CliError> {
    let client = ctx.reading_client(args.user)?;
    let mut path = args.path;
    if !path.ends_with('/') {
        path.push('/');
    }
    let mut options = ListOptions {
        limit: args.limit,
        cursor: args.cursor,
        reverse: args.reverse,
        shallow: args.shallow,
    };
    // With --json and --all, one object with every entry.
    let mut collected: Vec<ListEntry> = Vec::new();
    loop {
        let page = client.list(&path, options.clone(), args.user).await?;
        let next = match &page.cursor {
            Some(cursor) if page.has_more => Some(cursor.clone()),
            _ => None,
        };
        if ctx.json {
            if args.all {
                collected.extend(page.entries);
            } else {
                return print_json(&page);
            }
        } else {
            print(&listing_lines(&page.entries, args.long))?;
        }
        match next {
            Some(cursor) if args.all => options.cursor = Some(cursor),
            Some(cursor) => {
                eprintln!("next cursor: {cursor}");
                return Ok(());
            }
            None => break,
        }
    }
    if ctx.json {
        return print_json(&json!({"entries": collected, "cursor": null, "has_more": false}));
    }
    Ok(())
}

/// One line per entry: the path, or with `long` the size, the update time (UTC) and the
/// path, sizes aligned. Sub-folders of a shallow listing show `-` for both.
fn listing_lines(entries: &[ListEntry], long: bool) -> String {
    let mut out = String::new();
    let width = entries
        .iter()
        .filter_map(|e| e.size)
        .map(|s| s.to_string().len())
        .max()
        .unwrap_or(1);
    for entry in entries {
        if long {
            let size = entry.size.map_or_else(|| "-".to_owned(), |s| s.to_string());
            let updated = entry
                .updated_at
                .map_or_else(|| format!("{:19}", "-"), utc_time);
            out.push_str(&format!("{size:>width$}  {updated}  "));
        }
        out.push_str(&entry.path);
        out.push('\n');
    }
    out
}

/// `pk rm PATH` and `pk rm -r PATH[/]`.
pub async fn rm(ctx: &Context, path: &str, recursive: bool) -> Result<(), CliError> {
    let client = ctx.signing_client()?;
    if !recursive {
        let result = match client.delete(path).await {
            Err(ClientError::PathKind { .. }) if path.ends_with('/') => {
                return Err(CliError::Usage(format!(
                    "{path} is a folder: use `pk rm -r {path}` to delete everything under it"
                )));
            }
            other => other?,
        };
        if ctx.json {
            return print_json(&result);
        }
        eprintln!("deleted {}", result.path);
        return Ok(());
    }
    let folder = if path.ends_with('/') {
        path.to_owned()
    } else {
        format!("{path}/")
    };
    let entries = client
        .list_all(
            &folder,
            ListOptions {
                limit: Some(homeserver_protocol::query::MAX_LIST_LIMIT),
                ..ListOptions::default()
            },
            None,
        )
        .await?;
    let mut deleted = Vec::new();
    // `rm -r name` also removes an entry called exactly `name`, as rm -r does a file.
    let targets = (!path.ends_with('/'))
        .then(|| path.to_owned())
        .into_iter()
        .chain(entries.into_iter().map(|e| e.path));
    for target in targets {
        match client.delete(&target).await {
            Ok(result) => {
                if !ctx.json {
                    eprintln!("deleted {}", result.path);
                }
                deleted.push(result.path);
            }
            // Gone already (another client, or `name` was only a folder).
            Err(e) if e.is_not_found() => {}
            Err(e) => return Err(e.into()),
        }
    }
    if deleted.is_empty() {
        return Err(CliError::NotFound(format!("nothing to delete at {path}")));
    }
    if ctx.json {
        return print_json(&json!({ "deleted": deleted }));
    }
    eprintln!("deleted {} entries", deleted.len());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(path: &str, size: Option<u64>, updated: Option<i64>) -> ListEntry {
        ListEntry {
            path: path.into(),
            size,
            created_at: updated,
            updated_at: updated,
            content_hash: size.map(|_| pk_client::transfer::content_hash_of(b"")),
        }
    }

    #[test]
    fn long_listing_aligns_sizes() {
        let entries = [
            entry("/pub/a/x", Some(5), Some(1_700_000_000)),
            entry("/pub/a/big", Some(123_456), Some(0)),
            entry("/pub/a/sub/", None, None),
        ];
        assert_eq!(
            listing_lines(&entries, false),
            "/pub/a/x\n/pub/a/big\n/pub/a/sub/\n"
        );
        assert_eq!(
            listing_lines(&entries, true),
            "     5  2023-11-14 22:13:20  /pub/a/x\n\
             123456  1970-01-01 00:00:00  /pub/a/big\n     \
             -  -                    /pub/a/sub/\n"
        );
        assert_eq!(listing_lines(&[], true), "");
    }
}
