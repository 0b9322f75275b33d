//! Where `pk`'s settings come from, lowest first: built-in defaults, the config file and
//! its profiles, the environment, flags. [`resolve`] turns all of them into [`Settings`]
//! that remember where each value came from (`pk config` shows it).
//!
//! The config file is `$PK_CONFIG`, else `$XDG_CONFIG_HOME/pk/config.toml`, else
//! `~/.config/pk/config.toml`; it is optional:
//!
//! ```toml
//! profile = "default"            # used when neither --profile nor PK_PROFILE names one
//!
//! [profiles.default]
//! homeserver = "http://127.0.0.1:6286"
//! key_file = "keys/default.key"  # relative to this file's folder; ~/ is the home folder
//!
//! [profiles.work]
//! homeserver = "https://hs.example.org"
//! key_file = "~/secrets/work.key"
//! ```
//!
//! Keys live in the `keys/` folder next to the config file: without a `key_file`, a
//! profile's key is `keys/<profile>.key` there, which is where `pk keygen` writes it.
//! Secrets never go into the config file itself.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use pk_client::DEFAULT_HOMESERVER;
use serde::Deserialize;

/// Environment variable naming the config file.
pub const CONFIG_ENV: &str = "PK_CONFIG";
/// Environment variable holding the secret key itself (64 hex characters).
pub const SECRET_KEY_ENV: &str = "PK_SECRET_KEY";
/// The profile used when nothing names one.
pub const DEFAULT_PROFILE: &str = "default";

/// The environment as `pk` reads it: a snapshot, so that tests can pass their own.
#[derive(Debug, Clone, Default)]
pub struct Environment {
    /// `PK_CONFIG`.
    pub config: Option<PathBuf>,
    /// `XDG_CONFIG_HOME`.
    pub xdg_config_home: Option<PathBuf>,
    /// `HOME` (or, on Windows, `USERPROFILE`).
    pub home: Option<PathBuf>,
    /// `APPDATA` (Windows).
    pub appdata: Option<PathBuf>,
    /// `PK_SECRET_KEY`.
    pub secret_key: Option<String>,
}

impl Environment {
    pub fn current() -> Self {
        let path = |name: &str| {
            std::env::var_os(name)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        };
        Self {
            config: path(CONFIG_ENV),
            xdg_config_home: path("XDG_CONFIG_HOME").filter(|p| p.is_absolute()),
            home: path("HOME").or_else(|| path("USERPROFILE")),
            appdata: path("APPDATA"),
            secret_key: std::env::var(SECRET_KEY_ENV)
                .ok()
                .filter(|v| !v.trim().is_empty()),
        }
    }
}

/// The config file's content.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigFile {
    /// The profile used when neither --profile nor PK_PROFILE names one.
    pub profile: Option<String>,
    /// Named sets of settings: `[profiles.NAME]`.
    #[serde(default)]
    pub profiles: BTreeMap<String, Profile>,
}

/// One `[profiles.NAME]` section.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Profile {
    /// The homeserver's URL.
    pub homeserver: Option<String>,
    /// The secret key file (relative to the config file's folder; `~/` expands).
    pub key_file: Option<PathBuf>,
}

/// Where a setting's value came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    Default,
    ConfigFile,
    Environment,
    Flag,
}

impl Origin {
    pub fn as_str(self) -> &'static str {
        match self {
            Origin::Default => "default",
            Origin::ConfigFile => "config file",
            Origin::Environment => "environment",
            Origin::Flag => "flag",
        }
    }
}

/// What the command line said (clap fills in `PK_HOMESERVER`, `PK_SECRET_KEY_FILE` and
/// `PK_PROFILE` for missing flags), each with where it came from.
#[derive(Debug, Clone, Default)]
pub struct Given {
    pub homeserver: Option<(String, Origin)>,
    pub key_file: Option<(PathBuf, Origin)>,
    pub profile: Option<(String, Origin)>,
}

/// Where the secret key comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeySource {
    /// A key file (`Origin::Default`: the profile's file in the keys folder, which
    /// exists).
    File { path: PathBuf, origin: Origin },
    /// `PK_SECRET_KEY`.
    Environment(String),
    /// None configured.
    None,
}

