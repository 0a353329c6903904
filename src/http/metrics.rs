//! `GET /metrics`: Prometheus text (prometheus-client) from the node's counters
//! ([`crate::metrics`]), its replication status and the HTTP layer's own counters.

use crate::driver::ReplicationStatus;
use crate::metrics::MetricsSnapshot;
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Registry, Unit};

type Labels = Vec<(&'static str, String)>;

fn latency_histogram() -> Histogram {
    // 100 µs .. ~26 s.
    Histogram::new(exponential_buckets(0.0001, 2.0, 19))
}

/// Counters of the HTTP layer (cheap to clone: every field shares its value).
#[derive(Clone, Debug)]
pub(crate) struct HttpMetrics {
    pub(crate) requests: Family<Labels, Counter>,
    pub(crate) duration: Family<Labels, Histogram>,
    pub(crate) rejected: Family<Labels, Counter>,
    pub(crate) events: Family<Labels, Counter>,
    pub(crate) connections_open: Gauge,
    pub(crate) connections_refused: Counter,
    pub(crate) watchers: Gauge,
}

impl Default for HttpMetrics {
    fn default() -> Self {
        Self {
            requests: Family::default(),
            duration: Family::new_with_constructor(latency_histogram),
            rejected: Family::default(),
            events: Family::default(),
            connections_open: Gauge::default(),
            connections_refused: Counter::default(),
            watchers: Gauge::default(),
        }
    }
}

impl HttpMetrics {
    pub(crate) fn rejected(&self, reason: &'static str) {
        self.rejected
            .get_or_create(&vec![("reason", reason.to_owned())])
            .inc();
    }
    pub(crate) fn events(&self, result: &'static str, n: u64) {
        if n > 0 {
            self.events
                .get_or_create(&vec![("result", result.to_owned())])
                .inc_by(n);
        }
    }
}

fn labelled(pairs: &[(&'static str, &str, u64)]) -> Family<Labels, Counter> {
    let f: Family<Labels, Counter> = Family::default();
    for (k, v, n) in pairs {
        f.get_or_create(&vec![(*k, (*v).to_owned())]).inc_by(*n);
    }
    f
}

/// Everything a scrape reports, gathered before encoding.
pub(crate) struct Scrape<'a> {
    pub(crate) node: MetricsSnapshot,
    pub(crate) commits: crate::metrics::CommitHistograms,
    pub(crate) replication: Option<ReplicationStatus>,
    pub(crate) store_bytes: u64,
    pub(crate) net: Option<crate::net::NetStatsSnapshot>,
    pub(crate) http: &'a HttpMetrics,
}

/// Renders a scrape as Prometheus text (OpenMetrics-compatible).
pub(crate) fn render(s: &Scrape<'_>) -> Result<String, std::fmt::Error> {
    let mut r = Registry::with_prefix("tidemark");
    let n = &s.node;
    r.register(
        "writes",
        "Writes (ops or events) by result",
        labelled(&[
            ("result", "applied", n.ops_applied),
            ("result", "duplicate", n.duplicates),
            ("result", "rejected", n.rejected_ops),
            ("result", "backpressure", n.backpressure),
        ]),
    );
    r.register(
        "commits",
        "Durable commit groups",
        ConstCounter::new(n.commits),
    );
    r.register(
        "commit_group_writes",
        "Writes carried by commit groups (divide by commits for the mean group size)",
        ConstCounter::new(n.commit_groups_ops),
    );
    r.register(
        "commit_group_writes_max",
        "Largest commit group so far",
        ConstGauge::new(n.commit_group_max as i64),
    );
    r.register_with_unit(
        "commit_duration",
        "Time spent in durable commits (fsync included)",
        Unit::Seconds,
        ConstCounter::new(n.commit_latency_us_sum as f64 / 1e6),
    );
    r.register_with_unit(
        "commit_duration_max",
        "Longest durable commit so far",
        Unit::Seconds,
        ConstGauge::new(n.commit_latency_us_max as f64 / 1e6),
    );
    r.register(
        "commit_group_ops",
        "Ops per local commit group (one observation per group)",
        s.commits.group_ops.clone(),
    );
    r.register_with_unit(
        "commit",
        "Latency of each local commit group (redb transaction, fsync included when durable)",
        Unit::Seconds,
        s.commits.commit_seconds.clone(),
    );
    r.register_with_unit(
        "fsync",
        "Latency of each durable local commit group, fsync included (immediate durability)",
        Unit::Seconds,
        s.commits.fsync_seconds.clone(),
    );
    r.register(
        "log_entries",
        "Retained delta-log entries",
        ConstGauge::new(n.log_entries as i64),
    );
    r.register_with_unit(
        "compaction_reclaimed",
        "Log bytes reclaimed by compaction",
        Unit::Bytes,
        ConstCounter::new(n.compaction_reclaimed_bytes),
    );
    r.register(
        "remote_rejected",
        "Remote deltas rejected by validation",
        ConstCounter::new(n.remote_rejected),
    );
    r.register(
        "hlc_rejected",
        "Remote timestamps too far ahead of the local clock",
        ConstCounter::new(n.hlc_rejected),
    );
    r.register(
        "reidentified",
        "Times the data directory was found to be a restored copy and took a new replica id",
        ConstCounter::new(n.reidentified),
    );
    r.register_with_unit(
        "store",
        "Size of the data directory",
        Unit::Bytes,
        ConstGauge::new(s.store_bytes as i64),
    );
    if let Some(rep) = &s.replication {
        let lag: Family<Labels, Gauge> = Family::default();
        for (peer, acked) in &rep.peer_acked {
            let behind = rep
                .log_bounds
                .1
                .saturating_sub(acked.unwrap_or(rep.log_bounds.0));
            lag.get_or_create(&vec![("peer", format!("{:016x}", peer.0))])
                .set(behind as i64);
        }
        r.register(
            "replication_lag_entries",
            "Per peer, our log entries it has not acknowledged",
            lag,
        );
        r.register(
            "peers_connected",
            "Peers connected now",
            ConstGauge::new(rep.peers_connected.len() as i64),
        );
        let st = &rep.stats;
        r.register(
            "deltas_sent",
            "Delta-intervals sent",
            ConstCounter::new(st.deltas_sent),
        );
        r.register(
            "deltas_applied",
            "Delta-intervals joined",
            ConstCounter::new(st.deltas_applied),
        );
        r.register(
            "state_transfers",
            "State transfers by direction",
            labelled(&[
                ("direction", "sent", st.transfers_started),
                ("direction", "received", st.transfers_received),
            ]),
        );
        r.register(
            "frames_rejected",
            "Peer frames that could not be decoded",
            ConstCounter::new(rep.frames_rejected),
        );
    }
    if let Some(net) = &s.net {
        r.register(
            "peer_connections",
            "Peer connections by result (established, refused: TLS or identity failures)",
            labelled(&[
                ("result", "established", net.connections_established),
                ("result", "refused", net.connections_refused),
            ]),
        );
        r.register(
            "peers_disconnected",
            "Authenticated peers disconnected for breaking the protocol",
            ConstCounter::new(net.peers_disconnected),
        );
        r.register_with_unit(
            "peer_frame",
            "Replication frame bytes by direction",
            Unit::Bytes,
            labelled(&[
                ("direction", "sent", net.frame_bytes_sent),
                ("direction", "received", net.frame_bytes_received),
            ]),
        );
        r.register_with_unit(
            "peer_udp",
            "UDP payload bytes of peer connections by direction (QUIC and TLS included)",
            Unit::Bytes,
            labelled(&[
                ("direction", "sent", net.udp_bytes_sent),
                ("direction", "received", net.udp_bytes_received),
            ]),
        );
    }
    let h = s.http;
    r.register(
        "http_requests",
        "HTTP requests by route and status",
        h.requests.clone(),
    );
    r.register_with_unit(
        "http_request_duration",
        "HTTP request latency by route (writes include the durable commit)",
        Unit::Seconds,
        h.duration.clone(),
    );
    r.register(
        "http_rejected",
        "HTTP requests refused by a bound (reason: concurrency, watchers, auth, headers, body, line)",
        h.rejected.clone(),
    );
    r.register(
        "ingest_events",
        "Streamed events by result (accepted, duplicate, late, rejected)",
        h.events.clone(),
    );
    r.register(
        "http_connections_open",
        "Open HTTP connections",
        h.connections_open.clone(),
    );
    r.register(
        "http_connections_refused",
        "HTTP connections closed at once over http.connections_max",
        h.connections_refused.clone(),
    );
    r.register("http_watchers", "Open watch streams", h.watchers.clone());
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, &r)?;
    Ok(out)
}

/// Bytes of the regular files directly in `dir` (the redb file and its companions).
pub(crate) fn dir_bytes(dir: &std::path::Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .filter_map(|e| e.metadata().ok())
                .filter(std::fs::Metadata::is_file)
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}
