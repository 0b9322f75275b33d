//! Secret keys for `pk`: reading the configured key ([`KeySource`]), `pk keygen`,
//! `pk pubkey`, and `pk config` (which shows where the key and the other settings come
//! from).
//!
//! The key text form (64 hex characters of the Ed25519 seed) is the protocol crate's;
//! this module only finds it and keeps it private on disk (mode 0600, in a folder of
//! mode 0700 when `pk` creates it).

use std::io::Write;
use std::path::{Path, PathBuf};

use pk_client::Keypair;
use serde_json::json;

use super::config::{KeySource, Origin, SECRET_KEY_ENV};
use super::output::{print, print_json};
use super::{CliError, Context};

/// The configured key pair, or `None` when no key is configured.
pub fn load(source: &KeySource) -> Result<Option<Keypair>, CliError> {
    match source {
        KeySource::File { path, .. } => {
            let text = std::fs::read_to_string(path).map_err(|e| {
                CliError::io(
                    format!("cannot read the secret key file {}", path.display()),
                    e,
                )
            })?;
            Keypair::from_secret_hex(&text)
                .map(Some)
                .map_err(|source| CliError::BadKey {
                    origin: path.display().to_string(),
                    source,
                })
        }
        KeySource::Environment(text) => {
            Keypair::from_secret_hex(text)
                .map(Some)
                .map_err(|source| CliError::BadKey {
                    origin: SECRET_KEY_ENV.to_owned(),
                    source,
                })
        }
        KeySource::None => Ok(None),
    }
}

/// `pk keygen [--out FILE | --print] [--force]`.
pub fn keygen(
    ctx: &Context,
    out: Option<&Path>,
    print_secret: bool,
    force: bool,
) -> Result<(), CliError> {
    let keypair = Keypair::random();
    let public = keypair.public_key().to_z32();
    if print_secret {
        if ctx.json {
            return print_json(&json!({"public_key": public, "secret_key": keypair.secret_hex()}));
        }
        print(&format!("{}\n", keypair.secret_hex()))?;
        eprintln!("public key: {public}");
        return Ok(());
    }
    let path = match out {
        Some(path) => path.to_owned(),
        None => ctx.settings.keygen_path.clone().ok_or_else(|| {
            CliError::Usage(
                "no config folder to save the key in (HOME is not set): pass --out FILE or \
                 --print"
                    .into(),
            )
        })?,
    };
    if out.is_none()
        && let Some(dir) = path.parent()
    {
        create_private_dir(dir)
            .map_err(|e| CliError::io(format!("cannot create {}", dir.display()), e))?;
    }
    write_secret_file(&path, &keypair, force)?;
    if ctx.json {
        return print_json(&json!({"public_key": public, "key_file": path}));
    }
    print(&format!("{public}\n"))?;
    eprintln!("secret key saved to {} (keep it private)", path.display());
    Ok(())
}

/// `pk pubkey`.
pub fn pubkey(ctx: &Context) -> Result<(), CliError> {
    let public = ctx.keypair()?.public_key().to_z32();
    if ctx.json {
        return print_json(&json!({ "public_key": public }));
    }
    print(&format!("{public}\n"))
}

/// `pk config`: the effective settings and where each comes from. Never prints a
/// secret.
pub fn show_config(ctx: &Context) -> Result<(), CliError> {
    let s = &ctx.settings;
    let (key, key_origin) = match &s.key {
        KeySource::File { path, origin } => (Some(path.display().to_string()), origin.as_str()),
        KeySource::Environment(_) => (
            Some(SECRET_KEY_ENV.to_owned()),
            Origin::Environment.as_str(),
        ),
        KeySource::None => (None, "none"),
    };
    let public_key = load(&s.key).ok().flatten().map(|k| k.public_key().to_z32());
    if ctx.json {
        return print_json(&json!({
            "config_file": s.config_file,
            "config_file_exists": s.config_file_exists,
            "profiles": s.profiles,
            "profile": s.profile,
            "profile_origin": s.profile_origin.as_str(),
            "homeserver": s.homeserver,
            "homeserver_origin": s.homeserver_origin.as_str(),
            "key": key,
            "key_origin": key_origin,
            "public_key": public_key,
            "keygen_path": s.keygen_path,
        }));
    }
    let file = match &s.config_file {
        Some(path) if s.config_file_exists => path.display().to_string(),
        Some(path) => format!("{} (not there: defaults apply)", path.display()),
        None => "none (set HOME or PK_CONFIG)".to_owned(),
    };
    let mut text = format!("config file  {file}\n");
    if !s.profiles.is_empty() {
        text.push_str(&format!("profiles     {}\n", s.profiles.join(", ")));
    }
    text.push_str(&format!(
        "profile      {} ({})\nhomeserver   {} ({})\n",
        s.profile,
        s.profile_origin.as_str(),
        s.homeserver,
        s.homeserver_origin.as_str()
    ));
    match (&key, &public_key) {
        (Some(key), Some(public)) => text.push_str(&format!(
            "key          {key} ({key_origin})\npublic key   {public}\n"
        )),
        (Some(key), None) => {
            text.push_str(&format!("key          {key} ({key_origin}, unreadable)\n"))
        }
        (None, _) => {
            let hint = s
                .keygen_path
                .as_ref()
                .map(|p| format!(": `pk keygen` saves one to {}", p.display()))
                .unwrap_or_default();
            text.push_str(&format!("key          none{hint}\n"));
        }
    }
    print(&text)
}

