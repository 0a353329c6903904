//! One quinn endpoint per node: accepts and dials peers, authenticates them, and carries
//! protocol frames between the QUIC stream of each peer and the node's writer thread.
//!
//! # Per connection
//! 1. QUIC + TLS 1.3 handshake with mutual certificate verification against the cluster CA.
//! 2. The dialer opens the connection's only bidirectional stream; each side sends a
//!    [`NetHello`] (node name, instance nonce) as its first frame. Each side checks that the
//!    peer's certificate names the node the peer claims; otherwise the connection is closed and
//!    counted, before anything reaches the replica.
//! 3. Frames: a 4-byte little-endian length, then [`crate::codec`] bytes (version byte +
//!    bincode). A length over `frame_bytes_max`, an undecodable frame, or a message the replica
//!    refuses closes the connection (counted); nothing of it is applied.
//!
//! # Bounds
//! Outgoing: a per-peer queue of `outbox_frames_max` frames; when it is full the frame is dropped
//! (the replica retransmits, widening the interval: a slow peer never makes anything queue).
//! Incoming: at most `inbound_bytes_max` decoded bytes per connection wait for the writer; the
//! reader stops reading until they are applied, so QUIC flow control pushes back on the sender.
//! One stream per connection (the peer may not open more), at most `peers_max` connections.
//!
//! # Membership
//! SWIM datagrams (`membership`) ride the same authenticated connection (QUIC datagrams, a
//! bounded buffer each way). A connection registers its peer with the writer, but the replica
//! treats it as up only while SWIM reports the member alive. Seeds are dialled until joined;
//! afterwards connections are made to the members SWIM probes. While SWIM has a member alive,
//! a connection from another instance (hello nonce) with its name is refused with the
//! name-conflict close code, so a second process holding a certificate for that name cannot take
//! its place; a restarted member gets in once SWIM has declared its old incarnation down.

use super::certs::TlsDir;
use super::faults::{Faults, FaultySocket};
use super::link::{EventSink, NetEvent, PeerLink, close};
use super::membership::{MemberId, MemberStatus, Membership, SwimLinks, SwimOptions};
use super::tls::{self, DIAL_NAME};
use super::{NetError, NetStats, NetStatsSnapshot, NetStatus, peer_id_of_name};
use crate::proto::{Message, PeerId};
use bytes::Bytes;
use quinn::{Connection, Endpoint, RecvStream, SendStream, VarInt};
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, mpsc};

/// Network options of a node (timeouts and bounds of the transport).
#[derive(Clone, Debug)]
pub struct NetOptions {
    /// Largest frame accepted or sent, checked before reading its body (default: the node's
    /// `limits.frame_bytes_max`).
    pub frame_bytes_max: usize,
    /// Decoded bytes per connection waiting for the writer before the reader stops reading
    /// (default 2 × `frame_bytes_max`, at least one frame).
    pub inbound_bytes_max: usize,
    /// Frames queued per peer for sending; more are dropped and retransmitted later by the
    /// protocol (default 64).
    pub outbox_frames_max: usize,
    /// Most simultaneous peer connections (default 64).
    pub peers_max: usize,
    /// Keep-alive interval of a connection (default 500 ms).
    pub keep_alive: Duration,
    /// A connection silent this long is closed and the peer reported down (default 3 s).
    pub idle_timeout: Duration,
    /// Time for the name exchange after the TLS handshake (default 5 s).
    pub handshake_timeout: Duration,
    /// First and largest delay between dial attempts to a join address (default 100 ms, 2 s).
    pub redial_min: Duration,
    /// See `redial_min`.
    pub redial_max: Duration,
    /// Fault injection under QUIC (tests and examples; `None` in production).
    pub faults: Option<Faults>,
    /// SWIM membership timing (failure detection).
    pub swim: SwimOptions,
    /// The address other members dial to reach this node (default: the bound address). Needed
    /// when binding every interface (`0.0.0.0`, `[::]`), which no peer can dial: starting such
    /// an endpoint without it is refused. Port 0 means "the bound port".
    pub advertise: Option<SocketAddr>,
}

