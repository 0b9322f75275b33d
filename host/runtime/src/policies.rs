//! Reading `policies/policies.toml`: which module serves each slot and the data the
//! guest gets through its `config` import. Resolving a slot yields the module's bytes,
//! where they came from, the config values, and a fingerprint of both, so a reload can
//! tell a changed slot from an unchanged one.
//!
//! Without a policies.toml in the directory, the defaults compiled into the binary are
//! used (the repository's policies/ at build time), so a server started anywhere has
//! sensible data.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::builtin;
use crate::error::RuntimeError;
use crate::types::Slot;

/// The file naming the slots' modules and data.
pub const POLICIES_FILE: &str = "policies.toml";

/// The config values of one slot, as the guest sees them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SlotConfig(BTreeMap<String, String>);

impl SlotConfig {
    pub fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).map(String::as_str)
    }

    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.0.keys().map(String::as_str)
    }

    pub(crate) fn insert(&mut self, key: String, value: String) {
        self.0.insert(key, value);
    }

    fn digest_into(&self, hasher: &mut blake3::Hasher) {
        for (key, value) in &self.0 {
            // Length prefixes keep ("ab", "c") and ("a", "bc") apart.
            hasher.update(&(key.len() as u64).to_le_bytes());
            hasher.update(key.as_bytes());
            hasher.update(&(value.len() as u64).to_le_bytes());
            hasher.update(value.as_bytes());
        }
    }
}

/// Where a module came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ModuleSource {
    /// A file under the policies directory.
    File(PathBuf),
    /// The default guest compiled into the binary.
    Builtin,
}

impl fmt::Display for ModuleSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ModuleSource::File(path) => write!(f, "{}", path.display()),
            ModuleSource::Builtin => f.write_str("builtin"),
        }
    }
}

/// What serves a slot whose module file does not exist.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
enum Fallback {
    /// The built-in default guest.
    #[default]
    Builtin,
    /// Nothing: the slot keeps its safe default (or its previous module on a reload).
    None,
}

/// One slot's section of policies.toml.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct SlotSpec {
    module: Option<String>,
    #[serde(default)]
    fallback: Fallback,
    #[serde(default)]
    config: toml::Table,
    #[serde(default)]
    files: BTreeMap<String, String>,
}

/// A slot, resolved: ready to compile and load.
#[derive(Debug, Clone)]
pub(crate) struct ResolvedSlot {
    pub bytes: Cow<'static, [u8]>,
    pub module_hash: blake3::Hash,
    pub source: ModuleSource,
    pub config: SlotConfig,
    /// BLAKE3 over the module hash and the config: equal means nothing changed.
    pub fingerprint: blake3::Hash,
}

/// A parsed policies directory.
#[derive(Debug)]
pub(crate) struct Policies {
    dir: PathBuf,
    /// False when the directory has no policies.toml and the compiled-in defaults apply.
    from_dir: bool,
    slots: BTreeMap<Slot, SlotSpec>,
}

