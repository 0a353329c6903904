//! The embedded node: open a data directory, apply ops and events, read typed values, watch
//! changes, shut down cleanly. Works fully offline; replication layers on top.

use crate::config::NodeConfig;
use crate::driver::{CompactReport, Driver, Input, ReplicationStatus};
use crate::error::Error;
use crate::metrics::{Metrics, MetricsSnapshot};
use crate::model::Delta;
use crate::model::Rejected;
use crate::net::link::{EventSink, LinkLimits, NetEvent, PeerLink};
use crate::net::transport::Net;
use crate::net::{NetError, NetOptions, NetStatus, TlsDir, certs};
use crate::ops::{self, Event, Op};
use crate::proto::replica::Replica;
use crate::proto::{ApplyOutcome, PeerId};
use crate::store::{DeltasSince, LocalCommit, LocalWrite, OpenOptions, Reader, RedbStore};
use crate::watch::{Cursor, Feed, KeyFilter, Watch};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tidemark_crdts::{CausalContext, Key, KeyKind, ReplicaId, Value};
use tokio::sync::oneshot;

/// How many writes a call applied and how many it skipped as duplicates.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WriteOutcome {
    /// Ops or events applied.
    pub applied: usize,
    /// Events or idempotent ops already applied before (no-ops).
    pub duplicates: usize,
    /// Events refused as late by some view of their stream (the window they fall into ended
    /// more than its lateness before the watermark): counted, never applied to that window.
    /// Their other effects (ops, on-time windows) were applied and they count as `applied`.
    pub late: usize,
}

/// A member's removal for good ([`Node::decommission`]): its record as the cluster holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Removal {
    /// The member removed.
    pub replica: ReplicaId,
    /// It was already removed: nothing was written, this is the existing record.
    pub already: bool,
    /// When the record was written (wall-clock ms of the node that wrote it; `None` when the
    /// record does not say).
    pub at_ms: Option<u64>,
    /// The node that wrote the record (`None` when the record does not say).
    pub by: Option<ReplicaId>,
    /// The member's name as SWIM knew it when it was removed (`None` when the record does not
    /// say: removed by replica id while no member of that name was known).
    pub name: Option<String>,
}

/// How often a node looks for removals it has not logged yet.
const REMOVALS_TICK: Duration = Duration::from_millis(500);

/// A caller's writes of at most this many ops commit on its own thread when the writer is
/// idle ([`Node::enqueue_or_commit`]); larger batches always go to the writer thread (their
/// commit is long enough that the hand-off does not matter, and a tokio worker is not held
/// for it).
const INLINE_OPS_MAX: usize = 64;

/// A node's peer id: stable for a replica id (a wiped node, with a new id, is a new peer).
fn peer_id_of(replica: ReplicaId) -> PeerId {
    let [hi, lo] = [(replica.0 >> 64) as u64, replica.0 as u64];
    PeerId(hi ^ lo)
}

struct Shared {
    inputs: Mutex<Option<Sender<Input>>>,
    /// The writer's state: the writer thread drives it; a lone small write commits on its
    /// caller's thread when the writer is idle ([`crate::driver::Writer::commit_inline`]).
    writer: Arc<crate::driver::Writer>,
    queued_ops: Arc<AtomicUsize>,
    metrics: Arc<Metrics>,
    changes: Arc<Feed>,
    reader: Mutex<Option<Reader>>,
    /// The replica id the node opened with: its link and SWIM identity for this run.
    replica: ReplicaId,
    /// The store's replica id now: the identity of this node's dots, announcements and seals
    /// (a store that re-identifies at run time switches it, see [`Node::replica_id`]).
    identity: Arc<std::sync::RwLock<ReplicaId>>,
    epoch: u64,
    config: NodeConfig,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    views: Arc<crate::views::Views>,
    /// The peer network endpoint, once [`Node::listen`] was called.
    net: Mutex<Option<Arc<crate::net::transport::Net>>>,
    /// Frames from peers that could not be decoded (shared with in-process links to us).
    frames_rejected: Arc<std::sync::atomic::AtomicU64>,
    /// Our in-process links (`Node::connect`): peer → link id, to take the link down.
    local_links: Mutex<std::collections::BTreeMap<PeerId, u64>>,
    /// Held while a removal is checked and written: a repeated request writes nothing.
    removing: tokio::sync::Mutex<()>,
    /// The removals already logged (`None` until the first look, at open).
    removals_logged: Mutex<Option<std::collections::BTreeSet<ReplicaId>>>,
    /// The members this node knew, also from earlier runs (`members.json` in the data
    /// directory, see [`crate::net::known`]).
    known: Mutex<Vec<crate::net::known::KnownMember>>,
    /// The node's background tasks (removals, view maintenance): stopped by
    /// [`Node::shutdown`], so none holds the store past it.
    tasks: Mutex<Vec<tokio::task::JoinHandle<()>>>,
}

impl Drop for Shared {
    /// The last handle is gone without [`Node::shutdown`]: stop the writer after the writes
    /// already queued (with a final durable commit) and wait for it, so the database is closed
    /// when the drop returns. Peers only hold this node's inbox, which keeps nothing alive.
    fn drop(&mut self) {
        let inputs = self.inputs.get_mut().ok().and_then(Option::take);
        if let Some(tx) = inputs {
            let (reply, _) = oneshot::channel();
            let _ = tx.send(Input::Shutdown { reply });
        }
        if let Ok(reader) = self.reader.get_mut() {
            reader.take();
        }
        let thread = self.thread.get_mut().ok().and_then(Option::take);
        if let Some(t) = thread {
            if t.thread().id() != std::thread::current().id() {
                let _ = t.join();
            }
        }
    }
}

/// An embedded Tidemark node. Cheap to clone (clones share one node).
///
/// Dropping the last handle without [`Node::shutdown`] shuts the node down the same way (it
/// blocks the dropping thread until the writer has finished and the database is closed).
///
/// Guarantees: a write call returns `Ok` only after its effects are durably committed (in the
/// default `Immediate` durability); a rejected call applies nothing; reads see committed state
/// and never block the writer; at most one process opens a data directory.
#[derive(Clone)]
pub struct Node {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node")
            .field("replica", &self.shared.replica)
            .field("data_dir", &self.shared.config.data_dir)
            .finish_non_exhaustive()
    }
}

impl Node {
    /// Opens (or creates) the node in `config.data_dir`, recovering committed state.
    ///
    /// # Errors
    /// [`Error::Config`] for invalid limits; [`Error::Store`] when the directory is in use by
    /// another process or the stored state cannot be read.
    pub async fn open(config: NodeConfig) -> Result<Node, Error> {
        tokio::task::spawn_blocking(move || Self::open_blocking(config))
            .await
            .map_err(|_| Error::Closed)?
    }