/// The effective settings.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The config file consulted (it may not exist), if a location could be found.
    pub config_file: Option<PathBuf>,
    pub config_file_exists: bool,
    /// Profiles the config file defines.
    pub profiles: Vec<String>,
    pub profile: String,
    pub profile_origin: Origin,
    pub homeserver: String,
    pub homeserver_origin: Origin,
    pub key: KeySource,
    /// Where `pk keygen` writes when not told: the key file this profile uses.
    pub keygen_path: Option<PathBuf>,
}

/// Why the settings cannot be worked out.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read the config file {}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("invalid config file {}: {message}", path.display())]
    Parse { path: PathBuf, message: String },
    #[error("no profile `{name}` in {}{}", file_text(.file), known_profiles(.known))]
    UnknownProfile {
        name: String,
        file: Option<PathBuf>,
        known: Vec<String>,
    },
    #[error("invalid profile name `{0}`: use letters, digits, `-` and `_` (it names a key file)")]
    ProfileName(String),
}

fn file_text(file: &Option<PathBuf>) -> String {
    match file {
        Some(f) => f.display().to_string(),
        None => "the config file (none found: set PK_CONFIG or HOME)".to_owned(),
    }
}

fn known_profiles(known: &[String]) -> String {
    if known.is_empty() {
        " (it defines none)".to_owned()
    } else {
        format!(" (it defines: {})", known.join(", "))
    }
}

/// The config file's location: `PK_CONFIG`, else the user's config folder.
pub fn config_file_path(env: &Environment) -> Option<PathBuf> {
    if let Some(path) = &env.config {
        return Some(path.clone());
    }
    let dir = if let Some(xdg) = &env.xdg_config_home {
        xdg.join("pk")
    } else if let Some(home) = &env.home {
        home.join(".config").join("pk")
    } else {
        env.appdata.as_ref()?.join("pk")
    };
    Some(dir.join("config.toml"))
}

/// Reads the config file; a missing file is an empty one.
pub fn load_file(path: &Path) -> Result<Option<ConfigFile>, ConfigError> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(ConfigError::Read {
                path: path.to_owned(),
                source,
            });
        }
    };
    toml::from_str(&text)
        .map(Some)
        .map_err(|e| ConfigError::Parse {
            path: path.to_owned(),
            // toml's message names the key and quotes the line; keep it on one line.
            message: e
                .to_string()
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" "),
        })
}

/// Works out the effective settings.
pub fn resolve(given: &Given, env: &Environment) -> Result<Settings, ConfigError> {
    let config_file = config_file_path(env);
    let file = match &config_file {
        Some(path) => load_file(path)?,
        None => None,
    };
    // `PK_CONFIG` naming a file that is not there is a mistake worth reporting.
    if let (Some(path), None, Some(_)) = (&config_file, &file, &env.config) {
        return Err(ConfigError::Read {
            path: path.clone(),
            source: std::io::Error::new(std::io::ErrorKind::NotFound, "no such file"),
        });
    }
    let config_file_exists = file.is_some();
    let file = file.unwrap_or_default();
    let known: Vec<String> = file.profiles.keys().cloned().collect();

    let (profile, profile_origin) = match (&given.profile, &file.profile) {
        (Some((name, origin)), _) => (name.clone(), *origin),
        (None, Some(name)) => (name.clone(), Origin::ConfigFile),
        (None, None) => (DEFAULT_PROFILE.to_owned(), Origin::Default),
    };
    if profile.is_empty()
        || !profile
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    {
        return Err(ConfigError::ProfileName(profile));
    }
    let section = match file.profiles.get(&profile) {
        Some(section) => section.clone(),
        // The default profile needs no section; any other name must exist.
        None if profile == DEFAULT_PROFILE => Profile::default(),
        None => {
            return Err(ConfigError::UnknownProfile {
                name: profile,
                file: config_file,
                known,
            });
        }
    };

    let (homeserver, homeserver_origin) = match (&given.homeserver, &section.homeserver) {
        (Some((url, origin)), _) => (url.clone(), *origin),
        (None, Some(url)) => (url.clone(), Origin::ConfigFile),
        (None, None) => (DEFAULT_HOMESERVER.to_owned(), Origin::Default),
    };

    let base = config_file
        .as_deref()
        .and_then(Path::parent)
        .map(Path::to_path_buf);
    let profile_key = section
        .key_file
        .as_deref()
        .map(|p| expand_path(p, base.as_deref(), env.home.as_deref()));
    let default_key = base
        .as_ref()
        .map(|dir| dir.join("keys").join(format!("{profile}.key")));
    let key = if let Some((path, origin)) = &given.key_file {
        KeySource::File {
            path: path.clone(),
            origin: *origin,
        }
    } else if let Some(secret) = &env.secret_key {
        KeySource::Environment(secret.clone())
    } else if let Some(path) = &profile_key {
        KeySource::File {
            path: path.clone(),
            origin: Origin::ConfigFile,
        }
    } else {
        match &default_key {
            Some(path) if path.is_file() => KeySource::File {
                path: path.clone(),
                origin: Origin::Default,
            },
            _ => KeySource::None,
        }
    };
    let keygen_path = given
        .key_file
        .as_ref()
        .map(|(p, _)| p.clone())
        .or(profile_key)
        .or(default_key);

    Ok(Settings {
        config_file,
        config_file_exists,
        profiles: known,
        profile,
        profile_origin,
        homeserver,
        homeserver_origin,
        key,
        keygen_path,
    })
}

