//! Hostile review of `views::held` (branch views-distinct): races between the record's mark,
//! its element-row read and a remote removal of this node's dot.

use super::Node;
use crate::config::NodeConfig;
use crate::driver::Input;
use crate::proto::PeerId;
use crate::store::{DeltasSince, LocalWrite};
use crate::views::{Event, ViewDef, keys};
use serde_json::json;
use tidemark_crdts::{Key, KeyKind, Mutation};
use tokio::sync::oneshot;

fn defs() -> Vec<ViewDef> {
    serde_json::from_value(json!([
        {"name": "users", "stream": "s", "kind": "distinct", "group_by": ["page"],
         "field": "user", "window": {"tumbling": "1m", "lateness": "1h"}},
    ]))
    .expect("defs")
}

async fn open(dir: &std::path::Path, held_bytes: usize) -> Node {
    let mut cfg = NodeConfig::new(dir);
    cfg.views = defs();
    cfg.limits.view_held_bytes = held_bytes;
    Node::open(cfg).await.expect("open")
}

fn ev(source: &str, seq: u64, page: &str, user: &str, time: u64) -> Event {
    Event::new(source, seq, json!({"page": page, "user": user})).at(time)
}

fn cell(node: &Node, page: &str) -> Key {
    let (_, v) = node.shared.views.find("users").expect("view");
    let group = serde_json::to_string(&json!([page])).expect("group");
    Key::new(
        KeyKind::ORSet,
        keys::view_key("users", &v.digest, Some(0), &group),
    )
}

fn holds_own(node: &Node, page: &str, user: &str) -> bool {
    let elem = json!(user).to_string();
    node.reader()
        .expect("reader")
        .set_holds_own(&cell(node, page), &elem, node.me())
        .expect("read")
}

async fn ship(from: &Node, to: &Node) {
    let DeltasSince::Deltas { delta, .. } = from
        .deltas_since(to.context().expect("ctx"), 1 << 24)
        .await
        .expect("deltas")
    else {
        panic!("the log is whole");
    };
    to.apply_remote(PeerId(9), delta)
        .await
        .expect("apply")
        .expect("valid delta");
}

/// Guard (passes): a remote removal of A's dot of `x` that commits — and makes the record
/// forget the cell — after `ingest` opened its reader and before `skip_present` takes its mark
/// (forced by holding the watermark lock `ingest` takes in between). Had the read gone through
/// a snapshot older than the mark, the stale "held" would be recorded and every later add of
/// `x` skipped. It is not: `Node::reader()` is unsnapshotted, `sets_hold_own` opens its read
/// transaction after the mark.
async fn stale_snapshot_race(held_bytes: usize, rounds: usize) -> Option<String> {
    let (da, db) = (
        tempfile::tempdir().expect("a"),
        tempfile::tempdir().expect("b"),
    );
    let (a, b) = (open(da.path(), held_bytes).await, open(db.path(), 0).await);
    // A holds `x` under its own dot in every round's cell.
    let first: Vec<Event> = (0..rounds)
        .map(|i| ev("seed", i as u64 + 1, &format!("/p{i}"), "x", 1_000))
        .collect();
    a.ingest("s", first).await.expect("seed");
    ship(&a, &b).await;
    let mut seq = 0u64;
    for i in 0..rounds {
        let page = format!("/p{i}");
        // B removes `x` observing A's dot (as the branch's own test does).
        let rx = b
            .enqueue(vec![LocalWrite {
                ops: vec![(cell(&b, &page), Mutation::Remove(json!("x").to_string()))],
                event: None,
                stamps: Vec::new(),
                late: None,
                own_dots: false,
            }])
            .expect("enqueue");
        rx.await.expect("reply").expect("commit");
        let DeltasSince::Deltas { delta, .. } = b
            .deltas_since(a.context().expect("ctx"), 1 << 24)
            .await
            .expect("deltas")
        else {
            panic!("B's log is whole");
        };
        // A big batch (so `admit` runs a while before `skip_present` takes its mark) that
        // also adds `x`; the remote removal is handed to the writer right before the reader
        // is opened and commits while `admit` runs.
        let mut batch = vec![];
        seq += 1;
        batch.push(ev(&format!("r{i}"), seq, &page, "x", 1_001));
        for k in 0..20u64 {
            seq += 1;
            batch.push(ev(&format!("r{i}"), seq, &page, &format!("f{k}"), 1_002));
        }
        // The removal is handed to the writer right before `ingest` opens its reader, and a
        // thread holds the views' watermark lock (taken by `ingest` after opening its reader
        // and before `admit`) until the writer answered the removal, i.e. after it committed
        // and told the record to forget the cell. This only widens a window a busy node has
        // anyway (any delay between the reader's opening and the mark).
        let (reply, rx) = oneshot::channel();
        let (locked_tx, locked_rx) = std::sync::mpsc::channel();
        let views = std::sync::Arc::clone(&a.shared.views);
        let holder = std::thread::spawn(move || {
            let guard = views.watermarks.lock().expect("lock");
            locked_tx.send(()).expect("signal");
            // Until the writer answered, or 500 ms (the writer's remote-change hook may wait
            // on a lock that views maintenance holds while it waits for this one; the
            // record's forgetting comes first in that hook, so by then it happened).
            let mut rx = rx;
            let t0 = std::time::Instant::now();
            let mut got = None;
            while t0.elapsed() < std::time::Duration::from_millis(500) {
                match rx.try_recv() {
                    Ok(r) => {
                        got = Some(Ok(r));
                        break;
                    }
                    Err(tokio::sync::oneshot::error::TryRecvError::Empty) => {
                        std::thread::sleep(std::time::Duration::from_millis(1));
                    }
                    Err(_) => break,
                }
            }
            drop(guard);
            got.unwrap_or_else(|| rx.blocking_recv())
        });
        let between = async {
            locked_rx.recv().expect("locked");
            a.send(Input::ApplyRemote {
                origin: PeerId(9),
                delta,
                reply,
            })
            .expect("send");
        };
        a.ingest_then("s", batch, between)
            .await
            .expect("race batch");
        holder
            .join()
            .expect("holder")
            .expect("reply")
            .expect("apply")
            .expect("valid delta");
        // A later event adds `x` again: it must end up held under A's dot.
        seq += 1;
        a.ingest("s", vec![ev(&format!("r{i}"), seq, &page, "x", 1_003)])
            .await
            .expect("ingest");
        if !holds_own(&a, &page, "x") {
            let v = a.get(&cell(&a, &page)).expect("get");
            let has_x = format!("{v:?}").contains("\\\"x\\\"");
            a.shutdown().await.expect("shutdown");
            b.shutdown().await.expect("shutdown");
            return Some(format!(
                "round {i}: an event adding x was applied after the remote removal, yet A \
                 does not hold x under its dot (cell value holds x: {has_x})"
            ));
        }
    }
    a.shutdown().await.expect("shutdown");
    b.shutdown().await.expect("shutdown");
    None
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn review_a_removal_committed_between_reader_and_mark_is_not_recorded_stale() {
    // Control: the record off never loses `x`.
    assert_eq!(stale_snapshot_race(0, 3).await, None);
    if let Some(what) = stale_snapshot_race(1 << 20, 5).await {
        panic!("{what}");
    }
}
