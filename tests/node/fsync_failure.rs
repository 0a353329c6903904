//! fsync failure (docs/design/principles.md: pitfalls "partial transaction counted" and "fsync
//! retry").
//!
//! 1. At the `RedbStore` level (the only place a redb backend can be injected: `Node::open`
//!    opens its file itself and has no backend hook): a backend fails the N-th `sync_data` with
//!    EIO (random N over the whole run, open included; once or sticky). The operation whose
//!    sync failed returns `Err` (never acknowledged), the store halts (`halted()` is set and
//!    every later write fails with `StoreError::Halted`, even when the disk would accept the
//!    retry), and after a restart from the durable image — or from the image where everything
//!    written reached the disk — every acknowledged write is intact. `INJECTIONS=<n>` (default
//!    150, `SOAK=1` ×10); `SEED=<n>` replays.
//!    The same with a write-ahead log (`RedbStore::open_with_backends`): the LOG's `sync_data`
//!    fails with EIO on a local commit group. The commit returns `Err`, the store halts, readers
//!    see nothing of the group, and a restart from the durable images of both files holds
//!    exactly the groups acknowledged before it (from other images: those, or those plus the
//!    failed group, whole).
//! 2. Through the `Node` API with real files: a child process runs with a file-size limit
//!    (`ulimit -f`, SIGXFSZ ignored), so redb's writes fail with EFBIG once the file reaches it.
//!    The failing ingest is not acknowledged, every later write is refused, and a restart
//!    without the limit finds every acknowledged event exactly once. (This injects the failure
//!    on write/extend rather than on fsync: the `Node` has no hook for the latter.)

use crate::common;

use common::workload::{Action, ME, Model, Part, Peer, WALL0, values_of};
use common::{FaultBackend, ImageKind, Rec, crash_image};
use rand::Rng;
use std::collections::BTreeSet;
use std::io::Write;
use std::panic::AssertUnwindSafe;
use std::process::{Command, Stdio};
use tidemark::crdts::CausalContext;
use tidemark::ops::validate_ops;
use tidemark::store::{OpenOptions, RedbStore, StoreError};
use tidemark::{Event, Key, KeyKind, Limits, Node, NodeConfig, Op, Value};

fn options() -> OpenOptions {
    OpenOptions {
        new_replica_id: Some(ME),
        ..OpenOptions::default()
    }
}

/// Reopens `image` and checks it holds exactly one of `candidates` (model + context), is
/// consistent, and accepts new writes with fresh dots.
fn reopen_and_check(image: Vec<u8>, candidates: &[(&Model, &CausalContext)], what: &str) {
    check_reopened(
        RedbStore::open_with_backend(FaultBackend::from_image(image), options()),
        candidates,
        what,
    );
}

/// Checks a restarted store as [`reopen_and_check`] does.
fn check_reopened(
    opened: Result<RedbStore, StoreError>,
    candidates: &[(&Model, &CausalContext)],
    what: &str,
) {
    let mut store = match opened {
        Ok(s) => s,
        Err(e) => {
            // Only acceptable when nothing was ever committed (the file was being created).
            assert!(
                candidates
                    .iter()
                    .all(|(m, c)| m.values.is_empty() && c.is_empty()),
                "{what}: restart refused with acknowledged data on disk: {e}"
            );
            assert!(!e.to_string().is_empty());
            return;
        }
    };
    store.verify().expect("verify after restart");
    assert!(
        store.check_integrity().expect("integrity check runs"),
        "{what}"
    );
    let values = values_of(&store);
    let found = candidates
        .iter()
        .find(|(m, c)| m.values == values && *c == store.ctx());
    let Some((_, ctx)) = found else {
        panic!(
            "{what}: restarted state is not the acknowledged one: {} keys, expected {}; context \
             {:?}, expected {:?}",
            values.len(),
            candidates[0].0.values.len(),
            store.ctx(),
            candidates[0].1
        )
    };
    let before = ctx.max_seq(ME);
    store
        .commit_local(
            &validate_ops(&[Op::inc_gcounter("after", 1)], &Limits::default()).expect("valid"),
            WALL0 + 10_000_000,
        )
        .expect("a restarted store accepts writes");
    assert_eq!(store.ctx().max_seq(ME), before + 1, "{what}: dot reuse");
}

