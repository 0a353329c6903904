//! `GET /metrics`: Prometheus text (prometheus-client) from the node's counters
//! ([`crate::metrics`]), its replication status and the HTTP layer's own counters.

use crate::driver::ReplicationStatus;
use crate::metrics::MetricsSnapshot;
use crate::proto::PeerId;
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Registry, Unit};
use std::collections::BTreeMap;
use std::sync::atomic::AtomicU64;

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
    /// The live watch and final-window consumers (`tidemark_watch_consumer_*`).
    pub(crate) consumers: std::sync::Arc<super::consumers::Consumers>,
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
            consumers: std::sync::Arc::default(),
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

/// Per member SWIM knows, its state as a state set (1 for its state, 0 for the others;
/// `decommissioned` for a member removed for good, whatever SWIM last heard of it), and the
/// seconds since this node last heard from it.
fn register_members(
    r: &mut Registry,
    members: &[crate::net::MemberStatus],
    gone: &std::collections::BTreeSet<String>,
) {
    if members.is_empty() {
        return;
    }
    let state: Family<Labels, Gauge> = Family::default();
    let contact: Family<Labels, Gauge<f64, AtomicU64>> = Family::default();
    for m in members {
        let now = match m.state {
            _ if gone.contains(&m.replica.replace('-', "")) => "decommissioned",
            crate::net::MemberState::Alive => "alive",
            crate::net::MemberState::Suspect => "suspect",
            crate::net::MemberState::Down if m.left => "left",
            crate::net::MemberState::Down => "down",
        };
        for st in ["alive", "suspect", "down", "left", "decommissioned"] {
            state
                .get_or_create(&vec![("member", m.name.clone()), ("state", st.to_owned())])
                .set(i64::from(st == now));
        }
        if let Some(ms) = m.last_contact_ms {
            contact
                .get_or_create(&vec![("member", m.name.clone())])
                .set(ms as f64 / 1000.0);
        }
    }
    r.register(
        "member_state",
        "Per member SWIM knows, 1 for its state (alive, suspect, down, left, decommissioned), \
         0 for the others",
        state,
    );
    r.register_with_unit(
        "member_last_contact",
        "Per member, time since this node last heard from it",
        Unit::Seconds,
        contact,
    );
}

/// Per view: events by result, and the watermarks (epoch seconds) with this node's lag
/// behind its clock. A watermark not announced yet is left out (no sample), not zero.
fn register_views(r: &mut Registry, views: &[crate::views::ViewSummary], now_ms: u64) {
    if views.is_empty() {
        return;
    }
    let events: Family<Labels, Counter> = Family::default();
    let wm: Family<Labels, Gauge<f64, AtomicU64>> = Family::default();
    let cluster: Family<Labels, Gauge<f64, AtomicU64>> = Family::default();
    let lag: Family<Labels, Gauge<f64, AtomicU64>> = Family::default();
    let conflicts: Family<Labels, Gauge> = Family::default();
    for v in views {
        let name = &v.definition.name;
        let labels = |extra: Option<(&'static str, &str)>| {
            let mut l: Labels = vec![
                ("view", name.clone()),
                ("stream", v.definition.stream.clone()),
            ];
            l.extend(extra.map(|(k, x)| (k, x.to_owned())));
            l
        };
        let c = &v.counters;
        for (result, n) in [
            ("folded", c.folded),
            ("late", c.late),
            ("rejected", c.rejected),
        ] {
            events
                .get_or_create(&labels(Some(("result", result))))
                .inc_by(n);
        }
        if let Some(w) = v.watermark {
            wm.get_or_create(&labels(None)).set(w as f64 / 1000.0);
            lag.get_or_create(&labels(None))
                .set(now_ms.saturating_sub(w) as f64 / 1000.0);
        }
        if let Some(w) = v.cluster_watermark {
            cluster.get_or_create(&labels(None)).set(w as f64 / 1000.0);
        }
        conflicts
            .get_or_create(&labels(None))
            .set(v.definition_conflicts.len() as i64);
    }
    r.register(
        "view_events",
        "Per view, stream events by result (folded into a window, late for one, rejected)",
        events,
    );
    r.register_with_unit(
        "view_watermark",
        "Per view, this node's announced watermark of its stream (epoch seconds)",
        Unit::Seconds,
        wm,
    );
    r.register_with_unit(
        "view_cluster_watermark",
        "Per view, the watermark every member has passed, as this node can vouch (epoch \
         seconds; windows end plus lateness below it are final)",
        Unit::Seconds,
        cluster,
    );
    r.register_with_unit(
        "view_watermark_lag",
        "Per view, how far this node's watermark trails its clock",
        Unit::Seconds,
        lag,
    );
    r.register(
        "view_definition_conflicts",
        "Per view, replicas announcing another definition of its stream's views (no window \
         is final while above 0)",
        conflicts,
    );
}

