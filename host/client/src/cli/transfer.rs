//! `pk cp` and `pk sync`: files and folders between this machine and the homeserver.
//!
//! An argument that starts with `/pub/` or `/private/` is a homeserver path; anything
//! else is local. A folder copy lists both sides first (the homeserver's listing carries
//! every entry's size and content hash; a local file is hashed only when its size
//! matches the other side's), then [`plan`]s: a file whose counterpart has the same
//! content hash is left alone, every other file is sent, and `sync --delete` removes
//! what the source does not have. Then the plan runs, one line per action.
//!
//! Integrity: uploads declare their SHA-256 and the server refuses a body that does not
//! match it; downloads go to a temporary file, are checked against the content hash and
//! only then replace the local file.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use pk_client::transfer::{content_hash_of_etag, local_content_hash};
use pk_client::{DownloadOptions, ListOptions, PkClient, PublicKey, StoragePath};
use serde::Serialize;

use super::args::{CopyArgs, SyncArgs};
use super::output::{finish, human_size, print, print_json, progress_of};
use super::{CliError, Context};

/// One side of a copy.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Location {
    /// A homeserver path.
    Remote(String),
    Local(PathBuf),
}

impl Location {
    fn parse(arg: &str) -> Self {
        let remote = ["/pub", "/private"]
            .iter()
            .any(|root| arg == *root || arg.starts_with(&format!("{root}/")));
        if remote {
            Location::Remote(arg.to_owned())
        } else {
            Location::Local(PathBuf::from(arg))
        }
    }
}

/// A file on either side, by its path relative to the folder being copied (`/`
/// separated).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Item {
    size: u64,
    /// The content hash when known (base64 BLAKE3).
    hash: Option<String>,
}

/// What a folder copy does.
#[derive(Debug, Default, PartialEq, Eq)]
struct Plan {
    /// Relative paths to send, in order.
    send: Vec<String>,
    /// Relative paths already the same on both sides.
    unchanged: Vec<String>,
    /// Relative paths to delete from the destination (`sync --delete`).
    delete: Vec<String>,
}

/// The pure decision: send what the destination lacks or has with other content; with
/// `delete`, remove what the source lacks. A file counts as the same only when sizes
/// and known content hashes agree.
fn plan(
    source: &BTreeMap<String, Item>,
    destination: &BTreeMap<String, Item>,
    delete: bool,
) -> Plan {
    let mut out = Plan::default();
    for (rel, item) in source {
        let same = destination
            .get(rel)
            .is_some_and(|d| d.size == item.size && d.hash.is_some() && d.hash == item.hash);
        if same {
            out.unchanged.push(rel.clone());
        } else {
            out.send.push(rel.clone());
        }
    }
    if delete {
        out.delete = destination
            .keys()
            .filter(|rel| !source.contains_key(*rel))
            .cloned()
            .collect();
    }
    out
}

/// What was done (or, in a dry run, would be), as `--json` prints it.
#[derive(Debug, Default, Serialize)]
struct Report {
    dry_run: bool,
    uploaded: Vec<Moved>,
    downloaded: Vec<Moved>,
    deleted: Vec<String>,
    unchanged: usize,
    /// Bytes sent or received.
    bytes: u64,
}

#[derive(Debug, Serialize)]
struct Moved {
    /// The homeserver path.
    path: String,
    /// The local file.
    file: PathBuf,
    size: u64,
}

/// `pk cp SOURCE DESTINATION [-r] [--force] [--user Z32] [--dry-run]`.
pub async fn cp(ctx: &Context, args: CopyArgs) -> Result<(), CliError> {
    let source = Location::parse(&args.source);
    let destination = Location::parse(&args.destination);
    match (&source, &destination) {
        (Location::Local(from), Location::Remote(to)) => {
            if from.is_dir() {
                if !args.recursive {
                    return Err(CliError::Usage(format!(
                        "{} is a folder: use `pk cp -r` to copy it",
                        from.display()
                    )));
                }
                if args.user.is_some() {
                    return Err(CliError::Usage(
                        "--user reads someone's public data; uploads go to your own".into(),
                    ));
                }
                return upload_folder(ctx, from, &folder_path(to), false, args.dry_run).await;
            }
            upload_file(ctx, from, to, args.dry_run).await
        }
        (Location::Remote(from), Location::Local(to)) => {
            if args.recursive || from.ends_with('/') {
                if !args.recursive {
                    return Err(CliError::Usage(format!(
                        "{from} is a folder: use `pk cp -r` to copy it"
                    )));
                }
                return download_folder(
                    ctx,
                    &folder_path(from),
                    to,
                    args.user,
                    false,
                    args.dry_run,
                )
                .await;
            }
            download_file(ctx, from, to, args.user, args.force, args.dry_run).await
        }
        (Location::Remote(_), Location::Remote(_)) => Err(CliError::Usage(
            "both paths are on the homeserver; one of them must be local (a homeserver path \
             starts with /pub/)"
                .into(),
        )),
        (Location::Local(_), Location::Local(_)) => Err(CliError::Usage(
            "neither path is on the homeserver (a homeserver path starts with /pub/); for a \
             local folder named pub, write ./pub"
                .into(),
        )),
    }
}