impl NetOptions {
    /// Defaults for frames of at most `frame_bytes_max` bytes.
    pub fn new(frame_bytes_max: usize) -> Self {
        Self {
            frame_bytes_max,
            inbound_bytes_max: frame_bytes_max.saturating_mul(2),
            outbox_frames_max: 64,
            peers_max: 64,
            keep_alive: Duration::from_millis(500),
            idle_timeout: Duration::from_secs(3),
            handshake_timeout: Duration::from_secs(5),
            redial_min: Duration::from_millis(100),
            redial_max: Duration::from_secs(2),
            faults: None,
            swim: SwimOptions::default(),
            advertise: None,
        }
    }
}

/// The first frame on a connection: who the sender claims to be.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct NetHello {
    /// The node name (must be the one its certificate names).
    pub(crate) name: String,
    /// Random per endpoint start: tells a restarted peer's new connection from a duplicate.
    pub(crate) instance: u64,
}

const HELLO_BYTES_MAX: usize = 1024;
/// Receive and send buffer of SWIM datagrams per connection.
const DATAGRAM_BUFFER_BYTES: usize = 64 * 1024;
/// SWIM datagrams kept per member while a connection to it is being dialled.
const PENDING_DATAGRAMS_MAX: usize = 16;

/// What [`Net::register`] made of a new connection.
enum Registration {
    /// Registered under this link id.
    Linked(u64),
    /// Another connection to the same peer is kept.
    Duplicate,
    /// Another member with the peer's name is alive on another connection.
    NameConflict,
}

/// Name conflicts remembered (each logged once); forgotten when full.
const CONFLICTS_REMEMBERED: usize = 1024;

struct LinkEntry {
    id: u64,
    instance: u64,
    dialer_is_me: bool,
    conn: Connection,
}

/// A node's network endpoint (shared by its accept loop, dial loops and connections).
pub(crate) struct Net {
    endpoint: Endpoint,
    client: quinn::ClientConfig,
    name: String,
    instance: u64,
    pub(crate) events: EventSink,
    opts: NetOptions,
    membership: OnceLock<Membership>,
    /// Addresses being dialled now (one attempt each).
    dialing: Mutex<BTreeSet<SocketAddr>>,
    /// SWIM datagrams waiting for a connection to their member.
    pending: Mutex<BTreeMap<String, Vec<Bytes>>>,
    links: Mutex<BTreeMap<String, LinkEntry>>,
    /// Name conflicts already logged: (peer name, peer instance).
    conflicts: Mutex<BTreeSet<(String, u64)>>,
    /// The instance of the last connection registered for each peer name.
    instances: Mutex<BTreeMap<String, u64>>,
    /// Refused and failed connections already warned about, per remote and reason.
    warned: super::refusals::WarnLimiter,
    next_link: AtomicU64,
    pub(crate) stats: Arc<NetStats>,
    closing: AtomicBool,
    closed: Notify,
    local_addr: SocketAddr,
    /// The address members dial (`NetOptions::advertise`, else `local_addr`).
    advertised: SocketAddr,
}

/// The address members dial: `advertise` (its port 0 replaced by the bound port), else the bound
/// address, which must then be one a peer can dial (not `0.0.0.0` / `[::]`).
fn advertised_addr(
    bound: SocketAddr,
    advertise: Option<SocketAddr>,
) -> Result<SocketAddr, NetError> {
    let mut addr = advertise.unwrap_or(bound);
    if addr.port() == 0 {
        addr.set_port(bound.port());
    }
    if addr.ip().is_unspecified() {
        return Err(NetError::Config(format!(
            "peers cannot dial {addr}: a node bound to every interface must name the address \
             peers use to reach it (`--advertise ADDR`, `peer.advertise`)"
        )));
    }
    Ok(addr)
}

impl std::fmt::Debug for Net {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Net")
            .field("name", &self.name)
            .field("local_addr", &self.local_addr)
            .finish_non_exhaustive()
    }
}

fn transport_config(opts: &NetOptions) -> Result<Arc<quinn::TransportConfig>, NetError> {
    let mut t = quinn::TransportConfig::default();
    t.max_concurrent_bidi_streams(VarInt::from_u32(1))
        .max_concurrent_uni_streams(VarInt::from_u32(0))
        .keep_alive_interval(Some(opts.keep_alive))
        .max_idle_timeout(Some(
            quinn::IdleTimeout::try_from(opts.idle_timeout)
                .map_err(|e| NetError::Config(format!("idle_timeout: {e}")))?,
        ))
        // SWIM's datagrams: a small bounded buffer (a full one drops, which SWIM tolerates).
        .datagram_receive_buffer_size(Some(DATAGRAM_BUFFER_BYTES))
        .datagram_send_buffer_size(DATAGRAM_BUFFER_BYTES);
    Ok(Arc::new(t))
}

