//! `tidemark snapshot`: a verified point-in-time copy of a stopped node's data directory, and
//! `tidemark snapshot --verify FILE`.

use anyhow::Context;
use std::path::{Path, PathBuf};
use tidemark::config::Limits;
use tidemark::store::{OpenOptions, RedbStore, SnapshotInfo, verify_snapshot};

/// Flags of `tidemark snapshot`.
#[derive(Debug, clap::Args)]
pub struct SnapshotArgs {
    /// The data directory of a stopped node (a running node holds it: stop it first).
    #[arg(long, value_name = "DIR", required_unless_present = "verify")]
    pub data: Option<PathBuf>,
    /// The snapshot file to write (must not exist; written atomically).
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

/// Runs the command; prints one line (or the header as JSON) on success.
pub fn run(args: &SnapshotArgs, json: bool) -> anyhow::Result<()> {
    let limits = Limits::default();
    let (path, info) = if let Some(file) = &args.verify {
        let info = verify_snapshot(file, &limits)
            .with_context(|| format!("{} is not a valid snapshot", file.display()))?;
        (file.clone(), info)
    } else {
        let (Some(dir), Some(out)) = (&args.data, &args.out) else {
            anyhow::bail!("--data and --out are required");
        };
        if !dir.join(tidemark::store::DB_FILE).is_file() {
            anyhow::bail!("{} holds no tidemark data", dir.display());
        }
        let store = RedbStore::open(
            dir,
            OpenOptions {
                limits: limits.clone(),
                ..OpenOptions::default()
            },
        )
        .with_context(|| format!("cannot open {} (is the node still running?)", dir.display()))?;
        let info = store
            .snapshot(out, wall_ms())
            .with_context(|| format!("cannot write the snapshot {}", out.display()))?;
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
