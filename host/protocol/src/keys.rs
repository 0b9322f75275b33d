//! Ed25519 keys. A user *is* a public key; its text form is z-base-32 of the 32 raw
//! bytes (52 characters), the form pkarr and the wider network use.

use std::fmt;
use std::str::FromStr;
use std::sync::LazyLock;

use ed25519_dalek::{Signature, Signer, SigningKey, VerifyingKey};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Length of the z-base-32 text form of a public key.
pub const PUBLIC_KEY_TEXT_LEN: usize = 52;

/// The z-base-32 alphabet of key texts.
pub const Z32_ALPHABET: &[u8; 32] = b"ybndrfg8ejkmcpqxot1uwisza345h769";

/// Whether `text` can start a key's text: at most 52 characters of the z-base-32
/// alphabet (the empty text starts every key).
pub fn is_z32_prefix(text: &str) -> bool {
    text.len() <= PUBLIC_KEY_TEXT_LEN && text.bytes().all(|b| Z32_ALPHABET.contains(&b))
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PublicKeyError {
    #[error("public key must be {PUBLIC_KEY_TEXT_LEN} z-base-32 characters, got {0}")]
    Length(usize),
    #[error("public key is not valid z-base-32")]
    Encoding,
    #[error("public key is not a valid Ed25519 point")]
    Point,
}

/// An Ed25519 public key: the identity of a user (or a server).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct PublicKey(VerifyingKey);

impl PublicKey {
    pub fn from_bytes(bytes: &[u8; 32]) -> Result<Self, PublicKeyError> {
        VerifyingKey::from_bytes(bytes)
            .map(Self)
            .map_err(|_| PublicKeyError::Point)
    }

    pub fn as_bytes(&self) -> &[u8; 32] {
        self.0.as_bytes()
    }

    /// The z-base-32 text form.
    pub fn to_z32(&self) -> String {
        z32::encode(self.0.as_bytes())
    }

    pub fn verifying_key(&self) -> &VerifyingKey {
        &self.0
    }

    /// Strict Ed25519 verification (rejects small-order keys and malleable signatures).
    pub fn verify_strict(&self, message: &[u8], signature: &Signature) -> bool {
        self.0.verify_strict(message, signature).is_ok()
    }
}

/// Keys parsed so far, by their text. Parsing decompresses a curve point (a field
/// square root: ~10 µs, a fifth of the server's time for a public GET before this
/// cache), and a server parses the same few keys over and over (`Pubky-Host`,
/// `Authorization`). Only valid keys are kept, and parsing is a pure function, so a hit
/// answers exactly what parsing would. Bounded: a flood of distinct keys evicts, never
/// grows it.
static PARSED_KEYS: LazyLock<quick_cache::sync::Cache<[u8; PUBLIC_KEY_TEXT_LEN], PublicKey>> =
    LazyLock::new(|| quick_cache::sync::Cache::new(4096));

impl FromStr for PublicKey {
    type Err = PublicKeyError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let text: [u8; PUBLIC_KEY_TEXT_LEN] = s
            .as_bytes()
            .try_into()
            .map_err(|_| PublicKeyError::Length(s.len()))?;
        if let Some(key) = PARSED_KEYS.get(&text) {
            return Ok(key);
        }
        let key = parse_key(s)?;
        PARSED_KEYS.insert(text, key);
        Ok(key)
    }
}

fn parse_key(s: &str) -> Result<PublicKey, PublicKeyError> {
    let bytes = z32::decode(s.as_bytes()).map_err(|_| PublicKeyError::Encoding)?;
    let bytes: [u8; 32] = bytes
        .get(..32)
        .and_then(|b| b.try_into().ok())
        .ok_or(PublicKeyError::Encoding)?;
    let key = PublicKey::from_bytes(&bytes)?;
    // z-base-32 of 32 bytes has 4 spare bits: refuse non-canonical spellings so that
    // one key has exactly one text form (it is used as a database key).
    if key.to_z32() != s {
        return Err(PublicKeyError::Encoding);
    }
    Ok(key)
}

impl fmt::Display for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_z32())
    }
}

impl fmt::Debug for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PublicKey({})", self.to_z32())
    }
}

impl Serialize for PublicKey {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_z32())
    }
}

impl<'de> Deserialize<'de> for PublicKey {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// An Ed25519 key pair. The secret is the 32-byte seed.
#[derive(Clone)]
pub struct Keypair(SigningKey);

impl Keypair {
    /// A new random key pair from the operating system's CSPRNG.
    pub fn random() -> Self {
        let mut seed = [0u8; 32];
        // The OS RNG failing is not a condition any caller can handle.
        getrandom::fill(&mut seed).expect("operating system RNG unavailable");
        Self::from_seed(&seed)
    }

    pub fn from_seed(seed: &[u8; 32]) -> Self {
        Self(SigningKey::from_bytes(seed))
    }

    /// Parses a secret key file's content: the 32-byte seed as 64 hex characters
    /// (surrounding white space ignored).
    pub fn from_secret_hex(text: &str) -> Result<Self, SecretKeyError> {
        let text = text.trim();
        let bytes = hex::decode(text).map_err(|_| SecretKeyError)?;
        let seed: [u8; 32] = bytes.try_into().map_err(|_| SecretKeyError)?;
        Ok(Self::from_seed(&seed))
    }

