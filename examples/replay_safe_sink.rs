//! A replay-safe sink: the final-window feed of a view followed into an SQLite table.
//!
//! An embedded node counts clicks per page in one-minute windows while events keep arriving.
//! A consumer follows `Node::final_windows` a page at a time. Each page's windows go into the
//! table with `INSERT … ON CONFLICT DO UPDATE … WHERE version < excluded.version`, and the
//! consumer's cursor is saved in the same database. Twice the consumer is "killed" mid-stream:
//! - once inside a transaction (the rows are rolled back, the page comes again);
//! - once after committing the rows but before saving the cursor (the page is delivered twice,
//!   and the replay changes nothing).
//!
//! Each time it restarts from the cursor it saved, on a fresh database connection. At the end
//! the table must equal the final rows of the view, or the example exits non-zero.
//!
//! Run: `cargo run --example replay_safe_sink`.

use rusqlite::{Connection, params};
use serde_json::json;
use std::collections::BTreeMap;
use std::process::ExitCode;
use tidemark::views::{Event, FinalCursor, ViewDef, ViewQuery};
use tidemark::{Node, NodeConfig};

const MIN: u64 = 60_000;
/// 2026-11-29T10:00:00Z.
const T0: u64 = 1_795_946_400_000;
const VIEW: &str = "clicks_per_page";

fn open_sink(path: &std::path::Path) -> rusqlite::Result<Connection> {
    let db = Connection::open(path)?;
    db.execute_batch(
        "CREATE TABLE IF NOT EXISTS final_windows (
             view TEXT NOT NULL, window_start INTEGER NOT NULL, grp TEXT NOT NULL,
             value TEXT NOT NULL, version INTEGER NOT NULL,
             PRIMARY KEY (view, window_start, grp));
         CREATE TABLE IF NOT EXISTS cursors (consumer TEXT PRIMARY KEY, cursor TEXT NOT NULL);",
    )?;
    Ok(db)
}

fn saved_cursor(db: &Connection) -> rusqlite::Result<Option<String>> {
    let mut q = db.prepare("SELECT cursor FROM cursors WHERE consumer = 'sink'")?;
    let mut rows = q.query([])?;
    rows.next()?.map(|r| r.get(0)).transpose()
}

/// How the consumer ends a page.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Ending {
    /// Rows and cursor committed together.
    Commit,
    /// Killed inside the transaction: nothing of the page is kept.
    DieInTransaction,
    /// Rows committed, killed before the cursor is saved: the page comes again.
    DieBeforeCursor,
}

/// Takes one page of the feed into the sink; returns how many windows it held.
async fn consume_page(node: &Node, db: &mut Connection, ending: Ending) -> anyhow::Result<usize> {
    let after: Option<FinalCursor> = saved_cursor(db)?.map(|c| c.parse()).transpose()?;
    let page = node.final_windows(VIEW, after.as_ref(), 25).await?;
    let tx = db.transaction()?;
    for w in &page.windows {
        tx.execute(
            "INSERT INTO final_windows (view, window_start, grp, value, version)
             VALUES (?1, ?2, ?3, ?4, ?5)
             ON CONFLICT (view, window_start, grp) DO UPDATE
             SET value = excluded.value, version = excluded.version
             WHERE version < excluded.version",
            params![
                w.view,
                i64::try_from(w.window_start)?,
                serde_json::Value::Object(w.group.clone()).to_string(),
                w.value.to_string(),
                i64::try_from(w.version)?,
            ],
        )?;
    }
    match ending {
        Ending::DieInTransaction => return Ok(page.windows.len()), // dropped: rolled back
        Ending::DieBeforeCursor => {
            tx.commit()?;
            return Ok(page.windows.len());
        }
        Ending::Commit => {}
    }
    if let Some(next) = &page.next {
        tx.execute(
            "INSERT INTO cursors (consumer, cursor) VALUES ('sink', ?1)
             ON CONFLICT (consumer) DO UPDATE SET cursor = excluded.cursor",
            params![next],
        )?;
    }
    tx.commit()?;
    Ok(page.windows.len())
}

fn click(seq: u64, t: u64) -> Event {
    let page = ["/", "/cart", "/docs", "/pricing"][usize::try_from(seq % 4).unwrap_or(0)];
    Event::new("web-1", seq, json!({ "page": page })).at(t)
}

async fn run() -> anyhow::Result<bool> {
    let dir = tempfile::tempdir()?;
    let mut cfg = NodeConfig::new(dir.path().join("node"));
    cfg.views = serde_json::from_value::<Vec<ViewDef>>(json!([{
        "name": VIEW, "stream": "clicks", "kind": "count", "group_by": ["page"],
        "window": {"tumbling": "1m", "lateness": "10s"},
    }]))?;
    let node = Node::open(cfg).await?;
    let sink_path = dir.path().join("sink.sqlite");
    let mut db = open_sink(&sink_path)?;
    let (mut seq, mut pages, mut deliveries) = (0u64, 0usize, 0usize);
    // 30 minutes of clicks, a batch of 40 per 30 s of event time, consumed as they finalize.
    for step in 0..60u64 {
        let batch: Vec<Event> = (0..40)
            .map(|i| {
                seq += 1;
                click(seq, T0 + step * 30_000 + i * 700)
            })
            .collect();
        node.ingest("clicks", batch).await?;
        let ending = match pages {
            7 => Ending::DieInTransaction,
            12 => Ending::DieBeforeCursor,
            _ => Ending::Commit,
        };
        deliveries += consume_page(&node, &mut db, ending).await?;
        pages += 1;
        if ending != Ending::Commit {
            println!("consumer killed ({ending:?}) after page {pages}; restarting from its cursor");
            drop(db);
            db = open_sink(&sink_path)?;
        }
    }
    // One click far ahead closes every window before it; then drain the feed.
    seq += 1;
    node.ingest("clicks", vec![click(seq, T0 + 60 * MIN)])
        .await?;
    loop {
        let n = consume_page(&node, &mut db, Ending::Commit).await?;
        deliveries += n;
        if n == 0 {
            break;
        }
    }
    // The table against the view's final rows.
    let page = node.view(VIEW, &ViewQuery::default()).await?;
    let finals: BTreeMap<(u64, String), String> = page
        .rows
        .iter()
        .filter(|r| r.is_final)
        .filter_map(|r| {
            Some((
                (
                    r.window_start?,
                    serde_json::Value::Object(r.group.clone()).to_string(),
                ),
                r.value.to_string(),
            ))
        })
        .collect();
    let mut q = db.prepare("SELECT window_start, grp, value FROM final_windows ORDER BY 1, 2")?;
    let table: BTreeMap<(u64, String), String> = q
        .query_map([], |r| {
            let start: i64 = r.get(0)?;
            Ok(((u64::try_from(start).unwrap_or(0), r.get(1)?), r.get(2)?))
        })?
        .collect::<Result<_, _>>()?;
    let total: u64 = table.values().filter_map(|v| v.parse::<u64>().ok()).sum();
    println!(
        "{} final windows in the sink ({} deliveries, replays included), {} clicks counted of {} sent before the closing one",
        table.len(),
        deliveries,
        total,
        seq - 1
    );
    node.shutdown().await?;
    Ok(table == finals && total == seq - 1)
}

#[tokio::main]
async fn main() -> ExitCode {
    match run().await {
        Ok(true) => {
            println!("the sink equals the view's final windows");
            ExitCode::SUCCESS
        }
        Ok(false) => {
            eprintln!("the sink differs from the view's final windows");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("replay_safe_sink: {e:#}");
            ExitCode::FAILURE
        }
    }
}
