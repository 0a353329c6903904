//! Hostile review of when a restored copy's joining ends (`Views::settle_restored`,
//! `read::restored_settled`, `Views::first_sync`'s `peers_covered`): can the wait end wrongly,
//! so that a copy applies on time events for windows its cluster already sealed (and reports
//! such a window final with another value than the cluster's)?

use serde_json::json;
use std::time::{Duration, Instant};
use tidemark::views::{Event, ViewDef, ViewQuery};
use tidemark::{Node, NodeConfig};

use crate::support::converge;

const MIN: u64 = 60_000;

fn defs() -> Vec<ViewDef> {
    serde_json::from_value(json!([
        {"name": "c", "stream": "s", "kind": "count", "window": {"tumbling": "1m"}},
    ]))
    .expect("defs")
}

async fn open(dir: &std::path::Path, joining: bool) -> Node {
    let mut cfg = NodeConfig::new(dir);
    cfg.views = defs();
    cfg.joining = joining;
    Node::open(cfg).await.expect("open")
}

fn ev(src: &str, seq: u64, t: u64) -> Event {
    Event::new(src, seq, json!({"user": src})).at(t)
}

async fn final_of(node: &Node, start: u64) -> Option<serde_json::Value> {
    let page = node.view("c", &ViewQuery::default()).await.expect("view");
    page.rows
        .into_iter()
        .find(|r| r.window_start == Some(start) && r.is_final)
        .map(|r| r.value)
}