/// How a faulted run ended.
struct Ended {
    /// The step whose sync failed (`None`: during open; `Some(len)`: no failure fired).
    failed_step: Option<usize>,
    /// What failed.
    what: &'static str,
}

#[test]
fn a_failed_fsync_is_never_acknowledged_and_halts_the_store() {
    let seed = common::seed("fsync_failure");
    let mut rng = common::rng(seed);
    let injections = common::env_usize("INJECTIONS", 150) * if common::soak() { 10 } else { 1 };
    let mut fired = 0;
    let mut by_step: std::collections::BTreeMap<&str, u64> = Default::default();
    let mut run = 0;
    while fired < injections {
        run += 1;
        assert!(run < injections * 10, "the injections do not fire");
        let wseed: u64 = rng.random();
        let mut wrng = common::rng(wseed);
        let plan: Vec<Action> = (0..wrng.random_range(5..40))
            .map(|_| Action::random(&mut wrng))
            .collect();
        // Probe without faults: the syncs the run makes, and the state after every step (the
        // run is deterministic: fixed replica ids, wall clock and plan).
        let probe = FaultBackend::default();
        let mut states = vec![(Model::default(), CausalContext::new())];
        let total = {
            let mut store = RedbStore::open_with_backend(probe.clone(), options()).expect("open");
            let mut peer = Peer::new();
            let mut model = Model::default();
            for (i, a) in plan.iter().enumerate() {
                a.execute(&mut store, &mut peer, WALL0 + i as u64)
                    .expect("probe step");
                a.apply(&mut model, &peer);
                states.push((model.clone(), store.ctx().clone()));
            }
            // Not the syncs of the close: a failure there acknowledges nothing.
            probe.syncs()
        };
        let n = rng.random_range(1..=total);
        let sticky = rng.random_bool(0.5);
        let ctx = format!(
            "seed {seed}, run {run} (workload seed {wseed}): sync {n}/{total} fails{}",
            if sticky { " (sticky)" } else { " (once)" }
        );
        let backend = FaultBackend::recording();
        backend.fail_sync_at(n, sticky);
        let ended = std::panic::catch_unwind(AssertUnwindSafe(|| {
            let mut store = match RedbStore::open_with_backend(backend.clone(), options()) {
                Ok(s) => s,
                Err(e) => {
                    assert_eq!(backend.failures(), 1, "{ctx}: open failed on its own: {e}");
                    return Ended {
                        failed_step: None,
                        what: "open",
                    };
                }
            };
            assert_eq!(
                backend.failures(),
                0,
                "{ctx}: open succeeded over a failed sync"
            );
            let mut peer = Peer::new();
            for (i, action) in plan.iter().enumerate() {
                let acked_ctx = store.ctx().clone();
                assert_eq!(
                    acked_ctx, states[i].1,
                    "{ctx}: the run is not deterministic"
                );
                match action.execute(&mut store, &mut peer, WALL0 + i as u64) {
                    Ok(()) => assert_eq!(
                        backend.failures(),
                        0,
                        "{ctx}: step {i} ({}) acknowledged although its sync failed",
                        action.name()
                    ),
                    Err(e) => {
                        assert_eq!(
                            backend.failures(),
                            1,
                            "{ctx}: step {i} ({}) failed without an injected fault: {e}",
                            action.name()
                        );
                        assert!(!matches!(e, StoreError::InvalidOp(_)), "{ctx}: {e}");
                        assert!(store.halted().is_some(), "{ctx}: the store did not halt");
                        assert_eq!(store.ctx(), &acked_ctx, "{ctx}: a failed commit moved ctx");
                        // No retry-and-continue, even when the disk would now accept it.
                        let retry =
                            Action::Commit(vec![Part::Ops(vec![Op::inc_gcounter("retry", 1)])]);
                        for attempt in [retry, Action::Compact, Action::Sync] {
                            match attempt.execute(&mut store, &mut peer, WALL0 + 1_000) {
                                Err(StoreError::Halted(why)) => assert!(!why.is_empty()),
                                other => panic!(
                                    "{ctx}: {} after a failed sync: {other:?}",
                                    attempt.name()
                                ),
                            }
                        }
                        assert_eq!(store.ctx(), &acked_ctx, "{ctx}");
                        return Ended {
                            failed_step: Some(i),
                            what: action.name(),
                        };
                    }
                }
            }
            Ended {
                failed_step: Some(plan.len()),
                what: "none",
            }
        }))
        .unwrap_or_else(|p| panic!("{ctx}: {}", panic_text(&*p)));
        if backend.failures() == 0 {
            // The sync fired only at shutdown, or after the last step: nothing to check.
            continue;
        }
        fired += 1;
        *by_step.entry(ended.what).or_default() += 1;
        // Candidates: the acknowledged prefix, or it plus the failed step (which may or may
        // not have reached the disk before its sync failed).
        let acked = ended.failed_step.unwrap_or(0);
        let mut candidates = vec![(&states[acked].0, &states[acked].1)];
        if let Some(next) = states
            .get(acked + 1)
            .filter(|_| ended.failed_step.is_some())
        {
            candidates.push((&next.0, &next.1));
        }
        // Restart from what the disk holds: the durable image, everything written, and random
        // cuts of the unsynced tail.
        let log = backend.log();
        let failed_syncs = log.iter().filter(|r| **r == Rec::SyncFailed).count();
        assert!(failed_syncs >= 1 && (sticky || failed_syncs == 1), "{ctx}");
        let mut kinds = vec![ImageKind::DurableOnly, ImageKind::Everything];
        kinds.extend((0..3).map(|_| ImageKind::pick(&mut rng)));
        for kind in kinds {
            let image = crash_image(&log, log.len(), kind, &mut rng);
            let what = format!("{ctx}: restart from {kind:?}");
            std::panic::catch_unwind(AssertUnwindSafe(|| {
                reopen_and_check(image, &candidates, &what);
            }))
            .unwrap_or_else(|p| panic!("{what}: {}", panic_text(&*p)));
        }
    }
    println!("fsync_failure: {fired} injected EIO in {run} runs; failed steps: {by_step:?}");
}