impl Net {
    /// Binds `addr`, starts accepting peers and joins SWIM as `(replica, epoch)`. Must run
    /// inside a tokio runtime.
    pub(crate) fn start(
        addr: SocketAddr,
        tls: &TlsDir,
        mut opts: NetOptions,
        events: EventSink,
        seed: u64,
        (replica, epoch): (u128, u64),
    ) -> Result<Arc<Net>, NetError> {
        opts.inbound_bytes_max = opts.inbound_bytes_max.max(opts.frame_bytes_max);
        if u32::try_from(opts.inbound_bytes_max).is_err() {
            return Err(NetError::Config(
                "inbound_bytes_max must fit in 32 bits".into(),
            ));
        }
        let transport = transport_config(&opts)?;
        let mut server = quinn::ServerConfig::with_crypto(Arc::new(tls::server_crypto(tls)?));
        server.transport_config(Arc::clone(&transport));
        let mut client = quinn::ClientConfig::new(Arc::new(tls::client_crypto(tls)?));
        client.transport_config(transport);
        let socket = std::net::UdpSocket::bind(addr).map_err(NetError::Io)?;
        let runtime: Arc<dyn quinn::Runtime> = Arc::new(quinn::TokioRuntime);
        let mut udp = runtime.wrap_udp_socket(socket).map_err(NetError::Io)?;
        if let Some(faults) = &opts.faults {
            udp = Arc::new(FaultySocket::new(udp, faults.clone()));
        }
        let endpoint = Endpoint::new_with_abstract_socket(
            quinn::EndpointConfig::default(),
            Some(server),
            udp,
            runtime,
        )
        .map_err(NetError::Io)?;
        let local_addr = endpoint.local_addr().map_err(NetError::Io)?;
        let advertised = advertised_addr(local_addr, opts.advertise)?;
        let net = Arc::new(Net {
            endpoint,
            client,
            name: tls.name().to_owned(),
            instance: seed,
            events,
            opts,
            membership: OnceLock::new(),
            dialing: Mutex::new(BTreeSet::new()),
            pending: Mutex::new(BTreeMap::new()),
            links: Mutex::new(BTreeMap::new()),
            conflicts: Mutex::new(BTreeSet::new()),
            instances: Mutex::new(BTreeMap::new()),
            warned: super::refusals::WarnLimiter::new(Duration::from_secs(60)),
            next_link: AtomicU64::new(1),
            stats: Arc::new(NetStats::default()),
            closing: AtomicBool::new(false),
            closed: Notify::new(),
            local_addr,
            advertised,
        });
        let me = MemberId {
            name: net.name.clone(),
            addr: advertised,
            replica,
            epoch,
            boot_ms: crate::clock::wall_ms(),
            bump: 0,
            version: env!("CARGO_PKG_VERSION").to_owned(),
        };
        let sinks = (net.events.clone(), Arc::clone(&net.stats));
        let membership = Membership::start(&net, sinks, me, &net.opts.swim, seed);
        let _ = net.membership.set(membership);
        tokio::spawn(Arc::clone(&net).accept_loop());
        tracing::info!(name = %net.name, %local_addr, %advertised, "peer endpoint listening");
        Ok(net)
    }

    pub(crate) fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    fn is_closing(&self) -> bool {
        self.closing.load(Ordering::Acquire)
    }

    /// Announces our leave to the cluster (SWIM), then closes every connection and the
    /// endpoint; dial loops stop.
    pub(crate) async fn shutdown(&self) {
        if let Some(m) = self.membership.get() {
            m.leave().await;
            // Let the leave datagrams go out before the connections close.
            tokio::time::sleep(Duration::from_millis(30)).await;
        }
        self.closing.store(true, Ordering::Release);
        self.closed.notify_waiters();
        self.endpoint
            .close(VarInt::from_u32(close::SHUTDOWN), b"shutdown");
        let _ = tokio::time::timeout(Duration::from_millis(250), self.endpoint.wait_idle()).await;
    }

