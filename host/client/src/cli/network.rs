//! `pk` on the network: homeservers named by key (found on the mainline DHT and reached
//! over raw-public-key TLS), `pk publish` (the user's `_pubky` record) and `pk migrate`
//! (moving to another homeserver).

use std::collections::HashMap;

use pk_client::pkarr::{Resolver, ResolverSettings};
use pk_client::transfer::content_hash_of;
use pk_client::{ListEntry, ListOptions, PkClient, PublicKey};
use serde_json::json;

use super::args::Command;
use super::output::{finish, print, print_json};
use super::{CliError, Context};

/// Where the homeserver is: a URL, and the key its TLS must present when it was named
/// by key.
#[derive(Debug, Clone)]
pub struct Target {
    pub url: String,
    pub pinned: Option<PublicKey>,
}

/// DHT settings from the environment: `PK_PKARR_BOOTSTRAP` and `PK_PKARR_RELAYS`
/// (comma separated).
fn resolver_settings() -> ResolverSettings {
    let list = |name: &str| -> Vec<String> {
        std::env::var(name)
            .unwrap_or_default()
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect()
    };
    ResolverSettings {
        bootstrap: list("PK_PKARR_BOOTSTRAP"),
        relays: list("PK_PKARR_RELAYS"),
        timeout: None,
    }
}

fn resolver() -> Result<Resolver, CliError> {
    Ok(Resolver::new(&resolver_settings())?)
}

impl Target {
    /// The configured value as a plain URL (before any DHT lookup).
    pub fn url(value: &str) -> Self {
        Self {
            url: value.to_owned(),
            pinned: None,
        }
    }

    /// The homeserver a value names: a URL as it is; a public key through its pkarr
    /// record; `pkarr` through the record of `subject` (else the user's own key).
    pub async fn resolve(ctx: &Context, subject: Option<PublicKey>) -> Result<Self, CliError> {
        Self::of(ctx, &ctx.settings.homeserver, subject).await
    }

    async fn of(ctx: &Context, value: &str, subject: Option<PublicKey>) -> Result<Self, CliError> {
        let value = value.trim();
        if value.eq_ignore_ascii_case("pkarr") {
            let user = match subject {
                Some(user) => user,
                None => ctx.optional_keypair()?.map(|k| k.public_key()).ok_or_else(|| {
                    CliError::Usage(
                        "--homeserver pkarr finds the homeserver of a user: configure your key or name one with --user".into(),
                    )
                })?,
            };
            let resolver = resolver()?;
            let server = resolver.homeserver_of(&user).await?;
            return Self::by_key(&resolver, server).await;
        }
        match value.parse::<PublicKey>() {
            Ok(server) => Self::by_key(&resolver()?, server).await,
            Err(_) => Ok(Self::url(value)),
        }
    }

    /// The homeserver `server`: its raw-public-key TLS endpoint (TLS pinned to that
    /// key), else the ordinary https URL its record names (CA-checked TLS; the server's
    /// key is then checked with `GET /info`).
    async fn by_key(resolver: &Resolver, server: PublicKey) -> Result<Self, CliError> {
        match resolver.endpoint_of(&server).await {
            Ok(url) => Ok(Self {
                url: url.to_string(),
                pinned: Some(server),
            }),
            Err(e) => match resolver.public_url_of(&server).await {
                Ok(Some(url)) => {
                    let info = PkClient::new(url.as_str(), None)?.server_info().await?;
                    if info.public_key != server {
                        return Err(CliError::Usage(format!(
                            "{url} (named in the record of {server}) answers as {}",
                            info.public_key
                        )));
                    }
                    Ok(Self::url(url.as_str()))
                }
                _ => Err(e.into()),
            },
        }
    }
}

/// Whether `command` talks to a homeserver (the others never look it up).
pub fn talks_to_a_homeserver(command: &Command) -> bool {
    !matches!(
        command,
        Command::Keygen { .. } | Command::Pubkey | Command::Config | Command::Completions { .. }
    )
}