#[test]
fn a_failed_log_fsync_is_never_acknowledged_and_halts_the_store() {
    let seed = common::seed("wal_fsync_failure");
    let mut rng = common::rng(seed);
    let injections = common::env_usize("INJECTIONS", 150) * if common::soak() { 10 } else { 1 };
    let mut fired = 0;
    let mut run = 0;
    while fired < injections {
        run += 1;
        assert!(run < injections * 10, "the injections do not fire");
        let wseed: u64 = rng.random();
        let mut wrng = common::rng(wseed);
        let plan: Vec<Action> = (0..wrng.random_range(5..40))
            .map(|_| Action::random(&mut wrng))
            .collect();
        // Probe without faults: the log syncs the run makes (one per local group), and the
        // state after every step.
        let probe_wal = FaultBackend::default();
        let mut states = vec![(Model::default(), CausalContext::new())];
        let (total, open_syncs) = {
            let mut store = RedbStore::open_with_backends(
                FaultBackend::default(),
                probe_wal.clone(),
                options(),
            )
            .expect("open");
            // The open's own syncs (a new log is zero-filled and synced) are not a commit's.
            let open_syncs = probe_wal.syncs();
            let mut peer = Peer::new();
            let mut model = Model::default();
            for (i, a) in plan.iter().enumerate() {
                a.execute(&mut store, &mut peer, WALL0 + i as u64)
                    .expect("probe step");
                a.apply(&mut model, &peer);
                states.push((model.clone(), store.ctx().clone()));
            }
            (probe_wal.syncs(), open_syncs)
        };
        if total <= open_syncs {
            continue;
        }
        let n = rng.random_range(open_syncs + 1..=total);
        let sticky = rng.random_bool(0.5);
        let ctx = format!(
            "seed {seed}, run {run} (workload seed {wseed}): log sync {n}/{total} fails{}",
            if sticky { " (sticky)" } else { " (once)" }
        );
        let db = FaultBackend::recording();
        let wal = FaultBackend::recording();
        wal.fail_sync_at(n, sticky);
        let failed_step = std::panic::catch_unwind(AssertUnwindSafe(|| {
            let mut store = RedbStore::open_with_backends(db.clone(), wal.clone(), options())
                .unwrap_or_else(|e| panic!("{ctx}: open: {e}"));
            let mut peer = Peer::new();
            for (i, action) in plan.iter().enumerate() {
                let (acked_model, acked_ctx) = &states[i];
                assert_eq!(
                    store.ctx(),
                    acked_ctx,
                    "{ctx}: the run is not deterministic"
                );
                let reader = store.reader();
                match action.execute(&mut store, &mut peer, WALL0 + i as u64) {
                    Ok(()) => assert_eq!(
                        wal.failures(),
                        0,
                        "{ctx}: step {i} ({}) acknowledged although its log sync failed",
                        action.name()
                    ),
                    Err(e) => {
                        assert_eq!(
                            wal.failures(),
                            1,
                            "{ctx}: step {i} ({}) failed without an injected fault: {e}",
                            action.name()
                        );
                        assert!(
                            matches!(action, Action::Commit(_)),
                            "{ctx}: step {i} ({}) synced the log",
                            action.name()
                        );
                        assert!(!matches!(e, StoreError::InvalidOp(_)), "{ctx}: {e}");
                        assert!(store.halted().is_some(), "{ctx}: the store did not halt");
                        assert_eq!(store.ctx(), acked_ctx, "{ctx}: a failed commit moved ctx");
                        // Readers see nothing of the group: neither a new reader nor one
                        // taken before it.
                        assert_eq!(
                            &values_of(&store),
                            &acked_model.values,
                            "{ctx}: the failed group is visible to readers"
                        );
                        let before: std::collections::BTreeMap<_, _> = reader
                            .entries()
                            .expect("entries")
                            .into_iter()
                            .map(|(k, e)| (k, e.value()))
                            .filter(|(k, v)| *v != Value::empty(k.kind))
                            .collect();
                        assert_eq!(&before, &acked_model.values, "{ctx}: an older reader");
                        // No retry-and-continue, even when the log would now accept it.
                        let retry =
                            Action::Commit(vec![Part::Ops(vec![Op::inc_gcounter("retry", 1)])]);
                        for attempt in [retry, Action::Compact, Action::Sync] {
                            match attempt.execute(&mut store, &mut peer, WALL0 + 1_000) {
                                Err(StoreError::Halted(why)) => assert!(!why.is_empty()),
                                other => panic!(
                                    "{ctx}: {} after a failed log sync: {other:?}",
                                    attempt.name()
                                ),
                            }
                        }
                        match store.checkpoint() {
                            Err(StoreError::Halted(_)) => {}
                            other => panic!("{ctx}: checkpoint after a failed log sync: {other:?}"),
                        }
                        assert_eq!(store.ctx(), acked_ctx, "{ctx}");
                        assert_eq!(&values_of(&store), &acked_model.values, "{ctx}");
                        return Some(i);
                    }
                }
            }
            None
        }))
        .unwrap_or_else(|p| panic!("{ctx}: {}", panic_text(&*p)));
        let Some(failed) = failed_step else {
            assert_eq!(wal.failures(), 0, "{ctx}: a log sync failed unnoticed");
            continue;
        };
        fired += 1;
        // Restart from what the disks hold. The durable images: exactly the acknowledged
        // groups. Others (the failed frame may have reached the disk): those, or those plus
        // the failed group whole.
        let (db_log, wal_log) = (db.log(), wal.log());
        let failed_syncs = wal_log.iter().filter(|r| **r == Rec::SyncFailed).count();
        assert_eq!(
            failed_syncs, 1,
            "{ctx}: the halted store synced the log again"
        );
        let acked = (&states[failed].0, &states[failed].1);
        let with_failed = (&states[failed + 1].0, &states[failed + 1].1);
        let mut kinds = vec![
            (ImageKind::DurableOnly, ImageKind::DurableOnly),
            (ImageKind::Everything, ImageKind::Everything),
        ];
        kinds.extend((0..3).map(|_| (ImageKind::pick(&mut rng), ImageKind::pick(&mut rng))));
        for (db_kind, wal_kind) in kinds {
            let db_image = crash_image(&db_log, db_log.len(), db_kind, &mut rng);
            let wal_image = crash_image(&wal_log, wal_log.len(), wal_kind, &mut rng);
            let what = format!("{ctx}: restart from db {db_kind:?}, log {wal_kind:?}");
            let candidates =
                if (db_kind, wal_kind) == (ImageKind::DurableOnly, ImageKind::DurableOnly) {
                    vec![acked]
                } else {
                    vec![acked, with_failed]
                };
            std::panic::catch_unwind(AssertUnwindSafe(|| {
                check_reopened(
                    RedbStore::open_with_backends(
                        FaultBackend::from_image(db_image),
                        FaultBackend::from_image(wal_image),
                        options(),
                    ),
                    &candidates,
                    &what,
                );
            }))
            .unwrap_or_else(|p| panic!("{what}: {}", panic_text(&*p)));
        }
    }
    println!("wal_fsync_failure: {fired} injected log EIO in {run} runs");
}