    /// What the endpoint knows: name, address, connected peers, counters.
    pub(crate) fn status(&self) -> NetStatus {
        let links = self.links.lock().map(|l| {
            l.iter()
                .filter(|(_, e)| e.conn.close_reason().is_none())
                .map(|(n, e)| (n.clone(), e.conn.stats()))
                .collect::<Vec<_>>()
        });
        let links = links.unwrap_or_default();
        let mut stats: NetStatsSnapshot = self.stats.snapshot();
        for (_, s) in &links {
            stats.udp_bytes_sent += s.udp_tx.bytes;
            stats.udp_bytes_received += s.udp_rx.bytes;
        }
        NetStatus {
            name: self.name.clone(),
            local_addr: self.local_addr,
            peers: links.into_iter().map(|(n, _)| n).collect(),
            members: self.members(),
            stats,
        }
    }

    /// The cluster members as SWIM sees them.
    pub(crate) fn members(&self) -> Vec<MemberStatus> {
        self.membership
            .get()
            .map(Membership::members)
            .unwrap_or_default()
    }

    fn live_conn(&self, name: &str) -> Option<Connection> {
        self.links
            .lock()
            .ok()?
            .get(name)
            .map(|e| e.conn.clone())
            .filter(|c| c.close_reason().is_none())
    }

    /// Sends a SWIM datagram to member `name` (at `addr`): on its connection, or once a
    /// connection to it is made (bounded; the oldest is dropped).
    pub(crate) fn send_swim(self: &Arc<Self>, name: &str, addr: SocketAddr, bytes: Bytes) {
        if let Some(conn) = self.live_conn(name) {
            NetStats::add(&self.stats.swim_bytes_sent, bytes.len() as u64);
            let _ = conn.send_datagram(bytes);
            return;
        }
        if let Ok(mut p) = self.pending.lock() {
            let q = p.entry(name.to_owned()).or_default();
            if q.len() >= PENDING_DATAGRAMS_MAX {
                q.remove(0);
            }
            q.push(bytes);
        }
        self.ensure_link(name, addr);
    }

    /// Dials member `name` at `addr` once unless a connection to it is live or being made.
    pub(crate) fn ensure_link(self: &Arc<Self>, name: &str, addr: SocketAddr) {
        if self.is_closing()
            || self.live_conn(name).is_some()
            || addr == self.local_addr
            || addr == self.advertised
        {
            return;
        }
        let fresh = self.dialing.lock().is_ok_and(|mut d| d.insert(addr));
        if !fresh {
            return;
        }
        let net = Arc::clone(self);
        tokio::spawn(async move {
            let outcome = net.dial(addr).await;
            if let Ok(mut d) = net.dialing.lock() {
                d.remove(&addr);
            }
            if let Err(e) = outcome {
                net.dial_failed(addr, &e, "member");
            }
        });
    }

    /// Logs a failed dial: at WARN (once a minute per address and reason) when the cause is
    /// configuration (certificates, names) or the address is a seed; at DEBUG when a member
    /// is merely down.
    fn dial_failed(&self, addr: SocketAddr, e: &NetError, what: &'static str) {
        let why = super::refusals::reason(&e.to_string());
        let loud = what == "seed" || super::refusals::is_misconfiguration(why);
        if let Some(suppressed) = loud
            .then(|| self.warned.due(&addr.to_string(), why))
            .flatten()
        {
            tracing::warn!(%addr, reason = why, error = %e, suppressed, "cannot connect to a {what} peer");
        } else {
            tracing::debug!(%addr, reason = why, error = %e, "cannot connect to a {what} peer");
        }
    }

    /// One dial to `addr`, running the connection to its end if it is made.
    async fn dial(self: &Arc<Self>, addr: SocketAddr) -> Result<String, NetError> {
        let connecting = self
            .endpoint
            .connect_with(self.client.clone(), addr, DIAL_NAME)
            .map_err(|e| NetError::Connect(e.to_string()))?;
        let conn = connecting
            .await
            .map_err(|e| NetError::Connect(e.to_string()))?;
        self.run_connection(conn, true).await
    }

    async fn accept_loop(self: Arc<Self>) {
        while let Some(incoming) = self.endpoint.accept().await {
            if self.is_closing() {
                incoming.refuse();
                break;
            }
            let live = self.links.lock().map_or(0, |l| l.len());
            if live >= self.opts.peers_max {
                NetStats::add(&self.stats.connections_refused, 1);
                incoming.refuse();
                continue;
            }
            let net = Arc::clone(&self);
            let remote = incoming.remote_address();
            tokio::spawn(async move {
                match incoming.await {
                    Ok(conn) => {
                        let _ = net.run_connection(conn, false).await;
                    }
                    Err(e) => {
                        net.connection_refused(remote, &e);
                    }
                }
            });
        }
    }

