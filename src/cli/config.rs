//! The node's TOML configuration: file, then flags (`--set KEY=VALUE` reaches every key),
//! unknown keys rejected by their dotted name.

use anyhow::{Context, bail};
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;
use std::path::PathBuf;
use tidemark::http::HttpConfig;
use tidemark::views::ViewDef;
use tidemark::{Durability, Limits, NodeConfig};

/// `[peer]`: the peer network (QUIC + mTLS + SWIM).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PeerConfig {
    /// Where peers connect (UDP, QUIC).
    pub listen: SocketAddr,
    /// The directory `tidemark certs issue` wrote (CA certificate, node certificate and key).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls: Option<PathBuf>,
    /// The address other members dial to reach this node (default: `listen`). Required when
    /// `listen` binds every interface (`0.0.0.0:7701`); port 0 means the `listen` port.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub advertise: Option<SocketAddr>,
    /// Peers to join at start.
    pub join: Vec<String>,
    /// A member SWIM declared down is evicted from replication this many ms later (so it stops
    /// pinning compaction) unless it comes back first (default 30,000).
    pub down_grace_ms: u64,
}

impl Default for PeerConfig {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 7701)),
            tls: None,
            advertise: None,
            join: Vec::new(),
            down_grace_ms: 30_000,
        }
    }
}

/// `[log]`.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LogConfig {
    /// `text` or `json`.
    pub format: LogFormat,
}

impl Default for LogConfig {
    fn default() -> Self {
        Self {
            format: LogFormat::Text,
        }
    }
}

/// Log line format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// `durability`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum DurabilityName {
    /// Acknowledge after the durable (fsynced) commit.
    Immediate,
    /// Acknowledge after the commit; fsync every `relaxed_sync_interval_ms`.
    Relaxed,
}

/// The whole node configuration (`tidemark serve --print-config` prints it).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// The data directory.
    pub data_dir: PathBuf,
    /// When writes are acknowledged.
    pub durability: DurabilityName,
    /// In relaxed durability, the longest time between durable commits.
    pub relaxed_sync_interval_ms: u64,
    /// Delta-log entries kept for briefly disconnected peers.
    pub log_retain_entries: u64,
    /// HTTP API.
    pub http: HttpConfig,
    /// Peer network.
    pub peer: PeerConfig,
    /// Logging.
    pub log: LogConfig,
    /// Node limits.
    pub limits: Limits,
    /// Stream views (`[[views]]`, API.md "Events and streams").
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub views: Vec<ViewDef>,
}

impl Default for Config {
    fn default() -> Self {
        let node = NodeConfig::new("./tidemark-data");
        Self {
            data_dir: node.data_dir,
            durability: DurabilityName::Immediate,
            relaxed_sync_interval_ms: node.relaxed_sync_interval.as_millis() as u64,
            log_retain_entries: node.log_retain_entries,
            http: HttpConfig::default(),
            peer: PeerConfig::default(),
            log: LogConfig::default(),
            limits: Limits::default(),
            views: Vec::new(),
        }
    }
}

/// The `name` of each `[[views]]` entry (empty when missing), to name views in errors.
fn view_names(table: &toml::Table) -> Vec<String> {
    table
        .get("views")
        .and_then(toml::Value::as_array)
        .map(|views| {
            views
                .iter()
                .map(|v| {
                    v.get("name")
                        .and_then(toml::Value::as_str)
                        .unwrap_or_default()
                        .to_owned()
                })
                .collect()
        })
        .unwrap_or_default()
}

/// ` (view "clicks")` for a key inside a named `[[views]]` entry (`views[1].kind`), else empty.
fn view_suffix(key: &str, names: &[String]) -> String {
    let Some(rest) = key.strip_prefix("views[") else {
        return String::new();
    };
    let name = rest
        .split(']')
        .next()
        .and_then(|i| i.parse::<usize>().ok())
        .and_then(|i| names.get(i))
        .filter(|n| !n.is_empty());
    match name {
        Some(n) => format!(" (view {n:?})"),
        None => String::new(),
    }
}

/// Parses a flag value as a TOML value (`64`, `true`, `"x"`, `[1, 2]`), or else as a string.
fn toml_value(text: &str) -> toml::Value {
    toml::from_str::<toml::Table>(&format!("v = {text}"))
        .ok()
        .and_then(|mut t| t.remove("v"))
        .unwrap_or_else(|| toml::Value::String(text.to_owned()))
}

/// Sets the dotted `key` (`http.token`) in `table`.
pub fn set_key(table: &mut toml::Table, key: &str, value: toml::Value) -> anyhow::Result<()> {
    let mut parts: Vec<&str> = key.split('.').collect();
    let last = parts
        .pop()
        .filter(|p| !p.is_empty())
        .context("empty config key")?;
    let mut t = table;
    for part in parts {
        let entry = t
            .entry(part.to_owned())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        t = entry
            .as_table_mut()
            .with_context(|| format!("config key `{key}`: `{part}` is not a table"))?;
    }
    t.insert(last.to_owned(), value);
    Ok(())
}

