//! The live feed consumers of this server — `GET /v1/watch` streams (kind `watch`) and
//! `GET /v1/views/{view}/final` feeds (kind `final`) — for the per-consumer metrics
//! (`tidemark_watch_consumer_*`).
//!
//! Each consumer gets an id from a per-process counter when its stream opens and is listed
//! until its stream ends or its client disconnects (the server notices a closed connection when
//! it next writes to it: a change, a window or a keep-alive). Every consumer holds one of the
//! `http.watchers_max` watcher slots while it is listed, so the list (and each per-consumer
//! metric family) has at most that many entries.
//!
//! A watch consumer is read through a [`WatchProbe`] of its watcher (the ring knows its
//! position). A final-window feed reports its own progress ([`FinalProgress`]): the windows it
//! read into its page and has not sent, and where its reading stopped; a scrape counts the
//! windows final after that (up to [`FINAL_COUNT_MAX`]).

use crate::Node;
use crate::views::FinalCursor;
use crate::watch::WatchProbe;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Instant;

/// Final windows a scrape counts past a final feed's page (one `final_windows` read): past
/// it, `behind_entries` is a lower bound.
pub(crate) const FINAL_COUNT_MAX: usize = 1000;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The consumers open now, by id.
#[derive(Debug, Default)]
pub(crate) struct Consumers {
    next: AtomicU64,
    live: Mutex<BTreeMap<u64, Probe>>,
}

#[derive(Clone, Debug)]
enum Probe {
    Watch(WatchProbe),
    Final(Arc<FinalProgress>),
}

/// One consumer's place in [`Consumers`]: it leaves the list when this is dropped (with the
/// stream that holds it).
#[derive(Debug)]
pub(crate) struct Registered {
    id: u64,
    consumers: Arc<Consumers>,
}

impl Registered {
    /// The consumer's id.
    pub(crate) fn id(&self) -> u64 {
        self.id
    }
}

impl Drop for Registered {
    fn drop(&mut self) {
        lock(&self.consumers.live).remove(&self.id);
    }
}

/// How far behind one consumer is, as a scrape reports it.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct ConsumerStatus {
    /// Its id (unique in this process).
    pub(crate) id: u64,
    /// `watch` or `final`.
    pub(crate) kind: &'static str,
    /// Entries it has not been sent (watch: changes after its position, of any key; final:
    /// final windows, counted up to [`FINAL_COUNT_MAX`] past its page).
    pub(crate) behind_entries: u64,
    /// Watch: age of the oldest change it has not read; final: time since its feed was last
    /// caught up (or opened). 0 when `behind_entries` is.
    pub(crate) behind_seconds: f64,
    /// Bytes held for it that it has not been sent (watch: in the shared ring; final: its
    /// page).
    pub(crate) buffered_bytes: u64,
}

impl Consumers {
    fn register(self: &Arc<Self>, probe: Probe) -> Registered {
        let id = self.next.fetch_add(1, Ordering::Relaxed) + 1;
        lock(&self.live).insert(id, probe);
        Registered {
            id,
            consumers: Arc::clone(self),
        }
    }

    /// Lists a watch stream, read through `probe`.
    pub(crate) fn register_watch(self: &Arc<Self>, probe: WatchProbe) -> Registered {
        self.register(Probe::Watch(probe))
    }

    /// Lists a final-window feed, which reports its progress into `progress`.
    pub(crate) fn register_final(self: &Arc<Self>, progress: Arc<FinalProgress>) -> Registered {
        self.register(Probe::Final(progress))
    }