    /// Joins the cluster through the seed at `addr`: dials it with backoff until one
    /// authenticated connection to it was made (and announced to SWIM) or SWIM already knows a
    /// live member; then stops. Afterwards SWIM decides whom to keep connected.
    pub(crate) fn spawn_dial_loop(self: &Arc<Self>, addr: SocketAddr) {
        let net = Arc::clone(self);
        tokio::spawn(async move {
            let mut backoff = net.opts.redial_min;
            while !net.is_closing() {
                if net.membership.get().is_some_and(Membership::joined) {
                    return;
                }
                let fresh = net.dialing.lock().is_ok_and(|mut d| d.insert(addr));
                let outcome = if fresh {
                    let connecting = net
                        .endpoint
                        .connect_with(net.client.clone(), addr, DIAL_NAME);
                    let r = match connecting {
                        Ok(c) => match c.await {
                            Ok(conn) => {
                                // The connection lives on its own task; this loop watches it.
                                let (net2, watched) = (Arc::clone(&net), conn.clone());
                                tokio::spawn(async move {
                                    let _ = net2.run_connection(conn, true).await;
                                });
                                Ok(watched)
                            }
                            Err(e) => Err(NetError::Connect(e.to_string())),
                        },
                        Err(e) => Err(NetError::Connect(e.to_string())),
                    };
                    if let Ok(mut d) = net.dialing.lock() {
                        d.remove(&addr);
                    }
                    r
                } else {
                    Err(NetError::Connect("already dialling".into()))
                };
                match outcome {
                    // Joined through it: the seed did its job. If it closes first (the seed
                    // refused us, say while another member with our name looks alive there),
                    // dial again.
                    Ok(conn) => {
                        if net.joined_or_closed(&conn).await {
                            return;
                        }
                        backoff = (backoff * 2).min(net.opts.redial_max);
                    }
                    Err(e) => {
                        net.dial_failed(addr, &e, "seed");
                        backoff = (backoff * 2).min(net.opts.redial_max);
                    }
                }
                tokio::select! {
                    _ = tokio::time::sleep(backoff) => {}
                    _ = net.closed.notified() => break,
                }
            }
        });
    }

