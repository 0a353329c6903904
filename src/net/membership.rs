//! SWIM membership and failure detection through the `foca` crate, carried as QUIC datagrams
//! on the same authenticated peer connections as the replication stream.
//!
//! # Why datagrams
//! SWIM is built on unreliable, unordered probes: a lost ping is exactly what it must notice.
//! QUIC datagrams give that on the connection that is already mutually authenticated (no second
//! port, no second handshake), without head-of-line blocking behind a large state transfer on
//! the replication stream, and without retransmissions that would hide a dead peer.
//!
//! # Identity and authentication
//! A member is [`MemberId`]: the node name its certificate names, its peer address, replica id,
//! epoch and boot time. A restart (same replica id, new epoch) and a wipe (new replica id) are
//! new identities with the same name; once the old one is down (or left), foca keeps the newer
//! (later boot) one, so both rejoin. While a member is alive its name is its own: another
//! identity claiming it (a second process holding a certificate for that name) is refused,
//! logged and counted (`NetStats::name_conflicts`), and the transport refuses its connections.
//! A datagram is handed to foca only if the header's sender name is the authenticated
//! name of the connection it came on; anything else is dropped and counted.
//!
//! # What SWIM decides
//! Only members SWIM reports alive (and connected) are given to the replica as up peers
//! (`NetEvent::Alive`); a member declared down is taken down at once and
//! evicted from the replica after `member_down_grace_ms`. Seeds (`join_peer`) are only for
//! joining: every new authenticated connection is announced to, and SWIM keeps dialing the
//! members it probes.
//!
//! Every message goes through [`crate::codec`] (version byte + bincode, size-limited) behind a
//! 2-byte length, which is what foca's `Codec` needs (one item read per call).

use super::NetStats;
use super::link::{EventSink, NetEvent};
use bytes::{Buf, BufMut, Bytes};
use foca::{AccumulatingRuntime, Foca, Header, Identity, Member, OwnedNotification, State, Timer};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, oneshot};

/// A cluster member's SWIM identity.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct MemberId {
    /// The node name (as its certificate names it).
    pub(crate) name: String,
    /// Where its peer endpoint listens.
    pub(crate) addr: SocketAddr,
    /// Its replica id (a wiped node has a new one).
    pub(crate) replica: u128,
    /// Its epoch (bumped at every open of its store).
    pub(crate) epoch: u64,
    /// Wall-clock ms when its endpoint started: the later boot wins a name conflict with a
    /// member that is down.
    pub(crate) boot_ms: u64,
    /// Bumped when it renews itself after being declared down.
    pub(crate) bump: u16,
    /// The build version it runs (`CARGO_PKG_VERSION`; empty: not known, as in the partial
    /// identity an announce is addressed to).
    pub(crate) version: String,
}

/// The longest version text shown for a member; a longer one (or one with control
/// characters) is shown as unknown.
const VERSION_BYTES_MAX: usize = 64;

/// A member's version as shown: `None` when it announced none or one that is not a short
/// printable text.
fn shown_version(v: &str) -> Option<String> {
    (!v.is_empty() && v.len() <= VERSION_BYTES_MAX && !v.chars().any(char::is_control))
        .then(|| v.to_owned())
}

impl MemberId {
    fn rank(&self) -> (u64, u16, u64, u128) {
        (self.boot_ms, self.bump, self.epoch, self.replica)
    }

    /// True when `self` is `other` renewed after being declared down: the same incarnation of
    /// the same process with a later bump.
    fn renews(&self, other: &Self) -> bool {
        self.name == other.name
            && self.addr == other.addr
            && self.replica == other.replica
            && self.epoch == other.epoch
            && self.boot_ms == other.boot_ms
            && (1..=u16::MAX / 2).contains(&self.bump.wrapping_sub(other.bump))
    }
}

