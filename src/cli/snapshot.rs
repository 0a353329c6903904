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
use tidemark::api;
use tidemark::config::Limits;
use tidemark::{SnapshotInfo, StoreError, snapshot_data_dir, verify_snapshot};

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

/// Whether the node that answered `status` (`GET /v1/cluster`) serves the data directory
/// `dir`: the same database file (`device:inode`) where both sides can tell, else the same
/// canonical path.
fn serves(node: &api::ClusterNode, dir: &Path) -> anyhow::Result<bool> {
    let local = tidemark::file_identity(&dir.join(tidemark::DB_FILE));
    if let (Some(theirs), Some(ours)) = (node.data_file.as_deref(), local.as_deref()) {
        return Ok(theirs == ours);
    }
    let want =
        std::fs::canonicalize(dir).with_context(|| format!("cannot resolve {}", dir.display()))?;
    Ok(Path::new(&node.data_dir) == want.as_path())
}

/// Snapshots the node at `client` into `out` (see the module doc). When `dir` is given, the
/// node must serve it.
fn download(client: &Client, dir: Option<&Path>, out: &Path) -> anyhow::Result<SnapshotInfo> {
    let status: api::Cluster =
        super::client::accept_as("GET /v1/cluster", client.get("/v1/cluster", &[])?)?.value;
    if let Some(dir) = dir
        && !serves(&status.node, dir)?
    {
        bail!(
            "{} is locked by a running node, but the node at the --url given serves {}; \
             pass --url of the node that runs {}",
            dir.display(),
            status.node.data_dir,
            dir.display()
        );
    }
    let parent = match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let name = out
        .file_name()
        .with_context(|| format!("{} is not a file name", out.display()))?
        .to_string_lossy()
        .into_owned();
    // Partial downloads of this name that an interrupted run left behind.
    let partial = format!(".{name}.partial-");
    if let Ok(entries) = std::fs::read_dir(&parent) {
        for e in entries.flatten() {
            if e.file_name().to_string_lossy().starts_with(&partial) {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
    let tmp = parent.join(format!("{partial}{}", std::process::id()));
    let mut guard = TempFile(Some(tmp.clone()));
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create_new(true);
    #[cfg(unix)]
    {
        // A full copy of the data: readable by its owner only.
        use std::os::unix::fs::OpenOptionsExt;
        opts.mode(0o600);
    }
    let mut file = opts
        .open(&tmp)
        .with_context(|| format!("cannot create {}", tmp.display()))?;
    let bar = std::io::stderr().is_terminal().then(|| {
        // Spins while the node writes and verifies the snapshot, then shows the download.
        let bar = indicatif::ProgressBar::new_spinner();
        bar.set_message("the node is taking the snapshot");
        bar.enable_steady_tick(std::time::Duration::from_millis(120));
        bar
    });
    let mut writer = std::io::BufWriter::with_capacity(1 << 20, &mut file);
    let answer = client.download("/v1/snapshot", &mut writer, |done, total| {
        if let Some(bar) = &bar {
            if let (Some(t), None) = (total, bar.length()) {
                if let Ok(style) = indicatif::ProgressStyle::with_template(
                    "{spinner} [{elapsed_precise}] [{wide_bar}] {bytes}/{total_bytes} ({bytes_per_sec})",
                ) {
                    bar.set_style(style);
                }
                bar.set_length(t);
            }
            bar.set_position(done);
        }
    });
    if let Some(bar) = &bar {
        bar.finish_and_clear();
    }
    let (bytes, headers) = answer?.map_err(anyhow::Error::new)?;
    writer.flush().context("writing the snapshot")?;
    drop(writer);
    file.sync_all()
        .with_context(|| format!("cannot sync {}", tmp.display()))?;
    drop(file);
    let info = verify_snapshot(&tmp, &Limits::default())
        .with_context(|| format!("the {bytes} bytes received are not a valid snapshot"))?;
    let announced = headers
        .get("x-tidemark-snapshot-replica")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    if info.source_replica.to_string() != announced {
        bail!(
            "the snapshot received is of replica {}, but the node announced {announced:?}",
            info.source_replica
        );
    }
    tidemark::publish_file(&tmp, out)
        .with_context(|| format!("cannot publish {}", out.display()))?;
    guard.0 = None;
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
            return Err(crate::Usage("--out FILE is required (or --verify FILE)".into()).into());
        };
        // A usage error (exit 2), found before anything is read or asked.
        if out.exists() {
            return Err(crate::Usage(format!(
                "{} already exists; snapshots are never overwritten",
                out.display()
            ))
            .into());
        }
        let info = match &args.data {
            None => download(client, None, out)?,
            Some(dir) => {
                if !dir.join(tidemark::DB_FILE).is_file() {
                    bail!("{} holds no tidemark data", dir.display());
                }
                match snapshot_data_dir(dir, out, &limits, wall_ms()) {
                    Ok(info) => info,
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
                        return Err(anyhow::Error::new(e).context(format!(
                            "cannot write a snapshot of {} to {}",
                            dir.display(),
                            out.display()
                        )));
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
        crate::outln!("{v}")?;
    } else {
        crate::outln!("{}", describe(&path, &info))?;
    }
    Ok(())
}