    /// Waits until SWIM has joined a live member (`true`) or `conn` closes first, or the
    /// endpoint closes (`false`).
    async fn joined_or_closed(&self, conn: &Connection) -> bool {
        loop {
            if self.membership.get().is_some_and(Membership::joined) {
                return true;
            }
            if conn.close_reason().is_some() || self.is_closing() {
                return false;
            }
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(50)) => {}
                _ = conn.closed() => {}
                _ = self.closed.notified() => return false,
            }
        }
    }

    /// Runs an established connection to its end: name exchange, registration with the
    /// writer, frames both ways. Returns the peer's name once it was authenticated.
    async fn run_connection(
        self: &Arc<Self>,
        conn: Connection,
        dialer: bool,
    ) -> Result<String, NetError> {
        let (peer_name, instance, send, recv) = match self.handshake(&conn, dialer).await {
            Ok(ok) => ok,
            // The peer refused us before its hello got out: a member with our name is alive
            // there.
            Err(e) if refused_for_our_name(&conn) => {
                self.refused_by_peer(&conn.remote_address().to_string(), 0);
                return Err(e);
            }
            Err(e) => {
                self.connection_refused(conn.remote_address(), &e);
                conn.close(VarInt::from_u32(close::IDENTITY), b"identity");
                return Err(e);
            }
        };
        let id = match self.register(&peer_name, instance, dialer, &conn) {
            Registration::Linked(id) => id,
            Registration::Duplicate => {
                conn.close(VarInt::from_u32(close::DUPLICATE), b"duplicate");
                return Ok(peer_name);
            }
            Registration::NameConflict => {
                NetStats::add(&self.stats.name_conflicts, 1);
                if self.first_conflict(&peer_name, instance) {
                    tracing::warn!(
                        peer = %peer_name,
                        remote = %conn.remote_address(),
                        "refused a second peer named like a member that is alive"
                    );
                }
                conn.close(VarInt::from_u32(close::NAME_CONFLICT), b"name conflict");
                return Err(NetError::Identity(format!(
                    "a member named {peer_name:?} is alive"
                )));
            }
        };
        NetStats::add(&self.stats.connections_established, 1);
        let peer = peer_id_of_name(&peer_name);
        let (tx, rx) = mpsc::channel(self.opts.outbox_frames_max.max(1));
        let link = PeerLink::quic(id, tx, conn.clone(), Arc::clone(&self.stats));
        if !self.events.send(NetEvent::Up { peer, link }) {
            conn.close(VarInt::from_u32(close::SHUTDOWN), b"shutdown");
            return Ok(peer_name);
        }
        let writer = tokio::spawn(write_frames(send, rx, Arc::clone(&self.stats)));
        let datagrams = {
            let (net, conn, name) = (Arc::clone(self), conn.clone(), peer_name.clone());
            tokio::spawn(async move {
                while let Ok(bytes) = conn.read_datagram().await {
                    NetStats::add(&net.stats.swim_bytes_received, bytes.len() as u64);
                    if let Some(m) = net.membership.get() {
                        m.datagram(&name, bytes);
                    }
                }
            })
        };
        let queued = self
            .pending
            .lock()
            .ok()
            .and_then(|mut p| p.remove(&peer_name))
            .unwrap_or_default();
        for bytes in queued {
            let _ = conn.send_datagram(bytes);
        }
        if let Some(m) = self.membership.get() {
            if !m.is_alive(&peer_name) {
                let _ = m.tx.try_send(super::membership::SwimInput::Linked {
                    name: peer_name.clone(),
                    addr: conn.remote_address(),
                });
            }
        }
        let why = self.read_frames(recv, peer).await;
        datagrams.abort();
        if let Some(quinn::ConnectionError::ApplicationClosed(c)) = conn.close_reason() {
            if c.error_code == VarInt::from_u32(close::SHUTDOWN) {
                if let Some(m) = self.membership.get() {
                    m.mark_left(&peer_name);
                }
            }
        }
        if refused_for_our_name(&conn) {
            self.refused_by_peer(&peer_name, instance);
        }
        if let Some(why) = why {
            NetStats::add(&self.stats.peers_disconnected, 1);
            tracing::warn!(peer = %peer_name, why, "disconnecting a peer");
            conn.close(VarInt::from_u32(close::PROTOCOL), why.as_bytes());
        }
        writer.abort();
        let s = conn.stats();
        NetStats::add(&self.stats.udp_bytes_sent_closed, s.udp_tx.bytes);
        NetStats::add(&self.stats.udp_bytes_received_closed, s.udp_rx.bytes);
        if let Ok(mut links) = self.links.lock() {
            if links.get(&peer_name).is_some_and(|e| e.id == id) {
                links.remove(&peer_name);
            }
        }
        let _ = self.events.send(NetEvent::Down { peer, link: id });
        Ok(peer_name)
    }

    async fn handshake(
        &self,
        conn: &Connection,
        dialer: bool,
    ) -> Result<(String, u64, SendStream, RecvStream), NetError> {
        let cert = tls::peer_end_entity(conn)
            .ok_or_else(|| NetError::Identity("no client certificate".into()))?;
        let mine = crate::codec::encode(
            "net hello",
            &NetHello {
                name: self.name.clone(),
                instance: self.instance,
            },
        )
        .map_err(|e| NetError::Identity(e.to_string()))?;
        let exchange = async {
            let (mut send, mut recv) = if dialer {
                conn.open_bi().await
            } else {
                conn.accept_bi().await
            }
            .map_err(|e| NetError::Identity(e.to_string()))?;
            if dialer {
                write_frame(&mut send, &mine).await?;
            }
            let bytes = read_frame(&mut recv, HELLO_BYTES_MAX)
                .await?
                .ok_or_else(|| NetError::Identity("closed before its hello".into()))?;
            let hello: NetHello = crate::codec::decode("net hello", &bytes, HELLO_BYTES_MAX)
                .map_err(|e| NetError::Identity(e.to_string()))?;
            if !dialer {
                write_frame(&mut send, &mine).await?;
            }
            Ok::<_, NetError>((hello, send, recv))
        };
        let (hello, send, recv) = tokio::time::timeout(self.opts.handshake_timeout, exchange)
            .await
            .map_err(|_| NetError::Identity("no hello in time".into()))??;
        if !tls::cert_names_node(&cert, &hello.name) {
            return Err(NetError::Identity(format!(
                "peer claims to be {:?} but its certificate names another node",
                hello.name
            )));
        }
        if hello.name == self.name {
            return Err(NetError::Identity("peer claims our own name".into()));
        }
        Ok((hello.name, hello.instance, send, recv))
    }

    /// Counts a refused peer connection and warns of it (rate-limited, with how many were
    /// suppressed): only a configuration problem is worth a warning; a peer that paused,
    /// restarted or timed out is reconnecting (debug).
    fn connection_refused(&self, remote: SocketAddr, e: &dyn std::fmt::Display) {
        NetStats::add(&self.stats.connections_refused, 1);
        let why = super::refusals::reason(&e.to_string());
        if let Some(suppressed) = (!super::refusals::is_transient(why))
            .then(|| self.warned.due(&remote.to_string(), why))
            .flatten()
        {
            tracing::warn!(%remote, reason = why, error = %e, suppressed, "refused a peer connection");
        } else {
            tracing::debug!(%remote, reason = why, error = %e, "peer connection failed");
        }
    }

    /// Counts (and logs once) that `peer` refused us for another member with our name.
    fn refused_by_peer(&self, peer: &str, instance: u64) {
        NetStats::add(&self.stats.name_conflicts, 1);
        if self.first_conflict(peer, instance) {
            tracing::warn!(
                peer,
                name = %self.name,
                "refused by a peer: another member with our name is alive there"
            );
        }
    }

    /// True the first time a name conflict with (`name`, `instance`) is met: later ones are
    /// counted but not logged again.
    fn first_conflict(&self, name: &str, instance: u64) -> bool {
        self.conflicts.lock().is_ok_and(|mut c| {
            if c.len() >= CONFLICTS_REMEMBERED {
                c.clear();
            }
            c.insert((name.to_owned(), instance))
        })
    }

    /// Registers an authenticated connection. `Duplicate` when another connection to the same
    /// peer is kept instead (both sides pick the same one: a newer peer instance wins, and
    /// between two connections of the same instances the one dialled by the smaller name);
    /// `NameConflict` when the peer is another instance than the last one registered with its
    /// name and SWIM has that member alive (or suspect): the newcomer is refused, whether the
    /// known one's connection is live or between reconnections. A restarted member gets in once
    /// SWIM has declared its old incarnation down (or it left).
    fn register(
        &self,
        name: &str,
        instance: u64,
        dialer_is_me: bool,
        conn: &Connection,
    ) -> Registration {
        let Ok(mut links) = self.links.lock() else {
            return Registration::Duplicate;
        };
        let id = self.next_link.fetch_add(1, Ordering::Relaxed);
        let preferred_dialer_is_me = self.name.as_str() < name;
        let known = self
            .instances
            .lock()
            .ok()
            .and_then(|i| i.get(name).copied());
        if known.is_some_and(|k| k != instance)
            && self.membership.get().is_some_and(|m| m.is_alive(name))
        {
            return Registration::NameConflict;
        }
        if let Some(old) = links.get(name) {
            let alive = old.conn.close_reason().is_none();
            let keep_old = alive
                && old.instance == instance
                && old.dialer_is_me == preferred_dialer_is_me
                && dialer_is_me != preferred_dialer_is_me;
            if keep_old {
                return Registration::Duplicate;
            }
            if alive {
                old.conn
                    .close(VarInt::from_u32(close::DUPLICATE), b"replaced");
            }
        }
        links.insert(
            name.to_owned(),
            LinkEntry {
                id,
                instance,
                dialer_is_me,
                conn: conn.clone(),
            },
        );
        if let Ok(mut i) = self.instances.lock() {
            i.insert(name.to_owned(), instance);
        }
        Registration::Linked(id)
    }

    /// Reads frames until the stream ends; `Some(reason)` if the peer broke the protocol.
    async fn read_frames(&self, mut recv: RecvStream, peer: PeerId) -> Option<&'static str> {
        let budget = Arc::new(Semaphore::new(self.opts.inbound_bytes_max));
        loop {
            let bytes = match read_frame(&mut recv, self.opts.frame_bytes_max).await {
                Ok(Some(b)) => b,
                Ok(None) => return None,
                Err(NetError::FrameTooLarge { .. }) => {
                    NetStats::add(&self.stats.frames_rejected, 1);
                    return Some("frame over the size limit");
                }
                Err(_) => return None,
            };
            NetStats::add(&self.stats.frame_bytes_received, bytes.len() as u64 + 4);
            let msg: Message =
                match crate::codec::decode("protocol frame", &bytes, self.opts.frame_bytes_max) {
                    Ok(m) => m,
                    Err(e) => {
                        NetStats::add(&self.stats.frames_rejected, 1);
                        tracing::warn!(error = %e, "undecodable frame");
                        return Some("undecodable frame");
                    }
                };
            let n = u32::try_from(bytes.len().max(1)).unwrap_or(u32::MAX);
            let permit: OwnedSemaphorePermit = match Arc::clone(&budget).acquire_many_owned(n).await
            {
                Ok(p) => p,
                Err(_) => return None,
            };
            let event = NetEvent::Message {
                from: peer,
                msg: Box::new(msg),
                permit: Some(permit),
                local: false,
            };
            if !self.events.send(event) {
                return None;
            }
        }
    }
}