    /// [`Node::open`] for callers outside an async runtime (the node still needs one for its
    /// async calls).
    ///
    /// # Errors
    /// As [`Node::open`].
    pub fn open_blocking(config: NodeConfig) -> Result<Node, Error> {
        config.limits.validate().map_err(Error::Config)?;
        let views = crate::views::Views::new(&config.views)?;
        let mut store = RedbStore::open(
            &config.data_dir,
            OpenOptions {
                limits: config.limits.clone(),
                durability: config.durability,
                new_replica_id: None,
            },
        )?;
        // A copy restored from a snapshot of a cluster member joins: its source's cluster may
        // have sealed windows since, without it.
        let views = Arc::new(
            views
                .joining(config.joining)
                .restored_joining(
                    store.restored_joining(),
                    store.restored_context().cloned(),
                    store.seed_cursor().map(|(source, _)| source),
                )
                .held_bytes(config.limits.view_held_bytes),
        );
        let (tx, rx) = std::sync::mpsc::channel();
        let queued_ops = Arc::new(AtomicUsize::new(0));
        let metrics = Arc::new(Metrics::default());
        let previous_end = store.take_watch_end()?;
        let changes = Arc::new(Feed::new(
            config.limits.watch_buffer_max,
            config.limits.watch_buffer_bytes_max,
            previous_end.map(|(run, n)| Cursor::from_parts(run, n)),
            Duration::from_secs(config.limits.watch_resume_secs),
        ));
        let reader = store.reader();
        let replica = store.replica();
        let restored = store.seed_cursor().is_some();
        views.settle_restored(&reader, replica, false, peer_id_of)?;
        let announce = views.restore(
            &reader,
            replica,
            crate::clock::wall_ms(),
            restored,
            store.restored_context(),
        )?;
        {
            // Stream-view retention: entries of removed windows are dropped on receipt.
            let views = Arc::clone(&views);
            store.set_remote_filter(Arc::new(move |key: &Key| views.keep_remote(key)));
        }
        // A run-time re-identification switches the node's view identity on the writer
        // thread, before the next message or write is handled.
        let identity = Arc::new(std::sync::RwLock::new(replica));
        let reidentified: crate::driver::Reidentified = {
            let (identity, views) = (Arc::clone(&identity), Arc::clone(&views));
            Arc::new(move |new, ctx| {
                views.reidentified(&ctx);
                if let Ok(mut id) = identity.write() {
                    *id = new;
                }
            })
        };
        let epoch = store.epoch();
        let mut replication = config.replication.clone();
        replication.message_bytes_target = replication
            .message_bytes_target
            .min(config.limits.message_bytes_target);
        let seed = u64::from_le_bytes(
            uuid::Uuid::new_v4().as_bytes()[..8]
                .try_into()
                .unwrap_or([7; 8]),
        );
        let core = Replica::new(replication, epoch, seed, store.known_peers());
        let relaxed = config.durability == crate::limits::Durability::Relaxed;
        let frames_rejected = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let durable = crate::driver::DurablePoint::new(&store, relaxed);
        let driver = Driver {
            store,
            queued_ops: Arc::clone(&queued_ops),
            metrics: Arc::clone(&metrics),
            changes: Arc::clone(&changes),
            group_ops_max: config.limits.commit_group_ops_max,
            tick: match config.durability {
                crate::limits::Durability::Relaxed => config.relaxed_sync_interval,
                crate::limits::Durability::Immediate => Duration::from_millis(100),
            },
            durable,
            checkpoints: crate::driver::Checkpoints::default(),
            replica: core,
            started: std::time::Instant::now(),
            log_retain_entries: config.log_retain_entries,
            frames_rejected: Arc::clone(&frames_rejected),
            frame_bytes_max: config.limits.frame_bytes_max,
            links: std::collections::BTreeMap::new(),
            net_alive: std::collections::BTreeSet::new(),
            freer: crate::driver::Freer::spawn(),
            caught_up: std::collections::BTreeMap::new(),
            ever_linked: std::collections::BTreeSet::new(),
            last_acked: std::collections::BTreeMap::new(),
            on_reidentified: Some(reidentified),
            on_remote_change: (!views.list().is_empty()).then(|| {
                let views = Arc::clone(&views);
                Arc::new(move |key: &Key| views.remote_change(key)) as crate::driver::RemoteChange
            }),
            next_tick: std::time::Instant::now(),
            planned_wake: std::time::Instant::now(),
        };
        let writer = Arc::new(crate::driver::Writer::new(driver));
        let thread = std::thread::Builder::new()
            .name("tidemark-writer".into())
            .spawn({
                let writer = Arc::clone(&writer);
                move || writer.run(rx)
            })
            .map_err(|e| Error::Config(format!("cannot start the writer thread: {e}")))?;
        tracing::info!(%replica, epoch, dir = %config.data_dir.display(), "node open");
        let data_dir = config.data_dir.clone();
        let node = Node {
            shared: Arc::new(Shared {
                inputs: Mutex::new(Some(tx)),
                writer,
                queued_ops,
                metrics,
                changes,
                reader: Mutex::new(Some(reader)),
                replica,
                identity,
                epoch,
                config,
                thread: Mutex::new(Some(thread)),
                views,
                net: Mutex::new(None),
                frames_rejected,
                local_links: Mutex::new(std::collections::BTreeMap::new()),
                removing: tokio::sync::Mutex::new(()),
                removals_logged: Mutex::new(None),
                known: Mutex::new(crate::net::known::load(&data_dir)),
                tasks: Mutex::new(Vec::new()),
            }),
        };
        // The removals recorded before this run are known (this node's own is logged).
        node.note_removals()?;
        if !announce.is_empty() {
            // The promises of the state this node opened with, announced before any write of
            // its own (the writer commits in queue order; nobody waits for this one).
            drop(node.enqueue(announce)?);
        }
        match tokio::runtime::Handle::try_current() {
            // Removals learned from peers are logged as they arrive.
            Ok(rt) => {
                let task = rt.spawn(removals_watch(Arc::downgrade(&node.shared)));
                if let Ok(mut tasks) = node.shared.tasks.lock() {
                    tasks.push(task);
                }
            }
            Err(_) => tracing::debug!("no async runtime at open: removals are logged on request"),
        }
        if node.shared.views.needs_maintenance() {
            // Idle watermarks and retention run in the background while the node lives.
            match tokio::runtime::Handle::try_current() {
                Ok(rt) => {
                    let task = rt.spawn(views_maintenance(Arc::downgrade(&node.shared)));
                    if let Ok(mut tasks) = node.shared.tasks.lock() {
                        tasks.push(task);
                    }
                }
                Err(_) => tracing::warn!(
                    "no async runtime at open: view retention and idle watermarks stay off"
                ),
            }
        }
        Ok(node)
    }

    /// This node's replica id: the identity of its dots, announcements and seals. It changes
    /// at run time only when the store turns out to be a copy restored under its old id (the
    /// `reidentified` metric counts it); the peer id ([`Node::peer_id`]) stays for the run.
    pub fn replica_id(&self) -> ReplicaId {
        self.me()
    }

    /// The store's replica id now (see [`Node::replica_id`]).
    fn me(&self) -> ReplicaId {
        self.shared
            .identity
            .read()
            .map_or(self.shared.replica, |id| *id)
    }

    /// This incarnation's epoch (bumped at every open).
    pub fn epoch(&self) -> u64 {
        self.shared.epoch
    }

    /// This node's id as a peer (derived from its replica id).
    pub fn peer_id(&self) -> PeerId {
        peer_id_of(self.shared.replica)
    }

    fn input_sender(&self) -> Result<Sender<Input>, Error> {
        self.shared
            .inputs
            .lock()
            .map_err(|_| Error::Closed)?
            .clone()
            .ok_or(Error::Closed)
    }

    /// Connects two nodes of this process (embedded sync): each becomes a peer of the other and
    /// they converge through the same protocol core, frames and codec the network uses. Works
    /// at any time: writes made while disconnected are exchanged on connect.
    ///
    /// # Errors
    /// [`Error::Closed`] if either node is shut down.
    pub fn connect(&self, other: &Node) -> Result<(), Error> {
        for (a, b) in [(self, other), (other, self)] {
            if let Ok(mut met) = a.shared.views.met.lock() {
                met.insert(b.peer_id());
            }
        }
        for (from, to) in [(self, other), (other, self)] {
            let link = PeerLink::local(from.peer_id(), to.event_sink()?, to.link_limits());
            if let Ok(mut links) = from.shared.local_links.lock() {
                links.insert(to.peer_id(), link.id);
            }
            from.send(Input::Net(NetEvent::Up {
                peer: to.peer_id(),
                link,
            }))?;
        }
        Ok(())
    }

    /// Disconnects two in-process nodes ("going offline"); each keeps writing locally.
    ///
    /// # Errors
    /// [`Error::Closed`] if either node is shut down.
    pub fn disconnect(&self, other: &Node) -> Result<(), Error> {
        for (from, to) in [(self, other), (other, self)] {
            let link = from
                .shared
                .local_links
                .lock()
                .ok()
                .and_then(|mut l| l.remove(&to.peer_id()));
            if let Some(link) = link {
                from.send(Input::Net(NetEvent::Down {
                    peer: to.peer_id(),
                    link,
                }))?;
            }
        }
        Ok(())
    }

    /// Where the network layer (and in-process peers) deliver events to this node's writer.
    fn event_sink(&self) -> Result<EventSink, Error> {
        let tx = self.input_sender()?;
        Ok(EventSink::new(move |e| tx.send(Input::Net(e)).is_ok()))
    }

    /// The clock now and, for a stream this (joining) node has not synced yet, whether it
    /// holds what each linked peer held when they met (asked of the writer, after every
    /// input it received before).
    ///
    /// A restored copy that still joins its cluster asks its committed state whether that is
    /// over (`Views::settle_restored`) once it holds what its linked peers held, so that it
    /// starts from their announcements and seals together, not from one side's.
    async fn sync_now(&self, stream: &str) -> Result<crate::views::SyncNow, Error> {
        let peers_covered = if self.shared.views.awaits_sync(stream) {
            let (reply, rx) = oneshot::channel();
            self.send(Input::PeersCovered { reply })?;
            rx.await.map_err(|_| Error::Closed)?
        } else {
            false
        };
        if peers_covered {
            self.settle_restored(true)?;
        }
        Ok(crate::views::SyncNow {
            now_ms: crate::clock::wall_ms(),
            peers_covered,
        })
    }

