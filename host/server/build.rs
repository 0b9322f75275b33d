//! Build script: names the commit this binary is built from, for `GET /info` and the
//! `hs_build_info` metric. `HOMESERVER_COMMIT` in the build's environment wins (a build
//! from a source archive); else `git rev-parse` in the checkout; else "unknown". It
//! reruns only when the checkout's HEAD moves, so a build of unchanged sources does not
//! recompile the crate.

use std::path::Path;
use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let dir = std::env::var_os("CARGO_MANIFEST_DIR")?;
    let output = Command::new("git")
        .args(args)
        .current_dir(dir)
        .output()
        .ok()?;
    let text = String::from_utf8(output.stdout).ok()?;
    (output.status.success() && !text.trim().is_empty()).then(|| text.trim().to_owned())
}

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=HOMESERVER_COMMIT");
    let commit = match std::env::var("HOMESERVER_COMMIT") {
        Ok(commit) if !commit.trim().is_empty() => commit.trim().to_owned(),
        _ => {
            // HEAD, the branch it names and packed refs: what moves with a commit.
            // (A path that does not exist would rerun the script on every build.)
            for name in ["HEAD", "packed-refs"] {
                if let Some(path) =
                    git(&["rev-parse", "--path-format=absolute", "--git-path", name])
                    && Path::new(&path).exists()
                {
                    println!("cargo:rerun-if-changed={path}");
                }
            }
            if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"])
                && let Some(path) =
                    git(&["rev-parse", "--path-format=absolute", "--git-path", &branch])
                && Path::new(&path).exists()
            {
                println!("cargo:rerun-if-changed={path}");
            }
            git(&["rev-parse", "--short=12", "HEAD"]).unwrap_or_else(|| "unknown".into())
        }
    };
    println!("cargo:rustc-env=HOMESERVER_COMMIT={commit}");
}
