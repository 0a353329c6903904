//! A retry answered "duplicate" changes no view, also when the dedup mark that makes it one
//! arrives from a peer after the batch's coalescing was decided and before it commits.

use super::Node;
use crate::config::NodeConfig;
use crate::proto::PeerId;
use crate::store::DeltasSince;
use crate::views::{Event, ViewDef, ViewQuery};
use serde_json::json;

fn defs() -> Vec<ViewDef> {
    serde_json::from_value(json!([
        {"name": "c", "stream": "s", "kind": "count", "window": {"tumbling": "1m"}},
        {"name": "u", "stream": "s", "kind": "sum", "field": "n", "window": {"tumbling": "1m"}},
    ]))
    .expect("defs")
}

async fn open(dir: &std::path::Path) -> Node {
    let mut cfg = NodeConfig::new(dir);
    cfg.views = defs();
    Node::open(cfg).await.expect("open")
}

async fn totals(node: &Node) -> (u64, i64) {
    let mut out = (0, 0);
    for r in node.view("c", &ViewQuery::default()).await.expect("c").rows {
        out.0 += r.value.as_u64().unwrap_or(0);
    }
    for r in node.view("u", &ViewQuery::default()).await.expect("u").rows {
        out.1 += r.value.as_i64().unwrap_or(0);
    }
    out
}

#[tokio::test]
async fn a_duplicate_whose_mark_arrives_from_a_peer_mid_batch_changes_no_view() {
    let (da, db) = (
        tempfile::tempdir().expect("a"),
        tempfile::tempdir().expect("b"),
    );
    let (a, b) = (open(da.path()).await, open(db.path()).await);
    let e = |seq: u64| Event::new("p", seq, json!({"n": 5})).at(1_000 + seq);
    // A applies event 1.
    let out = a.ingest("s", vec![e(1)]).await.expect("a ingests");
    assert_eq!(out.applied, 1);
    let DeltasSince::Deltas { delta, .. } = a
        .deltas_since(b.context().expect("ctx"), 1 << 20)
        .await
        .expect("deltas")
    else {
        panic!("A's log is whole");
    };
    // The producer retries event 1 (with a new event 2) on B. B decides to coalesce (it holds
    // no mark of `p` yet); A's delta carrying the mark of event 1 is joined before B's batch
    // is queued.
    let join = async {
        b.apply_remote(PeerId(1), delta)
            .await
            .expect("apply")
            .expect("valid delta");
    };
    let out = b
        .ingest_then("s", vec![e(1), e(2)], join)
        .await
        .expect("b ingests");
    assert_eq!((out.applied, out.duplicates), (1, 1), "{out:?}");
    // Exactly the two applied events are counted: one from A, one from B.
    assert_eq!(totals(&b).await, (2, 10), "the duplicate changed a view");
    // The same on a batch that turns all-duplicate.
    let out = b.ingest("s", vec![e(1), e(2)]).await.expect("retry");
    assert_eq!((out.applied, out.duplicates), (0, 2));
    assert_eq!(totals(&b).await, (2, 10));
    a.shutdown().await.expect("shutdown");
    b.shutdown().await.expect("shutdown");
}