/// `~/x` under the home folder; a relative path under `base` (the config file's folder).
fn expand_path(path: &Path, base: Option<&Path>, home: Option<&Path>) -> PathBuf {
    if let (Ok(rest), Some(home)) = (path.strip_prefix("~"), home) {
        return home.join(rest);
    }
    match base {
        Some(base) if path.is_relative() => base.join(path),
        _ => path.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Fixture {
        dir: tempfile::TempDir,
    }

    impl Fixture {
        fn new() -> Self {
            Self {
                dir: tempfile::tempdir().unwrap(),
            }
        }

        /// An environment whose home is the temporary folder.
        fn env(&self) -> Environment {
            Environment {
                home: Some(self.dir.path().to_owned()),
                ..Environment::default()
            }
        }

        fn config_dir(&self) -> PathBuf {
            self.dir.path().join(".config").join("pk")
        }

        fn write_config(&self, text: &str) -> PathBuf {
            let path = self.config_dir().join("config.toml");
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, text).unwrap();
            path
        }
    }

    #[test]
    fn defaults_without_a_config_file() {
        let f = Fixture::new();
        let s = resolve(&Given::default(), &f.env()).unwrap();
        assert_eq!(s.homeserver, DEFAULT_HOMESERVER);
        assert_eq!(
            (s.profile.as_str(), s.profile_origin, s.homeserver_origin),
            (DEFAULT_PROFILE, Origin::Default, Origin::Default)
        );
        assert_eq!(s.key, KeySource::None);
        assert_eq!(
            s.config_file,
            Some(f.config_dir().join("config.toml")),
            "~/.config/pk/config.toml"
        );
        assert!(!s.config_file_exists);
        assert_eq!(
            s.keygen_path,
            Some(f.config_dir().join("keys").join("default.key"))
        );
        // Once `pk keygen` wrote the default key, it is used.
        let key = f.config_dir().join("keys").join("default.key");
        std::fs::create_dir_all(key.parent().unwrap()).unwrap();
        std::fs::write(&key, "00").unwrap();
        let s = resolve(&Given::default(), &f.env()).unwrap();
        assert_eq!(
            s.key,
            KeySource::File {
                path: key,
                origin: Origin::Default
            }
        );
    }

    #[test]
    fn xdg_config_home_and_pk_config_move_the_file() {
        let f = Fixture::new();
        let xdg = f.dir.path().join("xdg");
        let env = Environment {
            xdg_config_home: Some(xdg.clone()),
            ..f.env()
        };
        let s = resolve(&Given::default(), &env).unwrap();
        assert_eq!(s.config_file, Some(xdg.join("pk").join("config.toml")));
        assert_eq!(
            s.keygen_path,
            Some(xdg.join("pk").join("keys").join("default.key"))
        );

        let custom = f.dir.path().join("elsewhere").join("pk.toml");
        std::fs::create_dir_all(custom.parent().unwrap()).unwrap();
        std::fs::write(&custom, "[profiles.default]\nhomeserver = \"h:1\"\n").unwrap();
        let env = Environment {
            config: Some(custom.clone()),
            ..env
        };
        let s = resolve(&Given::default(), &env).unwrap();
        assert_eq!((s.homeserver.as_str(), s.config_file_exists), ("h:1", true));
        assert_eq!(
            s.keygen_path,
            Some(f.dir.path().join("elsewhere/keys/default.key"))
        );
        // PK_CONFIG naming a missing file is an error, not a silent default.
        let env = Environment {
            config: Some(f.dir.path().join("missing.toml")),
            ..f.env()
        };
        assert!(matches!(
            resolve(&Given::default(), &env),
            Err(ConfigError::Read { .. })
        ));
    }

    #[test]
    fn layers_in_order() {
        let f = Fixture::new();
        f.write_config(
            r#"
            profile = "work"
            [profiles.default]
            homeserver = "http://home:1"
            [profiles.work]
            homeserver = "https://work.example"
            key_file = "keys/w.key"
            [profiles.abs]
            key_file = "~/secret/abs.key"
            "#,
        );
        // The file's profile.
        let s = resolve(&Given::default(), &f.env()).unwrap();
        assert_eq!(
            (s.profile.as_str(), s.profile_origin),
            ("work", Origin::ConfigFile)
        );
        assert_eq!(
            (s.homeserver.as_str(), s.homeserver_origin),
            ("https://work.example", Origin::ConfigFile)
        );
        let work_key = f.config_dir().join("keys").join("w.key");
        assert_eq!(
            s.key,
            KeySource::File {
                path: work_key.clone(),
                origin: Origin::ConfigFile
            },
            "relative to the config file's folder"
        );
        assert_eq!(s.keygen_path, Some(work_key));
        assert_eq!(s.profiles, ["abs", "default", "work"]);

        // PK_PROFILE / --profile choose another; ~ expands.
        let given = Given {
            profile: Some(("abs".into(), Origin::Environment)),
            ..Given::default()
        };
        let s = resolve(&given, &f.env()).unwrap();
        assert_eq!(s.homeserver, DEFAULT_HOMESERVER);
        assert_eq!(
            s.key,
            KeySource::File {
                path: f.dir.path().join("secret").join("abs.key"),
                origin: Origin::ConfigFile
            }
        );

        // PK_SECRET_KEY beats the profile's key file; a key file flag beats both.
        let env = Environment {
            secret_key: Some("ab".repeat(32)),
            ..f.env()
        };
        let s = resolve(&Given::default(), &env).unwrap();
        assert_eq!(s.key, KeySource::Environment("ab".repeat(32)));
        let given = Given {
            key_file: Some(("mine.key".into(), Origin::Flag)),
            homeserver: Some(("127.0.0.1:9".into(), Origin::Environment)),
            ..Given::default()
        };
        let s = resolve(&given, &env).unwrap();
        assert_eq!(
            s.key,
            KeySource::File {
                path: "mine.key".into(),
                origin: Origin::Flag
            }
        );
        assert_eq!(s.keygen_path, Some(PathBuf::from("mine.key")));
        assert_eq!(
            (s.homeserver.as_str(), s.homeserver_origin),
            ("127.0.0.1:9", Origin::Environment)
        );
    }

    #[test]
    fn mistakes_are_named() {
        let f = Fixture::new();
        let path = f.write_config("[profiles.default]\nhomeservr = \"x\"\n");
        let err = resolve(&Given::default(), &f.env()).unwrap_err();
        let text = err.to_string();
        assert!(text.contains(&path.display().to_string()), "{text}");
        assert!(text.contains("homeservr"), "{text}");
        assert!(!text.contains('\n'), "{text}");

        f.write_config("[profiles.a]\n[profiles.b]\n");
        let given = Given {
            profile: Some(("c".into(), Origin::Flag)),
            ..Given::default()
        };
        let text = resolve(&given, &f.env()).unwrap_err().to_string();
        assert!(
            text.contains("no profile `c`") && text.contains("a, b"),
            "{text}"
        );
        // The default profile needs no section; a file naming a missing one is wrong.
        assert!(resolve(&Given::default(), &f.env()).is_ok());
        f.write_config("profile = \"nope\"\n");
        assert!(matches!(
            resolve(&Given::default(), &f.env()),
            Err(ConfigError::UnknownProfile { .. })
        ));
        let given = Given {
            profile: Some(("../x".into(), Origin::Flag)),
            ..Given::default()
        };
        assert!(matches!(
            resolve(&given, &f.env()),
            Err(ConfigError::ProfileName(_))
        ));
    }
}