    /// The secret seed as 64 lower-case hex characters (the secret key file format).
    pub fn secret_hex(&self) -> String {
        hex::encode(self.0.to_bytes())
    }

    pub fn seed(&self) -> [u8; 32] {
        self.0.to_bytes()
    }

    pub fn public_key(&self) -> PublicKey {
        PublicKey(self.0.verifying_key())
    }

    pub fn sign(&self, message: &[u8]) -> Signature {
        self.0.sign(message)
    }

    pub fn signing_key(&self) -> &SigningKey {
        &self.0
    }
}

impl fmt::Debug for Keypair {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Keypair({})", self.public_key())
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("secret key must be 64 hex characters (a 32-byte Ed25519 seed)")]
pub struct SecretKeyError;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_key_text_starts_with_a_z32_prefix_of_itself() {
        let text = Keypair::from_seed(&[9; 32]).public_key().to_z32();
        for end in 0..=text.len() {
            assert!(is_z32_prefix(&text[..end]));
        }
        assert!(!is_z32_prefix(&format!("{text}y")));
        // `l`, `v` and `2` are not in the alphabet; upper case is not either.
        for bad in ["l", "v", "2", "Y", "yb-"] {
            assert!(!is_z32_prefix(bad), "{bad}");
        }
    }

    #[test]
    fn z32_round_trip() {
        let kp = Keypair::from_seed(&[7; 32]);
        let text = kp.public_key().to_z32();
        assert_eq!(text.len(), PUBLIC_KEY_TEXT_LEN);
        assert_eq!(text.parse::<PublicKey>(), Ok(kp.public_key()));
    }

    #[test]
    fn known_key_text() {
        // Vector from pubky apps: the BIP39 "abandon x11 about" key.
        let hex_key = "c5785e1865b708938aff8161d573006496663b1aa10834e396dc566869a2c66a";
        let bytes: [u8; 32] = hex::decode(hex_key).unwrap().try_into().unwrap();
        let key = PublicKey::from_bytes(&bytes).unwrap();
        assert_eq!(
            key.to_z32(),
            "aihfhgdfshrj8nz9ofo7khayc1mgcqa4wrrdjahs5tmgo4pna3iy"
        );
    }

    #[test]
    fn rejects_bad_text() {
        assert_eq!("abc".parse::<PublicKey>(), Err(PublicKeyError::Length(3)));
        let bad = "l".repeat(52); // 'l' is not in the z-base-32 alphabet
        assert_eq!(bad.parse::<PublicKey>(), Err(PublicKeyError::Encoding));
    }

    #[test]
    fn rejects_non_canonical_text() {
        let text = Keypair::from_seed(&[1; 32]).public_key().to_z32();
        // Flip the last character among spellings that decode to the same 32 bytes.
        let last = text.chars().last().unwrap();
        let alphabet = "ybndrfg8ejkmcpqxot1uwisza345h769";
        let mut found_alias = false;
        for c in alphabet.chars().filter(|c| *c != last) {
            let alias = format!("{}{}", &text[..51], c);
            if let Ok(bytes) = z32::decode(alias.as_bytes())
                && bytes.get(..32) == Some(Keypair::from_seed(&[1; 32]).public_key().as_bytes())
            {
                found_alias = true;
                assert!(
                    alias.parse::<PublicKey>().is_err(),
                    "alias {alias} accepted"
                );
            }
        }
        let _ = found_alias;
    }

    #[test]
    fn parsing_again_answers_the_same_and_the_cache_never_admits_an_alias() {
        let key = Keypair::from_seed(&[3; 32]).public_key();
        let text = key.to_z32();
        assert_eq!(text.parse::<PublicKey>(), Ok(key));
        assert_eq!(text.parse::<PublicKey>(), Ok(key)); // from the cache
        // Every other spelling of the last character is still refused after the
        // canonical text was cached (aliases decode to the same bytes, not the same text).
        let alphabet = "ybndrfg8ejkmcpqxot1uwisza345h769";
        for c in alphabet.chars().filter(|c| !text.ends_with(*c)) {
            let alias = format!("{}{c}", &text[..51]);
            if let Ok(parsed) = alias.parse::<PublicKey>() {
                assert_eq!(
                    parsed.to_z32(),
                    alias,
                    "{alias} parsed as another key's alias"
                );
            }
        }
        let bad = format!("{}l", &text[..51]);
        assert_eq!(bad.parse::<PublicKey>(), Err(PublicKeyError::Encoding));
    }

    #[test]
    fn secret_hex_round_trip() {
        let kp = Keypair::random();
        let back = Keypair::from_secret_hex(&format!("  {}\n", kp.secret_hex())).unwrap();
        assert_eq!(back.public_key(), kp.public_key());
        assert!(Keypair::from_secret_hex("zz").is_err());
        assert!(Keypair::from_secret_hex(&"ab".repeat(31)).is_err());
    }
}
