//! Watching the policies directory: a debounced (notify) watcher that reloads the
//! runtime when a module, policies.toml or a data file changes. The reload runs on the
//! watcher's thread, off the request path; unchanged slots are skipped by fingerprint,
//! so a burst of events costs one cheap pass.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};

use notify::{RecommendedWatcher, RecursiveMode};
use notify_debouncer_mini::{DebounceEventResult, Debouncer, new_debouncer};

use crate::error::RuntimeError;
use crate::runtime::{PolicyRuntime, ReloadOutcome};

/// Keeps the watcher alive; dropping it stops watching.
pub struct WatchHandle {
    _debouncer: Debouncer<RecommendedWatcher>,
    dir: PathBuf,
}

impl std::fmt::Debug for WatchHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WatchHandle")
            .field("dir", &self.dir)
            .finish()
    }
}

impl PolicyRuntime {
    /// Starts watching the policies directory (which must exist). The watcher holds
    /// only a weak reference: it does not keep the runtime alive.
    pub fn watch(self: &Arc<Self>) -> Result<WatchHandle, RuntimeError> {
        let dir = self.config().policies_dir.clone();
        let cache_dir = self.config().cache_dir.clone();
        let runtime: Weak<Self> = Arc::downgrade(self);
        let watch_error = |e: notify::Error| RuntimeError::Watch {
            path: dir.clone(),
            message: e.to_string(),
        };
        let mut debouncer = new_debouncer(
            self.config().watch_debounce,
            move |result: DebounceEventResult| {
                let events = match result {
                    Ok(events) => events,
                    Err(e) => {
                        tracing::warn!("policies watcher: {e}");
                        return;
                    }
                };
                if !events
                    .iter()
                    .any(|e| relevant(&e.path, cache_dir.as_deref()))
                {
                    return;
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
            },
        )
        .map_err(watch_error)?;
        debouncer
            .watcher()
            .watch(&dir, RecursiveMode::Recursive)
            .map_err(watch_error)?;
        tracing::info!(dir = %dir.display(), "watching the policies directory");
        Ok(WatchHandle {
            _debouncer: debouncer,
            dir,
        })
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