/// `pk sync SOURCE DESTINATION [--delete] [--dry-run] [--user Z32]`.
pub async fn sync(ctx: &Context, args: SyncArgs) -> Result<(), CliError> {
    match (
        Location::parse(&args.source),
        Location::parse(&args.destination),
    ) {
        (Location::Local(from), Location::Remote(to)) => {
            if !from.is_dir() {
                return Err(CliError::Usage(format!(
                    "{} is not a folder (sync copies folders; use `pk cp` for a file)",
                    from.display()
                )));
            }
            if args.user.is_some() {
                return Err(CliError::Usage(
                    "--user reads someone's public data; uploads go to your own".into(),
                ));
            }
            upload_folder(ctx, &from, &folder_path(&to), args.delete, args.dry_run).await
        }
        (Location::Remote(from), Location::Local(to)) => {
            download_folder(
                ctx,
                &folder_path(&from),
                &to,
                args.user,
                args.delete,
                args.dry_run,
            )
            .await
        }
        _ => Err(CliError::Usage(
            "sync needs one local folder and one homeserver folder (a homeserver path starts \
             with /pub/)"
                .into(),
        )),
    }
}

/// `path` with a trailing `/`.
fn folder_path(path: &str) -> String {
    if path.ends_with('/') {
        path.to_owned()
    } else {
        format!("{path}/")
    }
}

/// The last segment of a path, for `cp FILE /pub/dir/`.
fn file_name_of(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

async fn upload_file(ctx: &Context, from: &Path, to: &str, dry_run: bool) -> Result<(), CliError> {
    let to = if to.ends_with('/') {
        let name = from.file_name().and_then(|n| n.to_str()).ok_or_else(|| {
            CliError::Usage(format!("{} has no usable file name", from.display()))
        })?;
        format!("{to}{name}")
    } else {
        to.to_owned()
    };
    let client = ctx.signing_client()?;
    let size = std::fs::metadata(from)
        .map_err(|e| CliError::io(format!("cannot read {}", from.display()), e))?
        .len();
    let mut report = Report {
        dry_run,
        ..Report::default()
    };
    // Unchanged on the server: nothing to send.
    let (hash, _) = local_content_hash(from).await?;
    let remote = match client.head(&to, None).await {
        Ok(meta) => meta.etag.map(|e| content_hash_of_etag(&e).to_owned()),
        Err(e) if e.is_not_found() => None,
        Err(e) => return Err(e.into()),
    };
    if remote.as_deref() == Some(hash.as_str()) {
        report.unchanged = 1;
    } else {
        send_up(ctx, &client, from, &to, size, &mut report).await?;
    }
    finish_report(ctx, &report)
}

async fn download_file(
    ctx: &Context,
    from: &str,
    to: &Path,
    user: Option<PublicKey>,
    force: bool,
    dry_run: bool,
) -> Result<(), CliError> {
    let target = if to.is_dir() || to.as_os_str().to_string_lossy().ends_with('/') {
        to.join(file_name_of(from))
    } else {
        to.to_owned()
    };
    let client = ctx.reading_client(user)?;
    let mut report = Report {
        dry_run,
        ..Report::default()
    };
    if target.exists() {
        let (local, _) = local_content_hash(&target).await?;
        let remote = match client.head(from, user).await {
            Ok(meta) => meta.etag.map(|e| content_hash_of_etag(&e).to_owned()),
            Err(e) if e.is_not_found() => {
                return Err(CliError::NotFound(format!("no entry at {from}")));
            }
            Err(e) => return Err(e.into()),
        };
        if remote.as_deref() == Some(local.as_str()) {
            report.unchanged = 1;
            return finish_report(ctx, &report);
        }
        if !force {
            return Err(CliError::Exists { path: target });
        }
    }
    send_down(ctx, &client, from, &target, user, None, &mut report).await?;
    finish_report(ctx, &report)
}

/// Uploads one file, or in a dry run records that it would.
async fn send_up(
    ctx: &Context,
    client: &PkClient,
    file: &Path,
    path: &str,
    size: u64,
    report: &mut Report,
) -> Result<(), CliError> {
    if !report.dry_run {
        let bar = ctx.bars.for_transfer(path, Some(size));
        let result = client
            .put_file_with_progress(path, file, progress_of(&bar))
            .await;
        finish(bar);
        result?;
    }
    action_line(
        ctx,
        report.dry_run,
        "upload",
        &format!("{} → {path}", file.display()),
        size,
    )?;
    report.bytes += size;
    report.uploaded.push(Moved {
        path: path.to_owned(),
        file: file.to_owned(),
        size,
    });
    Ok(())
}

/// Downloads one entry over `target` (checked against its hash), or in a dry run
/// records that it would. `known_size` comes from a listing, when there was one.
async fn send_down(
    ctx: &Context,
    client: &PkClient,
    path: &str,
    target: &Path,
    user: Option<PublicKey>,
    known_size: Option<u64>,
    report: &mut Report,
) -> Result<(), CliError> {
    let size = if report.dry_run {
        match known_size {
            Some(size) => size,
            None => client.head(path, user).await?.content_length.unwrap_or(0),
        }
    } else {
        if let Some(dir) = target.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)
                .map_err(|e| CliError::io(format!("cannot create {}", dir.display()), e))?;
        }
        let response = client.get(path, user).await?;
        let bar = ctx.bars.for_transfer(path, response.meta().content_length);
        let options = DownloadOptions {
            overwrite: true,
            progress: progress_of(&bar),
        };
        let saved = response.save_verified(path, target, options).await;
        finish(bar);
        saved?.size
    };
    action_line(
        ctx,
        report.dry_run,
        "download",
        &format!("{path} → {}", target.display()),
        size,
    )?;
    report.bytes += size;
    report.downloaded.push(Moved {
        path: path.to_owned(),
        file: target.to_owned(),
        size,
    });
    Ok(())
}