fn panic_text(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<String>()
        .cloned()
        .or_else(|| p.downcast_ref::<&str>().map(|s| (*s).to_owned()))
        .unwrap_or_default()
}

// ---------------------------------------------------------------------------------------------
// Through the Node API: a child process under a file-size limit.

const CHILD_DIR: &str = "TIDEMARK_FSIZE_CHILD_DIR";

fn event(seq: u64) -> Event {
    Event {
        source: "writer".into(),
        seq,
        ops: vec![
            Op::inc_gcounter("events", 1),
            Op::add("ids", seq),
            // Bulk, so the file grows quickly to the limit.
            Op::set_lww(&format!("blob/{}", seq % 256), "x".repeat(2_000)),
        ],
        ..Default::default()
    }
}

/// The child: ingests until a write fails, then checks nothing more is acknowledged.
#[test]
fn child_node_until_write_error() {
    let Ok(dir) = std::env::var(CHILD_DIR) else {
        return; // Only meaningful as the child of the test below.
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async move {
        let mut out = std::io::stdout().lock();
        // Start on a fresh line: the harness has printed "test <name> ... " without one.
        writeln!(out).expect("stdout");
        let node = match Node::open(NodeConfig::new(&dir)).await {
            Ok(n) => n,
            Err(e) => {
                writeln!(out, "OPEN_FAIL {}", e.code()).expect("stdout");
                return;
            }
        };
        let mut seq = 0u64;
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        loop {
            assert!(std::time::Instant::now() < deadline, "never hit the limit");
            let batch: Vec<Event> = (0..20)
                .map(|_| {
                    seq += 1;
                    event(seq)
                })
                .collect();
            let ids: Vec<String> = batch.iter().map(|e| e.seq.to_string()).collect();
            writeln!(out, "SEND {}", ids.join(" ")).expect("stdout");
            out.flush().expect("flush");
            match node.ingest("s", batch).await {
                Ok(_) => writeln!(out, "ACK {}", ids.join(" ")).expect("stdout"),
                Err(e) => {
                    writeln!(out, "FAIL {} {e}", e.code()).expect("stdout");
                    break;
                }
            }
            out.flush().expect("flush");
        }
        // Nothing is acknowledged after the failure, whatever the caller tries.
        for i in 0..3 {
            seq += 1;
            let ids = seq.to_string();
            writeln!(out, "SEND {ids}").expect("stdout");
            match node.ingest("s", vec![event(seq)]).await {
                Ok(_) => writeln!(out, "ACK {ids}").expect("stdout"),
                Err(e) => writeln!(out, "AFTER{i} {} {e}", e.code()).expect("stdout"),
            }
        }
        match node.apply(Op::inc_gcounter("plain", 1)).await {
            Ok(_) => writeln!(out, "ACK plain").expect("stdout"),
            Err(e) => writeln!(out, "AFTER_APPLY {}", e.code()).expect("stdout"),
        }
        out.flush().expect("flush");
        let _ = node.shutdown().await;
    });
}