    /// What an in-process link to this node decodes frames under (as our network would).
    fn link_limits(&self) -> LinkLimits {
        LinkLimits {
            frame_bytes_max: self.shared.config.limits.frame_bytes_max,
            frames_rejected: Arc::clone(&self.shared.frames_rejected),
        }
    }

    /// Starts this node's peer endpoint (QUIC, mutual TLS) on `addr` — port 0 picks a free
    /// port — and returns the bound address. A peer that connects (or that
    /// [`Node::join_peer`] dials) becomes a replication peer once both sides verified that the
    /// other's certificate is issued by the cluster CA in `tls` and names the node the other
    /// claims to be. Needs a tokio runtime. Offline-first: writes never wait for the network;
    /// peers exchange what they lack whenever they are connected.
    ///
    /// # Errors
    /// [`Error::Net`] when the address cannot be bound, the TLS material is unusable or the
    /// node already listens; [`Error::Closed`].
    pub async fn listen(&self, addr: SocketAddr, tls: TlsDir) -> Result<SocketAddr, Error> {
        let opts = NetOptions::new(self.shared.config.limits.frame_bytes_max);
        self.listen_with(addr, tls, opts).await
    }

    /// [`Node::listen`] with explicit network options (timeouts, bounds, fault injection).
    ///
    /// # Errors
    /// As [`Node::listen`].
    pub async fn listen_with(
        &self,
        addr: SocketAddr,
        tls: TlsDir,
        mut opts: NetOptions,
    ) -> Result<SocketAddr, Error> {
        let events = self.event_sink()?;
        opts.frame_bytes_max = opts
            .frame_bytes_max
            .min(self.shared.config.limits.frame_bytes_max);
        let mut guard = self.shared.net.lock().map_err(|_| Error::Closed)?;
        if let Some(net) = guard.as_ref() {
            return Err(NetError::AlreadyListening(net.local_addr()).into());
        }
        let seed = u64::from_le_bytes(
            uuid::Uuid::new_v4().as_bytes()[..8]
                .try_into()
                .unwrap_or([9; 8]),
        );
        let member = (self.shared.replica.0, self.shared.epoch);
        let net = Net::start(addr, &tls, opts, events, seed, member)?;
        let local = net.local_addr();
        *guard = Some(net);
        Ok(local)
    }

    /// Zero-config networking: uses the certificate in `<data_dir>/tls`, creating a local CA
    /// and a certificate for this node there on first use, and listens on `addr`, which must
    /// be a loopback address (a node with a generated CA is not reachable from elsewhere).
    ///
    /// # Errors
    /// [`Error::Net`] for a non-loopback address or unusable certificates; as [`Node::listen`].
    pub async fn listen_local(&self, addr: SocketAddr) -> Result<SocketAddr, Error> {
        if !addr.ip().is_loopback() {
            return Err(NetError::Config(
                "a node without configured certificates binds to loopback only".into(),
            )
            .into());
        }
        let dir = self.shared.config.data_dir.join("tls");
        let name = format!("node-{:032x}", self.shared.replica.0);
        let tls = tokio::task::spawn_blocking(move || certs::ensure_local(&dir, &name))
            .await
            .map_err(|_| Error::Closed)?
            .map_err(NetError::from)?;
        self.listen(addr, tls).await
    }

    /// Joins the cluster through the seed at `addr` (repeatable): dials it now, and again with
    /// backoff (`redial_min`..`redial_max`) until one authenticated connection to it was made
    /// or SWIM reports a live member; then stops (it never redials forever). Afterwards SWIM
    /// membership decides whom this node probes, connects to and replicates with. Returns at
    /// once; replication starts when the seed's node (and the members it tells of) are alive.
    ///
    /// # Errors
    /// [`Error::Net`] ([`NetError::NotListening`]) before [`Node::listen`]; [`Error::Closed`].
    pub fn join_peer(&self, addr: SocketAddr) -> Result<(), Error> {
        let guard = self.shared.net.lock().map_err(|_| Error::Closed)?;
        let net = guard.as_ref().ok_or(NetError::NotListening)?;
        net.spawn_dial_loop(addr);
        Ok(())
    }

    /// Every member this node knows: SWIM's view, then the members it knew (also in earlier
    /// runs, see [`crate::net::known`]) that SWIM does not know now, as `Down` with no last
    /// contact (not heard from since this node started). Empty before [`Node::listen`].
    pub fn members(&self) -> Vec<crate::net::MemberStatus> {
        let Some(net) = self.net_status() else {
            return Vec::new();
        };
        let mut members = net.members;
        if let Ok(known) = self.shared.known.lock() {
            let unheard = crate::net::known::unheard(&known, &members, &net.name);
            members.extend(unheard);
        }
        members
    }

    /// Dials every member this node knew in earlier runs (not a member removed for good) as a
    /// seed, until it joined the cluster through one: a restarted node rejoins without
    /// `--join`. Returns how many it dials.
    ///
    /// # Errors
    /// [`NetError::NotListening`] before [`Node::listen`].
    pub fn rejoin_known(&self) -> Result<usize, Error> {
        let me = self.net_status().map(|n| n.name).unwrap_or_default();
        let gone = self.decommissioned()?;
        let known = self
            .shared
            .known
            .lock()
            .map(|k| k.clone())
            .unwrap_or_default();
        let mut dialed = 0;
        for k in known {
            let removed = gone
                .iter()
                .any(|g| g.to_string() == k.replica.replace('-', ""));
            if k.name == me || removed {
                continue;
            }
            self.join_peer(k.addr)?;
            dialed += 1;
        }
        Ok(dialed)
    }

    /// Keeps SWIM's current view in the known members (and their file) when it changed.
    fn remember_members(&self) {
        let Some(net) = self.net_status() else {
            return;
        };
        let Ok(mut known) = self.shared.known.lock() else {
            return;
        };
        if crate::net::known::merge(&mut known, &net.members, &net.name)
            && let Err(e) = crate::net::known::save(&self.shared.config.data_dir, &known)
        {
            tracing::warn!(error = %e, "cannot keep the known members");
        }
    }

    /// The network endpoint's name, address, connected peers and counters (`None` before
    /// [`Node::listen`]).
    pub fn net_status(&self) -> Option<NetStatus> {
        let guard = self.shared.net.lock().ok()?;
        guard.as_ref().map(|n| n.status())
    }

    /// Where replication stands: peers, their acknowledged cursors, the log, counters.
    ///
    /// # Errors
    /// [`Error::Closed`].
    pub async fn replication_status(&self) -> Result<ReplicationStatus, Error> {
        let (reply, rx) = oneshot::channel();
        self.send(Input::Status { reply })?;
        rx.await.map_err(|_| Error::Closed)
    }

    /// The encoded bytes of our committed delta-log entries in `[from, to)`: a peer's
    /// replication lag in bytes is `log_bytes(acked, log_end)` with its acknowledged cursor
    /// (see [`ReplicationStatus`]). Read on an MVCC read transaction (the writer is not
    /// asked); bounded: at most [`crate::store::LOG_BYTES_ENTRIES_MAX`] entries are summed,
    /// beyond which the answer is a lower bound marked not `exact`
    /// ([`crate::store::Reader::log_bytes`]).
    ///
    /// # Errors
    /// Storage failures; [`Error::Closed`].
    pub fn log_bytes(&self, from: u64, to: u64) -> Result<crate::store::LogBytes, Error> {
        Ok(self
            .reader()?
            .log_bytes(from, to, crate::store::LOG_BYTES_ENTRIES_MAX)?)
    }

    /// The configuration the node was opened with.
    pub fn config(&self) -> &NodeConfig {
        &self.shared.config
    }

    /// True when the node runs as a joining node: [`NodeConfig::joining`], or its store was
    /// restored from a snapshot of a cluster member ([`Node::restore`]) and the copy has
    /// neither synced with a live member of its cluster yet nor removed every other member it
    /// knows of ([`Node::decommission`]). Such a node waits for its first sync with the
    /// cluster before it applies events to a stream's windows.
    pub fn is_joining(&self) -> bool {
        self.shared.views.is_joining()
    }