/// Polls (maintaining `all`) until window `start` of `c` is final on `node`; None after 10 s.
async fn poll_final(node: &Node, all: &[&Node], start: u64) -> Option<serde_json::Value> {
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(10) {
        for n in all {
            n.maintain_views().await.expect("maintain");
        }
        if let Some(v) = final_of(node, start).await {
            return Some(v);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    None
}

/// A + B (linked) seal [0,1m) and [2m,3m); a snapshot of A is taken; then the live cluster
/// seals [3m,4m) with count 2 (events of A and B the snapshot does not hold). Returns
/// (a, b, snapshot path).
async fn cluster_moved_on(root: &std::path::Path) -> (Node, Node, std::path::PathBuf) {
    let a = open(&root.join("a"), false).await;
    let b = open(&root.join("b"), false).await;
    a.connect(&b).expect("connect");
    a.ingest("s", vec![ev("a", 1, 10_000), ev("a", 2, 2 * MIN)])
        .await
        .expect("a");
    b.ingest("s", vec![ev("b", 1, 20_000), ev("b", 2, 2 * MIN)])
        .await
        .expect("b");
    converge(&[&a, &b]).await;
    assert_eq!(poll_final(&a, &[&a, &b], 0).await, Some(json!(2)));
    let snap = root.join("a.snap");
    a.snapshot(&snap).await.expect("snapshot");
    a.ingest("s", vec![ev("a", 3, 3 * MIN + 1), ev("a", 4, 5 * MIN)])
        .await
        .expect("a");
    b.ingest("s", vec![ev("b", 3, 3 * MIN + 2), ev("b", 4, 5 * MIN)])
        .await
        .expect("b");
    converge(&[&a, &b]).await;
    assert_eq!(poll_final(&a, &[&a, &b], 3 * MIN).await, Some(json!(2)));
    assert_eq!(poll_final(&b, &[&a, &b], 3 * MIN).await, Some(json!(2)));
    (a, b, snap)
}

/// Which node the copy R (of A) is linked to instead of its live cluster.
#[derive(Clone, Copy, Debug)]
enum Other {
    /// A brand-new node started alone (it never met anyone).
    FreshAlone,
    /// A brand-new node started with `--join` (it joins the cluster through the copy).
    FreshJoining,
    /// A second copy of the same snapshot.
    SecondCopy,
}

/// R, a copy of A, is linked only to `other` (never to A or B). For every window the live
/// cluster sealed after the snapshot ([3m,4m), final 2), R must not apply an event on time
/// nor report a final value other than 2. Returns what R did: Err(description) on a fork.
async fn copy_linked_to(other: Other) -> Result<(), String> {
    let root = tempfile::tempdir().expect("tempdir");
    let (a, b, snap) = cluster_moved_on(root.path()).await;
    Node::restore(&snap, root.path().join("r")).expect("restore");
    let r = open(&root.path().join("r"), false).await;
    assert!(r.is_joining(), "a copy of a member joins");
    let x = match other {
        Other::FreshAlone => open(&root.path().join("x"), false).await,
        Other::FreshJoining => open(&root.path().join("x"), true).await,
        Other::SecondCopy => {
            Node::restore(&snap, root.path().join("x")).expect("restore");
            open(&root.path().join("x"), false).await
        }
    };
    r.connect(&x).expect("connect");
    converge(&[&r, &x]).await;
    // Give the wait every chance to end (bounded): an event for [3m,4m), which the live
    // cluster sealed with A's and B's events (R holds neither), must stay late.
    let started = Instant::now();
    let mut applied_at = None;
    for seq in 1.. {
        let out = r
            .ingest("s", vec![ev("r", seq, 3 * MIN + 3)])
            .await
            .expect("r ingests");
        if out.applied > 0 && out.late == 0 {
            applied_at = Some(seq);
            break;
        }
        if started.elapsed() > Duration::from_secs(3) {
            break;
        }
        converge(&[&r, &x]).await;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let joining = (r.is_joining(), x.is_joining());
    let result = if let Some(seq) = applied_at {
        // Show the consequence: R (with x) seals [3m,4m) with its own value.
        r.ingest("s", vec![ev("r", 1000, 6 * MIN)])
            .await
            .expect("r ingests");
        x.ingest("s", vec![ev("x", 1000, 6 * MIN)])
            .await
            .expect("x ingests");
        converge(&[&r, &x]).await;
        let on_r = poll_final(&r, &[&r, &x], 3 * MIN).await;
        // And once R meets its live cluster after all.
        r.connect(&a).expect("connect");
        r.connect(&b).expect("connect");
        converge(&[&a, &b, &r, &x]).await;
        let later = poll_final(&r, &[&a, &b, &r, &x], 3 * MIN).await;
        let on_a = final_of(&a, 3 * MIN).await;
        let row_r = r
            .view("c", &ViewQuery::default())
            .await
            .expect("view")
            .rows
            .into_iter()
            .find(|w| w.window_start == Some(3 * MIN))
            .map(|w| (w.value, w.is_final));
        Err(format!(
            "{other:?}: copy R applied on time (ingest #{seq}) an event for [3m,4m), which the \
             live cluster sealed with 2; R's final of [3m,4m) = {on_r:?} (cluster: 2); \
             (r, x) joining = {joining:?}; linked to A and B later: R final {later:?} (row {row_r:?}), A {on_a:?}"
        ))
    } else {
        Ok(())
    };
    for n in [a, b, r, x] {
        n.shutdown().await.expect("shutdown");
    }
    result
}

/// Attack (1a): the copy linked to a brand-new node started alone.
///
/// Used to fail (fixed: a restored copy counts as synced only on an announcement, newer than
/// its snapshot, by a known member of its cluster): `Views::first_sync` ends the copy's node-level joining as soon as
/// `at.peers_covered` holds for the linked peers, and a peer that holds nothing the copy lacks
/// (a brand-new node, a `--join` node, another copy of the same snapshot) is trivially
/// covered. The copy then applies on time (late 0) an event for [3m,4m), a window its live
/// cluster A + B sealed after the snapshot with 2. Linked to A and B afterwards, the copy reads
/// [3m,4m) = 3, never final (10 s of maintenance on all nodes), while A and B read 2 final.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_linked_to_a_fresh_node_does_not_fork_the_cluster() {
    if let Err(e) = copy_linked_to(Other::FreshAlone).await {
        panic!("{e}");
    }
}

/// Attack (1b): the copy linked to a brand-new node that joins through it (`--join`).
///
/// Used to fail (fixed: a restored copy counts as synced only on an announcement, newer than
/// its snapshot, by a known member of its cluster): `Views::first_sync` ends the copy's node-level joining as soon as
/// `at.peers_covered` holds for the linked peers, and a peer that holds nothing the copy lacks
/// (a brand-new node, a `--join` node, another copy of the same snapshot) is trivially
/// covered. The copy then applies on time (late 0) an event for [3m,4m), a window its live
/// cluster A + B sealed after the snapshot with 2. Linked to A and B afterwards, the copy reads
/// [3m,4m) = 3, never final (10 s of maintenance on all nodes), while A and B read 2 final.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_linked_to_a_fresh_joining_node_does_not_fork_the_cluster() {
    if let Err(e) = copy_linked_to(Other::FreshJoining).await {
        panic!("{e}");
    }
}

/// Attack (1c): two copies of the same snapshot linked to each other.
///
/// Used to fail (fixed: a restored copy counts as synced only on an announcement, newer than
/// its snapshot, by a known member of its cluster): `Views::first_sync` ends the copy's node-level joining as soon as
/// `at.peers_covered` holds for the linked peers, and a peer that holds nothing the copy lacks
/// (a brand-new node, a `--join` node, another copy of the same snapshot) is trivially
/// covered. The copy then applies on time (late 0) an event for [3m,4m), a window its live
/// cluster A + B sealed after the snapshot with 2. Linked to A and B afterwards, the copy reads
/// [3m,4m) = 3, never final (10 s of maintenance on all nodes), while A and B read 2 final.
/// Both copies end up not joining: they act as a separate cluster for the snapshot's streams.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_copies_of_one_snapshot_do_not_fork_the_cluster() {
    if let Err(e) = copy_linked_to(Other::SecondCopy).await {
        panic!("{e}");
    }
}

