//! `tidemark snapshot`: a verified point-in-time copy of a node's state, and
//! `tidemark snapshot --verify FILE`.
//!
//! `--data DIR` of a stopped node reads the directory itself. While a daemon runs, it holds the
//! directory locked: the command then asks that daemon (at `--url`, which must report `DIR` as
//! its data directory) for a snapshot over HTTP (`GET /v1/snapshot`), as it does with `--url`
//! alone. A downloaded snapshot is written to a hidden temporary file next to `--out`, fsynced,
//! verified here, and only then published under its final name (never replacing a file).

use super::client::Client;
use anyhow::{Context, bail};
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use tidemark::config::Limits;
use tidemark::store::{OpenOptions, RedbStore, SnapshotInfo, StoreError, verify_snapshot};

/// Flags of `tidemark snapshot`.
#[derive(Debug, clap::Args)]
pub struct SnapshotArgs {
    /// The node's data directory. A stopped node's is read directly; a running daemon's is
    /// snapshotted by that daemon over HTTP (at `--url`). Without `--data`, the node at
    /// `--url` is snapshotted.
    #[arg(long, value_name = "DIR")]
    pub data: Option<PathBuf>,
    /// The snapshot file to write (must not exist; written atomically, verified).
    #[arg(long, value_name = "FILE", required_unless_present = "verify")]
    pub out: Option<PathBuf>,
    /// Only verify an existing snapshot file and print what it holds.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["data", "out"])]
    pub verify: Option<PathBuf>,
}

fn wall_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

fn describe(path: &Path, info: &SnapshotInfo) -> String {
    let rows: u64 = info
        .tables
        .iter()
        .filter(|(n, _)| n == "rows")
        .map(|(_, r)| *r)
        .sum();
    format!(
        "snapshot {} verified: replica {} (epoch {}), log end {}, {} rows, {} tables",
        path.display(),
        info.source_replica,
        info.source_epoch,
        info.source_log_end,
        rows,
        info.tables.len()
    )
}

/// Removes a temporary file unless disarmed.
struct TempFile(Option<PathBuf>);

impl Drop for TempFile {
    fn drop(&mut self) {
        if let Some(p) = self.0.take() {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// Snapshots the node at `client` into `out` (see the module doc). When `dir` is given, the
/// node must report it as its data directory.
fn download(client: &Client, dir: Option<&Path>, out: &Path) -> anyhow::Result<SnapshotInfo> {
    let status = super::client::accept(client.get("/v1/cluster", &[])?)?;
    let serves = status["node"]["data_dir"].as_str().unwrap_or_default();
    let replica = status["node"]["replica"].as_str().unwrap_or_default();
    if let Some(dir) = dir {
        let want = std::fs::canonicalize(dir)
            .with_context(|| format!("cannot resolve {}", dir.display()))?;
        if Path::new(serves) != want {
            bail!(
                "{} is locked by a running node, but the node at the --url given serves {serves:?}; \
                 pass --url of the node that runs {}",
                dir.display(),
                dir.display()
            );
        }
    }
    let parent = match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let name = out
        .file_name()
        .with_context(|| format!("{} is not a file name", out.display()))?;
    let tmp = parent.join(format!(
        ".{}.partial-{}",
        name.to_string_lossy(),
        std::process::id()
    ));
    let mut guard = TempFile(Some(tmp.clone()));
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&tmp)
        .with_context(|| format!("cannot create {}", tmp.display()))?;
    let bar = std::io::stderr().is_terminal().then(|| {
        let bar = indicatif::ProgressBar::no_length();
        if let Ok(style) = indicatif::ProgressStyle::with_template(
            "{spinner} [{elapsed_precise}] [{wide_bar}] {bytes}/{total_bytes} ({bytes_per_sec})",
        ) {
            bar.set_style(style);
        }
        bar
    });
    let mut writer = std::io::BufWriter::with_capacity(1 << 20, &mut file);
    let answer = client.download("/v1/snapshot", &mut writer, |done, total| {
        if let Some(bar) = &bar {
            if let Some(t) = total {
                bar.set_length(t);
            }
            bar.set_position(done);
        }
    })?;
    if let Some(bar) = &bar {
        bar.finish_and_clear();
    }
    let (bytes, _) = answer.map_err(anyhow::Error::new)?;
    writer.flush().context("writing the snapshot")?;
    drop(writer);
    file.sync_all()
        .with_context(|| format!("cannot sync {}", tmp.display()))?;
    drop(file);
    let info = verify_snapshot(&tmp, &Limits::default())
        .with_context(|| format!("the {bytes} bytes received are not a valid snapshot"))?;
    if info.source_replica.to_string() != replica {
        bail!(
            "the snapshot received is of replica {}, not of the node asked ({replica})",
            info.source_replica
        );
    }
    std::fs::hard_link(&tmp, out).map_err(|e| {
        if e.kind() == std::io::ErrorKind::AlreadyExists {
            anyhow::anyhow!(
                "{} already exists; snapshots are never overwritten",
                out.display()
            )
        } else {
            anyhow::Error::new(e).context(format!("cannot publish {}", out.display()))
        }
    })?;
    drop(guard.0.take().map(std::fs::remove_file));
    if let Ok(d) = std::fs::File::open(&parent) {
        let _ = d.sync_all();
    }
    Ok(info)
}

/// Runs the command; prints one line (or the header as JSON) on success. `client` reaches the
/// node named by `--url` (used when the data directory is held by a running daemon, or when
/// `--data` is absent).
pub fn run(args: &SnapshotArgs, json: bool, client: &Client) -> anyhow::Result<()> {
    let limits = Limits::default();
    let (path, info) = if let Some(file) = &args.verify {
        let info = verify_snapshot(file, &limits)
            .with_context(|| format!("{} is not a valid snapshot", file.display()))?;
        (file.clone(), info)
    } else {
        let Some(out) = &args.out else {
            bail!("--out is required");
        };
        if out.exists() {
            bail!(
                "{} already exists; snapshots are never overwritten",
                out.display()
            );
        }
        let info = match &args.data {
            None => download(client, None, out)?,
            Some(dir) => {
                if !dir.join(tidemark::store::DB_FILE).is_file() {
                    bail!("{} holds no tidemark data", dir.display());
                }
                let opened = RedbStore::open(
                    dir,
                    OpenOptions {
                        limits: limits.clone(),
                        ..OpenOptions::default()
                    },
                );
                match opened {
                    Ok(store) => store
                        .snapshot(out, wall_ms())
                        .with_context(|| format!("cannot write the snapshot {}", out.display()))?,
                    // A running node holds the directory: ask it over HTTP.
                    Err(StoreError::AlreadyOpen { .. }) => download(client, Some(dir), out)
                        .with_context(|| {
                            format!(
                                "{} is held by a running node (is the node still running? \
                                 a daemon is asked over HTTP at --url; an embedded node must \
                                 take the snapshot itself, Node::snapshot)",
                                dir.display()
                            )
                        })?,
                    Err(e) => {
                        return Err(
                            anyhow::Error::new(e).context(format!("cannot open {}", dir.display()))
                        );
                    }
                }
            }
        };
        (out.clone(), info)
    };
    if json {
        let v = serde_json::json!({
            "file": path.display().to_string(),
            "source_replica": info.source_replica.to_string(),
            "source_epoch": info.source_epoch,
            "source_log_end": info.source_log_end,
            "tables": info.tables.iter().map(|(n, r)| serde_json::json!({"name": n, "rows": r})).collect::<Vec<_>>(),
        });
        println!("{v}");
    } else {
        println!("{}", describe(&path, &info));
    }
    Ok(())
}
