//! The bot's identity: an Ed25519 key derived from a 12-word BIP39 mnemonic, as
//! Pubky's own apps derive it: seed = BIP39's PBKDF2 of the words with an empty
//! passphrase (64 bytes); the Ed25519 secret is the seed's first 32 bytes.

use std::io::Write;
use std::path::Path;

use bip39::Mnemonic;
use homeserver_protocol::Keypair;

#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    #[error("the mnemonic is not 12 valid BIP39 words: {0}")]
    Invalid(String),
    #[error("{path}: {source}")]
    File {
        path: String,
        source: std::io::Error,
    },
}

/// The key of a mnemonic.
pub fn keypair_from_mnemonic(words: &str) -> Result<Keypair, IdentityError> {
    let mnemonic = Mnemonic::parse_normalized(words.trim())
        .map_err(|e| IdentityError::Invalid(e.to_string()))?;
    if mnemonic.word_count() != 12 {
        return Err(IdentityError::Invalid(format!(
            "{} words, expected 12",
            mnemonic.word_count()
        )));
    }
    let seed = mnemonic.to_seed_normalized("");
    let mut secret = [0u8; 32];
    secret.copy_from_slice(&seed[..32]);
    Ok(Keypair::from_seed(&secret))
}

/// The configured mnemonic, else the one in `file`, else a new one written to `file`
/// (mode 0600). Returns the key and whether it was made now.
pub fn load_or_create(mnemonic: &str, file: &Path) -> Result<(Keypair, bool), IdentityError> {
    if !mnemonic.trim().is_empty() {
        return Ok((keypair_from_mnemonic(mnemonic)?, false));
    }
    let io = |source| IdentityError::File {
        path: file.display().to_string(),
        source,
    };
    match std::fs::read_to_string(file) {
        Ok(words) => return Ok((keypair_from_mnemonic(&words)?, false)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io(e)),
    }
    let mut entropy = [0u8; 16];
    getrandom::fill(&mut entropy).map_err(|e| io(std::io::Error::other(e.to_string())))?;
    let mnemonic =
        Mnemonic::from_entropy(&entropy).map_err(|e| IdentityError::Invalid(e.to_string()))?;
    if let Some(dir) = file.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(io)?;
    }
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let mut out = options.open(file).map_err(io)?;
    writeln!(out, "{mnemonic}").map_err(io)?;
    out.sync_all().map_err(io)?;
    Ok((keypair_from_mnemonic(&mnemonic.to_string())?, true))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The all-`abandon` BIP39 vector, whose key Pubky's apps agree on.
    #[test]
    fn the_abandon_vector() {
        let words = format!("{}about", "abandon ".repeat(11));
        let key = keypair_from_mnemonic(&words).unwrap().public_key();
        assert_eq!(
            key.to_z32(),
            "aihfhgdfshrj8nz9ofo7khayc1mgcqa4wrrdjahs5tmgo4pna3iy"
        );
        assert_eq!(
            hex_of(key.as_bytes()),
            "c5785e1865b708938aff8161d573006496663b1aa10834e396dc566869a2c66a"
        );
    }

    fn hex_of(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    #[test]
    fn bad_mnemonics_are_refused() {
        assert!(keypair_from_mnemonic("not a mnemonic").is_err());
        let words = format!("{}abandon", "abandon ".repeat(11)); // bad checksum
        assert!(keypair_from_mnemonic(&words).is_err());
        let words = format!("{}art", "abandon ".repeat(23)); // 24 words
        assert!(keypair_from_mnemonic(&words).is_err());
    }

    #[test]
    fn a_new_mnemonic_is_kept_and_reused() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("sub/bot.mnemonic");
        let (first, created) = load_or_create("", &file).unwrap();
        assert!(created);
        let (again, created) = load_or_create("", &file).unwrap();
        assert!(!created);
        assert_eq!(first.public_key(), again.public_key());
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&file).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
    }
}
