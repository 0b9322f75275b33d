//! What is compiled into the binary: the three default guests (built from `guests/` by
//! build.rs) and the default contents of `policies/` (policies.toml, wordlists, keyword
//! tables). They serve when the policies directory lacks a file, and
//! [`install_defaults`] writes them out so an operator has files to edit.

use std::path::{Path, PathBuf};

use crate::error::RuntimeError;
use crate::policies::POLICIES_FILE;
use crate::types::Slot;

/// The default policies.toml.
pub const POLICIES_TOML: &str = include_str!("../../../policies/policies.toml");

/// The default data files, by their path relative to the policies directory.
const DATA_FILES: [(&str, &str); 5] = [
    (
        "wordlists/offensive.txt",
        include_str!("../../../policies/wordlists/offensive.txt"),
    ),
    (
        "wordlists/spam.txt",
        include_str!("../../../policies/wordlists/spam.txt"),
    ),
    (
        "wordlists/political.txt",
        include_str!("../../../policies/wordlists/political.txt"),
    ),
    (
        "keywords/summary.txt",
        include_str!("../../../policies/keywords/summary.txt"),
    ),
    (
        "keywords/factcheck.txt",
        include_str!("../../../policies/keywords/factcheck.txt"),
    ),
];

const CAPABILITY_POLICY: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/capability-policy.wasm"));
const SAFETY_FILTER: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/safety-filter.wasm"));
const INTENT_CLASSIFIER: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/intent-classifier.wasm"));

/// The built-in guests compiled by build.rs for the engine of the default settings
/// (empty when it could not: a cross build, or no built-in guests).
const CAPABILITY_POLICY_NATIVE: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/capability-policy.cwasm"));
const SAFETY_FILTER_NATIVE: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/safety-filter.cwasm"));
const INTENT_CLASSIFIER_NATIVE: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/intent-classifier.cwasm"));

/// The built-in guest for `slot` compiled at build time (see [`crate::cache`] for how
/// it is loaded), if the build made it.
pub(crate) fn precompiled(slot: Slot) -> Option<&'static [u8]> {
    let bytes = match slot {
        Slot::CapabilityPolicy => CAPABILITY_POLICY_NATIVE,
        Slot::SafetyFilter => SAFETY_FILTER_NATIVE,
        Slot::IntentClassifier => INTENT_CLASSIFIER_NATIVE,
    };
    (!bytes.is_empty()).then_some(bytes)
}

/// The built-in guest for `slot`; `None` in a build made with
/// `HOMESERVER_SKIP_GUEST_BUILD`.
pub fn module(slot: Slot) -> Option<&'static [u8]> {
    let bytes = match slot {
        Slot::CapabilityPolicy => CAPABILITY_POLICY,
        Slot::SafetyFilter => SAFETY_FILTER,
        Slot::IntentClassifier => INTENT_CLASSIFIER,
    };
    (!bytes.is_empty()).then_some(bytes)
}

/// A default data file's text, by its path relative to the policies directory.
pub(crate) fn data_file(relative: &str) -> Option<&'static str> {
    DATA_FILES
        .iter()
        .find(|(path, _)| *path == relative)
        .map(|(_, text)| *text)
}

/// The file name the default policies.toml gives `slot`'s module.
pub fn module_file_name(slot: Slot) -> String {
    format!("{}.wasm", slot.name())
}

/// What [`install_defaults`] did.
#[derive(Debug, Clone, Default)]
pub struct InstallReport {
    pub written: Vec<PathBuf>,
    /// Files that existed and were left alone (without `overwrite`).
    pub kept: Vec<PathBuf>,
}

/// Writes the default policies directory: policies.toml, the wordlists and keyword
/// tables, and the three built-in guests as `<slot>.wasm`. Existing files are kept
/// unless `overwrite`. Backs `homeserver policy install`.
pub fn install_defaults(dir: &Path, overwrite: bool) -> Result<InstallReport, RuntimeError> {
    let mut files: Vec<(PathBuf, &[u8])> =
        vec![(dir.join(POLICIES_FILE), POLICIES_TOML.as_bytes())];
    for (relative, text) in DATA_FILES {
        files.push((dir.join(relative), text.as_bytes()));
    }
    for slot in Slot::ALL {
        match module(slot) {
            Some(bytes) => files.push((dir.join(module_file_name(slot)), bytes)),
            None => {
                return Err(RuntimeError::NoModule {
                    slot,
                    message: "this build has no built-in guests (HOMESERVER_SKIP_GUEST_BUILD)"
                        .to_owned(),
                });
            }
        }
    }
    let mut report = InstallReport::default();
    for (path, bytes) in files {
        if path.exists() && !overwrite {
            report.kept.push(path);
            continue;
        }
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(|e| RuntimeError::io(parent, e))?;
        }
        write_atomically(&path, bytes)?;
        report.written.push(path);
    }
    Ok(report)
}

/// Writes via a temporary file and a rename, so a watcher never sees half a file.
pub(crate) fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), RuntimeError> {
    let file_name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = path.with_file_name(format!(".{file_name}.tmp-{}", std::process::id()));
    std::fs::write(&tmp, bytes).map_err(|e| RuntimeError::io(&tmp, e))?;
    std::fs::rename(&tmp, path).map_err(|e| RuntimeError::io(path, e))
}