    /// True for a copy restored from a snapshot of a cluster member that still joins its
    /// cluster (see [`Node::is_joining`]).
    pub fn is_restored_joining(&self) -> bool {
        self.shared.views.waits_as_copy()
    }

    /// Ends a restored copy's joining state when its committed state says it is over (see
    /// [`Node::is_joining`]); nothing for other nodes.
    fn settle_restored(&self, peers_covered: bool) -> Result<(), Error> {
        if !self.shared.views.waits_as_copy() {
            return Ok(());
        }
        let reader = self.reader()?;
        self.shared
            .views
            .settle_restored(&reader, self.me(), peers_covered, peer_id_of)?;
        Ok(())
    }

    fn reader(&self) -> Result<Reader, Error> {
        self.shared
            .reader
            .lock()
            .map_err(|_| Error::Closed)?
            .clone()
            .ok_or(Error::Closed)
    }

    fn send(&self, input: Input) -> Result<(), Error> {
        let guard = self.shared.inputs.lock().map_err(|_| Error::Closed)?;
        let tx = guard.as_ref().ok_or(Error::Closed)?;
        tx.send(input).map_err(|_| Error::Closed)
    }

    async fn submit(&self, writes: Vec<LocalWrite>) -> Result<WriteOutcome, Error> {
        if writes.is_empty() {
            return Ok(WriteOutcome::default());
        }
        let rx = self.enqueue_or_commit(writes)?;
        let commit: LocalCommit = rx.await.map_err(|_| Error::Closed)??;
        let duplicates = commit.duplicate.iter().filter(|d| **d).count();
        let applied = commit.duplicate.len() - duplicates;
        self.count_applied(applied);
        Ok(WriteOutcome {
            applied,
            duplicates,
            late: 0,
        })
    }

    /// Counts `n` client writes (ops or events) acknowledged as applied: the
    /// `tidemark_writes_total{result="applied"}` counter and the write history.
    fn count_applied(&self, n: usize) {
        Metrics::add(&self.shared.metrics.ops_applied, n as u64);
    }

    /// Queues `writes` for the writer (after the backpressure check); the receiver gets the
    /// commit. Writes queued earlier commit earlier.
    fn enqueue(
        &self,
        writes: Vec<LocalWrite>,
    ) -> Result<oneshot::Receiver<Result<LocalCommit, Error>>, Error> {
        self.enqueue_with(writes, None)
    }

    /// [`Node::enqueue`] of a view batch whose view mutations were coalesced (`fallback`: how
    /// the writer un-coalesces it if some event would not be applied).
    fn enqueue_with(
        &self,
        writes: Vec<LocalWrite>,
        fallback: Option<crate::store::BatchFallback>,
    ) -> Result<oneshot::Receiver<Result<LocalCommit, Error>>, Error> {
        self.enqueue_inner(writes, fallback, false)
    }

