//! `keel profile`: named connection settings (brokers, TLS files, time
//! limit) kept in `~/.config/keel/profiles.toml`, as `rpk profile` and
//! `nats context` keep theirs, so a user does not repeat them. Flags and
//! `KEEL_*` variables win over the profile in use (`--profile NAME`,
//! `KEEL_PROFILE`, or the one `keel profile use` chose); the profile wins
//! over the defaults.

use std::collections::BTreeMap;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use clap::Subcommand;
use serde::{Deserialize, Serialize};

use crate::Connection;

#[derive(Subcommand)]
pub enum ProfileCommand {
    /// Save the connection flags given (--broker, --tls-ca, --tls-cert,
    /// --tls-key, --user, --secret, --timeout) as profile NAME, and use it
    /// from now on.
    Create {
        /// The profile's name (one word).
        name: String,
    },
    /// Use profile NAME from now on.
    Use {
        /// A profile's name (see keel profile list).
        name: String,
    },
    /// List the profiles; * marks the one in use.
    List,
    /// Delete profile NAME.
    Delete {
        /// A profile's name (see keel profile list).
        name: String,
    },
}

/// One profile: what it sets of a [`Connection`].
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct Profile {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub broker: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls_ca: Option<PathBuf>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls_cert: Option<PathBuf>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls_key: Option<PathBuf>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeout: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// The user's secret (the file is readable by its owner only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub secret: Option<String>,
}

/// The profiles file.
#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct Profiles {
    /// The profile in use when none is named.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub current: Option<String>,
    #[serde(default)]
    pub profiles: BTreeMap<String, Profile>,
}

/// Where the profiles live: `KEEL_PROFILES`, else
/// `$XDG_CONFIG_HOME/keel/profiles.toml`, else `~/.config/keel/profiles.toml`.
pub fn path() -> anyhow::Result<PathBuf> {
    if let Some(path) = std::env::var_os("KEEL_PROFILES") {
        return Ok(PathBuf::from(path));
    }
    let config = match std::env::var_os("XDG_CONFIG_HOME").filter(|dir| !dir.is_empty()) {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(std::env::var_os("HOME").context("HOME is not set: set KEEL_PROFILES to a file")?)
            .join(".config"),
    };
    Ok(config.join("keel").join("profiles.toml"))
}

impl Profiles {
    /// The file's profiles (none if it does not exist).
    pub fn load(path: &Path) -> anyhow::Result<Profiles> {
        match std::fs::read_to_string(path) {
            Ok(text) => toml::from_str(&text).with_context(|| format!("parsing {}", path.display())),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(Profiles::default()),
            Err(error) => Err(error).with_context(|| format!("reading {}", path.display())),
        }
    }

    fn save(&self, path: &Path) -> anyhow::Result<()> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        let text = toml::to_string(self).context("writing the profiles")?;
        // Written whole, then renamed over the old file: never half a file.
        // Readable by its owner only: a profile may hold a user's secret.
        let temporary = path.with_extension("toml.new");
        let _ = std::fs::remove_file(&temporary);
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&temporary)
            .with_context(|| format!("creating {}", temporary.display()))?;
        file.write_all(text.as_bytes()).with_context(|| format!("writing {}", temporary.display()))?;
        std::fs::rename(&temporary, path).with_context(|| format!("replacing {}", path.display()))
    }
}

