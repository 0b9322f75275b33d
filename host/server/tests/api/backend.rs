//! Which metadata backend the suite runs against, and a throwaway database on it.
//!
//! `HS_TEST_BACKEND` picks the backend for the whole suite: `sqlite` (default).

use std::path::Path;
use std::sync::Arc;

use homeserver::persistence::{DatabaseUrl, MetadataStore, open_metadata};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
}

impl Backend {
    /// The backend named by `HS_TEST_BACKEND`.
    pub fn current() -> Self {
        match std::env::var("HS_TEST_BACKEND").as_deref() {
            Err(_) | Ok("") | Ok("sqlite") => Backend::Sqlite,
            Ok(other) => panic!("HS_TEST_BACKEND={other}: expected sqlite"),
        }
    }

    /// Whether several server instances may share one database of this backend.
    pub fn shared(self) -> bool {
        false
    }
}

/// A database for one test: a file under the test's data dir.
pub struct TestDatabase {
    pub url: DatabaseUrl,
}

impl TestDatabase {
    pub async fn create(dir: &Path) -> Self {
        let url = match Backend::current() {
            Backend::Sqlite => format!("sqlite://{}/hs.db", dir.display()),
        };
        Self {
            url: DatabaseUrl::parse(&url).unwrap(),
        }
    }

    /// A new connection pool to it, as a server instance would open.
    pub async fn open(&self) -> Arc<dyn MetadataStore> {
        open_metadata(&self.url).await.unwrap()
    }
}