    /// Consumers listed now.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        lock(&self.live).len()
    }

    /// How far behind each consumer listed now is, by id. A final feed's count reads its view
    /// once per distinct position (consumers at the same place share the read).
    pub(crate) async fn status(&self, node: &Node) -> Vec<ConsumerStatus> {
        let probes: Vec<(u64, Probe)> = lock(&self.live)
            .iter()
            .map(|(id, p)| (*id, p.clone()))
            .collect();
        let now = Instant::now();
        let mut counted: HashMap<(String, Option<String>), u64> = HashMap::new();
        let mut out = Vec::with_capacity(probes.len());
        for (id, probe) in probes {
            match probe {
                Probe::Watch(p) => {
                    // `None`: the watcher went in the meantime (its entry goes with it).
                    let Some(b) = p.behind() else { continue };
                    out.push(ConsumerStatus {
                        id,
                        kind: "watch",
                        behind_entries: b.changes,
                        behind_seconds: if b.changes == 0 {
                            0.0
                        } else {
                            b.age.as_secs_f64()
                        },
                        buffered_bytes: b.bytes as u64,
                    });
                }
                Probe::Final(p) => {
                    let (read_to, queued, queued_bytes, caught_up_at) = {
                        let st = lock(&p.state);
                        (
                            st.read_to.clone(),
                            st.queued,
                            st.queued_bytes,
                            st.caught_up_at,
                        )
                    };
                    let key = (p.view.clone(), read_to.as_ref().map(ToString::to_string));
                    let after = match counted.get(&key) {
                        Some(n) => *n,
                        None => {
                            // A failed read counts nothing past the page (the feed itself
                            // ends on a failing read).
                            let n = node
                                .final_windows(&p.view, read_to.as_ref(), FINAL_COUNT_MAX)
                                .await
                                .map_or(0, |page| page.windows.len() as u64);
                            counted.insert(key, n);
                            n
                        }
                    };
                    let behind = queued as u64 + after;
                    out.push(ConsumerStatus {
                        id,
                        kind: "final",
                        behind_entries: behind,
                        behind_seconds: if behind == 0 {
                            0.0
                        } else {
                            now.saturating_duration_since(caught_up_at).as_secs_f64()
                        },
                        buffered_bytes: queued_bytes as u64,
                    });
                }
            }
        }
        out
    }
}

/// Where a final-window feed stands, as the feed reports it.
#[derive(Debug)]
pub(crate) struct FinalProgress {
    view: String,
    state: Mutex<FinalState>,
}

#[derive(Debug)]
struct FinalState {
    /// The position after the windows read into the page (where the windows not read yet
    /// start).
    read_to: Option<FinalCursor>,
    /// Windows read into the page and not sent yet, and their bytes (as JSON).
    queued: usize,
    queued_bytes: usize,
    /// When the feed last found no final window after its position (or opened).
    caught_up_at: Instant,
}

impl FinalProgress {
    /// A feed of `view` starting after `after`.
    pub(crate) fn new(view: &str, after: Option<FinalCursor>) -> Arc<Self> {
        Arc::new(Self {
            view: view.to_owned(),
            state: Mutex::new(FinalState {
                read_to: after,
                queued: 0,
                queued_bytes: 0,
                caught_up_at: Instant::now(),
            }),
        })
    }

    /// The feed's page now holds `queued` windows (`bytes` of JSON) not sent yet, read up to
    /// `read_to`.
    pub(crate) fn set(&self, read_to: Option<&FinalCursor>, queued: usize, bytes: usize) {
        let mut st = lock(&self.state);
        if let Some(c) = read_to {
            st.read_to = Some(c.clone());
        }
        st.queued = queued;
        st.queued_bytes = bytes;
    }

    /// The feed found no final window after its position.
    pub(crate) fn caught_up(&self) {
        lock(&self.state).caught_up_at = Instant::now();
    }
}

/// The response header naming a consumer's id (the `consumer` label of its metrics).
pub(crate) const CONSUMER_HEADER: &str = "x-tidemark-consumer";

/// Names consumer `id` in `response`'s [`CONSUMER_HEADER`].
pub(crate) fn name_consumer(response: &mut axum::response::Response, id: u64) {
    response
        .headers_mut()
        .insert(CONSUMER_HEADER, axum::http::HeaderValue::from(id));
}

/// Bytes of `value` as JSON text, counted without building the text.
pub(crate) fn json_bytes<T: serde::Serialize>(value: &T) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut c = Count(0);
    match serde_json::to_writer(&mut c, value) {
        Ok(()) => c.0,
        Err(_) => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_bytes_counts_the_text() {
        let v = serde_json::json!({"a": [1, 2, "three"]});
        assert_eq!(json_bytes(&v), v.to_string().len());
    }

    #[test]
    fn a_consumer_leaves_the_list_when_its_registration_drops_and_ids_are_not_reused() {
        let c = Arc::new(Consumers::default());
        let a = c.register_final(FinalProgress::new("v", None));
        let b = c.register_final(FinalProgress::new("v", None));
        assert_eq!((a.id(), b.id(), c.len()), (1, 2, 2));
        drop(a);
        assert_eq!(c.len(), 1);
        let d = c.register_final(FinalProgress::new("v", None));
        assert_eq!(d.id(), 3);
        drop((b, d));
        assert_eq!(c.len(), 0);
    }
}