/// Creates `dir` (and its parents) for keys; a folder `pk` creates is private (0700).
fn create_private_dir(dir: &Path) -> std::io::Result<()> {
    if dir.as_os_str().is_empty() || dir.is_dir() {
        return Ok(());
    }
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::DirBuilderExt;
        builder.mode(0o700);
    }
    builder.create(dir)
}

/// Writes the secret so that it is never readable by others, not even briefly: a
/// temporary file (created 0600) in the same directory is renamed into place.
fn write_secret_file(path: &Path, keypair: &Keypair, force: bool) -> Result<(), CliError> {
    if !force && path.exists() {
        return Err(CliError::Exists {
            path: path.to_owned(),
        });
    }
    let shown = path.display().to_string();
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_owned(),
        _ => PathBuf::from("."),
    };
    let mut tmp = tempfile::Builder::new()
        .prefix(".pk-key-")
        .tempfile_in(&dir)
        .map_err(|e| CliError::io(format!("cannot create {shown}"), e))?;
    restrict_permissions(tmp.as_file())
        .map_err(|e| CliError::io(format!("cannot restrict permissions of {shown}"), e))?;
    writeln!(tmp, "{}", keypair.secret_hex())
        .and_then(|()| tmp.as_file().sync_all())
        .map_err(|e| CliError::io(format!("cannot write {shown}"), e))?;
    let persisted = if force {
        tmp.persist(path)
    } else {
        // Another process may have created the file since the check above.
        tmp.persist_noclobber(path)
    };
    persisted.map_err(|e| {
        if e.error.kind() == std::io::ErrorKind::AlreadyExists {
            CliError::Exists {
                path: path.to_owned(),
            }
        } else {
            CliError::io(format!("cannot write {shown}"), e.error)
        }
    })?;
    Ok(())
}

#[cfg(unix)]
fn restrict_permissions(file: &std::fs::File) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    file.set_permissions(std::fs::Permissions::from_mode(0o600))
}

#[cfg(not(unix))]
fn restrict_permissions(_file: &std::fs::File) -> std::io::Result<()> {
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(path: &Path) -> KeySource {
        KeySource::File {
            path: path.to_owned(),
            origin: Origin::Flag,
        }
    }

    #[test]
    fn secret_file_round_trip_and_no_clobber() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("user.key");
        let kp = Keypair::from_seed(&[9; 32]);
        write_secret_file(&path, &kp, false).unwrap();
        let loaded = load(&file(&path)).unwrap().unwrap();
        assert_eq!(loaded.public_key(), kp.public_key());
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }

        let other = Keypair::from_seed(&[10; 32]);
        assert!(matches!(
            write_secret_file(&path, &other, false),
            Err(CliError::Exists { .. })
        ));
        let public = |p: &Path| load(&file(p)).unwrap().unwrap().public_key();
        assert_eq!(public(&path), kp.public_key());
        write_secret_file(&path, &other, true).unwrap();
        assert_eq!(public(&path), other.public_key());
        // No temporary files left behind.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn bad_key_file_is_reported() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bad.key");
        std::fs::write(&path, "not hex").unwrap();
        assert!(matches!(load(&file(&path)), Err(CliError::BadKey { .. })));
        let missing = dir.path().join("missing.key");
        assert!(matches!(load(&file(&missing)), Err(CliError::Io { .. })));
        assert!(matches!(
            load(&KeySource::Environment("zz".into())),
            Err(CliError::BadKey { .. })
        ));
        assert!(matches!(load(&KeySource::None), Ok(None)));
    }

    #[cfg(unix)]
    #[test]
    fn key_folders_pk_creates_are_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let keys = dir.path().join("pk").join("keys");
        create_private_dir(&keys).unwrap();
        let mode = std::fs::metadata(&keys).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
        // An existing folder is left as it is.
        create_private_dir(&keys).unwrap();
    }
}
