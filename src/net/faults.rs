//! A fault-injecting UDP socket under quinn (tests and examples): drops, duplicates, delays
//! and partitions datagrams on the sending side, by seed.

use quinn::udp::{RecvMeta, Transmit};
use quinn::{AsyncUdpSocket, UdpPoller};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::BTreeSet;
use std::io::{self, IoSliceMut};
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

#[derive(Debug)]
struct FaultState {
    rng: ChaCha8Rng,
    blocked: BTreeSet<SocketAddr>,
    isolated: bool,
    drop_per_mille: u32,
    dup_per_mille: u32,
    delay_ms_max: u64,
}

/// The fault plan of one endpoint, shared with its socket: change it at any time. Every
/// decision is drawn from one seeded RNG (the order of datagrams still depends on scheduling,
/// so a seed reproduces the plan, not the exact run).
#[derive(Clone, Debug)]
pub struct Faults {
    state: Arc<Mutex<FaultState>>,
    dropped: Arc<AtomicU64>,
}

/// What to do with one datagram.
enum Fate {
    Send,
    Drop,
    Duplicate,
    Delay(Duration),
}

impl Faults {
    /// No faults yet; `seed` drives every later random decision.
    pub fn new(seed: u64) -> Self {
        Self {
            state: Arc::new(Mutex::new(FaultState {
                rng: ChaCha8Rng::seed_from_u64(seed),
                blocked: BTreeSet::new(),
                isolated: false,
                drop_per_mille: 0,
                dup_per_mille: 0,
                delay_ms_max: 0,
            })),
            dropped: Arc::new(AtomicU64::new(0)),
        }
    }

    fn with<T>(&self, f: impl FnOnce(&mut FaultState) -> T) -> Option<T> {
        self.state.lock().ok().map(|mut s| f(&mut s))
    }

    /// Drops every datagram sent to `addr` (a one-way partition; block on both sides for a
    /// full one).
    pub fn block(&self, addr: SocketAddr) {
        self.with(|s| s.blocked.insert(addr));
    }

    /// Stops dropping datagrams to `addr`.
    pub fn unblock(&self, addr: SocketAddr) {
        self.with(|s| s.blocked.remove(&addr));
    }

    /// Drops every datagram this endpoint sends (`true`) or stops doing so.
    pub fn isolate(&self, on: bool) {
        self.with(|s| s.isolated = on);
    }

    /// Ends every partition and isolation (random loss stays as set).
    pub fn heal(&self) {
        self.with(|s| {
            s.blocked.clear();
            s.isolated = false;
        });
    }

    /// Random faults per datagram: drop and duplicate probabilities in ‰, and a uniform delay
    /// of up to `delay_ms_max` (which also reorders).
    pub fn set_random(&self, drop_per_mille: u32, dup_per_mille: u32, delay_ms_max: u64) {
        self.with(|s| {
            s.drop_per_mille = drop_per_mille;
            s.dup_per_mille = dup_per_mille;
            s.delay_ms_max = delay_ms_max;
        });
    }

    /// Datagrams dropped so far (partitions and random loss).
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    fn fate(&self, to: SocketAddr) -> Fate {
        let fate = self.with(|s| {
            if s.isolated || s.blocked.contains(&to) {
                return Fate::Drop;
            }
            let roll = s.rng.random_range(0..1000u32);
            if roll < s.drop_per_mille {
                Fate::Drop
            } else if roll < s.drop_per_mille + s.dup_per_mille {
                Fate::Duplicate
            } else if s.delay_ms_max > 0 && s.rng.random_range(0..4u32) == 0 {
                Fate::Delay(Duration::from_millis(
                    s.rng.random_range(0..=s.delay_ms_max),
                ))
            } else {
                Fate::Send
            }
        });
        let fate = fate.unwrap_or(Fate::Send);
        if matches!(fate, Fate::Drop) {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
        fate
    }
}

/// A UDP socket that applies [`Faults`] to what it sends.
#[derive(Debug)]
pub(crate) struct FaultySocket {
    inner: Arc<dyn AsyncUdpSocket>,
    faults: Faults,
}

impl FaultySocket {
    pub(crate) fn new(inner: Arc<dyn AsyncUdpSocket>, faults: Faults) -> Self {
        Self { inner, faults }
    }
}

impl AsyncUdpSocket for FaultySocket {
    fn create_io_poller(self: Arc<Self>) -> Pin<Box<dyn UdpPoller>> {
        Arc::clone(&self.inner).create_io_poller()
    }

    fn try_send(&self, transmit: &Transmit) -> io::Result<()> {
        match self.faults.fate(transmit.destination) {
            Fate::Send => self.inner.try_send(transmit),
            Fate::Drop => Ok(()),
            Fate::Duplicate => {
                self.inner.try_send(transmit)?;
                let _ = self.inner.try_send(transmit);
                Ok(())
            }
            Fate::Delay(d) => {
                let Ok(rt) = tokio::runtime::Handle::try_current() else {
                    return self.inner.try_send(transmit);
                };
                let inner = Arc::clone(&self.inner);
                let (destination, ecn, segment_size, src_ip) = (
                    transmit.destination,
                    transmit.ecn,
                    transmit.segment_size,
                    transmit.src_ip,
                );
                let contents = transmit.contents.to_vec();
                rt.spawn(async move {
                    tokio::time::sleep(d).await;
                    let _ = inner.try_send(&Transmit {
                        destination,
                        ecn,
                        contents: &contents,
                        segment_size,
                        src_ip,
                    });
                });
                Ok(())
            }
        }
    }

    fn poll_recv(
        &self,
        cx: &mut Context,
        bufs: &mut [IoSliceMut<'_>],
        meta: &mut [RecvMeta],
    ) -> Poll<io::Result<usize>> {
        self.inner.poll_recv(cx, bufs, meta)
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.inner.local_addr()
    }

    fn max_transmit_segments(&self) -> usize {
        self.inner.max_transmit_segments()
    }

    fn max_receive_segments(&self) -> usize {
        self.inner.max_receive_segments()
    }

    fn may_fragment(&self) -> bool {
        self.inner.may_fragment()
    }
}