/// The user whose data `command` reads, when it names one (`--user`).
pub fn subject_of(command: &Command) -> Option<PublicKey> {
    match command {
        Command::Get { user, .. } | Command::Stat { user, .. } => *user,
        Command::Ls(args) => args.user,
        Command::Cp(args) => args.user,
        Command::Sync(args) => args.user,
        Command::Replies { user, .. } => Some(*user),
        _ => None,
    }
}

/// `pk publish [--homeserver-key Z32]`.
pub async fn publish(ctx: &Context, homeserver_key: Option<PublicKey>) -> Result<(), CliError> {
    let client = ctx.signing_client()?;
    let server = match homeserver_key {
        Some(key) => key,
        None => client.server_info().await?.public_key,
    };
    let (to_server, on_dht) = publish_record(ctx, &client, server).await?;
    if ctx.json {
        return print_json(&json!({
            "homeserver": server.to_z32(),
            "stored_by_homeserver": to_server,
            "dht": on_dht.as_ref().map_or_else(|e| json!({"error": e}), |n| json!({"nodes": n})),
        }));
    }
    let user = ctx.keypair()?.public_key();
    let mut text = format!("published: {user} is on homeserver {server}\n");
    match on_dht {
        Ok(n) => text.push_str(&format!("  on the DHT: stored by {n} nodes\n")),
        Err(e) => text.push_str(&format!(
            "  on the DHT: not now ({e}); the homeserver republishes it\n"
        )),
    }
    if !to_server {
        text.push_str("  the homeserver had this record already\n");
    }
    print(&text)
}

/// Signs the user's record naming `server`, hands it to the homeserver `client` talks
/// to, and publishes it on the DHT. Returns whether the homeserver stored it, and the
/// DHT's answer (an error there is not fatal: the homeserver republishes).
async fn publish_record(
    ctx: &Context,
    client: &PkClient,
    server: PublicKey,
) -> Result<(bool, Result<u32, String>), CliError> {
    let keypair = ctx.keypair()?;
    let record = Resolver::user_record(&keypair, &server)?;
    let stored = client.store_record(&record).await?;
    let on_dht = match resolver() {
        Ok(resolver) => resolver.publish(&record).await.map_err(|e| e.to_string()),
        Err(e) => Err(e.to_string()),
    };
    Ok((stored, on_dht))
}