    /// [`Node::enqueue`] of a caller's own writes, committed on the calling thread when they
    /// are few, the writer is idle and the runtime is a multi-thread tokio runtime
    /// ([`crate::driver::Writer::commit_inline`]: the receiver then already holds the commit;
    /// [`NodeConfig::inline_commits`]). The commit blocks this thread; on a current-thread
    /// runtime it would stall every task, so there the write is always queued.
    fn enqueue_or_commit(
        &self,
        writes: Vec<LocalWrite>,
    ) -> Result<oneshot::Receiver<Result<LocalCommit, Error>>, Error> {
        let inline = self.shared.config.inline_commits
            && tokio::runtime::Handle::try_current()
                .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread);
        self.enqueue_inner(writes, None, inline)
    }

    fn enqueue_inner(
        &self,
        writes: Vec<LocalWrite>,
        fallback: Option<crate::store::BatchFallback>,
        inline: bool,
    ) -> Result<oneshot::Receiver<Result<LocalCommit, Error>>, Error> {
        let ops: usize = writes.iter().map(|w| w.ops.len().max(1)).sum();
        let limit = self.shared.config.limits.write_queue_ops_max;
        let before = self.shared.queued_ops.fetch_add(ops, Ordering::AcqRel);
        if before + ops > limit {
            self.shared.queued_ops.fetch_sub(ops, Ordering::AcqRel);
            Metrics::add(&self.shared.metrics.backpressure, 1);
            return Err(Error::Backpressure { queued: before });
        }
        let (reply, rx) = oneshot::channel();
        let (writes, fallback, reply) = if inline && ops <= INLINE_OPS_MAX {
            let writer = &self.shared.writer;
            match writer.commit_inline((writes, fallback, reply)) {
                crate::driver::Inline::Committed { wake } => {
                    if wake {
                        // Best effort: a closed queue means the writer is gone anyway.
                        let _ = self.send(Input::Wake);
                    }
                    return Ok(rx);
                }
                crate::driver::Inline::Declined(write) => write,
            }
        } else {
            (writes, fallback, reply)
        };
        self.shared.writer.note_queued();
        if let Err(e) = self.send(Input::Write {
            writes,
            fallback,
            reply,
        }) {
            self.shared.writer.unnote_queued();
            self.shared.queued_ops.fetch_sub(ops, Ordering::AcqRel);
            return Err(e);
        }
        Ok(rx)
    }

    /// Counts a refused call's `writes` (ops or events, at least one) in
    /// `tidemark_writes_total{result="rejected"}`: a refused batch applies none of them.
    fn count_rejection<T>(&self, r: Result<T, Error>, writes: usize) -> Result<T, Error> {
        if r.is_err() {
            self.note_refused(writes);
        }
        r
    }

    /// Counts `writes` (at least one) a client sent that were refused before they reached the
    /// node (a body that does not parse, a line that is no event): every write of a refused
    /// request, as far as it was read, counts as rejected.
    pub(crate) fn note_refused(&self, writes: usize) {
        Metrics::add(&self.shared.metrics.rejected_ops, writes.max(1) as u64);
    }

    /// Applies one op; returns after its durable commit.
    ///
    /// # Errors
    /// Validation errors naming the field; [`Error::Backpressure`]; storage errors (not
    /// acknowledged).
    pub async fn apply(&self, op: Op) -> Result<WriteOutcome, Error> {
        self.apply_batch(vec![op]).await
    }

    /// Applies a batch of ops, all or none; returns after the durable commit.
    ///
    /// # Errors
    /// As [`Node::apply`]; a validation error names the index of the op at fault and nothing
    /// of the batch is applied.
    pub async fn apply_batch(&self, ops: Vec<Op>) -> Result<WriteOutcome, Error> {
        let writes = self.count_rejection(
            ops::validate_ops(&ops, &self.shared.config.limits),
            ops.len(),
        )?;
        self.submit(writes).await
    }

    /// Applies writes validated op by op while a request body was parsed
    /// (`ops::OpsValidator`), all or none; a validation error is counted as a rejection.
    /// `read`: how many ops the request carried as far as it was read (all of them count as
    /// rejected when `writes` is an error).
    #[cfg(feature = "server")]
    pub(crate) async fn apply_writes(
        &self,
        writes: Result<Vec<LocalWrite>, Error>,
        read: usize,
    ) -> Result<WriteOutcome, Error> {
        let writes = self.count_rejection(writes, read)?;
        self.submit(writes).await
    }

    /// Ingests events of `stream` (API.md "Events and streams"); each `(source, seq)` is
    /// applied at most once: its ops, and for a stream with views its fields folded into every
    /// view of the stream, in the same durable transaction as its dedup mark. Events without
    /// `time` take this node's clock. An event whose window is already past its lateness is
    /// counted in `late` and not applied to that window.
    ///
    /// # Errors
    /// As [`Node::apply_batch`]; [`Error::InvalidEvent`] naming the event and field (a missing
    /// group or value field, a malformed `time`); nothing of a rejected batch is applied.
    pub async fn ingest(&self, stream: &str, events: Vec<Event>) -> Result<WriteOutcome, Error> {
        if !self.shared.views.has_stream(stream) {
            let writes = self.count_rejection(
                ops::validate_events(stream, &events, &self.shared.config.limits),
                events.len(),
            )?;
            return self.submit(writes).await;
        }
        self.ingest_then(stream, events, std::future::ready(()))
            .await
    }

    /// [`Node::ingest`] into a stream with views, awaiting `between` after the batch's
    /// coalescing was decided and before its writes are queued (tests use it to join a peer's
    /// delta in that gap).
    async fn ingest_then(
        &self,
        stream: &str,
        events: Vec<Event>,
        between: impl std::future::Future<Output = ()>,
    ) -> Result<WriteOutcome, Error> {
        let limits = &self.shared.config.limits;
        let views = &self.shared.views;
        let refused = |e: Error| {
            views.count_rejected(stream, events.len());
            e
        };
        let mut writes = self
            .count_rejection(ops::validate_events(stream, &events, limits), events.len())
            .map_err(refused)?;
        // Checked again, atomically, by the writer; here first so that a refused batch moves
        // no watermark.
        let reader = self.reader()?;
        let me = self.me();
        let early = crate::store::first_overflow(writes.iter().map(|w| w.ops.as_slice()), |k| {
            Ok(crate::store::counter_state(reader.entry(k)?.as_ref(), me))
        })?;
        if let Some(o) = early {
            self.note_refused(events.len());
            return Err(refused(Error::from_overflow(o)));
        }
        let folded = self
            .count_rejection(
                views.fold(stream, &events, crate::clock::wall_ms(), limits),
                events.len(),
            )
            .map_err(refused)?;
        if folded.is_empty() {
            return self.submit(writes).await;
        }
        let n = writes.len();
        views.touch(stream);
        // Events that cannot turn out duplicates or be refused at commit get their view
        // mutations coalesced into one per cell (`views::coalesce`).
        let start = views.begin_batch(stream, &events, &self.reader()?, limits.dedup_ranges_max)?;
        let mut guard = BatchGuard {
            views: Arc::clone(views),
            inflight: start.inflight,
            pending: None,
        };
        between.await;
        let at = self.sync_now(stream).await?;
        let reader = self.reader()?;
        let mut admitted = {
            let mut wms = views.watermarks.lock().map_err(|_| Error::Closed)?;
            // A joining node applies nothing to windows before it synced the stream, and
            // then starts from the largest watermark it holds.
            let (synced, adopted) = views.first_sync(&mut wms, stream, &reader, me, at)?;
            let mut admitted = views.admit(
                wms.get(stream).copied().unwrap_or_default(),
                crate::views::AdmitBatch {
                    stream,
                    folded,
                    events: &events,
                    known_dup: &start.known_dup,
                    gap_refused: &start.gap_refused,
                    inflight: &mut guard.inflight,
                    unsynced: !synced,
                    reader: &reader,
                    peer_of: peer_id_of,
                },
                &mut writes,
                self.me(),
                start.coalesce,
            )?;
            writes.extend(adopted);
            crate::views::keys::stamp_latest_writes(&mut writes);
            guard.pending = Some(self.enqueue_with(writes, admitted.fallback.take())?);
            if let Some(wm) = admitted.new_wm {
                wms.entry(stream.to_owned()).or_default().wm = Some(wm);
            }
            admitted
        };
        let done = match guard.pending.as_mut() {
            Some(rx) => rx.await,
            None => return Err(Error::Closed),
        };
        guard.pending = None;
        drop(guard);
        let commit: LocalCommit = done.map_err(|_| Error::Closed)?.map_err(|e| match e {
            // Refused at commit (an overflow, a counter delete, dedup gaps): nothing applied.
            Error::Store(_) | Error::Net(_) | Error::Closed | Error::Backpressure { .. } => e,
            e => refused(e),
        })?;
        let dup = &commit.duplicate[..n.min(commit.duplicate.len())];
        let effective: Vec<bool> = dup
            .iter()
            .enumerate()
            .map(|(i, d)| !*d && !commit.refused.iter().any(|r| r.writes.contains(&i)))
            .collect();
        let duplicates = dup.iter().filter(|d| **d).count();
        let applied = dup.len() - duplicates;
        // Every event applied: the batch's adds to `distinct` cells are held under our dot.
        views.committed(
            admitted.held.take(),
            effective.len() == n && effective.iter().all(|e| *e),
            me,
        );
        self.count_applied(applied);
        Ok(WriteOutcome {
            applied,
            duplicates,
            late: views.count(&admitted, &effective),
        })
    }

    /// Reads a page of view `name` (see [`crate::views::ViewQuery`]): rows with their group,
    /// window and value, and `final` only when the value can no longer change on any node
    /// this node knows of (the finality argument is in [`crate::views`]).
    ///
    /// # Errors
    /// [`Error::Config`] for a view that is not configured; storage failures.
    pub async fn view(
        &self,
        name: &str,
        query: &crate::views::ViewQuery,
    ) -> Result<crate::views::ViewPage, Error> {
        let known = self.seal_before_read().await?;
        // One read transaction for the whole page: finality inputs and rows of one state.
        self.shared.views.read(
            &self.reader()?.snapshot()?,
            name,
            query,
            self.me(),
            &known,
            peer_id_of,
        )
    }

    /// Up to `limit` (1..=1,000) windows of view `name` that are final on this node, after
    /// `after` (from the oldest window kept with `None`), in window order: each window once,
    /// with the value every node that reports it final reports (see
    /// [`crate::views::final_feed`]). Call again with the page's `next` for the next ones; an
    /// empty page means the next window is not final yet (`waiting_on`).
    ///
    /// # Errors
    /// [`Error::Config`] for a view that is not configured or has no window; storage failures.
    pub async fn final_windows(
        &self,
        name: &str,
        after: Option<&crate::views::FinalCursor>,
        limit: usize,
    ) -> Result<crate::views::FinalPage, Error> {
        let known = self.seal_before_read().await?;
        self.shared.views.final_page(
            &self.reader()?.snapshot()?,
            name,
            after,
            limit,
            self.me(),
            &known,
            peer_id_of,
        )
    }

    /// Every configured view with its definition, counters, watermark, cluster watermark,
    /// conflicting definitions and horizon on this node (what `GET /v1/views` lists).
    ///
    /// # Errors
    /// Storage failures; [`Error::Closed`].
    pub async fn view_summaries(&self) -> Result<Vec<crate::views::ViewSummary>, Error> {
        let known = self.seal_before_read().await?;
        self.shared
            .views
            .summaries(&self.reader()?.snapshot()?, self.me(), &known, peer_id_of)
    }

    /// [`Node::view_summaries`] for a caller that already holds a [`ReplicationStatus`] (a
    /// metrics scrape): the members met are taken from `status`, so no second round trip to
    /// the writer is made, and no seal step runs (seals move on the next maintenance round).
    ///
    /// # Errors
    /// Storage failures; [`Error::Closed`].
    pub fn view_summaries_given(
        &self,
        status: &ReplicationStatus,
    ) -> Result<Vec<crate::views::ViewSummary>, Error> {
        let known = self.view_members_given(status)?;
        self.shared
            .views
            .summaries(&self.reader()?.snapshot()?, self.me(), &known, peer_id_of)
    }

    /// Up to `limit` events of `stream`'s late lane with ids above `after` (from the oldest
    /// kept with `None`; `limit` 0 means the page maximum): every event this node
    /// acknowledged but applied to no view for being late, with the views, the reason, its
    /// watermark then and when. The lane is durable (written with the event) and bounded by
    /// `limits.late_bytes_max` per stream, oldest dropped first (counted in `dropped`).
    ///
    /// # Errors
    /// Storage failures.
    pub fn late_events(
        &self,
        stream: &str,
        after: Option<u64>,
        limit: usize,
    ) -> Result<crate::views::LateEvents, Error> {
        crate::views::late::page(&self.reader()?, stream, after, limit)
    }

    /// Peers that count as members for view finality: every peer met since open.
    ///
    /// Finality compares members by replica ([`peer_id_of`]); a network peer's link is keyed by
    /// its certificate name, so it is translated through the identity SWIM gossips for that
    /// name (until SWIM knows it, the name's id stays: it matches no announcer, so no cluster
    /// watermark is vouched for meanwhile).
    async fn view_members(&self) -> Result<Vec<PeerId>, Error> {
        let status = self.replication_status().await?;
        self.view_members_given(&status)
    }

    /// [`Node::view_members`] with the peers connected taken from `status`.
    fn view_members_given(&self, status: &ReplicationStatus) -> Result<Vec<PeerId>, Error> {
        // A QUIC peer's link id is derived from its node name; as a member it is its replica's
        // id. The name is resolved through the members this node knows (SWIM's view and the
        // remembered ones) and its own name; a name id that cannot be resolved is not added:
        // no announcer ever has it, so it would hold every window open for good (a peer
        // linked while SWIM refused or had forgotten its name: a fast restart). It is added
        // once SWIM knows the name.
        let known = self.members();
        let me_name = self.net_status().map(|n| n.name);
        let me = self.me();
        let resolve = |p: PeerId| -> Option<PeerId> {
            if me_name
                .as_deref()
                .is_some_and(|n| crate::net::peer_id_of_name(n) == p)
            {
                return Some(peer_id_of(me));
            }
            known
                .iter()
                .find(|m| crate::net::peer_id_of_name(&m.name) == p)
                .and_then(|m| u128::from_str_radix(&m.replica.replace('-', ""), 16).ok())
                .map(|r| peer_id_of(ReplicaId(r)))
        };
        // In-process links are named by replica already.
        let local: std::collections::BTreeSet<PeerId> = self
            .shared
            .local_links
            .lock()
            .map(|l| l.keys().copied().collect())
            .unwrap_or_default();
        let replicas: std::collections::BTreeSet<PeerId> =
            self.context()?.replicas().map(|r| peer_id_of(*r)).collect();
        let mut met = self.shared.views.met.lock().map_err(|_| Error::Closed)?;
        // Name ids already met (also from an earlier run's announcement) become replica ids.
        let named: Vec<(PeerId, PeerId)> = met
            .iter()
            .filter_map(|&p| resolve(p).filter(|q| *q != p).map(|q| (p, q)))
            .collect();
        for (p, q) in named {
            met.remove(&p);
            met.insert(q);
        }
        // Every peer linked since open, however briefly (a link that came and went before a
        // maintenance round still met it), and every peer connected now.
        for &p in status
            .peers_connected
            .iter()
            .chain(status.peer_acked.iter().map(|(p, _)| p))
        {
            if let Some(q) = resolve(p) {
                met.insert(q);
            } else if local.contains(&p) || replicas.contains(&p) {
                met.insert(p);
            }
        }
        Ok(met.iter().copied().collect())
    }

    /// One round of view maintenance (`views/maintain.rs`): idle watermarks, the retention
    /// horizon (announced, committed, then acted on), and purging the rows of removed
    /// windows. Returns the number of rows purged.
    ///
    /// # Errors
    /// Storage failures; [`Error::Closed`].
    pub async fn maintain_views(&self) -> Result<usize, Error> {
        use crate::views::maintain;
        let views = &self.shared.views;
        let round = views.maintenance.lock().await;
        let me = self.me();
        let known = self.view_members().await?;
        self.seal_step(&known, false).await?;
        let plans = maintain::plan(
            views,
            &self.reader()?,
            me,
            &known,
            peer_id_of,
            crate::clock::wall_ms(),
        )?;
        let mut purged = 0;
        for plan in plans {
            let rx = {
                let mut wms = views.watermarks.lock().map_err(|_| Error::Closed)?;
                match views.stage(&mut wms, &plan, me) {
                    Some(w) => Some(self.enqueue(vec![w])?),
                    None => None,
                }
            };
            if let Some(rx) = rx {
                rx.await.map_err(|_| Error::Closed)??;
            }
            views.raise_horizon(&plan.stream)?;
            let keys = maintain::expired_keys(
                views,
                &self.reader()?,
                &plan.stream,
                maintain::PURGE_BATCH,
                me,
            )?;
            if !keys.is_empty() {
                let (reply, rx) = oneshot::channel();
                self.send(Input::PurgeRows {
                    keys: keys.clone(),
                    reply,
                })?;
                let done = rx.await;
                // Forgotten after the purge (whatever its outcome), so nothing read before it
                // is recorded after.
                views.purged(&keys);
                purged += done.map_err(|_| Error::Closed)??;
            }
        }
        drop(round);
        // Contributions sealed windows leave out, into the late lane (`views/audit.rs`): under
        // a lock of its own, so view reads (which take the maintenance lock to seal) never
        // wait for an audit.
        let _audit = views.auditing.lock().await;
        let notes = views.audit_round(&self.reader()?, self.me(), crate::clock::wall_ms())?;
        if !notes.is_empty() {
            let written = match self.enqueue(notes) {
                Ok(rx) => rx.await.map_err(|_| Error::Closed).and_then(|r| r),
                Err(e) => Err(e),
            };
            if let Err(e) = written {
                views.audit_lost();
                return Err(e);
            }
        }
        Ok(purged)
    }

    /// The seal step of view maintenance (`views/seal.rs`): extends this node's membership
    /// epochs by the cluster watermark it vouches for, seals every deadline range all its
    /// members agree on, and waits until the announcement carrying them is committed (so a
    /// window is reported final only once its seal is durable). Call with the maintenance
    /// lock held.
    async fn seal_step(&self, known: &[PeerId], only_new_seals: bool) -> Result<(), Error> {
        use crate::views::maintain;
        let views = &self.shared.views;
        let me = self.me();
        let reader = self.reader()?;
        // Logged once by `note_removals` (WARN), which sees the record whether or not views run.
        if crate::views::read::gone(&reader)?.contains(&me) {
            views
                .removed
                .store(true, std::sync::atomic::Ordering::Relaxed);
        }
        // A node that has no watermark yet (a joining node, one that never ingested) starts
        // from its cluster's once it holds their announcements.
        let mut started = Vec::new();
        for stream in views.windowed_streams() {
            let at = self.sync_now(&stream).await?;
            let reader = self.reader()?;
            let mut wms = views.watermarks.lock().map_err(|_| Error::Closed)?;
            let (_, write) = views.first_sync(&mut wms, &stream, &reader, me, at)?;
            if let Some(w) = write {
                started.push(self.enqueue(vec![w])?);
            }
        }
        for rx in started {
            rx.await.map_err(|_| Error::Closed)??;
        }
        let inputs = maintain::seal_inputs(
            views,
            &self.reader()?,
            me,
            known,
            peer_id_of,
            crate::clock::wall_ms(),
        )?;
        let mut pending = Vec::new();
        for input in inputs {
            let wms = views.watermarks.lock().map_err(|_| Error::Closed)?;
            if let Some(w) = views.seal_stage(&wms, input, me, only_new_seals)? {
                pending.push(self.enqueue(vec![w])?);
            }
        }
        for rx in pending {
            rx.await.map_err(|_| Error::Closed)??;
        }
        Ok(())
    }

    /// Removes the member `replica` from the cluster for good (decommission): a replicated
    /// record every node learns (each logs it at INFO when it first does). From then on no
    /// node waits for its watermark: windows become final and retention proceeds without it
    /// (windows a seal already counts it in keep its contributions; its contributions to
    /// windows sealed afterwards are not counted). If it comes back it applies no event to a
    /// window (late, `decommissioned`). Use it for a member that is gone for good (its disk
    /// lost, or replaced by a restored copy under a new id).
    ///
    /// Idempotent: a member already removed is not written again; the answer is its existing
    /// record ([`Removal::already`]).
    ///
    /// # Errors
    /// [`Error::Config`] for this node itself; storage failures; [`Error::Closed`].
    pub async fn decommission(&self, replica: ReplicaId) -> Result<Removal, Error> {
        if replica == self.me() {
            return Err(Error::Config(
                "a node cannot remove itself: remove it from another member".into(),
            ));
        }
        // One removal at a time, so two requests for the same member write one record.
        let _one = self.shared.removing.lock().await;
        if let Some(existing) = self.removal(replica)? {
            return Ok(existing);
        }
        let at_ms = crate::clock::wall_ms();
        let by = self.me();
        // The name is kept in the record, so the member can still be named after SWIM forgets
        // it (a repeated `members remove NAME` after a restart answers with the record).
        let name = self.swim_name(replica);
        let record = serde_json::json!({"at": at_ms, "by": by.to_string(), "name": name});
        let w = LocalWrite {
            ops: vec![(
                crate::views::keys::gone_key(replica),
                tidemark_crdts::Mutation::Set(record.to_string()),
            )],
            ..LocalWrite::default()
        };
        let rx = self.enqueue(vec![w])?;
        rx.await.map_err(|_| Error::Closed)??;
        self.note_removals()?;
        self.settle_restored(false)?;
        Ok(Removal {
            replica,
            already: false,
            at_ms: Some(at_ms),
            by: Some(by),
            name,
        })
    }

    /// The name SWIM knows `replica` by, if it knows it.
    fn swim_name(&self, replica: ReplicaId) -> Option<String> {
        self.net_status().and_then(|n| {
            n.members
                .into_iter()
                .find(|m| m.replica.replace('-', "") == replica.to_string())
                .map(|m| m.name)
        })
    }

    /// The decommission record of `replica`, if the cluster removed it (`already` set).
    ///
    /// # Errors
    /// Storage failures.
    fn removal(&self, replica: ReplicaId) -> Result<Option<Removal>, Error> {
        let Value::Lww(Some(text)) = self.get(&crate::views::keys::gone_key(replica))? else {
            return Ok(None);
        };
        let record: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
        Ok(Some(Removal {
            replica,
            already: true,
            at_ms: record["at"].as_u64(),
            by: record["by"]
                .as_str()
                .and_then(|b| u128::from_str_radix(b, 16).ok())
                .map(ReplicaId),
            name: record["name"].as_str().map(str::to_owned),
        }))
    }

    /// Logs every removal this node has not logged yet, once each: INFO for another member
    /// (with who recorded it and when), WARN for this node itself. The records found at open
    /// are taken as known (logged by the run that learned them), except this node's own.
    ///
    /// # Errors
    /// Storage failures.
    fn note_removals(&self) -> Result<(), Error> {
        let gone = self.decommissioned()?;
        let Ok(mut known) = self.shared.removals_logged.lock() else {
            return Ok(());
        };
        let first = known.is_none();
        let logged = known.get_or_insert_with(std::collections::BTreeSet::new);
        for replica in gone {
            if !logged.insert(replica) {
                continue;
            }
            if replica == self.me() {
                tracing::warn!(
                    %replica,
                    "this node was removed from the cluster for good (decommissioned): it \
                     applies no more events to windows (they are kept in the late lane as \
                     decommissioned) and /readyz answers 503; start it on a new data \
                     directory to rejoin"
                );
            } else if !first {
                let r = self.removal(replica)?;
                let name = self
                    .swim_name(replica)
                    .or_else(|| r.as_ref().and_then(|r| r.name.clone()));
                tracing::info!(
                    %replica,
                    name = name.as_deref().unwrap_or("-"),
                    by = %r.as_ref().and_then(|r| r.by).map_or_else(|| "-".to_owned(), |b| b.to_string()),
                    at_ms = r.as_ref().and_then(|r| r.at_ms).unwrap_or(0),
                    "member removed from the cluster for good"
                );
            }
        }
        Ok(())
    }

    /// True when the cluster removed this node for good (a `~gone/` record names its replica,
    /// see [`Node::decommission`]).
    ///
    /// # Errors
    /// Storage failures.
    pub fn is_decommissioned(&self) -> Result<bool, Error> {
        self.get(&crate::views::keys::gone_key(self.me()))
            .map(|v| matches!(v, Value::Lww(Some(_))))
    }

    /// Every member removed for good (see [`Node::decommission`]), as this node knows it.
    ///
    /// # Errors
    /// Storage failures.
    pub fn decommissioned(&self) -> Result<Vec<ReplicaId>, Error> {
        Ok(crate::views::read::gone(&self.reader()?)?
            .into_iter()
            .collect())
    }

    /// The replica of the member `name`: a member SWIM knows by that name, or `name` itself
    /// when it is the replica id (32 hex digits) of a member or of a node whose writes this
    /// node holds (`None` otherwise: an id nobody has is no member).
    pub fn member_replica(&self, name: &str) -> Option<ReplicaId> {
        let swim = self.members();
        // A replica id is hex: any case names it.
        let lower = name.to_ascii_lowercase();
        let id_text = if name.len() == 32 {
            lower.as_str()
        } else {
            name
        };
        swim.iter()
            .find(|m| m.name == name)
            .and_then(|m| u128::from_str_radix(&m.replica.replace('-', ""), 16).ok())
            .map(ReplicaId)
            .or_else(|| {
                // A replica id only if this node knows it: a member, or writes it holds.
                let id = (name.len() == 32)
                    .then(|| u128::from_str_radix(name, 16).ok())
                    .flatten()
                    .map(ReplicaId)?;
                let known = self.context().ok()?.replicas().any(|r| *r == id)
                    || swim
                        .iter()
                        .any(|m| m.replica.replace('-', "") == id.to_string());
                known.then_some(id)
            })
            .or_else(|| {
                // A member removed for good, by the name its record keeps (SWIM forgets it).
                self.decommissioned().ok()?.into_iter().find(|r| {
                    *r != self.me()
                        && (r.to_string() == id_text
                            || self
                                .removal(*r)
                                .ok()
                                .flatten()
                                .and_then(|rec| rec.name)
                                .is_some_and(|n| n == name))
                })
            })
    }

    /// Brings this node's seals up to date before a read of views (one seal step under the
    /// maintenance lock), so a read reports final every window this node can seal now.
    async fn seal_before_read(&self) -> Result<Vec<PeerId>, Error> {
        let views = &self.shared.views;
        let _round = views.maintenance.lock().await;
        let known = self.view_members().await?;
        self.seal_step(&known, true).await?;
        Ok(known)
    }

    /// The configured views.
    pub fn views(&self) -> &[crate::views::CompiledView] {
        self.shared.views.list()
    }

    /// The committed value of `key` (the empty value of its type if never written).
    ///
    /// # Errors
    /// Storage failures.
    pub fn get(&self, key: &Key) -> Result<Value, Error> {
        Ok(self
            .reader()?
            .get(key)?
            .unwrap_or_else(|| Value::empty(key.kind)))
    }

    /// The committed value of `key`, or `None` when the store holds nothing for it (never
    /// written, or deleted with no state left): what tells a missing key from one whose value
    /// is its type's empty value.
    ///
    /// # Errors
    /// Storage failures.
    pub fn find(&self, key: &Key) -> Result<Option<Value>, Error> {
        Ok(self.reader()?.get(key)?)
    }

    /// Up to `limit` keys of `kind` with names starting with `prefix`, after `after`, ascending.
    ///
    /// # Errors
    /// Storage failures.
    pub fn list(
        &self,
        kind: KeyKind,
        prefix: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<(Key, Value)>, Error> {
        Ok(self.reader()?.list(kind, prefix, after, limit)?)
    }

    /// Changes committed from now on that match `filter`.
    pub fn watch(&self, filter: KeyFilter) -> Watch {
        self.shared.changes.subscribe(filter, None)
    }

    /// Changes committed after `cursor` (a [`Watch::cursor`] of this node, also from an earlier
    /// run) that match `filter`: every one exactly once, in commit order, as long as they are
    /// held (`limits.watch_buffer_max` / `_bytes_max`, `limits.watch_resume_secs`). When they
    /// are not, the first event is [`WatchEvent::Reset`](crate::WatchEvent::Reset): re-read
    /// the keys, then the changes after the reset follow. Never a silent gap.
    pub fn watch_from(&self, filter: KeyFilter, cursor: Cursor) -> Watch {
        self.shared.changes.subscribe(filter, Some(cursor))
    }

    /// The cursor of the newest change published (a watch started now resumes after it).
    pub fn watch_cursor(&self) -> Cursor {
        self.shared.changes.newest()
    }

    /// Where the watch feed stands: changes held and how far behind each watcher is.
    pub fn watch_status(&self) -> crate::watch::FeedStatus {
        self.shared.changes.status()
    }

    /// The committed causal context (the digest of everything this node has seen). In relaxed
    /// durability it includes local commits that are not durable yet.
    ///
    /// # Errors
    /// Storage failures.
    pub fn context(&self) -> Result<CausalContext, Error> {
        Ok(self.reader()?.context()?)
    }

    /// The retained deltas a peer at `remote` lacks, joined, up to about `bytes_max` bytes.
    /// Only durable commits are served: in relaxed durability pending commits are made durable
    /// first.
    ///
    /// # Errors
    /// Storage failures; [`Error::Closed`].
    pub async fn deltas_since(
        &self,
        remote: CausalContext,
        bytes_max: usize,
    ) -> Result<DeltasSince, Error> {
        let (reply, rx) = oneshot::channel();
        self.send(Input::DeltasSince {
            remote,
            bytes_max,
            reply,
        })?;
        rx.await.map_err(|_| Error::Closed)?
    }

    /// Joins a remote delta (with redundancy removal), durably (in relaxed durability too),
    /// before returning.
    /// `Ok(Err(reason))` when the delta is invalid: nothing applied.
    ///
    /// # Errors
    /// Storage failures; [`Error::Closed`].
    pub async fn apply_remote(
        &self,
        origin: PeerId,
        delta: Delta,
    ) -> Result<Result<ApplyOutcome, Rejected>, Error> {
        let (reply, rx) = oneshot::channel();
        self.send(Input::ApplyRemote {
            origin,
            delta,
            reply,
        })?;
        rx.await.map_err(|_| Error::Closed)?
    }

    /// Compacts: drops delta-log entries below `below` (default: all; replication passes the
    /// stable frontier) and reports what was reclaimed.
    ///
    /// # Errors
    /// Storage failures.
    pub async fn compact(&self, below: Option<u64>) -> Result<CompactReport, Error> {
        let (reply, rx) = oneshot::channel();
        self.send(Input::Compact { below, reply })?;
        rx.await.map_err(|_| Error::Closed)?
    }

    /// Writes a consistent point-in-time snapshot of this node's state to the file `out`
    /// (rows, dot index, context, dedup marks, HLC mark and every other table; not the delta
    /// log, not the replication cursors) while writes continue. The state is that of ONE redb
    /// read transaction taken by the writer at a durable point (in relaxed durability pending
    /// commits are made durable first). The copy is written to a temporary file next to `out`,
    /// fsynced, reopened and verified, then renamed to `out` and the directory fsynced: when
    /// this returns `Ok`, `out` is a complete verified snapshot; on any failure or crash
    /// nothing is left under `out`. A snapshot of a node that belongs to a cluster — a joining
    /// node ([`NodeConfig::joining`], or a node restored from such a snapshot), or one that
    /// has met a peer — records it: the restored copy opens as a joining node. A snapshot of a
    /// node that never met anyone does not: its copy works alone as the node did.
    ///
    /// # Errors
    /// [`Error::Store`] ([`crate::store::StoreError::Snapshot`] when `out` exists, storage and
    /// filesystem failures); [`Error::Closed`].
    pub async fn snapshot(
        &self,
        out: impl AsRef<std::path::Path>,
    ) -> Result<crate::store::SnapshotInfo, Error> {
        let (reply, rx) = oneshot::channel();
        self.send(Input::SnapshotRead { reply })?;
        let rtxn = rx.await.map_err(|_| Error::Closed)??;
        let out = out.as_ref().to_path_buf();
        let limits = self.shared.config.limits.clone();
        let joining = self.shared.views.copies_join();
        tokio::task::spawn_blocking(move || {
            rtxn.write_to(&out, &limits, crate::clock::wall_ms(), joining)
        })
        .await
        .map_err(|_| Error::Closed)?
        .map_err(Error::from)
    }

    /// Creates the data directory `dir` from a snapshot file, under a NEW replica id (and an
    /// epoch above the source's), so the restored node never reissues a dot of the node the
    /// snapshot was taken from (docs/design/principles.md, "Never reuse a dot": the kv679 bug
    /// class); then open it with [`Node::open`]. Refuses a non-empty `dir`. A node restored from a
    /// snapshot of X and connected to X catches up by deltas from X's log (no state transfer to
    /// it), as long as X still retains its log from the snapshot's point.
    ///
    /// A copy of a node that belonged to a cluster (the snapshot says so, see
    /// [`Node::snapshot`]) opens as a joining node whatever its [`NodeConfig::joining`]: until
    /// it syncs a stream with its cluster it applies no event to the stream's windows (late,
    /// `not_synced`) and seals nothing alone, even when the snapshot holds no announcement of
    /// the stream. A copy of a node that never met anyone (and of a snapshot written before
    /// this was recorded) opens as configured.
    ///
    /// # Errors
    /// [`Error::Store`]: an invalid snapshot, a non-empty `dir`, storage and filesystem failures.
    pub fn restore(
        snapshot: impl AsRef<std::path::Path>,
        dir: impl AsRef<std::path::Path>,
    ) -> Result<crate::store::SnapshotInfo, Error> {
        Ok(crate::store::restore_snapshot(
            snapshot.as_ref(),
            dir.as_ref(),
            None,
            &crate::limits::Limits::default(),
        )?)
    }

    /// Current metrics.
    pub fn metrics(&self) -> MetricsSnapshot {
        self.shared.metrics.snapshot()
    }

    /// The applied-writes counter sampled about once a second over the last ten minutes,
    /// oldest first (the console's write-rate chart; kept in memory, empty after open).
    pub fn write_history(&self) -> Vec<crate::metrics::WriteSample> {
        self.shared.metrics.write_history()
    }

    /// Histograms of local commit groups (group size, commit and fsync latency), live.
    pub fn commit_histograms(&self) -> crate::metrics::CommitHistograms {
        self.shared.metrics.commit_histograms()
    }

    /// Stops the writer after the writes already queued, and closes the database.
    ///
    /// # Errors
    /// [`Error::Closed`] if already shut down.
    pub async fn shutdown(&self) -> Result<(), Error> {
        // The members known now are kept for the next run (also between the periodic saves).
        self.remember_members();
        // The background tasks stop first (at their next await): a round under way drops the
        // readers it holds.
        let tasks: Vec<_> = self
            .shared
            .tasks
            .lock()
            .map(|mut t| std::mem::take(&mut *t))
            .unwrap_or_default();
        for task in tasks {
            task.abort();
            let _ = task.await;
        }
        let net = self.shared.net.lock().ok().and_then(|mut g| g.take());
        if let Some(net) = net {
            net.shutdown().await;
        }
        let (reply, rx) = oneshot::channel();
        self.send(Input::Shutdown { reply })?;
        let _ = rx.await;
        if let Ok(mut g) = self.shared.inputs.lock() {
            g.take();
        }
        // Release our read handle so the database file closes with the writer.
        let released = self
            .shared
            .reader
            .lock()
            .ok()
            .and_then(|mut g| g.take())
            .map(|r| r.release_watch());
        let thread = self.shared.thread.lock().ok().and_then(|mut g| g.take());
        if let Some(t) = thread {
            tokio::task::spawn_blocking(move || t.join())
                .await
                .map_err(|_| Error::Closed)?
                .map_err(|_| Error::Closed)?;
        }
        // A background task may hold a reader for a moment (a removal or view round under
        // way): the store is closed, and the directory free to open again, only once it let go.
        if let Some(watch) = released {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
            while !watch.released() && tokio::time::Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            if !watch.released() {
                tracing::warn!("a reader still holds the store 5 s after shutdown");
            }
        }
        Ok(())
    }
}