/// `upload a → b (12 B)`, or `would upload ...` in a dry run; nothing with --json.
fn action_line(
    ctx: &Context,
    dry_run: bool,
    verb: &str,
    what: &str,
    size: u64,
) -> Result<(), CliError> {
    if ctx.json {
        return Ok(());
    }
    let verb = if dry_run {
        format!("would {verb}")
    } else {
        format!("{verb}ed")
    };
    print(&format!("{verb} {what} ({})\n", human_size(size)))
}

fn finish_report(ctx: &Context, report: &Report) -> Result<(), CliError> {
    if ctx.json {
        return print_json(report);
    }
    let would = if report.dry_run { " (dry run)" } else { "" };
    eprintln!(
        "{} uploaded, {} downloaded, {} deleted, {} unchanged; {} transferred{would}",
        report.uploaded.len(),
        report.downloaded.len(),
        report.deleted.len(),
        report.unchanged,
        human_size(report.bytes)
    );
    Ok(())
}

/// Local files by relative path: where each is and its size.
type LocalFiles = BTreeMap<String, (PathBuf, u64)>;

/// Every regular file under `root` by relative path, and the names the homeserver
/// would refuse. Symbolic links to files are followed; links to folders are skipped
/// (they could loop), with a note on stderr.
fn walk_local(root: &Path) -> Result<(LocalFiles, Vec<String>), CliError> {
    let mut files = BTreeMap::new();
    let mut refused = Vec::new();
    let mut pending = vec![(root.to_owned(), String::new())];
    while let Some((dir, prefix)) = pending.pop() {
        let entries = std::fs::read_dir(&dir)
            .map_err(|e| CliError::io(format!("cannot read {}", dir.display()), e))?;
        for entry in entries {
            let entry =
                entry.map_err(|e| CliError::io(format!("cannot read {}", dir.display()), e))?;
            let path = entry.path();
            let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
                refused.push(path.display().to_string());
                continue;
            };
            let rel = format!("{prefix}{name}");
            let link = entry.file_type().is_ok_and(|t| t.is_symlink());
            let meta = std::fs::metadata(&path)
                .map_err(|e| CliError::io(format!("cannot read {}", path.display()), e))?;
            if meta.is_dir() {
                if link {
                    eprintln!("pk: skipping {} (a link to a folder)", path.display());
                } else {
                    pending.push((path, format!("{rel}/")));
                }
            } else if meta.is_file() {
                files.insert(rel, (path, meta.len()));
            }
        }
    }
    Ok((files, refused))
}