std::thread_local! {
    /// The members this thread's membership task has as active (alive or suspect) while one of
    /// its foca calls runs: what `MemberId::win_addr_conflict` needs and foca does not pass.
    static ACTIVE: std::cell::RefCell<Vec<MemberId>> = const { std::cell::RefCell::new(Vec::new()) };
    /// Conflicts decided during that call: (the active member kept, the newcomer refused).
    static REFUSED: std::cell::RefCell<Vec<(MemberId, MemberId)>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

impl Identity for MemberId {
    type Addr = String;

    fn renew(&self) -> Option<Self> {
        Some(Self {
            bump: self.bump.wrapping_add(1),
            ..self.clone()
        })
    }

    fn addr(&self) -> String {
        self.name.clone()
    }

    /// foca asks this of the identity it knows (`self`) against another with the same name.
    /// A renewal always wins over the identity it renews. Otherwise a member that is alive (or
    /// suspect) keeps its name: a second process with a certificate for it (a copied
    /// certificate, a misconfigured node) is refused rather than cutting the real one off. Only
    /// once the known one is down (or left) does the later boot win, so a restarted or wiped
    /// member rejoins.
    fn win_addr_conflict(&self, adversary: &Self) -> bool {
        if adversary.renews(self) {
            return false;
        }
        if self.renews(adversary) {
            return true;
        }
        if ACTIVE.with(|a| a.borrow().contains(self)) {
            REFUSED.with(|r| r.borrow_mut().push((self.clone(), adversary.clone())));
            return true;
        }
        self.rank() > adversary.rank()
    }
}

/// foca's codec through [`crate::codec`]: each item is a 2-byte big-endian length followed by
/// the codec's bytes (at most `limit`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct SwimCodec {
    pub(crate) limit: usize,
}

/// Why a SWIM item could not be encoded or decoded.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SwimCodecError {
    /// The codec refused it.
    #[error(transparent)]
    Codec(#[from] crate::codec::CodecError),
    /// The item is over the size limit.
    #[error("SWIM item of {0} bytes is over the limit")]
    TooLarge(usize),
    /// No room left in the packet (foca then sends what it has).
    #[error("no room left in the packet")]
    NoRoom,
    /// The packet ends inside an item.
    #[error("truncated SWIM packet")]
    Truncated,
}

impl SwimCodec {
    fn put<T: Serialize>(
        &self,
        what: &'static str,
        value: &T,
        mut buf: impl BufMut,
    ) -> Result<(), SwimCodecError> {
        let bytes = crate::codec::encode(what, value)?;
        let len = u16::try_from(bytes.len())
            .ok()
            .filter(|l| usize::from(*l) <= self.limit)
            .ok_or(SwimCodecError::TooLarge(bytes.len()))?;
        if buf.remaining_mut() < bytes.len() + 2 {
            return Err(SwimCodecError::NoRoom);
        }
        buf.put_u16(len);
        buf.put_slice(&bytes);
        Ok(())
    }

    fn take<T: serde::de::DeserializeOwned + Serialize>(
        &self,
        what: &'static str,
        mut buf: impl Buf,
    ) -> Result<T, SwimCodecError> {
        if buf.remaining() < 2 {
            return Err(SwimCodecError::Truncated);
        }
        let len = usize::from(buf.get_u16());
        if len > self.limit {
            return Err(SwimCodecError::TooLarge(len));
        }
        if buf.remaining() < len {
            return Err(SwimCodecError::Truncated);
        }
        let mut bytes = vec![0u8; len];
        buf.copy_to_slice(&mut bytes);
        Ok(crate::codec::decode(what, &bytes, self.limit)?)
    }
}

impl foca::Codec<MemberId> for SwimCodec {
    type Error = SwimCodecError;

    fn encode_header(
        &mut self,
        header: &Header<MemberId>,
        buf: impl BufMut,
    ) -> Result<(), Self::Error> {
        self.put("swim header", header, buf)
    }

    fn decode_header(&mut self, buf: impl Buf) -> Result<Header<MemberId>, Self::Error> {
        self.take("swim header", buf)
    }

    fn encode_member(
        &mut self,
        member: &Member<MemberId>,
        buf: impl BufMut,
    ) -> Result<(), Self::Error> {
        self.put("swim member", member, buf)
    }

    fn decode_member(&mut self, buf: impl Buf) -> Result<Member<MemberId>, Self::Error> {
        self.take("swim member", buf)
    }
}

/// SWIM timing of a node (part of [`super::NetOptions`]).
#[derive(Clone, Debug)]
pub struct SwimOptions {
    /// How often a random member is probed (default 1 s).
    pub probe_period: Duration,
    /// How long a direct probe waits for its ack before indirect probes (default 300 ms).
    pub probe_rtt: Duration,
    /// A suspect member not refuting in this time is declared down (default 3 s). A member
    /// killed without goodbye is declared down within about `probe_period × members +
    /// probe_period + suspect_to_down` (the SWIM timeout).
    pub suspect_to_down: Duration,
    /// Largest SWIM datagram (default 1,100 bytes: under QUIC's minimum datagram room).
    pub packet_bytes_max: usize,
}