/// Attack (3): A met B (B never announced a stream: known only through A's met list); the
/// copy of A removes A only. B is alive and a member: the copy must keep waiting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn removing_the_announcer_while_a_met_peer_lives_keeps_the_copy_waiting() {
    let root = tempfile::tempdir().expect("tempdir");
    let a = open(&root.path().join("a"), false).await;
    let b = open(&root.path().join("b"), false).await;
    a.connect(&b).expect("connect");
    converge(&[&a, &b]).await;
    a.ingest("s", vec![ev("a", 1, 10_000), ev("a", 2, 2 * MIN)])
        .await
        .expect("a");
    converge(&[&a, &b]).await;
    let snap = root.path().join("a.snap");
    a.snapshot(&snap).await.expect("snapshot");
    Node::restore(&snap, root.path().join("r")).expect("restore");
    let r = open(&root.path().join("r"), false).await;
    assert!(r.is_joining(), "a copy of a member joins");
    r.decommission(a.replica_id()).await.expect("decommission");
    let out = r
        .ingest("s", vec![ev("r", 1, 3 * MIN)])
        .await
        .expect("r ingests");
    assert!(
        r.is_joining() && out.late == 1,
        "B (met by A) is alive, yet the copy stopped waiting: joining={}, {out:?}",
        r.is_joining()
    );
    for n in [a, b, r] {
        n.shutdown().await.expect("shutdown");
    }
}

/// Attack (5, liveness) after a restart: the copy synced with A (A announced since the
/// snapshot), restarts, and must not wait again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_synced_with_its_cluster_stays_settled_across_a_restart() {
    let root = tempfile::tempdir().expect("tempdir");
    let (a, b, snap) = cluster_moved_on(root.path()).await;
    let dir = root.path().join("r");
    Node::restore(&snap, &dir).expect("restore");
    let r = open(&dir, false).await;
    r.connect(&a).expect("connect");
    r.connect(&b).expect("connect");
    let started = Instant::now();
    for seq in 1.. {
        let out = r.ingest("s", vec![ev("r", seq, 6 * MIN)]).await.expect("r");
        if out.late == 0 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "r never synced"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(!r.is_joining());
    assert_eq!(poll_final(&r, &[&a, &b, &r], 3 * MIN).await, Some(json!(2)));
    r.shutdown().await.expect("shutdown");
    drop(r);
    let r = open(&dir, false).await;
    assert!(
        !r.is_joining(),
        "synced before the restart, the copy waits again"
    );
    assert_eq!(final_of(&r, 3 * MIN).await, Some(json!(2)));
    for n in [a, b, r] {
        n.shutdown().await.expect("shutdown");
    }
}

