//! The commands that talk to the homeserver: `signup`, `put`, `get`, `ls`, `rm`.
//! Values are streamed both ways; nothing here holds a whole value in memory.

use std::io::Write;
use std::path::Path;

use pk_client::{ListOptions, PublicKey};

use super::args::LsArgs;
use super::{CliError, Context};

/// `pk signup [--token T]`.
pub async fn signup(ctx: &Context, token: Option<&str>) -> Result<(), CliError> {
    let result = ctx.signing_client()?.signup(token).await?;
    println!("signed up {}", result.public_key);
    Ok(())
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
    println!("{}", created.token);
    eprintln!("expires at {} (Unix seconds)", created.expires_at);
    Ok(())
}

/// `pk put PATH FILE|-`.
pub async fn put(ctx: &Context, path: &str, file: &Path) -> Result<(), CliError> {
    let client = ctx.signing_client()?;
    let result = if file == Path::new("-") {
        client.put_reader(path, tokio::io::stdin()).await?
    } else {
        client.put_file(path, file).await?
    };
    eprintln!("stored {} ({} bytes)", result.path, result.size);
    Ok(())
}

/// `pk get PATH [--user Z32] [-o FILE]`.
pub async fn get(
    ctx: &Context,
    path: &str,
    user: Option<PublicKey>,
    out: Option<&Path>,
) -> Result<(), CliError> {
    let response = ctx.reading_client(user)?.get(path, user).await?;
    // The output is only touched once the server has said yes, so a failed read never
    // truncates an existing file.
    match out {
        None => {
            let mut stdout = tokio::io::stdout();
            response.write_to(&mut stdout).await?;
        }
        Some(file) => {
            let shown = file.display().to_string();
            let mut target = tokio::fs::File::create(file)
                .await
                .map_err(|e| CliError::io(format!("cannot create {shown}"), e))?;
            let written = response.write_to(&mut target).await;
            let synced = match written {
                Ok(_) => target
                    .sync_all()
                    .await
                    .map_err(|e| CliError::io(format!("cannot write {shown}"), e)),
                Err(e) => Err(e.into()),
            };
            if let Err(e) = synced {
                // Leave no half-written value behind.
                drop(target);
                let _ = tokio::fs::remove_file(file).await;
                return Err(e);
            }
        }
    }
    Ok(())
}

/// `pk ls PATH/ [--limit N] [--cursor C] [--reverse] [--shallow] [--user Z32] [--all]`.
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
    loop {
        let page = client.list(&path, options.clone(), args.user).await?;
        let mut lines = String::new();
        for entry in &page.entries {
            lines.push_str(&entry.path);
            lines.push('\n');
        }
        let mut stdout = std::io::stdout().lock();
        stdout
            .write_all(lines.as_bytes())
            .and_then(|()| stdout.flush())
            .map_err(|e| CliError::io("cannot write the listing", e))?;
        drop(stdout);
        match page.cursor {
            Some(cursor) if page.has_more => {
                if args.all {
                    options.cursor = Some(cursor);
                } else {
                    eprintln!("next cursor: {cursor}");
                    return Ok(());
                }
            }
            _ => return Ok(()),
        }
    }
}

/// `pk rm PATH`.
pub async fn rm(ctx: &Context, path: &str) -> Result<(), CliError> {
    let result = ctx.signing_client()?.delete(path).await?;
    eprintln!("deleted {}", result.path);
    Ok(())
}