/// Fill what `connection` was not given from the profile in use, then the
/// defaults.
pub fn apply(connection: &mut Connection) -> anyhow::Result<()> {
    let path = path()?;
    let named = connection.profile.clone();
    let profiles = match (&named, Profiles::load(&path)) {
        (_, Ok(profiles)) => profiles,
        // An unreadable file matters only to a command that names a profile.
        (None, Err(_)) => Profiles::default(),
        (Some(_), Err(error)) => return Err(error),
    };
    let profile = match named.or(profiles.current.clone()) {
        Some(name) => match profiles.profiles.get(&name) {
            Some(profile) => profile.clone(),
            None if connection.profile.is_some() => {
                bail!("there is no profile {name:?} in {}: see keel profile list", path.display())
            }
            // The profile in use was deleted by hand: nothing to apply.
            None => Profile::default(),
        },
        None => Profile::default(),
    };
    if connection.broker.is_empty() {
        connection.broker = profile.broker;
    }
    if connection.broker.is_empty() {
        connection.broker = vec![crate::DEFAULT_BROKER.to_string()];
    }
    if connection.tls_ca.is_none() {
        connection.tls_ca = profile.tls_ca;
    }
    if connection.tls_cert.is_none() && connection.tls_key.is_none() {
        connection.tls_cert = profile.tls_cert;
        connection.tls_key = profile.tls_key;
    }
    if connection.user.is_none() && connection.secret.is_none() {
        connection.user = profile.user;
        connection.secret = profile.secret;
    }
    if connection.timeout.is_none() {
        if let Some(text) = profile.timeout {
            let timeout = humantime::parse_duration(&text)
                .with_context(|| format!("profile timeout {text:?} in {}", path.display()))?;
            connection.timeout = Some(timeout);
        }
    }
    Ok(())
}

/// An absolute form of `path`, so a profile works from any directory.
fn absolute(path: &Path) -> anyhow::Result<PathBuf> {
    std::path::absolute(path).with_context(|| format!("resolving {}", path.display()))
}

pub fn run(command: ProfileCommand, given: &Connection, json: bool) -> anyhow::Result<()> {
    let path = path()?;
    let mut profiles = Profiles::load(&path)?;
    match command {
        ProfileCommand::Create { name } => {
            if name.is_empty() || name.contains(char::is_whitespace) {
                bail!("{name:?} is not a usable profile name: give one word");
            }
            let profile = Profile {
                broker: given.broker.clone(),
                tls_ca: given.tls_ca.as_deref().map(absolute).transpose()?,
                tls_cert: given.tls_cert.as_deref().map(absolute).transpose()?,
                tls_key: given.tls_key.as_deref().map(absolute).transpose()?,
                timeout: given.timeout.map(|t| humantime::format_duration(t).to_string()),
                user: given.user.clone(),
                secret: given.secret.clone(),
            };
            let replaced = profiles.profiles.insert(name.clone(), profile).is_some();
            profiles.current = Some(name.clone());
            profiles.save(&path)?;
            let verb = if replaced { "replaced" } else { "created" };
            say!("{verb} profile {name} in {}; it is in use", path.display());
        }
        ProfileCommand::Use { name } => {
            if !profiles.profiles.contains_key(&name) {
                bail!("there is no profile {name:?} in {}: see keel profile list", path.display());
            }
            profiles.current = Some(name.clone());
            profiles.save(&path)?;
            say!("using profile {name}");
        }
        ProfileCommand::Delete { name } => {
            if profiles.profiles.remove(&name).is_none() {
                bail!("there is no profile {name:?} in {}", path.display());
            }
            if profiles.current.as_deref() == Some(name.as_str()) {
                profiles.current = None;
            }
            profiles.save(&path)?;
            say!("deleted profile {name}");
        }
        ProfileCommand::List => {
            for profile in profiles.profiles.values_mut() {
                if profile.secret.is_some() {
                    profile.secret = Some("(hidden)".to_string());
                }
            }
            if json {
                say!("{}", serde_json::to_string_pretty(&profiles)?);
                return Ok(());
            }
            let mut table = crate::table(&["", "PROFILE", "BROKERS", "TLS", "USER"], &[]);
            for (name, profile) in &profiles.profiles {
                let current = if profiles.current.as_deref() == Some(name.as_str()) { "*" } else { "" };
                let tls = match (&profile.tls_ca, &profile.tls_cert) {
                    (Some(_), Some(_)) => "yes, with a certificate",
                    (Some(_), None) => "yes",
                    _ => "no",
                };
                let brokers = if profile.broker.is_empty() {
                    crate::DEFAULT_BROKER.to_string()
                } else {
                    profile.broker.join(",")
                };
                let user = profile.user.clone().unwrap_or_default();
                table.add_row(vec![current.to_string(), name.clone(), brokers, tls.to_string(), user]);
            }
            crate::print_table(&table);
        }
    }
    Ok(())
}