impl Default for SwimOptions {
    fn default() -> Self {
        Self {
            probe_period: Duration::from_secs(1),
            probe_rtt: Duration::from_millis(300),
            suspect_to_down: Duration::from_secs(3),
            packet_bytes_max: 1100,
        }
    }
}

/// A member's SWIM state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MemberState {
    /// Answering probes.
    Alive,
    /// Suspected by some member; still treated as alive until declared down.
    Suspect,
    /// Declared down (or left): not a replication peer; evicted after the grace period.
    Down,
}

/// One member as this node's SWIM sees it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct MemberStatus {
    /// The node name (authenticated by its certificate when it talks to us).
    pub name: String,
    /// Its peer endpoint address.
    pub addr: SocketAddr,
    /// SWIM state.
    pub state: MemberState,
    /// SWIM incarnation (bumped when it refutes a suspicion).
    pub incarnation: u16,
    /// Its replica id (hex).
    pub replica: String,
    /// Its store epoch (bumped at every restart).
    pub epoch: u64,
    /// Milliseconds since this node last received a SWIM datagram from it (`None`: never).
    pub last_contact_ms: Option<u64>,
    /// Down because it said goodbye (its connection closed with a clean shutdown), not
    /// because it stopped answering.
    pub left: bool,
    /// The build version it announced in its SWIM identity (`None`: not known).
    pub version: Option<String>,
}

/// Inputs of the membership task.
pub(crate) enum SwimInput {
    /// A datagram from the authenticated peer `from`.
    Data { from: String, bytes: Bytes },
    /// A foca timer is due.
    Timer(Timer<MemberId>),
    /// A connection to `name` (listening at `addr`) was authenticated: announce to it.
    Linked { name: String, addr: SocketAddr },
    /// Leave the cluster (clean shutdown) and stop.
    Leave { done: oneshot::Sender<()> },
}

/// The handle the endpoint keeps on its membership task.
#[derive(Debug)]
pub(crate) struct Membership {
    pub(crate) tx: mpsc::Sender<SwimInput>,
    pub(crate) view: Arc<Mutex<Vec<MemberStatus>>>,
    pub(crate) alive: Arc<Mutex<BTreeMap<String, MemberId>>>,
    /// When a SWIM datagram last came from each member (by name).
    contact: Arc<Mutex<BTreeMap<String, Instant>>>,
    /// Members whose connection ended with a clean shutdown since they were last alive.
    left: Arc<Mutex<BTreeSet<String>>>,
}

const INPUT_QUEUE: usize = 1024;
/// Refused newcomers remembered (so each is logged and counted once); forgotten when full.
const REFUSED_REMEMBERED: usize = 1024;

/// What SWIM needs of the transport under it (the QUIC endpoint): datagrams to a member, and
/// a link to every member it finds alive.
pub(crate) trait SwimLinks: Send + Sync + 'static {
    /// Sends one SWIM datagram to member `name` at `addr` (queued until a link exists).
    fn send_swim(self: &Arc<Self>, name: &str, addr: SocketAddr, bytes: Bytes);
    /// Makes sure a connection to member `name` at `addr` exists or is being made.
    fn ensure_link(self: &Arc<Self>, name: &str, addr: SocketAddr);
}

