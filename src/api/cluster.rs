//! The cluster as one node sees it (`GET /v1/cluster`) and member removal
//! (`POST /v1/cluster/members/{name}/remove`).

use serde::{Deserialize, Serialize};

/// The node's delta log bounds: `{"end","start"}`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogBounds {
    /// The cursor after the last entry.
    pub end: u64,
    /// The first entry kept.
    pub start: u64,
}

/// The answering node itself (`node` of `GET /v1/cluster`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterNode {
    /// Its data directory, canonical where it resolves.
    pub data_dir: String,
    /// The file holding its data as `device:inode` (`null` where not known), so
    /// `tidemark snapshot --data DIR` can tell it talks to DIR's own node.
    pub data_file: Option<String>,
    /// The cluster recorded this node as removed for good.
    pub decommissioned: bool,
    /// Its store epoch (bumped at every start).
    pub epoch: u64,
    /// The address its HTTP API listens on.
    pub http: String,
    /// Its delta log bounds.
    pub log: LogBounds,
    /// Its node name (from its certificate); `null` without the peer network.
    pub name: Option<String>,
    /// Its peer id (16 hex digits).
    pub peer: String,
    /// The address its peer endpoint listens on; `null` without the peer network.
    pub peer_listen: Option<String>,
    /// Its replica id.
    pub replica: String,
    /// Its build version.
    pub version: String,
    /// Ops and events applied since it opened.
    pub writes_applied: u64,
}

/// One member of the cluster (`members` of `GET /v1/cluster`): every member SWIM knows, the
/// members known from earlier runs, and connected peers SWIM does not know yet (state
/// `connected`: `addr`, `epoch`, `incarnation` and `replica` are then omitted). `acked` and
/// every `lag_*` are `null` together when replication knows nothing of it (and for a member
/// removed for good).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ClusterMember {
    /// The last cursor into our log it acknowledged since this node opened.
    pub acked: Option<u64>,
    /// Its peer endpoint address (omitted for a `connected` peer SWIM does not know).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub addr: Option<String>,
    /// A peer connection to it is up.
    pub connected: bool,
    /// Its store epoch (omitted for a `connected` peer SWIM does not know).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epoch: Option<u64>,
    /// Its SWIM incarnation (omitted for a `connected` peer SWIM does not know).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub incarnation: Option<u16>,
    /// Encoded bytes of our log entries after `acked` (a lower bound when `lag_bytes_exact`
    /// is false).
    pub lag_bytes: Option<u64>,
    /// Whether `lag_bytes` counts every entry.
    pub lag_bytes_exact: Option<bool>,
    /// Our log entries after `acked`.
    pub lag_entries: Option<u64>,
    /// Seconds since it last had our whole log (0 while caught up).
    pub lag_seconds: Option<f64>,
    /// Seconds since this node last heard from it (`null`: never).
    pub last_contact: Option<f64>,
    /// Its node name.
    pub name: String,
    /// Its peer id (16 hex digits).
    pub peer: String,
    /// Its replica id (omitted for a `connected` peer SWIM does not know).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replica: Option<String>,
    /// `alive`, `suspect`, `down`, `left`, `decommissioned` or `connected`.
    pub state: String,
    /// The build version it announced (`null`: not known).
    pub version: Option<String>,
}

/// One replication peer (`peers` of `GET /v1/cluster`; members removed for good are left
/// out).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterPeer {
    /// The last cursor into our log it acknowledged (`null`: nothing yet).
    pub acked: Option<u64>,
    /// A peer connection to it is up.
    pub connected: bool,
    /// Encoded bytes of our log entries after `acked`.
    pub lag_bytes: Option<u64>,
    /// Whether `lag_bytes` counts every entry.
    pub lag_bytes_exact: Option<bool>,
    /// Our log entries after `acked` (`null` exactly when `acked` is).
    pub lag_entries: Option<u64>,
    /// Its node name where known.
    pub name: Option<String>,
    /// Its peer id (16 hex digits).
    pub peer: String,
}

/// One member as SWIM sees it, raw (`swim` of `GET /v1/cluster`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SwimMember {
    /// Its peer endpoint address.
    pub addr: String,
    /// Its store epoch.
    pub epoch: u64,
    /// Its SWIM incarnation.
    pub incarnation: u16,
    /// Milliseconds since this node last received a SWIM datagram from it (`null`: never).
    pub last_contact_ms: Option<u64>,
    /// Down because it said goodbye.
    pub left: bool,
    /// Its node name.
    pub name: String,
    /// Its replica id.
    pub replica: String,
    /// `alive`, `suspect` or `down`.
    pub state: String,
    /// The build version it announced (`null`: not known).
    pub version: Option<String>,
}

/// `GET /v1/cluster` answered 200.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Cluster {
    /// The replica ids removed for good (sorted).
    pub decommissioned: Vec<String>,
    /// Every member, sorted by name.
    pub members: Vec<ClusterMember>,
    /// The answering node.
    pub node: ClusterNode,
    /// Per-peer replication lag.
    pub peers: Vec<ClusterPeer>,
    /// SWIM's raw view; `null` without the peer network.
    pub swim: Option<Vec<SwimMember>>,
}

/// `POST /v1/cluster/members/{name}/remove` answered 200:
/// `{"already","at_ms","by","name","removed"}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberRemoved {
    /// It was removed before: nothing was written, `at_ms` and `by` are the existing record's.
    pub already: bool,
    /// When the record was written (wall clock of the node that wrote it; `null` when the
    /// record does not say).
    pub at_ms: Option<u64>,
    /// The replica id of the node that wrote it (`null` when the record does not say).
    pub by: Option<String>,
    /// The member's name as the record keeps it (else as given).
    pub name: String,
    /// Its replica id.
    pub removed: String,
}
