//! The writer's one peer path: what the network layer tells the writer thread ([`NetEvent`],
//! through an [`EventSink`]) and the writer's handle on one peer ([`PeerLink`]).
//!
//! A peer is reached the same way whether it is a QUIC connection or another node of this
//! process (`Node::connect`): the writer encodes a frame, checks it against `frame_bytes_max`
//! and hands it to the link, which never blocks. A QUIC link queues it for the connection's
//! stream (a full queue drops it, counted; the protocol retransmits); an in-process link
//! decodes it as the receiving connection would (same codec, same size limit) and delivers
//! it to the other node's writer. Either way the receiving writer sees [`NetEvent::Message`].

use super::NetStats;
use crate::proto::{Message, PeerId};
use quinn::{Connection, VarInt};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use tokio::sync::{OwnedSemaphorePermit, mpsc};

/// What the network layer reports to a node's writer thread.
#[derive(Debug)]
pub(crate) enum NetEvent {
    /// `peer` is reachable through `link` (replaces an older link to it).
    Up {
        /// The peer.
        peer: PeerId,
        /// Where its frames go.
        link: PeerLink,
    },
    /// Link `link` to `peer` ended (ignored when a newer link replaced it).
    Down {
        /// The peer.
        peer: PeerId,
        /// The id of the link that ended.
        link: u64,
    },
    /// SWIM reports the network peer alive (up in the replica once its link is connected too)
    /// or down (taken down, evicted after the replica's grace period). In-process links are
    /// alive while connected and never get this event.
    Alive {
        /// The peer.
        peer: PeerId,
        /// Alive or down.
        alive: bool,
    },
    /// A decoded protocol message from `from`. `permit`, when present, returns the frame's
    /// bytes to its connection's inbound budget once handled (bounded apply queue).
    Message {
        /// The sender.
        from: PeerId,
        /// The message.
        msg: Box<Message>,
        /// The connection's inbound-budget share held by this message.
        permit: Option<OwnedSemaphorePermit>,
        /// Sent over an in-process link: handled even before the link's `Up` (the two nodes'
        /// writers learn of a `Node::connect` independently, so the first message can win).
        local: bool,
    },
}

/// Where the network layer delivers its events: a node's writer input queue. Sending never
/// blocks; it returns `false` once that writer is gone.
#[derive(Clone)]
pub(crate) struct EventSink(Arc<dyn Fn(NetEvent) -> bool + Send + Sync>);

impl EventSink {
    /// A sink that hands each event to `deliver`.
    pub(crate) fn new(deliver: impl Fn(NetEvent) -> bool + Send + Sync + 'static) -> Self {
        Self(Arc::new(deliver))
    }

    /// Delivers `event`; `false` when the receiving writer is gone.
    pub(crate) fn send(&self, event: NetEvent) -> bool {
        (self.0)(event)
    }
}

impl std::fmt::Debug for EventSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("EventSink")
    }
}

/// How the receiving node of an in-process link checks its frames: its frame size limit and
/// its counter of frames that could not be decoded.
#[derive(Clone, Debug)]
pub(crate) struct LinkLimits {
    /// The receiver's `frame_bytes_max`.
    pub(crate) frame_bytes_max: usize,
    /// The receiver's count of undecodable frames.
    pub(crate) frames_rejected: Arc<AtomicU64>,
}

/// Ids of in-process links (the high half of the id space; QUIC links count from 1).
static NEXT_LOCAL_LINK: AtomicU64 = AtomicU64::new(1 << 63);

/// The writer thread's handle on one peer: a non-blocking way to send it encoded frames.
#[derive(Debug)]
pub(crate) struct PeerLink {
    /// Distinguishes this link from an older or newer one to the same peer.
    pub(crate) id: u64,
    via: Via,
}