async fn upload_folder(
    ctx: &Context,
    from: &Path,
    to: &str,
    delete: bool,
    dry_run: bool,
) -> Result<(), CliError> {
    let client = ctx.signing_client()?;
    let (files, mut refused) = walk_local(from)?;
    // Every name must make a valid path before anything is sent.
    for rel in files.keys() {
        let path = format!("{to}{rel}");
        if StoragePath::parse(&path).is_err() {
            refused.push(path);
        }
    }
    if !refused.is_empty() {
        let shown: Vec<&str> = refused.iter().take(10).map(String::as_str).collect();
        let more = refused.len().saturating_sub(shown.len());
        return Err(CliError::Usage(format!(
            "nothing was sent: {} file name(s) cannot be homeserver paths (letters, digits, \
             `-`, `_` and `.` only): {}{}",
            refused.len(),
            shown.join(", "),
            if more > 0 {
                format!(" and {more} more")
            } else {
                String::new()
            }
        )));
    }
    let mut remote = remote_items(&client, to, None).await?;
    let mut local: BTreeMap<String, Item> = BTreeMap::new();
    for (rel, (path, size)) in &files {
        // Hash only what might be unchanged: same size on the other side.
        let hash = match remote.get_mut(rel) {
            Some(item) if item.size == *size => {
                if item.hash.is_none() {
                    item.hash = remote_hash(&client, &format!("{to}{rel}"), None).await?;
                }
                Some(local_content_hash(path).await?.0)
            }
            _ => None,
        };
        local.insert(rel.clone(), Item { size: *size, hash });
    }
    let plan = plan(&local, &remote, delete);
    let mut report = Report {
        dry_run,
        unchanged: plan.unchanged.len(),
        ..Report::default()
    };
    for rel in &plan.send {
        if let Some((path, size)) = files.get(rel) {
            send_up(
                ctx,
                &client,
                path,
                &format!("{to}{rel}"),
                *size,
                &mut report,
            )
            .await?;
        }
    }
    for rel in &plan.delete {
        let path = format!("{to}{rel}");
        if !dry_run {
            match client.delete(&path).await {
                Ok(_) => {}
                Err(e) if e.is_not_found() => {}
                Err(e) => return Err(e.into()),
            }
        }
        deleted_line(ctx, dry_run, &path)?;
        report.deleted.push(path);
    }
    finish_report(ctx, &report)
}

async fn download_folder(
    ctx: &Context,
    from: &str,
    to: &Path,
    user: Option<PublicKey>,
    delete: bool,
    dry_run: bool,
) -> Result<(), CliError> {
    let client = ctx.reading_client(user)?;
    let mut remote = remote_items(&client, from, user).await?;
    if to.exists() && !to.is_dir() {
        return Err(CliError::Usage(format!("{} is not a folder", to.display())));
    }
    let (files, _) = if to.is_dir() {
        walk_local(to)?
    } else {
        Default::default()
    };
    let mut local: BTreeMap<String, Item> = BTreeMap::new();
    for (rel, (path, size)) in &files {
        let hash = match remote.get_mut(rel) {
            Some(item) if item.size == *size => {
                if item.hash.is_none() {
                    item.hash = remote_hash(&client, &format!("{from}{rel}"), user).await?;
                }
                Some(local_content_hash(path).await?.0)
            }
            _ => None,
        };
        local.insert(rel.clone(), Item { size: *size, hash });
    }
    let plan = plan(&remote, &local, delete);
    let mut report = Report {
        dry_run,
        unchanged: plan.unchanged.len(),
        ..Report::default()
    };
    for rel in &plan.send {
        let target = local_path(to, rel);
        let size = remote.get(rel).map(|item| item.size);
        send_down(
            ctx,
            &client,
            &format!("{from}{rel}"),
            &target,
            user,
            size,
            &mut report,
        )
        .await?;
    }
    for rel in &plan.delete {
        let Some((path, _)) = files.get(rel) else {
            continue;
        };
        if !dry_run {
            std::fs::remove_file(path)
                .map_err(|e| CliError::io(format!("cannot delete {}", path.display()), e))?;
        }
        let shown = path.display().to_string();
        deleted_line(ctx, dry_run, &shown)?;
        report.deleted.push(shown);
    }
    finish_report(ctx, &report)
}

fn deleted_line(ctx: &Context, dry_run: bool, what: &str) -> Result<(), CliError> {
    if ctx.json {
        return Ok(());
    }
    let verb = if dry_run { "would delete" } else { "deleted" };
    print(&format!("{verb} {what}\n"))
}

/// Where a relative homeserver path lands under the local folder `root`.
fn local_path(root: &Path, rel: &str) -> PathBuf {
    rel.split('/')
        .fold(root.to_owned(), |p, segment| p.join(segment))
}

