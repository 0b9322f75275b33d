//! Secret keys for `pk`: where the configured key comes from (`--key-file`,
//! `PK_SECRET_KEY_FILE`, `PK_SECRET_KEY`), and `pk keygen` / `pk pubkey`.
//!
//! The key text form (64 hex characters of the Ed25519 seed) is the protocol crate's;
//! this module only finds it and keeps it private on disk (mode 0600).

use std::io::Write;
use std::path::{Path, PathBuf};

use pk_client::Keypair;

use super::{CliError, Context};

/// Environment variable holding the secret key itself.
pub const SECRET_KEY_ENV: &str = "PK_SECRET_KEY";

/// The configured key pair: from `key_file` when given (flag or PK_SECRET_KEY_FILE),
/// else from PK_SECRET_KEY.
pub fn load(key_file: Option<&Path>) -> Result<Keypair, CliError> {
    if let Some(path) = key_file {
        let text = std::fs::read_to_string(path).map_err(|e| {
            CliError::io(
                format!("cannot read the secret key file {}", path.display()),
                e,
            )
        })?;
        return Keypair::from_secret_hex(&text).map_err(|source| CliError::BadKey {
            origin: path.display().to_string(),
            source,
        });
    }
    match std::env::var(SECRET_KEY_ENV) {
        Ok(text) if !text.trim().is_empty() => {
            Keypair::from_secret_hex(&text).map_err(|source| CliError::BadKey {
                origin: SECRET_KEY_ENV.to_owned(),
                source,
            })
        }
        _ => Err(CliError::MissingKey),
    }
}

/// `pk keygen [--out FILE] [--force]`.
pub fn keygen(out: Option<&Path>, force: bool) -> Result<(), CliError> {
    let keypair = Keypair::random();
    let public = keypair.public_key().to_z32();
    match out {
        Some(path) => {
            write_secret_file(path, &keypair, force)?;
            println!("{public}");
        }
        None => {
            println!("{}", keypair.secret_hex());
            eprintln!("public key: {public}");
        }
    }
    Ok(())
}

/// `pk pubkey`.
pub fn pubkey(ctx: &Context) -> Result<(), CliError> {
    println!("{}", ctx.keypair()?.public_key());
    Ok(())
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

    #[test]
    fn secret_file_round_trip_and_no_clobber() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("user.key");
        let kp = Keypair::from_seed(&[9; 32]);
        write_secret_file(&path, &kp, false).unwrap();
        let loaded = load(Some(&path)).unwrap();
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
        assert_eq!(load(Some(&path)).unwrap().public_key(), kp.public_key());
        write_secret_file(&path, &other, true).unwrap();
        assert_eq!(load(Some(&path)).unwrap().public_key(), other.public_key());
        // No temporary files left behind.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn bad_key_file_is_reported() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bad.key");
        std::fs::write(&path, "not hex").unwrap();
        assert!(matches!(load(Some(&path)), Err(CliError::BadKey { .. })));
        let missing = dir.path().join("missing.key");
        assert!(matches!(load(Some(&missing)), Err(CliError::Io { .. })));
    }
}