#[derive(Debug)]
enum Via {
    /// A QUIC connection: a bounded queue of frames for its stream.
    Quic {
        outbox: mpsc::Sender<Vec<u8>>,
        conn: Connection,
        stats: Arc<NetStats>,
    },
    /// Another node of this process: its writer's event sink.
    Local {
        me: PeerId,
        to: EventSink,
        limits: LinkLimits,
    },
}

impl PeerLink {
    /// A link over the QUIC connection `conn`, whose stream writer drains `outbox`.
    pub(crate) fn quic(
        id: u64,
        outbox: mpsc::Sender<Vec<u8>>,
        conn: Connection,
        stats: Arc<NetStats>,
    ) -> Self {
        Self {
            id,
            via: Via::Quic {
                outbox,
                conn,
                stats,
            },
        }
    }

    /// A link from the node `me` to another node of this process whose writer reads `to`;
    /// frames are decoded under the receiver's limits, as its network would.
    pub(crate) fn local(me: PeerId, to: EventSink, limits: LinkLimits) -> Self {
        Self {
            id: NEXT_LOCAL_LINK.fetch_add(1, Ordering::Relaxed),
            via: Via::Local { me, to, limits },
        }
    }

    /// True for an in-process link: alive while connected (no SWIM), and not closed when the
    /// peer sends what we refuse (it could not reconnect; nothing it sent was applied).
    pub(crate) fn is_local(&self) -> bool {
        matches!(self.via, Via::Local { .. })
    }

    /// Sends one encoded frame without waiting. A full QUIC queue drops it (counted; the
    /// protocol retransmits). `false` when the peer is gone (connection closed, or the other
    /// node's writer stopped): the caller takes the peer down.
    pub(crate) fn send(&self, bytes: Vec<u8>) -> bool {
        match &self.via {
            Via::Quic { outbox, stats, .. } => match outbox.try_send(bytes) {
                Ok(()) => true,
                Err(mpsc::error::TrySendError::Full(_)) => {
                    NetStats::add(&stats.frames_dropped_full, 1);
                    true
                }
                Err(mpsc::error::TrySendError::Closed(_)) => false,
            },
            Via::Local { me, to, limits } => {
                match crate::codec::decode::<Message>(
                    "protocol frame",
                    &bytes,
                    limits.frame_bytes_max,
                ) {
                    Ok(msg) => to.send(NetEvent::Message {
                        from: *me,
                        msg: Box::new(msg),
                        permit: None,
                        local: true,
                    }),
                    Err(e) => {
                        // Dropped like a lost packet, and counted by the receiver.
                        limits.frames_rejected.fetch_add(1, Ordering::Relaxed);
                        tracing::warn!(from = ?me, error = %e, "undecodable frame dropped");
                        true
                    }
                }
            }
        }
    }

    /// Closes the connection because the peer broke the protocol (counted). An in-process
    /// link stays open (see [`PeerLink::is_local`]).
    pub(crate) fn close_hostile(&self, why: &str) {
        if let Via::Quic { conn, stats, .. } = &self.via {
            NetStats::add(&stats.peers_disconnected, 1);
            tracing::warn!(peer = %conn.remote_address(), why, "disconnecting a peer");
            conn.close(VarInt::from_u32(close::PROTOCOL), why.as_bytes());
        }
    }
}

/// Close codes sent to a peer (QUIC application error codes).
pub(crate) mod close {
    /// The node shuts down.
    pub(crate) const SHUTDOWN: u32 = 0;
    /// The peer's claimed name is not the one its certificate names (or no hello came).
    pub(crate) const IDENTITY: u32 = 1;
    /// The peer broke the protocol (oversized or undecodable frame, refused message).
    pub(crate) const PROTOCOL: u32 = 2;
    /// Another connection to the same peer is kept.
    pub(crate) const DUPLICATE: u32 = 3;
    /// Another member with the peer's name is alive: the newcomer is refused.
    pub(crate) const NAME_CONFLICT: u32 = 4;
}