impl Membership {
    /// Starts the membership task of `net` as `me`, reporting liveness to `events`.
    pub(crate) fn start<N: SwimLinks>(
        net: &Arc<N>,
        (events, stats): (EventSink, Arc<NetStats>),
        me: MemberId,
        opts: &SwimOptions,
        seed: u64,
    ) -> Self {
        let (tx, rx) = mpsc::channel(INPUT_QUEUE);
        let view = Arc::new(Mutex::new(Vec::new()));
        let alive = Arc::new(Mutex::new(BTreeMap::new()));
        let contact = Arc::new(Mutex::new(BTreeMap::new()));
        let left = Arc::new(Mutex::new(BTreeSet::new()));
        let mut config = foca::Config::simple();
        config.probe_period = opts.probe_period;
        config.probe_rtt = opts.probe_rtt;
        config.suspect_to_down_after = opts.suspect_to_down;
        config.max_packet_size = std::num::NonZeroUsize::new(opts.packet_bytes_max.max(256))
            .unwrap_or(config.max_packet_size);
        config.notify_down_members = true;
        // Partitions heal: members declared down are re-announced to (and remembered long
        // enough for it), and a few random members are re-announced to periodically.
        config.remove_down_after = Duration::from_secs(24 * 3600);
        config.periodic_announce_to_down_members = Some(foca::PeriodicParams {
            frequency: opts.probe_period * 2,
            num_members: std::num::NonZeroUsize::MIN.saturating_add(1),
        });
        config.periodic_announce = Some(foca::PeriodicParams {
            frequency: opts.probe_period * 5,
            num_members: std::num::NonZeroUsize::MIN,
        });
        config.periodic_gossip = Some(foca::PeriodicParams {
            frequency: opts.probe_period / 2,
            num_members: std::num::NonZeroUsize::MIN.saturating_add(2),
        });
        let codec = SwimCodec {
            limit: opts.packet_bytes_max.max(256),
        };
        let foca = Foca::new(me, config, ChaCha8Rng::seed_from_u64(seed), codec);
        let task = Task {
            net: Arc::downgrade(net),
            foca,
            codec,
            rt: AccumulatingRuntime::new(),
            tx: tx.clone(),
            view: Arc::clone(&view),
            alive: Arc::clone(&alive),
            contact: Arc::clone(&contact),
            left: Arc::clone(&left),
            logged: BTreeMap::new(),
            refused: BTreeSet::new(),
            events,
            stats,
        };
        tokio::spawn(task.run(rx));
        Self {
            tx,
            view,
            alive,
            contact,
            left,
        }
    }

    /// Hands a received datagram to the task (dropped when its queue is full: SWIM tolerates
    /// loss).
    pub(crate) fn datagram(&self, from: &str, bytes: Bytes) {
        let _ = self.tx.try_send(SwimInput::Data {
            from: from.to_owned(),
            bytes,
        });
    }

    /// True when at least one other member is alive.
    pub(crate) fn joined(&self) -> bool {
        self.alive.lock().is_ok_and(|a| !a.is_empty())
    }

    /// True when `name` is an alive member.
    pub(crate) fn is_alive(&self, name: &str) -> bool {
        self.alive.lock().is_ok_and(|a| a.contains_key(name))
    }

    /// The members as SWIM sees them now, with when each was last heard from and whether a
    /// down one left cleanly.
    pub(crate) fn members(&self) -> Vec<MemberStatus> {
        let mut members = self.view.lock().map(|v| v.clone()).unwrap_or_default();
        let now = Instant::now();
        let contact = self.contact.lock().map(|c| c.clone()).unwrap_or_default();
        let left = self.left.lock().map(|l| l.clone()).unwrap_or_default();
        for m in &mut members {
            m.last_contact_ms = contact.get(&m.name).map(|at| {
                u64::try_from(now.saturating_duration_since(*at).as_millis()).unwrap_or(u64::MAX)
            });
            m.left = m.state == MemberState::Down && left.contains(&m.name);
        }
        members
    }

    /// Records that the connection to `name` ended with its clean shutdown (it left).
    pub(crate) fn mark_left(&self, name: &str) {
        if let Ok(mut l) = self.left.lock() {
            l.insert(name.to_owned());
        }
    }

    /// Announces our leave and stops the task (bounded wait).
    pub(crate) async fn leave(&self) {
        let (done, rx) = oneshot::channel();
        if self.tx.send(SwimInput::Leave { done }).await.is_ok() {
            let _ = tokio::time::timeout(Duration::from_millis(200), rx).await;
        }
    }
}

type SwimFoca = Foca<MemberId, SwimCodec, ChaCha8Rng, foca::NoCustomBroadcast>;

struct Task<N> {
    net: std::sync::Weak<N>,
    foca: SwimFoca,
    codec: SwimCodec,
    rt: AccumulatingRuntime<MemberId>,
    tx: mpsc::Sender<SwimInput>,
    view: Arc<Mutex<Vec<MemberStatus>>>,
    alive: Arc<Mutex<BTreeMap<String, MemberId>>>,
    contact: Arc<Mutex<BTreeMap<String, Instant>>>,
    left: Arc<Mutex<BTreeSet<String>>>,
    /// The state each member was last logged in.
    logged: BTreeMap<String, MemberState>,
    /// Newcomers refused for an active member's name (name, boot, replica), each logged once.
    refused: BTreeSet<(String, u64, u128)>,
    events: EventSink,
    stats: Arc<NetStats>,
}