/// Attack (2): the copy settles through a peer that never announced (a fresh node, see
/// `a_copy_linked_to_a_fresh_node_does_not_fork_the_cluster`), then restarts: the settled
/// state was in memory only (`peers_covered`), and nothing durable says it synced. It must
/// not flip back to waiting, and what it reported final must stay final with its value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_settled_by_a_silent_peer_keeps_its_state_across_a_restart() {
    let root = tempfile::tempdir().expect("tempdir");
    let (a, b, snap) = cluster_moved_on(root.path()).await;
    let dir = root.path().join("r");
    Node::restore(&snap, &dir).expect("restore");
    let r = open(&dir, false).await;
    let x = open(&root.path().join("x"), false).await;
    r.connect(&x).expect("connect");
    converge(&[&r, &x]).await;
    let started = Instant::now();
    for seq in 1.. {
        let out = r
            .ingest("s", vec![ev("r", seq, 3 * MIN + 3)])
            .await
            .expect("r");
        if out.late == 0 {
            break;
        }
        if started.elapsed() > Duration::from_secs(5) {
            // The copy kept waiting (attack 1 fixed): a silent peer settles nothing, so
            // there is no settled state to lose across a restart. It must still wait after
            // one.
            assert!(r.is_joining());
            r.shutdown().await.expect("shutdown");
            drop(r);
            let r = open(&dir, false).await;
            let joining = r.is_joining();
            for n in [a, b, r, x] {
                n.shutdown().await.expect("shutdown");
            }
            assert!(
                joining,
                "a copy that never synced stops waiting after a restart"
            );
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(!r.is_joining());
    let before = final_of(&r, 0).await;
    r.shutdown().await.expect("shutdown");
    drop(r);
    let r = open(&dir, false).await;
    let after = final_of(&r, 0).await;
    let joining = r.is_joining();
    for n in [a, b, r, x] {
        n.shutdown().await.expect("shutdown");
    }
    assert_eq!(before, after, "window [0,1m) changed across the restart");
    assert!(
        !joining,
        "settled (applied on time) before the restart, waiting again after it: the copy \
         flip-flops between member and joining"
    );
}

/// Attack (3b)/(4): A announced `s` alone, THEN met B (B never ingests); a snapshot of A is
/// taken right after A and B converged (no announcement of A since). A dies; the operator of the
/// copy removes A (the only member the copy can name). B is alive and a member of A's
/// cluster: the copy must keep waiting — otherwise B (which removes dead A too) and the copy
/// both run as the whole cluster and seal the same window with different values.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_that_removes_its_only_known_member_does_not_fork_from_a_later_met_peer() {
    let root = tempfile::tempdir().expect("tempdir");
    let a = open(&root.path().join("a"), false).await;
    a.ingest("s", vec![ev("a", 1, 10_000), ev("a", 2, 2 * MIN)])
        .await
        .expect("a");
    let b = open(&root.path().join("b"), false).await;
    a.connect(&b).expect("connect");
    converge(&[&a, &b]).await;
    let snap = root.path().join("a.snap");
    a.snapshot(&snap).await.expect("snapshot");
    let a_id = a.replica_id();
    a.shutdown().await.expect("shutdown");
    drop(a);
    Node::restore(&snap, root.path().join("r")).expect("restore");
    let r = open(&root.path().join("r"), false).await;
    assert!(r.is_joining(), "a copy of a member joins");
    r.decommission(a_id).await.expect("decommission");
    if r.is_joining() {
        // Held: the copy knows of B.
        for n in [b, r] {
            n.shutdown().await.expect("shutdown");
        }
        return;
    }
    // The copy settled: show the fork. B removes dead A as well and runs alone.
    b.decommission(a_id).await.expect("decommission");
    r.ingest("s", vec![ev("r", 1, 3 * MIN + 1), ev("r", 2, 5 * MIN)])
        .await
        .expect("r");
    b.ingest(
        "s",
        vec![
            ev("b", 1, 3 * MIN + 2),
            ev("b", 2, 3 * MIN + 3),
            ev("b", 3, 5 * MIN),
        ],
    )
    .await
    .expect("b");
    let on_r = poll_final(&r, &[&r], 3 * MIN).await;
    let on_b = poll_final(&b, &[&b], 3 * MIN).await;
    for n in [b, r] {
        n.shutdown().await.expect("shutdown");
    }
    panic!(
        "the copy settled after removing A although B (met by A) is alive: [3m,4m) final on \
         the copy {on_r:?}, on B {on_b:?}"
    );
}