#[test]
fn node_never_acknowledges_a_failed_write_and_halts() {
    let seed = common::seed("node_write_failure");
    let mut rng = common::rng(seed);
    let runs = if common::soak() { 20 } else { 3 };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let exe = std::env::current_exe().expect("current exe");
    for run in 0..runs {
        let dir = tempfile::tempdir().expect("tempdir");
        // Room for the initial file plus a few MiB of commits; POSIX `ulimit -f` counts 512 B.
        let limit_kib: u64 = rng.random_range(3 * 1024..12 * 1024);
        let child = Command::new("/bin/sh")
            .arg("-c")
            .arg(format!(
                "trap '' XFSZ; ulimit -f {}; exec \"$0\" \"$@\"",
                limit_kib * 2
            ))
            .arg(&exe)
            .args([
                "--exact",
                "fsync_failure::child_node_until_write_error",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD_DIR, dir.path())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn child");
        let output = child.wait_with_output().expect("child output");
        let stdout = String::from_utf8_lossy(&output.stdout);
        let ctx = format!(
            "seed {seed}, run {run}, limit {limit_kib} KiB; child stderr:\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
        assert!(output.status.success(), "{ctx}");
        let mut acked = BTreeSet::new();
        let mut sent = BTreeSet::new();
        let mut failed = None;
        let mut after = 0;
        for line in stdout.lines() {
            let mut words = line.split_whitespace();
            match words.next() {
                Some("SEND") => sent.extend(words.map(|w| w.parse::<u64>().expect("id"))),
                Some("ACK") => {
                    assert!(
                        failed.is_none(),
                        "{ctx}: acknowledged after a failure: {line}"
                    );
                    acked.extend(words.filter_map(|w| w.parse::<u64>().ok()));
                }
                Some("FAIL") => failed = Some(line.to_owned()),
                Some(w) if w.starts_with("AFTER") => {
                    assert_eq!(words.next(), Some("storage"), "{ctx}: {line}");
                    after += 1;
                }
                Some("OPEN_FAIL") => panic!("{ctx}: the limit is below the initial file"),
                _ => {}
            }
        }
        let failed = failed.unwrap_or_else(|| panic!("{ctx}: no write failed:\n{stdout}"));
        assert!(failed.starts_with("FAIL storage"), "{ctx}: {failed}");
        assert_eq!(
            after, 4,
            "{ctx}: later writes were not all refused:\n{stdout}"
        );
        assert!(
            !acked.is_empty(),
            "{ctx}: nothing acknowledged before the failure"
        );
        // Restart without the limit.
        {
            let mut store = RedbStore::open(dir.path(), OpenOptions::default()).expect("reopen");
            assert!(store.check_integrity().expect("integrity"), "{ctx}");
            store.verify().expect("verify");
        }
        rt.block_on(async {
            let node = Node::open(NodeConfig::new(dir.path())).await.expect("open");
            let Value::ORSet(ids) = node.get(&Key::new(KeyKind::ORSet, "ids")).expect("get") else {
                panic!("orset")
            };
            let ids: BTreeSet<u64> = ids.iter().map(|s| s.parse().expect("id")).collect();
            let missing: Vec<_> = acked.difference(&ids).take(5).collect();
            assert!(
                missing.is_empty(),
                "{ctx}: acknowledged events lost: {missing:?}"
            );
            let phantom: Vec<_> = ids.difference(&sent).take(5).collect();
            assert!(phantom.is_empty(), "{ctx}: events never sent: {phantom:?}");
            assert_eq!(
                node.get(&Key::new(KeyKind::GCounter, "events"))
                    .expect("get"),
                Value::GCounter(ids.len() as u64),
                "{ctx}: counted twice"
            );
            let r = node
                .ingest("s", acked.iter().map(|s| event(*s)).collect::<Vec<_>>())
                .await
                .expect("re-ingest");
            assert_eq!((r.applied, r.duplicates), (0, acked.len()), "{ctx}");
            node.apply(Op::inc_gcounter("plain", 1))
                .await
                .expect("writes work after the restart");
            node.shutdown().await.expect("shutdown");
            println!(
                "node_write_failure run {run}: limit {limit_kib} KiB, {} acked, {} applied, \
                 failure: {failed}",
                acked.len(),
                ids.len()
            );
        });
    }
}