/// Applies `KEY=VALUE` from `--set`.
pub fn set_assignment(table: &mut toml::Table, assignment: &str) -> anyhow::Result<()> {
    let (key, value) = assignment
        .split_once('=')
        .with_context(|| format!("--set {assignment:?}: expected KEY=VALUE"))?;
    set_key(table, key.trim(), toml_value(value.trim()))
}

impl Config {
    /// Reads `path` (when given) into a table to which flags are then applied.
    pub fn load_table(path: Option<&std::path::Path>) -> anyhow::Result<toml::Table> {
        let Some(path) = path else {
            return Ok(toml::Table::new());
        };
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read config file {}", path.display()))?;
        toml::from_str(&text).with_context(|| format!("config file {}", path.display()))
    }

    /// Builds the config from a table, naming any unknown or mistyped key by its dotted path.
    pub fn from_table(table: toml::Table) -> anyhow::Result<Self> {
        let view_names = view_names(&table);
        let config: Config =
            serde_path_to_error::deserialize(toml::Value::Table(table)).map_err(|e| {
                let path = e.path().to_string();
                let full = e.inner().to_string();
                let inner = full.lines().next().unwrap_or_default().to_owned();
                let key = match inner.strip_prefix("unknown field `") {
                    Some(rest) => {
                        let field = rest.split('`').next().unwrap_or_default();
                        if path == "." || path.is_empty() {
                            field.to_owned()
                        } else if path == field || path.ends_with(&format!(".{field}")) {
                            path
                        } else {
                            format!("{path}.{field}")
                        }
                    }
                    None => path,
                };
                anyhow::anyhow!(
                    "config key `{key}`{}: {inner}",
                    view_suffix(&key, &view_names)
                )
            })?;
        config.validate()?;
        Ok(config)
    }

    fn validate(&self) -> anyhow::Result<()> {
        if let Err(e) = self.limits.validate() {
            bail!("{e}");
        }
        if let Err(e) = self.http.validate() {
            bail!("{e}");
        }
        if let Err(e) = tidemark::views::Views::new(&self.views) {
            bail!("{e}");
        }
        Ok(())
    }

    /// The embedded node's configuration.
    pub fn node_config(&self) -> NodeConfig {
        let mut node = NodeConfig::new(&self.data_dir);
        node.limits = self.limits.clone();
        node.durability = match self.durability {
            DurabilityName::Immediate => Durability::Immediate,
            DurabilityName::Relaxed => Durability::Relaxed,
        };
        node.relaxed_sync_interval =
            std::time::Duration::from_millis(self.relaxed_sync_interval_ms);
        node.log_retain_entries = self.log_retain_entries;
        node.replication.member_down_grace_ms = self.peer.down_grace_ms;
        node.views = self.views.clone();
        node.joining = !self.peer.join.is_empty();
        node
    }

    /// The effective config as TOML, with the token redacted.
    pub fn to_toml(&self) -> anyhow::Result<String> {
        let mut shown = self.clone();
        if shown.http.token.is_some() {
            shown.http.token = Some("<redacted>".into());
        }
        Ok(toml::to_string(&shown)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_keys_are_named() {
        let table: toml::Table =
            toml::from_str("[http]\nlisten = \"127.0.0.1:1\"\nbogus = 1\n").unwrap_or_default();
        let err = Config::from_table(table).err().map(|e| e.to_string());
        assert!(
            err.as_deref().is_some_and(|e| e.contains("`http.bogus`")),
            "{err:?}"
        );
        let table: toml::Table = toml::from_str("colour = 1").unwrap_or_default();
        let err = Config::from_table(table).err().map(|e| e.to_string());
        assert!(
            err.as_deref().is_some_and(|e| e.contains("`colour`")),
            "{err:?}"
        );
    }

    #[test]
    fn flags_override_every_key() {
        let mut table = toml::Table::new();
        assert!(set_assignment(&mut table, "limits.batch_ops_max=500").is_ok());
        assert!(set_assignment(&mut table, "http.token=s3cret").is_ok());
        assert!(set_assignment(&mut table, "durability=relaxed").is_ok());
        let config = Config::from_table(table).ok();
        assert_eq!(config.as_ref().map(|c| c.limits.batch_ops_max), Some(500));
        assert_eq!(
            config.as_ref().and_then(|c| c.http.token.clone()),
            Some("s3cret".into())
        );
        assert_eq!(config.map(|c| c.durability), Some(DurabilityName::Relaxed));
    }
}