/// `pk migrate --to URL|KEY [--token T] [--no-publish]`.
pub async fn migrate(
    ctx: &Context,
    to: &str,
    token: Option<&str>,
    publish: bool,
) -> Result<(), CliError> {
    let source = ctx.signing_client()?;
    let target_at = Target::of(ctx, to, None).await?;
    let target = ctx.client_of(&target_at, Some(ctx.keypair()?))?;
    target.signup(token).await?;
    let from = listing(&source).await?;
    let already: HashMap<String, Option<String>> = listing(&target)
        .await?
        .into_iter()
        .map(|e| (e.path, e.content_hash))
        .collect();
    let total: u64 = from.iter().filter_map(|e| e.size).sum();
    let bar = ctx.bars.for_transfer("migrating", Some(total));
    let (mut copied, mut skipped, mut bytes) = (0u64, 0u64, 0u64);
    for entry in &from {
        let size = entry.size.unwrap_or(0);
        if entry.content_hash.is_some() && already.get(&entry.path) == Some(&entry.content_hash) {
            skipped += 1;
            if let Some(bar) = &bar {
                bar.inc(size);
            }
            continue;
        }
        let value = source.get_bytes(&entry.path, None).await?;
        let hash = content_hash_of(&value);
        if entry.content_hash.as_deref().is_some_and(|h| h != hash) {
            return Err(CliError::Incomplete(format!(
                "{} changed on the old homeserver while it was copied; run the migration again",
                entry.path
            )));
        }
        target.put_bytes(&entry.path, value).await?;
        copied += 1;
        bytes += size;
        if let Some(bar) = &bar {
            bar.inc(size);
        }
    }
    finish(bar);
    // Every value is on the new homeserver, by hash; and the source still lists what
    // was copied (a write to it meanwhile would be left behind).
    let arrived: HashMap<String, Option<String>> = listing(&target)
        .await?
        .into_iter()
        .map(|e| (e.path, e.content_hash))
        .collect();
    let missing: Vec<&str> = from
        .iter()
        .filter(|e| arrived.get(&e.path) != Some(&e.content_hash))
        .map(|e| e.path.as_str())
        .collect();
    if !missing.is_empty() {
        return Err(CliError::Incomplete(format!(
            "{} values differ on the new homeserver (e.g. {}); run the migration again",
            missing.len(),
            missing[0]
        )));
    }
    let now: HashMap<String, Option<String>> = listing(&source)
        .await?
        .into_iter()
        .map(|e| (e.path, e.content_hash))
        .collect();
    let copied_set: HashMap<&str, &Option<String>> = from
        .iter()
        .map(|e| (e.path.as_str(), &e.content_hash))
        .collect();
    let changed = now
        .iter()
        .filter(|(path, hash)| copied_set.get(path.as_str()) != Some(hash))
        .count();
    if changed > 0 {
        return Err(CliError::Incomplete(format!(
            "{changed} values were written on the old homeserver during the migration; run \
             it again to copy them (nothing was published yet)"
        )));
    }
    // Values on the new homeserver the old one does not have (written there before).
    let extra = arrived
        .keys()
        .filter(|p| !copied_set.contains_key(p.as_str()))
        .count();
    let published = if publish {
        let server = target.server_info().await?.public_key;
        let published = publish_record(ctx, &target, server).await?;
        // The old homeserver republishes the record it holds: give it the new one, so
        // it does not keep the old one alive (it may refuse; that is fine).
        if let Ok(record) = Resolver::user_record(&ctx.keypair()?, &server) {
            let _ = source.store_record(&record).await;
        }
        Some(published)
    } else {
        None
    };
    if ctx.json {
        return print_json(&json!({
            "copied": copied,
            "skipped": skipped,
            "bytes": bytes,
            "verified": from.len(),
            "extra_on_target": extra,
            "published": published.as_ref().map(|(stored, dht)| json!({
                "stored_by_homeserver": stored,
                "dht": dht.as_ref().map_or_else(|e| json!({"error": e}), |n| json!({"nodes": n})),
            })),
        }));
    }
    let mut text = format!(
        "migrated to {}: {copied} values copied ({bytes} bytes), {skipped} already there; all {} verified by hash\n",
        target.base_url().as_str().trim_end_matches('/'),
        from.len()
    );
    if extra > 0 {
        text.push_str(&format!(
            "the new homeserver also has {extra} values the old one does not (kept)\n"
        ));
    }
    match published {
        Some((_, Ok(n))) => text.push_str(&format!(
            "your record now names the new homeserver (stored by {n} DHT nodes)\n"
        )),
        Some((_, Err(e))) => text.push_str(&format!(
            "your record names the new homeserver; the DHT said: {e} (the homeserver republishes it)\n"
        )),
        None => text.push_str("your record was not changed (--no-publish)\n"),
    }
    text.push_str("the old homeserver keeps the data until you delete it\n");
    print(&text)
}

/// Every entry of the caller's `/pub/` on `client`'s homeserver.
async fn listing(client: &PkClient) -> Result<Vec<ListEntry>, CliError> {
    match client.list_all("/pub/", ListOptions::default(), None).await {
        Ok(entries) => Ok(entries),
        Err(e) if e.is_not_found() => Ok(Vec::new()),
        Err(e) => Err(e.into()),
    }
}