/// Every entry under the homeserver folder `prefix`, by relative path.
async fn remote_items(
    client: &PkClient,
    prefix: &str,
    user: Option<PublicKey>,
) -> Result<BTreeMap<String, Item>, CliError> {
    let options = ListOptions {
        limit: Some(homeserver_protocol::query::MAX_LIST_LIMIT),
        ..ListOptions::default()
    };
    let entries = client.list_all(prefix, options, user).await?;
    let mut items = BTreeMap::new();
    for entry in entries {
        let Some(rel) = entry.path.strip_prefix(prefix) else {
            continue;
        };
        // The server checks paths; a name that would leave the folder is never used.
        let safe = !rel.is_empty()
            && rel
                .split('/')
                .all(|s| !s.is_empty() && s != "." && s != "..");
        if !safe {
            continue;
        }
        items.insert(
            rel.to_owned(),
            Item {
                size: entry.size.unwrap_or(0),
                hash: entry.content_hash,
            },
        );
    }
    Ok(items)
}

/// An entry's content hash from its `ETag`, for a server whose listings lack them.
async fn remote_hash(
    client: &PkClient,
    path: &str,
    user: Option<PublicKey>,
) -> Result<Option<String>, CliError> {
    match client.head(path, user).await {
        Ok(meta) => Ok(meta.etag.map(|e| content_hash_of_etag(&e).to_owned())),
        Err(e) if e.is_not_found() => Ok(None),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn items(list: &[(&str, u64, Option<&str>)]) -> BTreeMap<String, Item> {
        list.iter()
            .map(|(rel, size, hash)| {
                (
                    (*rel).to_owned(),
                    Item {
                        size: *size,
                        hash: hash.map(str::to_owned),
                    },
                )
            })
            .collect()
    }

    #[test]
    fn which_side_is_which() {
        assert_eq!(
            Location::parse("/pub/a/"),
            Location::Remote("/pub/a/".into())
        );
        assert_eq!(Location::parse("/pub"), Location::Remote("/pub".into()));
        assert_eq!(
            Location::parse("/private/x"),
            Location::Remote("/private/x".into())
        );
        for local in ["./pub/a", "pub/a", "/home/u/pub", "/publish", "site", "."] {
            assert_eq!(
                Location::parse(local),
                Location::Local(local.into()),
                "{local}"
            );
        }
    }

    #[test]
    fn only_changed_files_are_sent() {
        let source = items(&[
            ("same", 3, Some("h1")),
            ("edited", 3, Some("h2")),
            ("grown", 9, None),
            ("new", 1, None),
            ("unknown-hash", 4, Some("h4")),
        ]);
        let destination = items(&[
            ("same", 3, Some("h1")),
            ("edited", 3, Some("old")),
            ("grown", 3, Some("h3")),
            ("unknown-hash", 4, None),
            ("extra", 5, Some("h5")),
        ]);
        let p = plan(&source, &destination, false);
        assert_eq!(p.send, ["edited", "grown", "new", "unknown-hash"]);
        assert_eq!(p.unchanged, ["same"]);
        assert!(p.delete.is_empty());
        let p = plan(&source, &destination, true);
        assert_eq!(p.delete, ["extra"]);
        // Nothing on either side: nothing to do.
        assert_eq!(
            plan(&BTreeMap::new(), &BTreeMap::new(), true),
            Plan::default()
        );
    }

    #[test]
    fn local_walk_finds_nested_files_and_refuses_bad_names() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("a/b")).unwrap();
        std::fs::write(root.join("top.txt"), b"1").unwrap();
        std::fs::write(root.join("a/b/deep.bin"), b"22").unwrap();
        std::fs::create_dir(root.join("empty")).unwrap();
        let (files, refused) = walk_local(root).unwrap();
        let found: Vec<(&str, u64)> = files.iter().map(|(k, (_, s))| (k.as_str(), *s)).collect();
        assert_eq!(found, [("a/b/deep.bin", 2), ("top.txt", 1)]);
        assert!(refused.is_empty());
        assert_eq!(
            local_path(root, "a/b/deep.bin"),
            root.join("a").join("b").join("deep.bin")
        );
        #[cfg(unix)]
        {
            // A link back up would loop: skipped.
            std::os::unix::fs::symlink(root, root.join("a/loop")).unwrap();
            let (files, _) = walk_local(root).unwrap();
            assert_eq!(files.len(), 2);
        }
    }

    #[test]
    fn names_of_files_and_folders() {
        assert_eq!(folder_path("/pub/a"), "/pub/a/");
        assert_eq!(folder_path("/pub/a/"), "/pub/a/");
        assert_eq!(file_name_of("/pub/a/b.txt"), "b.txt");
    }
}