impl<N: SwimLinks> Task<N> {
    async fn run(mut self, mut rx: mpsc::Receiver<SwimInput>) {
        while let Some(input) = rx.recv().await {
            let result = match input {
                SwimInput::Data { from, bytes } => self.on_data(&from, &bytes),
                SwimInput::Timer(t) => {
                    self.deciding(|task| task.foca.handle_timer(t, &mut task.rt))
                }
                SwimInput::Linked { name, addr } => {
                    let known = self
                        .alive
                        .lock()
                        .is_ok_and(|a| a.get(&name).is_some_and(|m| m.addr == addr));
                    if known {
                        Ok(())
                    } else {
                        // The destination's full identity is unknown yet: foca accepts an
                        // announce addressed to any identity with the receiver's name.
                        let dst = MemberId {
                            name,
                            addr,
                            replica: 0,
                            epoch: 0,
                            boot_ms: 0,
                            bump: 0,
                            version: String::new(),
                        };
                        self.foca.announce(dst, &mut self.rt)
                    }
                }
                SwimInput::Leave { done } => {
                    let r = self.foca.leave_cluster(&mut self.rt);
                    self.drain();
                    let _ = done.send(());
                    if let Err(e) = r {
                        tracing::debug!(error = %e, "swim: leave");
                    }
                    return;
                }
            };
            if let Err(e) = result {
                tracing::debug!(error = %e, "swim input refused");
            }
            self.drain();
        }
    }

    /// Hands a datagram to foca only if its sender is the connection's authenticated name.
    fn on_data(&mut self, from: &str, bytes: &[u8]) -> Result<(), foca::Error> {
        let mut peek = bytes;
        let claimed = foca::Codec::decode_header(&mut self.codec, &mut peek);
        match claimed {
            Ok(h) if h.src.name == from => {
                if let Ok(mut c) = self.contact.lock() {
                    c.insert(from.to_owned(), Instant::now());
                }
                self.deciding(|task| task.foca.handle_data(bytes, &mut task.rt))
            }
            _ => {
                NetStats::add(&self.stats.frames_rejected, 1);
                tracing::warn!(
                    peer = from,
                    "SWIM datagram refused (undecodable or not its sender)"
                );
                Ok(())
            }
        }
    }

    /// Runs a foca call that may meet identity conflicts: foca decides them through
    /// `MemberId::win_addr_conflict`, which is told who is active now; each newcomer refused
    /// for an active member's name is then counted and logged once.
    fn deciding<T>(&mut self, call: impl FnOnce(&mut Self) -> T) -> T {
        let active: Vec<MemberId> = self
            .foca
            .iter_membership_state()
            .filter(|m| m.state() != State::Down)
            .map(|m| m.id().clone())
            .collect();
        ACTIVE.with(|a| *a.borrow_mut() = active);
        let out = call(self);
        ACTIVE.with(|a| a.borrow_mut().clear());
        let refused = REFUSED.with(|r| std::mem::take(&mut *r.borrow_mut()));
        for (kept, newcomer) in refused {
            let key = (newcomer.name.clone(), newcomer.boot_ms, newcomer.replica);
            if self.refused.len() >= REFUSED_REMEMBERED {
                self.refused.clear();
            }
            if self.refused.insert(key) {
                NetStats::add(&self.stats.name_conflicts, 1);
                tracing::warn!(
                    member = %kept.name,
                    member_addr = %kept.addr,
                    newcomer_addr = %newcomer.addr,
                    newcomer_replica = %format!("{:032x}", newcomer.replica),
                    "refused a second member with the name of one that is alive"
                );
            }
        }
        out
    }

