//! The peer network (docs/design/principles.md, "Authenticated peers",
//! "Dissemination and backpressure"): the only module that knows quinn and rustls.
//!
//! * [`certs`]: the cluster CA and node certificates (rcgen).
//! * `tls`: mutual TLS over the cluster CA; a peer's node name comes from its certificate and
//!   must equal the name it claims in its first message on the connection.
//! * `transport`: one quinn endpoint per node (server and client), one connection per peer,
//!   protocol frames through [`crate::codec`] on the connection's one QUIC stream, bounded
//!   both ways.
//! * [`known`]: the members a node knew, kept across its restarts (rejoin without `--join`).
//! * [`Faults`]: a fault-injecting UDP socket under quinn for tests and examples.
//! * `membership`: SWIM (foca) over QUIC datagrams on the same connections; decides which
//!   authenticated peers are replication peers ([`MemberStatus`] in [`NetStatus::members`]).
//!
//! The writer thread (`driver`) sees a peer connection only as a bounded outbox it never waits
//! on: a local commit never waits for the network.

pub mod certs;
mod faults;
pub mod known;
pub(crate) mod link;
mod membership;
mod refusals;
mod tls;
pub(crate) mod transport;

pub use certs::{ClusterCa, TlsDir};
pub use faults::Faults;
pub use membership::{MemberState, MemberStatus, SwimOptions};
pub use transport::NetOptions;

use crate::proto::PeerId;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};

/// Why the network could not start or a peer connection failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NetError {
    /// Socket errors (bind, local address).
    #[error("network I/O: {0}")]
    Io(#[source] std::io::Error),
    /// The TLS material could not be used.
    #[error("TLS configuration: {0}")]
    Tls(String),
    /// Invalid network options.
    #[error("network configuration: {0}")]
    Config(String),
    /// Certificates could not be created or loaded.
    #[error(transparent)]
    Certs(#[from] certs::CertError),
    /// A dial failed (unreachable, refused, TLS failure).
    #[error("connect: {0}")]
    Connect(String),
    /// The peer's claimed identity does not match its certificate (or it claimed none).
    #[error("peer identity refused: {0}")]
    Identity(String),
    /// A frame's length is over the limit.
    #[error("frame of {len} bytes is over the limit of {limit}")]
    FrameTooLarge {
        /// The claimed length.
        len: usize,
        /// The limit.
        limit: usize,
    },
    /// The stream failed.
    #[error("stream: {0}")]
    Stream(String),
    /// The node already listens.
    #[error("the node already listens on {0}")]
    AlreadyListening(SocketAddr),
    /// `join_peer` before `listen`.
    #[error("the node does not listen yet: call listen first")]
    NotListening,
}

/// A peer's [`PeerId`] from its node name (FNV-1a 64): stable across its restarts and wipes.
pub fn peer_id_of_name(name: &str) -> PeerId {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in name.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    PeerId(h)
}

/// Live counters of a node's network endpoint.
#[derive(Debug, Default)]
pub(crate) struct NetStats {
    pub(crate) connections_established: AtomicU64,
    pub(crate) connections_refused: AtomicU64,
    pub(crate) peers_disconnected: AtomicU64,
    pub(crate) name_conflicts: AtomicU64,
    pub(crate) frames_rejected: AtomicU64,
    pub(crate) frames_dropped_full: AtomicU64,
    pub(crate) frame_bytes_sent: AtomicU64,
    pub(crate) frame_bytes_received: AtomicU64,
    pub(crate) udp_bytes_sent_closed: AtomicU64,
    pub(crate) udp_bytes_received_closed: AtomicU64,
    pub(crate) swim_bytes_sent: AtomicU64,
    pub(crate) swim_bytes_received: AtomicU64,
}

impl NetStats {
    pub(crate) fn add(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Ordering::Relaxed);
    }

    fn snapshot(&self) -> NetStatsSnapshot {
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        NetStatsSnapshot {
            connections_established: g(&self.connections_established),
            connections_refused: g(&self.connections_refused),
            peers_disconnected: g(&self.peers_disconnected),
            name_conflicts: g(&self.name_conflicts),
            frames_rejected: g(&self.frames_rejected),
            frames_dropped_full: g(&self.frames_dropped_full),
            frame_bytes_sent: g(&self.frame_bytes_sent),
            frame_bytes_received: g(&self.frame_bytes_received),
            udp_bytes_sent: g(&self.udp_bytes_sent_closed),
            udp_bytes_received: g(&self.udp_bytes_received_closed),
            swim_bytes_sent: g(&self.swim_bytes_sent),
            swim_bytes_received: g(&self.swim_bytes_received),
        }
    }
}

/// A copy of a node's network counters.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NetStatsSnapshot {
    /// Authenticated peer connections registered.
    pub connections_established: u64,
    /// Connections refused: failed TLS handshakes (no certificate, other CA, expired, ...),
    /// claimed names that the certificate does not name, missing hellos, too many peers.
    pub connections_refused: u64,
    /// Authenticated peers disconnected for breaking the protocol (oversized or undecodable
    /// frames, messages the replica refused).
    pub peers_disconnected: u64,
    /// Refusals of a peer claiming the name of another member that is alive: its connections
    /// refused here, our connections the peer refused for that reason, and identities with
    /// that name SWIM ignored (each counted once).
    pub name_conflicts: u64,
    /// Frames refused before decoding or by the decoder.
    pub frames_rejected: u64,
    /// Outgoing frames dropped because a peer's queue was full (retransmitted later).
    pub frames_dropped_full: u64,
    /// Frame bytes written to peer streams (length prefix included).
    pub frame_bytes_sent: u64,
    /// Frame bytes read from peer streams (length prefix included).
    pub frame_bytes_received: u64,
    /// UDP payload bytes sent on peer connections (QUIC and TLS overhead included).
    pub udp_bytes_sent: u64,
    /// UDP payload bytes received on peer connections.
    pub udp_bytes_received: u64,
    /// SWIM datagram payload bytes sent (membership traffic, inside `udp_bytes_sent`).
    pub swim_bytes_sent: u64,
    /// SWIM datagram payload bytes received.
    pub swim_bytes_received: u64,
}

/// Where a node's network stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NetStatus {
    /// Our node name (from our certificate).
    pub name: String,
    /// The bound address.
    pub local_addr: SocketAddr,
    /// Names of the peers connected now.
    pub peers: Vec<String>,
    /// The cluster members as SWIM sees them (name, address, state, incarnation).
    pub members: Vec<MemberStatus>,
    /// Counters.
    pub stats: NetStatsSnapshot,
}

impl TlsDir {
    /// Checks this identity before anything is started with it: the node key belongs to the
    /// node certificate, which the CA beside it issued and which is valid now.
    ///
    /// # Errors
    /// [`NetError::Tls`] saying which file is wrong.
    pub fn check(&self) -> Result<(), NetError> {
        tls::check(self)
    }
}