impl Policies {
    /// Reads `dir/policies.toml`, or the compiled-in defaults when it does not exist.
    pub(crate) fn read(dir: &Path) -> Result<Self, RuntimeError> {
        let file = dir.join(POLICIES_FILE);
        let (text, from_dir) = match std::fs::read_to_string(&file) {
            Ok(text) => (Cow::Owned(text), true),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                (Cow::Borrowed(builtin::POLICIES_TOML), false)
            }
            Err(e) => return Err(RuntimeError::io(file, e)),
        };
        let slots = parse(&text).map_err(|message| RuntimeError::PoliciesFile {
            path: if from_dir {
                file.clone()
            } else {
                PathBuf::from("<built-in policies.toml>")
            },
            message,
        })?;
        Ok(Self {
            dir: dir.to_owned(),
            from_dir,
            slots,
        })
    }

    /// The compiled-in default policies.toml and data (for `policy check`, where the
    /// module comes from the command line).
    pub(crate) fn builtin() -> Self {
        Self {
            dir: PathBuf::new(),
            from_dir: false,
            // Parsed in a unit test; an error here is a build of a broken repository.
            slots: parse(builtin::POLICIES_TOML).unwrap_or_default(),
        }
    }

    /// Resolves `slot`: reads its module (or picks the built-in one) and its data.
    /// `module_override` replaces the configured module (for `policy eval --module`).
    pub(crate) fn resolve(
        &self,
        slot: Slot,
        module_override: Option<&Path>,
    ) -> Result<ResolvedSlot, RuntimeError> {
        let spec = self.slots.get(&slot).cloned().unwrap_or_default();
        let (bytes, source) = match (module_override, &spec.module) {
            (Some(path), _) => (read_module(path)?, ModuleSource::File(path.to_owned())),
            (None, Some(name)) => {
                let path = self.dir.join(name);
                match std::fs::read(&path) {
                    Ok(bytes) => (Cow::Owned(bytes), ModuleSource::File(path)),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => match spec.fallback {
                        Fallback::Builtin => (builtin_module(slot)?, ModuleSource::Builtin),
                        Fallback::None => {
                            return Err(RuntimeError::NoModule {
                                slot,
                                message: format!(
                                    "{} does not exist and fallback is \"none\"",
                                    path.display()
                                ),
                            });
                        }
                    },
                    Err(e) => return Err(RuntimeError::io(path, e)),
                }
            }
            (None, None) => (builtin_module(slot)?, ModuleSource::Builtin),
        };

        let mut config = SlotConfig::default();
        for (key, value) in &spec.config {
            let value = config_value(value).map_err(|message| RuntimeError::PoliciesFile {
                path: self.dir.join(POLICIES_FILE),
                message: format!("[{slot}.config] {key}: {message}"),
            })?;
            config.insert(key.clone(), value);
        }
        for (key, file) in &spec.files {
            config.insert(key.clone(), self.read_data(file)?);
        }

        let module_hash = blake3::hash(&bytes);
        let mut hasher = blake3::Hasher::new();
        hasher.update(module_hash.as_bytes());
        config.digest_into(&mut hasher);
        Ok(ResolvedSlot {
            bytes,
            module_hash,
            source,
            config,
            fingerprint: hasher.finalize(),
        })
    }

    /// A data file's text, from the directory or, without a policies.toml there, from
    /// the compiled-in defaults.
    fn read_data(&self, file: &str) -> Result<String, RuntimeError> {
        if !self.from_dir
            && let Some(text) = builtin::data_file(file)
        {
            return Ok(text.to_owned());
        }
        let path = self.dir.join(file);
        std::fs::read_to_string(&path).map_err(|e| RuntimeError::io(path, e))
    }
}

fn read_module(path: &Path) -> Result<Cow<'static, [u8]>, RuntimeError> {
    std::fs::read(path)
        .map(Cow::Owned)
        .map_err(|e| RuntimeError::io(path, e))
}

fn builtin_module(slot: Slot) -> Result<Cow<'static, [u8]>, RuntimeError> {
    builtin::module(slot)
        .map(Cow::Borrowed)
        .ok_or_else(|| RuntimeError::NoModule {
            slot,
            message:
                "no module file and this build has no built-in guests (HOMESERVER_SKIP_GUEST_BUILD)"
                    .to_owned(),
        })
}

/// Parses policies.toml into one spec per slot. Unknown slots and keys are errors, so a
/// typo cannot silently leave a slot on its defaults.
fn parse(text: &str) -> Result<BTreeMap<Slot, SlotSpec>, String> {
    let table: toml::Table = text.parse().map_err(|e: toml::de::Error| e.to_string())?;
    let mut slots = BTreeMap::new();
    for (name, value) in table {
        let slot: Slot = name
            .parse()
            .map_err(|e: crate::types::UnknownSlot| e.to_string())?;
        let spec: SlotSpec = value
            .try_into()
            .map_err(|e: toml::de::Error| format!("[{name}]: {e}"))?;
        slots.insert(slot, spec);
    }
    Ok(slots)
}