    fn drain(&mut self) {
        let Some(net) = self.net.upgrade() else {
            return;
        };
        while let Some((to, bytes)) = self.rt.to_send() {
            net.send_swim(&to.name, to.addr, bytes);
        }
        while let Some((after, timer)) = self.rt.to_schedule() {
            let tx = self.tx.clone();
            tokio::spawn(async move {
                tokio::time::sleep(after).await;
                let _ = tx.send(SwimInput::Timer(timer)).await;
            });
        }
        while let Some(n) = self.rt.to_notify() {
            match n {
                OwnedNotification::MemberUp(id) => self.set_alive(&net, id, true),
                OwnedNotification::MemberDown(id) => self.set_alive(&net, id, false),
                OwnedNotification::Rename(old, new) => {
                    let was = self
                        .alive
                        .lock()
                        .is_ok_and(|a| a.get(&old.name) == Some(&old));
                    if was {
                        self.set_alive(&net, new, true);
                    }
                }
                other => tracing::debug!(?other, "swim notification"),
            }
        }
        let view: Vec<MemberStatus> = self
            .foca
            .iter_membership_state()
            .map(|m| MemberStatus {
                name: m.id().name.clone(),
                addr: m.id().addr,
                state: match m.state() {
                    State::Alive => MemberState::Alive,
                    State::Suspect => MemberState::Suspect,
                    State::Down => MemberState::Down,
                },
                incarnation: m.incarnation(),
                replica: format!("{:032x}", m.id().replica),
                epoch: m.id().epoch,
                last_contact_ms: None,
                left: false,
                version: shown_version(&m.id().version),
            })
            .collect();
        self.log_transitions(&view);
        if let Ok(mut v) = self.view.lock() {
            *v = view;
        }
    }

    /// Logs each member's SWIM state change once: becoming suspect or down at WARN (an operator
    /// should look), alive (new or again) at INFO.
    fn log_transitions(&mut self, view: &[MemberStatus]) {
        for (m, before) in transitions(&mut self.logged, view) {
            match (before, m.state) {
                (_, MemberState::Suspect) => tracing::warn!(
                    member = %m.name,
                    addr = %m.addr,
                    "member suspect: it does not answer probes"
                ),
                (_, MemberState::Down) => tracing::warn!(
                    member = %m.name,
                    addr = %m.addr,
                    "member down: no longer a replication peer"
                ),
                (None, MemberState::Alive) => {
                    tracing::info!(member = %m.name, addr = %m.addr, "member alive");
                }
                (Some(_), MemberState::Alive) => {
                    tracing::info!(member = %m.name, addr = %m.addr, "member alive again");
                }
            }
        }
    }

    fn set_alive(&mut self, net: &Arc<N>, id: MemberId, alive: bool) {
        let peer = super::peer_id_of_name(&id.name);
        let changed = match self.alive.lock() {
            Ok(mut a) if alive => a.insert(id.name.clone(), id.clone()).is_none(),
            Ok(mut a) => {
                if a.get(&id.name) == Some(&id) {
                    a.remove(&id.name);
                    true
                } else {
                    false
                }
            }
            Err(_) => false,
        };
        // The state changes are logged once each by `log_transitions`.
        if alive {
            if let Ok(mut l) = self.left.lock() {
                l.remove(&id.name);
            }
            net.ensure_link(&id.name, id.addr);
        }
        if changed {
            let _ = self.events.send(NetEvent::Alive { peer, alive });
        }
    }
}

