//! Commit metrics in `GET /metrics`: one observation per local commit group in
//! `tidemark_commit_group_ops`, `tidemark_commit_seconds` and (durable groups only)
//! `tidemark_fsync_seconds`, with exact counts, sums and buckets after known writes.

use crate::http_support;

use http_support::{Served, get, post};
use tidemark::Durability;

/// The value of the sample line `name` (exact match of everything before the value).
fn sample(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| {
            let (k, v) = l.rsplit_once(' ')?;
            (k == name).then(|| v.parse::<f64>().ok()).flatten()
        })
        .unwrap_or_else(|| panic!("no sample {name} in:\n{text}"))
}

fn metrics(s: &Served) -> String {
    let m = get(&s.url("/metrics"));
    assert_eq!(m.status, 200);
    m.text
}

fn inc(s: &Served, n: u64) {
    let ops: Vec<String> = (0..n)
        .map(|i| format!(r#"{{"type":"gcounter","key":"k{i}","op":"inc","by":1}}"#))
        .collect();
    let r = post(&s.url("/v1/ops"), format!("[{}]", ops.join(",")));
    assert_eq!(r.status, 200, "{}", r.text);
}

#[test]
fn commit_histograms_count_every_group_exactly() {
    let s = Served::start();
    let m = metrics(&s);
    assert_eq!(sample(&m, "tidemark_commit_group_ops_count"), 0.0);
    assert_eq!(sample(&m, "tidemark_fsync_seconds_count"), 0.0);
    // 20 sequential single-op requests: each is acknowledged before the next is sent, so each
    // is its own commit group.
    for _ in 0..20 {
        inc(&s, 1);
    }
    // One request of 10 ops: one group of 10.
    inc(&s, 10);
    let m = metrics(&s);
    assert_eq!(sample(&m, "tidemark_commit_group_ops_count"), 21.0);
    assert_eq!(sample(&m, "tidemark_commit_group_ops_sum"), 30.0);
    assert_eq!(
        sample(&m, r#"tidemark_commit_group_ops_bucket{le="1.0"}"#),
        20.0
    );
    assert_eq!(
        sample(&m, r#"tidemark_commit_group_ops_bucket{le="8.0"}"#),
        20.0
    );
    assert_eq!(
        sample(&m, r#"tidemark_commit_group_ops_bucket{le="16.0"}"#),
        21.0
    );
    assert_eq!(sample(&m, "tidemark_commit_seconds_count"), 21.0);
    assert_eq!(sample(&m, "tidemark_fsync_seconds_count"), 21.0);
    assert_eq!(
        sample(&m, r#"tidemark_fsync_seconds_bucket{le="+Inf"}"#),
        21.0
    );
    assert!(sample(&m, "tidemark_commit_seconds_sum") > 0.0);
    // A rejected batch commits nothing.
    let bad = post(
        &s.url("/v1/ops"),
        r#"[{"type":"gcounter","key":"x","op":"inc","by":1},{"type":"gcounter","key":"x","op":"nope"}]"#,
    );
    assert_eq!(bad.status, 400, "{}", bad.text);
    let m = metrics(&s);
    assert_eq!(sample(&m, "tidemark_commit_group_ops_count"), 21.0);
    // The older counters agree with the histograms.
    assert_eq!(sample(&m, "tidemark_commits_total"), 21.0);
}

#[test]
fn relaxed_commits_are_not_counted_as_fsyncs() {
    let s = Served::start_with(|n, _| n.durability = Durability::Relaxed);
    for _ in 0..5 {
        inc(&s, 1);
    }
    let m = metrics(&s);
    assert_eq!(sample(&m, "tidemark_commit_group_ops_count"), 5.0);
    assert_eq!(sample(&m, "tidemark_commit_seconds_count"), 5.0);
    assert_eq!(sample(&m, "tidemark_fsync_seconds_count"), 0.0);
}

/// The write-ahead log's metrics: writes grow `tidemark_wal_bytes`; once the log has been
/// still for a second the writer checkpoints it (`tidemark_checkpoints_total` counts it) and
/// the log is empty again — what a restart after a crash would replay is then nothing.
#[test]
fn an_idle_log_is_checkpointed_and_the_metrics_say_so() {
    let s = Served::start();
    for _ in 0..5 {
        inc(&s, 3);
    }
    let m = metrics(&s);
    let before = sample(&m, "tidemark_checkpoints_total");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let m = metrics(&s);
        let (wal, checkpoints) = (
            sample(&m, "tidemark_wal_bytes"),
            sample(&m, "tidemark_checkpoints_total"),
        );
        if wal == 0.0 && checkpoints > before {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no idle checkpoint within 20 s (wal {wal} bytes, checkpoints {checkpoints})"
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}