#[cfg(test)]
#[path = "node_trust_tests.rs"]
mod trust_tests;

#[cfg(test)]
#[path = "node_held_tests.rs"]
mod held_tests;

#[cfg(test)]
#[path = "node_held_review_tests.rs"]
mod held_review_tests;

/// Runs [`Node::maintain_views`] every [`crate::views::maintain::TICK`] while the node is
/// open (holding it only during a round).
async fn views_maintenance(shared: std::sync::Weak<Shared>) {
    let mut tick = tokio::time::interval(crate::views::maintain::TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(shared) = shared.upgrade() else {
            return;
        };
        let node = Node { shared };
        match node.maintain_views().await {
            Ok(_) => {}
            Err(Error::Closed) => return,
            Err(e) => tracing::warn!(error = %e, "view maintenance failed"),
        }
    }
}

/// Logs removals learned from peers ([`Node::note_removals`]) every [`REMOVALS_TICK`] while
/// the node is open (holding it only during a look).
async fn removals_watch(shared: std::sync::Weak<Shared>) {
    let mut tick = tokio::time::interval(REMOVALS_TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(shared) = shared.upgrade() else {
            return;
        };
        let node = Node { shared };
        match node.note_removals() {
            Ok(()) => {}
            Err(Error::Closed) => return,
            Err(e) => tracing::debug!(error = %e, "looking for removals failed"),
        }
        node.remember_members();
    }
}

/// Keeps an ingest batch's events registered as in flight until its commit is known, even if
/// the caller stops waiting (then a task waits for the commit).
struct BatchGuard {
    views: Arc<crate::views::Views>,
    inflight: crate::views::InFlight,
    pending: Option<oneshot::Receiver<Result<LocalCommit, Error>>>,
}

impl Drop for BatchGuard {
    fn drop(&mut self) {
        let inflight = std::mem::take(&mut self.inflight);
        match (self.pending.take(), tokio::runtime::Handle::try_current()) {
            (None, _) => self.views.end_batch(&inflight),
            (Some(rx), Ok(rt)) => {
                let views = Arc::clone(&self.views);
                rt.spawn(async move {
                    let _ = rx.await;
                    views.end_batch(&inflight);
                });
            }
            // No runtime to wait on: the sources stay registered, so their later batches keep
            // per-event view mutations (correct, only slower).
            (Some(_), Err(_)) => {}
        }
    }
}

#[cfg(test)]
#[path = "node_inline_tests.rs"]
mod inline_tests;