/// A config value as the guest sees it: strings as they are, booleans and numbers in
/// their TOML spelling, arrays one item a line.
fn config_value(value: &toml::Value) -> Result<String, String> {
    match value {
        toml::Value::String(s) => Ok(s.clone()),
        toml::Value::Boolean(b) => Ok(b.to_string()),
        toml::Value::Integer(i) => Ok(i.to_string()),
        toml::Value::Float(f) => Ok(f.to_string()),
        toml::Value::Array(items) => Ok(items
            .iter()
            .map(config_value)
            .collect::<Result<Vec<_>, _>>()?
            .join("\n")),
        toml::Value::Datetime(d) => Ok(d.to_string()),
        toml::Value::Table(_) => Err("tables are not allowed as config values".to_owned()),
    }
}

/// A JSON config override (golden cases) with the same rules as [`config_value`].
pub(crate) fn json_config_value(value: &serde_json::Value) -> String {
    match value {
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Array(items) => items
            .iter()
            .map(json_config_value)
            .collect::<Vec<_>>()
            .join("\n"),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtin_policies_parse() {
        let slots = parse(builtin::POLICIES_TOML).unwrap();
        assert_eq!(slots.len(), 3);
        let safety = &slots[&Slot::SafetyFilter];
        assert_eq!(safety.module.as_deref(), Some("safety-filter.wasm"));
        assert_eq!(
            config_value(&safety.config["lists"]).unwrap(),
            "offensive\nspam\npolitical"
        );
        assert_eq!(config_value(&safety.config["enabled"]).unwrap(), "true");
    }

    #[test]
    fn typos_are_errors() {
        assert!(parse("[capability-polcy]\nmodule = \"x.wasm\"").is_err());
        assert!(parse("[capability-policy]\nmodul = \"x.wasm\"").is_err());
        assert!(parse("[capability-policy]\nfallback = \"maybe\"").is_err());
        assert!(parse("[capability-policy.config]\nx = { a = 1 }").is_ok());
    }

    #[test]
    fn missing_dir_uses_builtin_data() {
        let dir = tempfile::tempdir().unwrap();
        let policies = Policies::read(&dir.path().join("absent")).unwrap();
        assert!(!policies.from_dir);
        let safety = policies.resolve(Slot::SafetyFilter, None);
        // Builds with HOMESERVER_SKIP_GUEST_BUILD have no module to resolve.
        if let Ok(resolved) = safety {
            assert_eq!(resolved.source, ModuleSource::Builtin);
            assert!(
                resolved
                    .config
                    .get("list.spam")
                    .unwrap()
                    .contains("free money")
            );
        }
    }

    #[test]
    fn fallback_none_refuses_missing_module() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join(POLICIES_FILE),
            "[capability-policy]\nmodule = \"mine.wasm\"\nfallback = \"none\"\n",
        )
        .unwrap();
        let policies = Policies::read(dir.path()).unwrap();
        let err = policies.resolve(Slot::CapabilityPolicy, None).unwrap_err();
        assert!(matches!(err, RuntimeError::NoModule { .. }), "{err}");
    }

    #[test]
    fn fingerprint_follows_config() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("m.wasm"), b"module").unwrap();
        let write = |ro: &str| {
            std::fs::write(
                dir.path().join(POLICIES_FILE),
                format!("[capability-policy]\nmodule = \"m.wasm\"\n[capability-policy.config]\nread-only-prefixes = \"{ro}\"\n"),
            )
            .unwrap();
            Policies::read(dir.path())
                .unwrap()
                .resolve(Slot::CapabilityPolicy, None)
                .unwrap()
                .fingerprint
        };
        let a = write("/pub/a/");
        assert_eq!(a, write("/pub/a/"));
        assert_ne!(a, write("/pub/b/"));
    }
}
