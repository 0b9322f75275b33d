//! The server's own Ed25519 identity (for TLS and DHT records): a secret key file of 64
//! hex characters, created with mode 0600 on first start.

use std::io::Write;
use std::path::Path;

use homeserver_protocol::Keypair;

#[derive(Debug, thiserror::Error)]
pub enum ServerKeyError {
    #[error("server key file {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("server key file {path}: not 64 hex characters")]
    Format { path: String },
}

pub fn load_or_create(path: &Path) -> Result<Keypair, ServerKeyError> {
    let shown = path.display().to_string();
    let io = |source| ServerKeyError::Io {
        path: shown.clone(),
        source,
    };
    match std::fs::read_to_string(path) {
        Ok(text) => Keypair::from_secret_hex(&text).map_err(|_| ServerKeyError::Format {
            path: shown.clone(),
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                std::fs::create_dir_all(dir).map_err(io)?;
            }
            let keypair = Keypair::random();
            let mut options = std::fs::OpenOptions::new();
            options.write(true).create_new(true);
            #[cfg(unix)]
            std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
            let mut file = options.open(path).map_err(io)?;
            file.write_all(keypair.secret_hex().as_bytes())
                .and_then(|()| file.sync_all())
                .map_err(io)?;
            Ok(keypair)
        }
        Err(e) => Err(io(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn created_once_then_reloaded() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/server.key");
        let first = load_or_create(&path).unwrap();
        let again = load_or_create(&path).unwrap();
        assert_eq!(first.public_key(), again.public_key());
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        std::fs::write(&path, "nonsense").unwrap();
        assert!(matches!(
            load_or_create(&path),
            Err(ServerKeyError::Format { .. })
        ));
    }
}