/// True when the peer closed `conn` because a member with our name is alive there.
fn refused_for_our_name(conn: &Connection) -> bool {
    matches!(
        conn.close_reason(),
        Some(quinn::ConnectionError::ApplicationClosed(c))
            if c.error_code == VarInt::from_u32(close::NAME_CONFLICT)
    )
}

async fn write_frames(mut send: SendStream, mut rx: mpsc::Receiver<Vec<u8>>, stats: Arc<NetStats>) {
    while let Some(bytes) = rx.recv().await {
        NetStats::add(&stats.frame_bytes_sent, bytes.len() as u64 + 4);
        if write_frame(&mut send, &bytes).await.is_err() {
            return;
        }
    }
    let _ = send.finish();
}

/// Writes one length-delimited frame.
pub(crate) async fn write_frame(send: &mut SendStream, bytes: &[u8]) -> Result<(), NetError> {
    let len = u32::try_from(bytes.len()).map_err(|_| NetError::FrameTooLarge {
        len: bytes.len(),
        limit: u32::MAX as usize,
    })?;
    send.write_all(&len.to_le_bytes())
        .await
        .map_err(|e| NetError::Stream(e.to_string()))?;
    send.write_all(bytes)
        .await
        .map_err(|e| NetError::Stream(e.to_string()))
}

