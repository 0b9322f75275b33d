//! `homeserver policy new --slot SLOT DIR`: a ready guest crate for one slot: its
//! Cargo.toml (wit-bindgen, a small release profile, a workspace of its own), the WIT
//! contract this server speaks, a working guest (`src/lib.rs`), its own golden cases
//! (`cases.jsonl`, for `policy check --cases`) and a README with the edit → build →
//! check → reload loop. With `--lang python` (capability-policy only): `app.py`, a
//! `build.sh` running componentize-py, the WIT, the cases and a README; with `--lang
//! javascript` (capability-policy only): `app.js`, `package.json`, `build.mjs` and a
//! `build.sh` running componentize-js, the WIT, the cases and a README. The templates
//! are the files beside this one.

use std::path::{Path, PathBuf};

use homeserver_runtime::Slot;

/// The WIT contract, as the server loads guests against it.
const WIT: &str = include_str!("../../../../../wit/guest.wit");
/// The wit-bindgen the built-in guests use (guests/Cargo.toml).
const WIT_BINDGEN: &str = "0.61";
/// The componentize-py of Python guests (scripts/build-python-guest).
const COMPONENTIZE_PY: &str = "0.25.1";
/// The componentize-js of JavaScript guests (scripts/build-js-tools).
const COMPONENTIZE_JS: &str = "0.23.0";

/// The language of a new guest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Lang {
    Rust,
    /// componentize-py; capability-policy only.
    Python,
    /// componentize-js; capability-policy only.
    #[value(alias = "js")]
    Javascript,
}

/// What `new` wrote.
#[derive(Debug)]
pub struct NewGuest {
    pub dir: PathBuf,
    pub files: Vec<PathBuf>,
    /// The module `cargo build --release --target wasm32-wasip2` makes, relative to `dir`.
    pub module: PathBuf,
}

/// Writes a guest for `slot` in `lang` into `dir` (which must not exist, or be empty).
pub fn new_guest(slot: Slot, lang: Lang, dir: &Path) -> Result<NewGuest, String> {
    if lang != Lang::Rust && slot != Slot::CapabilityPolicy {
        let language = if lang == Lang::Python {
            "Python"
        } else {
            "JavaScript"
        };
        return Err(format!(
            "a {language} template exists for capability-policy only, not {slot} (write \
             {slot} in Rust, or start from the capability-policy one and its WIT world)"
        ));
    }
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
    let fill = |template: &str| {
        template
            .replace("{name}", &name)
            .replace("{slot}", slot.name())
            .replace("{file}", &file)
            .replace("{wit_version}", wit_version())
            .replace("{componentize_py}", COMPONENTIZE_PY)
            .replace("{componentize_js}", COMPONENTIZE_JS)
    };
    let (files, module): (Vec<(&str, String)>, PathBuf) = match lang {
        Lang::Rust => (
            vec![
                ("Cargo.toml", cargo),
                ("src/lib.rs", source.to_owned()),
                ("wit/guest.wit", WIT.to_owned()),
                ("cases.jsonl", cases.to_owned()),
                ("README.md", fill(include_str!("README.md.txt"))),
                (".gitignore", "/target\n".to_owned()),
            ],
            Path::new("target/wasm32-wasip2/release").join(format!("{file}.wasm")),
        ),
        Lang::Python => (
            vec![
                ("app.py", include_str!("policy.py.txt").to_owned()),
                ("build.sh", fill(include_str!("build.sh.txt"))),
                ("wit/guest.wit", WIT.to_owned()),
                ("cases.jsonl", cases.to_owned()),
                ("README.md", fill(include_str!("README.py.md.txt"))),
                (".gitignore", "/.venv\n*.wasm\n__pycache__/\n".to_owned()),
            ],
            PathBuf::from(format!("{file}.wasm")),
        ),
        Lang::Javascript => (
            vec![
                ("app.js", include_str!("policy.js.txt").to_owned()),
                ("build.mjs", fill(include_str!("build.mjs.txt"))),
                ("package.json", fill(include_str!("package.json.txt"))),
                ("build.sh", fill(include_str!("build.js.sh.txt"))),
                ("wit/guest.wit", WIT.to_owned()),
                ("cases.jsonl", cases.to_owned()),
                ("README.md", fill(include_str!("README.js.md.txt"))),
                (".gitignore", "/node_modules\n*.wasm\n".to_owned()),
            ],
            PathBuf::from(format!("{file}.wasm")),
        ),
    };
    let mut written = Vec::new();
    for (path, text) in files {
        let path = dir.join(path);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(|e| format!("{}: {e}", parent.display()))?;
        }
        std::fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))?;
        if path.extension().is_some_and(|e| e == "sh") {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))
                .map_err(|e| format!("{}: {e}", path.display()))?;
        }
        written.push(path);
    }
    Ok(NewGuest {
        dir: dir.to_owned(),
        files: written,
        module,
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
        let made = new_guest(Slot::CapabilityPolicy, Lang::Rust, &dir).unwrap();
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
        assert!(new_guest(Slot::CapabilityPolicy, Lang::Rust, &dir).is_err());
    }

    #[test]
    fn writes_a_python_guest_for_the_policy_slot_only() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("py-policy");
        let made = new_guest(Slot::CapabilityPolicy, Lang::Python, &dir).unwrap();
        assert_eq!(made.module, Path::new("py_policy.wasm"));
        let build = std::fs::read_to_string(dir.join("build.sh")).unwrap();
        assert!(build.contains("--stub-wasi") && build.contains("-o py_policy.wasm"));
        assert!(!build.contains("{file}") && !build.contains("{componentize_py}"));
        let readme = std::fs::read_to_string(dir.join("README.md")).unwrap();
        assert!(!readme.contains("{file}") && !readme.contains("{componentize_py}"));
        let err = new_guest(Slot::SafetyFilter, Lang::Python, &tmp.path().join("f")).unwrap_err();
        assert!(err.contains("capability-policy only"), "{err}");
    }

    #[test]
    fn writes_a_javascript_guest_for_the_policy_slot_only() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("js-policy");
        let made = new_guest(Slot::CapabilityPolicy, Lang::Javascript, &dir).unwrap();
        assert_eq!(made.module, Path::new("js_policy.wasm"));
        let build = std::fs::read_to_string(dir.join("build.mjs")).unwrap();
        assert!(build.contains("'js_policy.wasm'") && build.contains("disableFeatures"));
        let package: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("package.json")).unwrap())
                .unwrap();
        assert_eq!(package["name"], "js-policy");
        assert_eq!(
            package["devDependencies"]["@bytecodealliance/componentize-js"],
            COMPONENTIZE_JS
        );
        for file in ["build.sh", "README.md", "app.js"] {
            let text = std::fs::read_to_string(dir.join(file)).unwrap();
            assert!(
                !text.contains("{file}") && !text.contains("{componentize_js}"),
                "{file}"
            );
        }
        let err = new_guest(
            Slot::IntentClassifier,
            Lang::Javascript,
            &tmp.path().join("f"),
        )
        .unwrap_err();
        assert!(
            err.contains("JavaScript template exists for capability-policy only"),
            "{err}"
        );
    }
}