/// The members of `view` whose state differs from the one `logged` holds for them (with that
/// former state), recording their new state; members gone from `view` are forgotten.
fn transitions<'a>(
    logged: &mut BTreeMap<String, MemberState>,
    view: &'a [MemberStatus],
) -> Vec<(&'a MemberStatus, Option<MemberState>)> {
    let mut changed = Vec::new();
    for m in view {
        let before = logged.insert(m.name.clone(), m.state);
        if before != Some(m.state) {
            changed.push((m, before));
        }
    }
    if logged.len() > view.len() {
        logged.retain(|name, _| view.iter().any(|m| &m.name == name));
    }
    changed
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(name: &str, state: MemberState) -> MemberStatus {
        MemberStatus {
            name: name.to_owned(),
            addr: "127.0.0.1:7701".parse().expect("addr"),
            state,
            incarnation: 0,
            replica: String::new(),
            epoch: 1,
            last_contact_ms: None,
            left: false,
            version: None,
        }
    }

    fn id(name: &str, boot_ms: u64, replica: u128) -> MemberId {
        MemberId {
            name: name.to_owned(),
            addr: "127.0.0.1:7701".parse().expect("addr"),
            replica,
            epoch: 1,
            boot_ms,
            bump: 0,
            version: env!("CARGO_PKG_VERSION").to_owned(),
        }
    }

    #[test]
    fn a_member_identity_carries_its_version_through_the_codec() {
        let me = id("alpha", 5, 7);
        let bytes = crate::codec::encode("swim identity", &me).expect("encode");
        let back: MemberId = crate::codec::decode("swim identity", &bytes, 1024).expect("decode");
        assert_eq!(back.version, env!("CARGO_PKG_VERSION"));
        assert_eq!(back, me);
        assert_eq!(
            shown_version(&back.version).as_deref(),
            Some(env!("CARGO_PKG_VERSION"))
        );
        assert_eq!(shown_version(""), None);
        assert_eq!(shown_version("1.0\n"), None);
        assert_eq!(shown_version("1.0\u{7}"), None);
        assert_eq!(shown_version(&"9".repeat(65)), None);
    }

    fn conflict_while_active(active: &[MemberId], known: &MemberId, other: &MemberId) -> bool {
        ACTIVE.with(|a| *a.borrow_mut() = active.to_vec());
        let kept = known.win_addr_conflict(other);
        ACTIVE.with(|a| a.borrow_mut().clear());
        kept
    }

    #[test]
    fn an_alive_member_keeps_its_name_and_a_down_one_gives_it_to_the_later_boot() {
        let real = id("n1", 1_000, 7);
        let impostor = id("n1", 2_000, 9);
        REFUSED.with(|r| r.borrow_mut().clear());
        // Alive (or suspect): the later boot is refused, and the refusal is recorded.
        assert!(conflict_while_active(
            std::slice::from_ref(&real),
            &real,
            &impostor
        ));
        let refused = REFUSED.with(|r| std::mem::take(&mut *r.borrow_mut()));
        assert_eq!(refused, [(real.clone(), impostor.clone())]);
        // Down (not active): the later boot wins, as a restarted or wiped member must.
        assert!(!conflict_while_active(&[], &real, &impostor));
        assert!(conflict_while_active(&[], &impostor, &real));
        assert!(REFUSED.with(|r| r.borrow().is_empty()));
        // A renewal (declared down, it renewed itself) wins over its old identity, active or
        // not, even across the bump's wrap; the old one never wins back.
        let renewed = real.renew().expect("renew");
        assert!(!conflict_while_active(
            std::slice::from_ref(&real),
            &real,
            &renewed
        ));
        assert!(conflict_while_active(&[], &renewed, &real));
        let mut old = real.clone();
        old.bump = u16::MAX;
        let wrapped = old.renew().expect("renew");
        assert_eq!(wrapped.bump, 0);
        assert!(wrapped.win_addr_conflict(&old));
        assert!(!old.win_addr_conflict(&wrapped));
        // A copy with a later bump but another boot is no renewal.
        let mut forged = impostor.clone();
        forged.bump = 1;
        assert!(!forged.renews(&real));
        assert!(conflict_while_active(
            std::slice::from_ref(&real),
            &real,
            &forged
        ));
        REFUSED.with(|r| r.borrow_mut().clear());
    }

    #[test]
    fn each_state_change_is_reported_once() {
        use MemberState::{Alive, Down, Suspect};
        let mut logged = BTreeMap::new();
        let names = |c: Vec<(&MemberStatus, Option<MemberState>)>| {
            c.into_iter()
                .map(|(m, before)| (m.name.clone(), before, m.state))
                .collect::<Vec<_>>()
        };
        let v = [status("a", Alive), status("b", Alive)];
        assert_eq!(
            names(transitions(&mut logged, &v)),
            [("a".into(), None, Alive), ("b".into(), None, Alive)]
        );
        assert!(transitions(&mut logged, &v).is_empty());
        let v = [status("a", Suspect), status("b", Alive)];
        assert_eq!(
            names(transitions(&mut logged, &v)),
            [("a".into(), Some(Alive), Suspect)]
        );
        assert!(transitions(&mut logged, &v).is_empty());
        let v = [status("a", Down), status("b", Alive)];
        assert_eq!(
            names(transitions(&mut logged, &v)),
            [("a".into(), Some(Suspect), Down)]
        );
        assert!(transitions(&mut logged, &v).is_empty());
        let v = [status("a", Alive)];
        assert_eq!(
            names(transitions(&mut logged, &v)),
            [("a".into(), Some(Down), Alive)]
        );
        assert_eq!(logged.len(), 1, "b, forgotten by SWIM, is forgotten");
    }
}