/// Reads one length-delimited frame; `Ok(None)` at a clean end of stream. The length is checked
/// against `limit` before the body is read.
pub(crate) async fn read_frame(
    recv: &mut RecvStream,
    limit: usize,
) -> Result<Option<Vec<u8>>, NetError> {
    let mut len = [0u8; 4];
    match recv.read_exact(&mut len).await {
        Ok(()) => {}
        Err(quinn::ReadExactError::FinishedEarly(0)) => return Ok(None),
        Err(e) => return Err(NetError::Stream(e.to_string())),
    }
    let len = u32::from_le_bytes(len) as usize;
    if len > limit {
        return Err(NetError::FrameTooLarge { len, limit });
    }
    let mut body = vec![0u8; len];
    recv.read_exact(&mut body)
        .await
        .map_err(|e| NetError::Stream(e.to_string()))?;
    Ok(Some(body))
}

impl SwimLinks for Net {
    fn send_swim(self: &Arc<Self>, name: &str, addr: SocketAddr, bytes: Bytes) {
        Net::send_swim(self, name, addr, bytes);
    }

    fn ensure_link(self: &Arc<Self>, name: &str, addr: SocketAddr) {
        Net::ensure_link(self, name, addr);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unspecified_bind_needs_an_advertised_address() {
        let any: SocketAddr = "0.0.0.0:7701".parse().expect("addr");
        assert!(matches!(
            advertised_addr(any, None),
            Err(NetError::Config(m)) if m.contains("--advertise")
        ));
        let v6any: SocketAddr = "[::]:7701".parse().expect("addr");
        assert!(advertised_addr(v6any, None).is_err());
        let public: SocketAddr = "10.1.2.3:0".parse().expect("addr");
        assert_eq!(
            advertised_addr(any, Some(public)).expect("advertised"),
            "10.1.2.3:7701".parse::<SocketAddr>().expect("addr")
        );
        let lo: SocketAddr = "127.0.0.1:7801".parse().expect("addr");
        assert_eq!(advertised_addr(lo, None).expect("bound"), lo);
        assert!(advertised_addr(lo, Some(any)).is_err());
    }
}
