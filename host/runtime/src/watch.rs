//! Watching the policies directory: a notify watcher whose change events (not reads:
//! a reload reads the files, and reacting to that would reload forever) are debounced on
//! a thread of their own, which then reloads the runtime off the request path. Unchanged
//! slots are skipped by fingerprint, so a burst of events costs one cheap pass.

use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Weak};
use std::time::Duration;

use notify::{Event, EventKind, RecommendedWatcher, RecursiveMode, Watcher};

use crate::error::RuntimeError;
use crate::runtime::{PolicyRuntime, ReloadOutcome};

/// Keeps the watcher alive; dropping it stops watching (and ends the debounce thread).
pub struct WatchHandle {
    _watcher: RecommendedWatcher,
    dir: PathBuf,
}

impl std::fmt::Debug for WatchHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WatchHandle")
            .field("dir", &self.dir)
            .finish()
    }
}

/// Whether an event says something changed (creation, modification, removal, rename);
/// `Access` events (opened, read, closed without writing) never do.
fn is_change(event: &Event) -> bool {
    !matches!(event.kind, EventKind::Access(_))
}

impl PolicyRuntime {
    /// Starts watching the policies directory (which must exist). The watcher holds
    /// only a weak reference: it does not keep the runtime alive.
    pub fn watch(self: &Arc<Self>) -> Result<WatchHandle, RuntimeError> {
        let dir = self.config().policies_dir.clone();
        let cache_dir = self.config().cache_dir.clone();
        let debounce = self.config().watch_debounce;
        let runtime: Weak<Self> = Arc::downgrade(self);
        let watch_error = |e: notify::Error| RuntimeError::Watch {
            path: dir.clone(),
            message: e.to_string(),
        };
        let (changes, changed) = mpsc::channel::<()>();
        let mut watcher =
            notify::recommended_watcher(move |result: notify::Result<Event>| match result {
                Ok(event)
                    if is_change(&event)
                        && event
                            .paths
                            .iter()
                            .any(|p| relevant(p, cache_dir.as_deref())) =>
                {
                    let _ = changes.send(());
                }
                Ok(_) => {}
                Err(e) => tracing::warn!("policies watcher: {e}"),
            })
            .map_err(watch_error)?;
        watcher
            .watch(&dir, RecursiveMode::Recursive)
            .map_err(watch_error)?;
        std::thread::Builder::new()
            .name("policies-watch".into())
            .spawn(move || debounce_and_reload(&changed, debounce, &runtime))
            .map_err(|e| RuntimeError::Watch {
                path: dir.clone(),
                message: e.to_string(),
            })?;
        tracing::info!(dir = %dir.display(), "watching the policies directory");
        Ok(WatchHandle {
            _watcher: watcher,
            dir,
        })
    }
}

/// Waits for a change, then for `quiet` without more, then reloads; ends when the
/// watcher (the sender) is dropped or the runtime is gone.
fn debounce_and_reload(
    changed: &mpsc::Receiver<()>,
    quiet: Duration,
    runtime: &Weak<PolicyRuntime>,
) {
    while changed.recv().is_ok() {
        loop {
            match changed.recv_timeout(quiet) {
                Ok(()) => continue,
                Err(RecvTimeoutError::Timeout) => break,
                Err(RecvTimeoutError::Disconnected) => return,
            }
        }
        let Some(runtime) = runtime.upgrade() else {
            return;
        };
        tracing::info!("policies directory changed; reloading guests");
        for slot in runtime.reload().slots {
            if let ReloadOutcome::Unchanged = slot.outcome {
                tracing::debug!(slot = %slot.slot, "guest unchanged");
            }
        }
    }
}

/// Whether a changed path can matter: not inside the module cache, not a hidden or
/// backup file (editor swap files, our own temporary files before their rename).
fn relevant(path: &Path, cache_dir: Option<&Path>) -> bool {
    if cache_dir.is_some_and(|cache| path.starts_with(cache)) {
        return false;
    }
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy())
        .unwrap_or_default();
    !(name.starts_with('.') || name.ends_with('~'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ignores_cache_and_temporary_files() {
        let cache = Path::new("/p/.cache");
        assert!(relevant(Path::new("/p/policies.toml"), Some(cache)));
        assert!(relevant(Path::new("/p/wordlists/spam.txt"), Some(cache)));
        assert!(!relevant(Path::new("/p/.cache/abc.cwasm"), Some(cache)));
        assert!(!relevant(Path::new("/p/.spam.txt.swp"), None));
        assert!(!relevant(Path::new("/p/spam.txt~"), None));
    }
}