fn labelled(pairs: &[(&'static str, &str, u64)]) -> Family<Labels, Counter> {
    let f: Family<Labels, Counter> = Family::default();
    for (k, v, n) in pairs {
        f.get_or_create(&vec![(*k, (*v).to_owned())]).inc_by(*n);
    }
    f
}

/// The labels of a per-peer replication sample: `peer` (its id, hex) and, where the peer's
/// node name is known (a connected peer or a member SWIM knows), `member` (that name, the
/// label of the `tidemark_member_*` families, so the two join on it).
fn peer_labels(peer: PeerId, names: &BTreeMap<PeerId, String>) -> Labels {
    let mut labels = vec![("peer", format!("{:016x}", peer.0))];
    if let Some(name) = names.get(&peer) {
        labels.push(("member", name.clone()));
    }
    labels
}

/// The node names of the peers `net` knows (connected now or members SWIM knows), by peer id.
pub(crate) fn peer_names(net: Option<&crate::net::NetStatus>) -> BTreeMap<PeerId, String> {
    net.map(|n| {
        n.peers
            .iter()
            .chain(n.members.iter().map(|m| &m.name))
            .map(|name| (crate::net::peer_id_of_name(name), name.clone()))
            .collect()
    })
    .unwrap_or_default()
}

/// A peer's replication lag in seconds, as `GET /v1/cluster` and `/metrics` both report it:
/// for a peer linked since open (connected now or not: `acked` is its entry of
/// [`ReplicationStatus::peer_acked`]), the time since it last had acknowledged our whole log;
/// `None` for a peer replication knows nothing of.
pub(crate) fn peer_lag_seconds(
    rep: &ReplicationStatus,
    peer: PeerId,
    acked: Option<u64>,
) -> Option<f64> {
    // It has our whole log (away or not): nothing to wait for, however long ago that was.
    if acked.is_some_and(|a| a >= rep.log_bounds.1) {
        return Some(0.0);
    }
    let ms = rep
        .peer_lag_ms
        .iter()
        .find(|(p, _)| *p == peer)
        .map(|(_, ms)| *ms);
    match ms {
        Some(ms) => Some(ms as f64 / 1000.0),
        // Linked but not yet noted by the writer: caught up only if it has the whole log.
        None => acked.is_some_and(|a| a >= rep.log_bounds.1).then_some(0.0),
    }
}

/// Per peer of `rep.peer_acked` that acknowledged something, the encoded bytes of our log
/// entries after its acknowledged cursor: its lag in bytes, a lower bound marked not `exact`
/// past [`crate::store::LOG_BYTES_ENTRIES_MAX`] entries. A peer that acknowledged nothing yet
/// (its lag is unknown) or whose bytes could not be read is left out.
pub(crate) fn lag_bytes(
    node: &crate::node::Node,
    rep: &ReplicationStatus,
) -> BTreeMap<PeerId, crate::store::LogBytes> {
    let (start, end) = rep.log_bounds;
    rep.peer_acked
        .iter()
        .filter_map(|(peer, acked)| {
            let from = (*acked)?.max(start);
            node.log_bytes(from, end).ok().map(|b| (*peer, b))
        })
        .collect()
}

/// The change feed's ring and how far behind its watchers are (`tidemark_watch_*`).
fn register_watch(r: &mut Registry, w: &crate::watch::FeedStatus) {
    let gauge = |v: usize| ConstGauge::new(i64::try_from(v).unwrap_or(i64::MAX));
    r.register(
        "watch_held_changes",
        "Recent changes the node holds for watchers to read and resume from (limits.watch_buffer_max)",
        gauge(w.held_changes),
    );
    r.register_with_unit(
        "watch_held",
        "Bytes of the changes held for watchers, shared by all of them (limits.watch_buffer_bytes_max)",
        Unit::Bytes,
        gauge(w.held_bytes),
    );
    r.register(
        "watch_recording",
        "1 while changes are recorded for watchers (someone watches, or did within limits.watch_resume_secs)",
        ConstGauge::new(i64::from(w.recording)),
    );
    r.register(
        "watch_consumers",
        "Watch streams following the change feed now",
        gauge(w.watchers.len()),
    );
    let max_changes = w.watchers.iter().map(|b| b.changes).max().unwrap_or(0);
    let max_secs = w
        .watchers
        .iter()
        .map(|b| b.age.as_secs_f64())
        .fold(0.0, f64::max);
    let max_bytes = w.watchers.iter().map(|b| b.bytes).max().unwrap_or(0);
    r.register(
        "watch_behind_changes_max",
        "Changes the furthest-behind watcher has not read yet (past the ring it is reset)",
        ConstGauge::new(i64::try_from(max_changes).unwrap_or(i64::MAX)),
    );
    r.register_with_unit(
        "watch_behind_max",
        "Age of the oldest change the furthest-behind watcher has not read yet",
        Unit::Seconds,
        ConstGauge::new(max_secs),
    );
    r.register_with_unit(
        "watch_behind_held_max",
        "Bytes of held changes the furthest-behind watcher has not read yet (held once, in the shared ring)",
        Unit::Bytes,
        gauge(max_bytes),
    );
}

/// Per live feed consumer, how far behind it is and what is held for it
/// (`tidemark_watch_consumer_*{consumer,kind}`). No family when no consumer is open.
fn register_consumers(
    r: &mut Registry,
    consumers: &[super::consumers::ConsumerStatus],
    watchers_max: usize,
) {
    if consumers.is_empty() {
        return;
    }
    let entries: Family<Labels, Gauge> = Family::default();
    let seconds: Family<Labels, Gauge<f64, AtomicU64>> = Family::default();
    let bytes: Family<Labels, Gauge> = Family::default();
    for c in consumers {
        let labels: Labels = vec![("consumer", c.id.to_string()), ("kind", c.kind.to_owned())];
        entries
            .get_or_create(&labels)
            .set(i64::try_from(c.behind_entries).unwrap_or(i64::MAX));
        seconds.get_or_create(&labels).set(c.behind_seconds);
        bytes
            .get_or_create(&labels)
            .set(i64::try_from(c.buffered_bytes).unwrap_or(i64::MAX));
    }
    let bound = format!(
        "one series per open consumer (consumer: its id in this process; kind: watch for \
         GET /v1/watch, final for GET /v1/views/VIEW/final), gone when it disconnects, at most \
         http.watchers_max ({watchers_max}) as each holds a watcher slot"
    );
    r.register(
        "watch_consumer_behind_entries",
        format!(
            "Per feed consumer, entries it has not been sent: watch, the changes published after \
             its position (of any key); final, the windows final on this node after its \
             position (counted up to {} past its page); {bound}",
            super::consumers::FINAL_COUNT_MAX
        ),
        entries,
    );
    r.register_with_unit(
        "watch_consumer_behind",
        format!(
            "Per feed consumer, watch: the age of the oldest change it has not read; final: the \
             time since its feed was last caught up (or opened); 0 while caught up; {bound}"
        ),
        Unit::Seconds,
        seconds,
    );
    r.register_with_unit(
        "watch_consumer_buffered",
        format!(
            "Per feed consumer, bytes held for it and not sent: watch, the held changes after \
             its position (in the ring shared by every watcher, at most \
             limits.watch_buffer_bytes_max); final, the windows read into its page (at most \
             64, as JSON); {bound}"
        ),
        Unit::Bytes,
        bytes,
    );
}

/// The replica ids removed for good (`gone`, as [`crate::Node::decommissioned`] lists them)
/// as 32 hex digits, and the peer ids of the members SWIM knows among them.
pub(crate) fn gone_members(
    gone: &[crate::ReplicaId],
    members: &[crate::net::MemberStatus],
) -> (
    std::collections::BTreeSet<String>,
    std::collections::BTreeSet<PeerId>,
) {
    let ids: std::collections::BTreeSet<String> = gone.iter().map(ToString::to_string).collect();
    let peers = members
        .iter()
        .filter(|m| ids.contains(&m.replica.replace('-', "")))
        .map(|m| crate::net::peer_id_of_name(&m.name))
        .collect();
    (ids, peers)
}

/// Everything a scrape reports, gathered before encoding.
pub(crate) struct Scrape<'a> {
    pub(crate) node: MetricsSnapshot,
    pub(crate) commits: crate::metrics::CommitHistograms,
    pub(crate) replication: Option<ReplicationStatus>,
    /// The node names of known peers ([`peer_names`]): the `member` label of per-peer samples.
    pub(crate) peer_names: BTreeMap<PeerId, String>,
    /// Per peer, its lag in bytes ([`lag_bytes`]).
    pub(crate) lag_bytes: BTreeMap<PeerId, crate::store::LogBytes>,
    pub(crate) store_bytes: u64,
    pub(crate) net: Option<crate::net::NetStatsSnapshot>,
    pub(crate) http: &'a HttpMetrics,
    /// Requests holding one of the `http.concurrency_max` slots right now.
    pub(crate) requests_in_flight: u64,
    /// This process's resource use (`process_*`), where the platform reports it.
    pub(crate) process: Option<crate::metrics::ProcessStats>,
    /// Every configured view with where it stands (empty when they could not be read).
    pub(crate) views: Vec<crate::views::ViewSummary>,
    /// Every member SWIM knows (empty for a node without a network).
    pub(crate) members: Vec<crate::net::MemberStatus>,
    /// The replica ids (32 hex digits) removed for good ([`crate::Node::decommissioned`]).
    pub(crate) gone: std::collections::BTreeSet<String>,
    /// The peer ids of the members removed for good: no lag sample is reported for them.
    pub(crate) gone_peers: std::collections::BTreeSet<PeerId>,
    /// This node's wall clock (ms) at the scrape: watermark lag is measured against it.
    pub(crate) now_ms: u64,
    /// The change feed's ring and its watchers.
    pub(crate) watch: crate::watch::FeedStatus,
    /// The live watch and final-window consumers of this server.
    pub(crate) consumers: Vec<super::consumers::ConsumerStatus>,
    /// `http.watchers_max`: the bound on consumers (named in the help text).
    pub(crate) watchers_max: usize,
}

/// Renders a scrape in `format`.
pub(crate) fn render(s: &Scrape<'_>, format: Format) -> Result<String, std::fmt::Error> {
    let mut r = Registry::with_prefix("tidemark");
    let n = &s.node;
    r.register(
        "writes",
        "Client writes (ops and stream events, one each) this node acknowledged or refused, by \
         result; writes replicated from peers are counted by tidemark_deltas_applied",
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
        "commits_inline",
        "Commit groups of a lone small write committed on its caller's thread while the \
         writer was idle (part of tidemark_commits)",
        ConstCounter::new(n.commits_inline),
    );
    r.register(
        "commit_group_writes",
        "Writes carried by commit groups (divide by commits for the mean group size)",
        ConstCounter::new(n.commit_groups_ops),
    );
    r.register_with_unit(
        "commit_duration",
        "Time spent in durable commits (fsync included)",
        Unit::Seconds,
        ConstCounter::new(n.commit_latency_us_sum as f64 / 1e6),
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
        "wal",
        "Write-ahead log bytes since the last checkpoint (replayed by a restart after a crash)",
        Unit::Bytes,
        ConstGauge::new(i64::try_from(n.wal_bytes).unwrap_or(i64::MAX)),
    );
    r.register(
        "checkpoints",
        "Checkpoints of the write-ahead log since the node started",
        ConstCounter::new(n.checkpoints),
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
        let labels = |peer: &PeerId| peer_labels(*peer, &s.peer_names);
        let lag: Family<Labels, Gauge> = Family::default();
        // A peer that acknowledged nothing yet has no sample (its lag is unknown), and a
        // decommissioned member none (it is not waited for any more).
        for (peer, acked) in &rep.peer_acked {
            let Some(acked) = acked.filter(|_| !s.gone_peers.contains(peer)) else {
                continue;
            };
            let behind = rep.log_bounds.1.saturating_sub(acked);
            lag.get_or_create(&labels(peer)).set(behind as i64);
        }
        r.register(
            "replication_lag_entries",
            "Per peer linked since start (connected or not), our log entries it has not \
             acknowledged",
            lag,
        );
        let lag_secs: Family<Labels, Gauge<f64, AtomicU64>> = Family::default();
        for (peer, acked) in &rep.peer_acked {
            if s.gone_peers.contains(peer) {
                continue;
            }
            if let Some(secs) = peer_lag_seconds(rep, *peer, *acked) {
                lag_secs.get_or_create(&labels(peer)).set(secs);
            }
        }
        let lag_bytes: Family<Labels, Gauge> = Family::default();
        for (peer, b) in s
            .lag_bytes
            .iter()
            .filter(|(p, _)| !s.gone_peers.contains(p))
        {
            lag_bytes
                .get_or_create(&labels(peer))
                .set(i64::try_from(b.bytes).unwrap_or(i64::MAX));
        }
        r.register_with_unit(
            "replication_lag",
            "Per peer linked since start, the encoded bytes of our log entries it has not \
             acknowledged (a lower bound past 4096 entries)",
            Unit::Bytes,
            lag_bytes,
        );
        r.register_with_unit(
            "replication_lag",
            "Per peer linked since start (connected or not), time since it last had \
             acknowledged our whole log (0 while caught up)",
            Unit::Seconds,
            lag_secs,
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
            "Delta-intervals joined from peers (the replicated writes this node applied)",
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
    register_views(&mut r, &s.views, s.now_ms);
    register_members(&mut r, &s.members, &s.gone);
    register_watch(&mut r, &s.watch);
    register_consumers(&mut r, &s.consumers, s.watchers_max);
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
        r.register(
            "peer_name_conflicts",
            "Peers refused for claiming the name of another member that is alive (connections \
             refused, refusals by the peer, identities SWIM ignored)",
            ConstCounter::new(net.name_conflicts),
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
    r.register(
        "http_requests_in_flight",
        "Requests holding one of the http.concurrency_max slots (probes, metrics and watch streams hold none)",
        ConstGauge::new(i64::try_from(s.requests_in_flight).unwrap_or(i64::MAX)),
    );
    let build: Family<Labels, Gauge> = Family::default();
    build
        .get_or_create(&vec![("version", env!("CARGO_PKG_VERSION").to_owned())])
        .set(1);
    r.register(
        "build_info",
        "Always 1; the version label is this node's release",
        build,
    );
    // The standard `process_*` metrics, without the `tidemark` prefix.
    let mut process = Registry::default();
    if let Some(p) = &s.process {
        process.register_with_unit(
            "process_cpu",
            "Total user and system CPU time spent",
            Unit::Seconds,
            ConstCounter::new(p.cpu_seconds),
        );
        process.register_with_unit(
            "process_resident_memory",
            "Resident memory size",
            Unit::Bytes,
            ConstGauge::new(p.resident_memory_bytes as i64),
        );
        process.register_with_unit(
            "process_virtual_memory",
            "Virtual memory size",
            Unit::Bytes,
            ConstGauge::new(p.virtual_memory_bytes as i64),
        );
        process.register(
            "process_open_fds",
            "Open file descriptors",
            ConstGauge::new(p.open_fds as i64),
        );
        if let Some(max) = p.max_fds {
            process.register(
                "process_max_fds",
                "Limit on open file descriptors",
                ConstGauge::new(max as i64),
            );
        }
        process.register_with_unit(
            "process_start_time",
            "Start time of the process since the Unix epoch",
            Unit::Seconds,
            ConstGauge::new(p.start_time_seconds),
        );
    }
    let mut out = String::new();
    prometheus_client::encoding::text::encode_registry(&mut out, &r)?;
    prometheus_client::encoding::text::encode_registry(&mut out, &process)?;
    match format {
        Format::OpenMetrics => {
            prometheus_client::encoding::text::encode_eof(&mut out)?;
            Ok(out)
        }
        Format::Text004 => Ok(text_004(&out)),
    }
}

/// The two exposition formats of `GET /metrics`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Format {
    /// Prometheus text format 0.0.4 (`text/plain; version=0.0.4`): the default.
    Text004,
    /// OpenMetrics 1.0 (`application/openmetrics-text`): when the client's `Accept` asks.
    OpenMetrics,
}

impl Format {
    /// OpenMetrics when `accept` names `application/openmetrics-text` (with a non-zero
    /// quality), else the Prometheus text format.
    pub(crate) fn negotiate(accept: Option<&str>) -> Self {
        let asks = accept.is_some_and(|a| {
            a.split(',').any(|item| {
                let mut parts = item.split(';').map(str::trim);
                let media = parts.next().unwrap_or_default();
                let refused = parts.any(|p| {
                    p.strip_prefix("q=")
                        .and_then(|q| q.parse::<f64>().ok())
                        .is_some_and(|q| q <= 0.0)
                });
                media.eq_ignore_ascii_case("application/openmetrics-text") && !refused
            })
        });
        if asks {
            Format::OpenMetrics
        } else {
            Format::Text004
        }
    }

    /// The `Content-Type` of an answer in this format.
    pub(crate) fn content_type(self) -> &'static str {
        match self {
            Format::Text004 => "text/plain; version=0.0.4; charset=utf-8",
            Format::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
        }
    }
}

/// Rewrites prometheus-client's OpenMetrics text as Prometheus text 0.0.4: a counter family is
/// named by its samples' `_total` name (its `# HELP` and `# TYPE` lines would otherwise name
/// no sample, which Prometheus and promtool read as metrics without help), and the
/// OpenMetrics-only `# UNIT` and `# EOF` lines go.
pub(crate) fn text_004(openmetrics: &str) -> String {
    let mut out = String::with_capacity(openmetrics.len());
    let mut help: Option<&str> = None;
    for line in openmetrics.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        if let Some(rest) = line.strip_prefix("# HELP ") {
            if let Some(h) = help.take() {
                out.push_str(h);
                out.push('\n');
            }
            help = Some(rest);
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap_or((rest, ""));
            let renamed = if kind == "counter" && !name.ends_with("_total") {
                format!("{name}_total")
            } else {
                name.to_owned()
            };
            if let Some(h) = help.take() {
                let text = h.split_once(' ').map_or("", |(_, t)| t);
                out.push_str(&format!("# HELP {renamed} {text}\n"));
            }
            out.push_str(&format!("# TYPE {renamed} {kind}\n"));
            continue;
        }
        if let Some(h) = help.take() {
            out.push_str("# HELP ");
            out.push_str(h);
            out.push('\n');
        }
        out.push_str(line);
        out.push('\n');
    }
    out
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accept_selects_openmetrics_only_when_asked() {
        assert_eq!(Format::negotiate(None), Format::Text004);
        assert_eq!(Format::negotiate(Some("text/plain")), Format::Text004);
        assert_eq!(Format::negotiate(Some("*/*")), Format::Text004);
        assert_eq!(
            Format::negotiate(Some(
                "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
            )),
            Format::OpenMetrics
        );
        assert_eq!(
            Format::negotiate(Some("application/openmetrics-text; q=0, text/plain")),
            Format::Text004
        );
    }

    #[test]
    fn counters_are_named_by_their_samples_in_text_004() {
        let om = "# HELP t_writes Writes.\n# TYPE t_writes counter\nt_writes_total{r=\"a\"} 3\n\
                  # HELP t_d Time.\n# TYPE t_d_seconds counter\n# UNIT t_d_seconds seconds\n\
                  t_d_seconds_total 0.5\n# HELP t_g G.\n# TYPE t_g gauge\nt_g 1\n# EOF\n";
        assert_eq!(
            text_004(om),
            "# HELP t_writes_total Writes.\n# TYPE t_writes_total counter\nt_writes_total{r=\"a\"} 3\n\
             # HELP t_d_seconds_total Time.\n# TYPE t_d_seconds_total counter\nt_d_seconds_total 0.5\n\
             # HELP t_g G.\n# TYPE t_g gauge\nt_g 1\n"
        );
    }
}