/// Attack (1d), the restart path of (a): the copy R (never ingesting) is linked to a
/// brand-new node X that ingests `s` (so X announces it), then R restarts alone.
/// `read::restored_settled` counts any announcement by a non-removed other replica that the
/// snapshot lacked as "synced with a live member of its cluster", X's included, although X
/// never was one. R must keep waiting after the restart.
///
/// Used to fail (fixed: a restored copy counts as synced only on an announcement, newer than
/// its snapshot, by a known member of its cluster): after the restart R is not joining and applies on time (late 0) an
/// event for [3m,4m), which its live cluster sealed with 2 after the snapshot. Independent of
/// the `peers_covered` hole (R never ingested before the restart): fixing `first_sync` alone
/// leaves this one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_restarted_after_meeting_a_fresh_announcer_keeps_waiting() {
    let root = tempfile::tempdir().expect("tempdir");
    let (a, b, snap) = cluster_moved_on(root.path()).await;
    let dir = root.path().join("r");
    Node::restore(&snap, &dir).expect("restore");
    let r = open(&dir, false).await;
    let x = open(&root.path().join("x"), false).await;
    r.connect(&x).expect("connect");
    x.ingest("s", vec![ev("x", 1, 10 * MIN)]).await.expect("x");
    x.maintain_views().await.expect("maintain");
    converge(&[&r, &x]).await;
    r.shutdown().await.expect("shutdown");
    drop(r);
    let r = open(&dir, false).await;
    let joining = r.is_joining();
    let out = r
        .ingest("s", vec![ev("r", 1, 3 * MIN + 3)])
        .await
        .expect("r ingests");
    for n in [a, b, r, x] {
        n.shutdown().await.expect("shutdown");
    }
    assert!(
        joining && out.late == 1,
        "after a restart the copy counts a fresh node's announcement as a sync with its \
         cluster: joining={joining}, an event for [3m,4m) (sealed by the cluster) {out:?}"
    );
}

/// Attack (5), liveness: the copy R of A linked to B only (B holds more than R: the windows
/// sealed after the snapshot). R must stop waiting, and agree with B on [3m,4m) = 2.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_linked_to_one_live_member_settles_and_agrees() {
    let root = tempfile::tempdir().expect("tempdir");
    let (a, b, snap) = cluster_moved_on(root.path()).await;
    Node::restore(&snap, root.path().join("r")).expect("restore");
    let r = open(&root.path().join("r"), false).await;
    r.connect(&b).expect("connect");
    let started = Instant::now();
    for seq in 1.. {
        let out = r.ingest("s", vec![ev("r", seq, 6 * MIN)]).await.expect("r");
        if out.late == 0 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "linked to live B, the copy never stopped waiting"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(!r.is_joining());
    let out = r
        .ingest("s", vec![ev("r", 1000, 3 * MIN + 3)])
        .await
        .expect("r");
    assert_eq!(out.late, 1, "[3m,4m) is sealed by the cluster: {out:?}");
    converge(&[&a, &b, &r]).await;
    assert_eq!(poll_final(&r, &[&a, &b, &r], 3 * MIN).await, Some(json!(2)));
    for n in [a, b, r] {
        n.shutdown().await.expect("shutdown");
    }
}

/// Liveness: the copy R of A linked to A and B that stayed idle since the snapshot (no event,
/// no announcement after it). A live member's idle watermark follows its clock, so its next
/// maintenance announces anew and R stops waiting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_linked_to_idle_live_members_settles() {
    let root = tempfile::tempdir().expect("tempdir");
    let a = open(&root.path().join("a"), false).await;
    let b = open(&root.path().join("b"), false).await;
    a.connect(&b).expect("connect");
    a.ingest("s", vec![ev("a", 1, 10_000), ev("a", 2, 2 * MIN)])
        .await
        .expect("a");
    b.ingest("s", vec![ev("b", 1, 20_000), ev("b", 2, 2 * MIN)])
        .await
        .expect("b");
    converge(&[&a, &b]).await;
    assert_eq!(poll_final(&a, &[&a, &b], 0).await, Some(json!(2)));
    converge(&[&a, &b]).await;
    let snap = root.path().join("a.snap");
    a.snapshot(&snap).await.expect("snapshot");
    Node::restore(&snap, root.path().join("r")).expect("restore");
    let r = open(&root.path().join("r"), false).await;
    assert!(r.is_joining(), "a copy of a member joins");
    r.connect(&a).expect("connect");
    r.connect(&b).expect("connect");
    let started = Instant::now();
    while r.is_joining() {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "linked to idle live members, the copy never stopped waiting"
        );
        for n in [&a, &b, &r] {
            n.maintain_views().await.expect("maintain");
        }
        r.ingest("s", vec![ev("r", 1, 2 * MIN + 5)])
            .await
            .expect("r");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for n in [a, b, r] {
        n.shutdown().await.expect("shutdown");
    }
}
