//! `homeserver policy new --slot SLOT DIR`: a ready guest crate for one slot: its
//! Cargo.toml (wit-bindgen, a small release profile, a workspace of its own), the WIT
//! contract this server speaks, a working guest (`src/lib.rs`), its own golden cases
//! (`cases.jsonl`, for `policy check --cases`) and a README with the edit → build →
//! check → reload loop. The templates are the files beside this one.

use std::path::{Path, PathBuf};

use homeserver_runtime::Slot;

/// The WIT contract, as the server loads guests against it.
const WIT: &str = include_str!("../../../../wit/guest.wit");
/// The wit-bindgen the built-in guests use (guests/Cargo.toml).
const WIT_BINDGEN: &str = "0.61";

/// What `new` wrote.
#[derive(Debug)]
pub struct NewGuest {
    pub dir: PathBuf,
    pub files: Vec<PathBuf>,
    /// The module `cargo build --release --target wasm32-wasip2` makes, relative to `dir`.
    pub module: PathBuf,
}

/// Writes a guest crate for `slot` into `dir` (which must not exist, or be empty).
pub fn new_guest(slot: Slot, dir: &Path) -> Result<NewGuest, String> {
    if dir.exists()
        && std::fs::read_dir(dir)
            .map_err(|e| format!("{}: {e}", dir.display()))?
            .next()
            .is_some()
    {
        return Err(format!(
            "{} exists and is not empty: choose a new folder",
            dir.display()
        ));
    }
    // `.` or `..` name no folder: the crate is named after the real one.
    let named = std::path::absolute(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let named = named.components().collect::<PathBuf>();
    let name = crate_name(&named)?;
    let file = name.replace('-', "_");
    let (source, cases) = match slot {
        Slot::CapabilityPolicy => (
            include_str!("policy.rs.txt"),
            include_str!("policy.cases.txt"),
        ),
        Slot::SafetyFilter => (
            include_str!("safety.rs.txt"),
            include_str!("safety.cases.txt"),
        ),
        Slot::IntentClassifier => (
            include_str!("intent.rs.txt"),
            include_str!("intent.cases.txt"),
        ),
    };
    let cargo = format!(
        r#"[package]
name = "{name}"
version = "0.1.0"
edition = "2024"
publish = false

[lib]
crate-type = ["cdylib"]

[dependencies]
wit-bindgen = {{ version = "{WIT_BINDGEN}", default-features = false, features = ["macros", "realloc", "std"] }}

# Small, and a panic aborts (the host sees a trap and uses the slot's safe default).
[profile.release]
opt-level = "s"
lto = true
codegen-units = 1
panic = "abort"
strip = true

# A workspace of its own, also inside another project's folder.
[workspace]
"#
    );
    let readme = include_str!("README.md.txt")
        .replace("{name}", &name)
        .replace("{slot}", slot.name())
        .replace("{file}", &file)
        .replace("{wit_version}", wit_version());
    let files: [(&str, &str); 6] = [
        ("Cargo.toml", &cargo),
        ("src/lib.rs", source),
        ("wit/guest.wit", WIT),
        ("cases.jsonl", cases),
        ("README.md", &readme),
        (".gitignore", "/target\n"),
    ];
    let mut written = Vec::new();
    for (path, text) in files {
        let path = dir.join(path);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(|e| format!("{}: {e}", parent.display()))?;
        }
        std::fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))?;
        written.push(path);
    }
    Ok(NewGuest {
        dir: dir.to_owned(),
        files: written,
        module: Path::new("target/wasm32-wasip2/release").join(format!("{file}.wasm")),
    })
}

/// The WIT package version (`package homeserver:guest@X;`).
fn wit_version() -> &'static str {
    WIT.lines()
        .find_map(|l| l.trim().strip_prefix("package homeserver:guest@"))
        .map_or("?", |v| v.trim_end_matches(';'))
}

/// A crate name from the folder's name: lower case, `-` for anything else.
fn crate_name(dir: &Path) -> Result<String, String> {
    let base = dir
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| format!("{}: no folder name to name the crate after", dir.display()))?;
    let name: String = base
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect();
    let name = name.trim_matches('-').to_owned();
    match name.chars().next() {
        Some(c) if c.is_ascii_alphabetic() => Ok(name),
        _ => Err(format!(
            "{base}: a crate name must start with a letter (the folder names the crate)"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_versions() {
        assert_eq!(crate_name(Path::new("/x/My Policy")).unwrap(), "my-policy");
        assert!(crate_name(Path::new("/x/2fast")).is_err());
        assert_eq!(wit_version(), "0.2.0");
    }

    #[test]
    fn writes_a_crate_and_refuses_a_folder_with_files() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("archive-policy");
        let made = new_guest(Slot::CapabilityPolicy, &dir).unwrap();
        assert_eq!(made.files.len(), 6);
        assert_eq!(
            made.module,
            Path::new("target/wasm32-wasip2/release/archive_policy.wasm")
        );
        let readme = std::fs::read_to_string(dir.join("README.md")).unwrap();
        assert!(readme.contains("--slot capability-policy --cases cases.jsonl"));
        assert!(
            !readme.contains("{slot}") && !readme.contains("{file}"),
            "{readme}"
        );
        assert!(new_guest(Slot::CapabilityPolicy, &dir).is_err());
    }
}
