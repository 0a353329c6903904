//! Client tasks: random counter increments, set adds (unique elements) and removes of elements
//! the client has just read, through HTTP, each recorded with its outcome.

use super::history::{NodeState, Op, OpKind, Outcome};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::{Value as J, json};
use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Counter keys (`gcounter/...`) the workload uses.
pub const COUNTERS: [&str; 3] = ["c0", "c1", "c2"];
/// Set keys (`orset/...`) the workload uses.
pub const SETS: [&str; 3] = ["s0", "s1", "s2"];

/// A blocking HTTP client without connection reuse (a request on a pooled connection to a
/// killed node would turn a definite failure into an indeterminate one).
pub fn agent(timeout: Duration) -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .max_idle_connections(0)
        .timeout_connect(Some(Duration::from_millis(500)))
        .timeout_global(Some(timeout))
        .build()
        .into()
}

/// `Fail` when the request surely never reached the node's handler, else `Info`.
fn transport_outcome(e: &ureq::Error) -> Outcome {
    match e {
        ureq::Error::ConnectionFailed
        | ureq::Error::HostNotFound
        | ureq::Error::Timeout(ureq::Timeout::Connect | ureq::Timeout::Resolve) => Outcome::Fail,
        ureq::Error::Io(io) if io.kind() == std::io::ErrorKind::ConnectionRefused => Outcome::Fail,
        _ => Outcome::Info,
    }
}

/// POSTs one op to `/v1/ops`.
pub fn post_op(agent: &ureq::Agent, http: SocketAddr, op: &J) -> Outcome {
    let body = J::Array(vec![op.clone()]).to_string();
    match agent
        .post(format!("http://{http}/v1/ops"))
        .header("content-type", "application/json")
        .send(body.as_bytes())
    {
        Ok(r) => match r.status().as_u16() {
            200 => Outcome::Ok,
            400..=499 => Outcome::Fail,
            _ => Outcome::Info,
        },
        Err(e) => transport_outcome(&e),
    }
}

/// Reads a key's JSON value: `Ok(None)` for 404, `Err` when the node cannot answer.
pub fn read(
    agent: &ureq::Agent,
    http: SocketAddr,
    kind: &str,
    key: &str,
) -> Result<Option<J>, String> {
    let mut r = agent
        .get(format!("http://{http}/v1/keys/{kind}/{key}"))
        .call()
        .map_err(|e| e.to_string())?;
    match r.status().as_u16() {
        404 => Ok(None),
        200 => {
            let text = r.body_mut().read_to_string().map_err(|e| e.to_string())?;
            let v: J = serde_json::from_str(&text).map_err(|e| e.to_string())?;
            Ok(Some(v["value"].clone()))
        }
        s => Err(format!("status {s}")),
    }
}

/// The workload keys of one node (plus `extra` counters), or why it cannot answer.
pub fn node_state(
    agent: &ureq::Agent,
    http: SocketAddr,
    extra_counters: &[String],
) -> Result<NodeState, String> {
    let mut st = NodeState::default();
    for key in COUNTERS
        .iter()
        .map(|s| (*s).to_owned())
        .chain(extra_counters.iter().cloned())
    {
        let v = read(agent, http, "gcounter", &key)?;
        let n = match v {
            None => 0,
            Some(v) => v.as_u64().ok_or_else(|| format!("gcounter/{key} = {v}"))?,
        };
        st.counters.insert(key, n);
    }
    for key in SETS {
        let v = read(agent, http, "orset", key)?;
        let mut set = BTreeSet::new();
        if let Some(v) = v {
            for e in v.as_array().ok_or_else(|| format!("orset/{key} = {v}"))? {
                set.insert(e.as_str().ok_or_else(|| format!("element {e}"))?.to_owned());
            }
        }
        st.sets.insert(key.to_owned(), set);
    }
    Ok(st)
}

/// Runs client `id` until `stop`, appending every op to `history`.
pub fn run_client(
    id: usize,
    seed: u64,
    nodes: Vec<SocketAddr>,
    start: Instant,
    stop: Arc<AtomicBool>,
    history: Arc<Mutex<Vec<Op>>>,
) {
    let mut rng =
        ChaCha8Rng::seed_from_u64(seed ^ (0x9E37_79B9_7F4A_7C15u64.wrapping_mul(id as u64 + 1)));
    let agent = agent(Duration::from_secs(2));
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let node = rng.random_range(0..nodes.len());
        let http = nodes[node];
        let dice = rng.random_range(0..100);
        let (kind, body) = if dice < 40 {
            let key = COUNTERS[rng.random_range(0..COUNTERS.len())].to_owned();
            let by = rng.random_range(1..=1000u64);
            let body = json!({"type":"gcounter","key":key,"op":"inc","by":by});
            (OpKind::Inc { key, by }, body)
        } else if dice < 75 {
            let key = SETS[rng.random_range(0..SETS.len())].to_owned();
            n += 1;
            let elem = format!("k{id}-{n}");
            let body = json!({"type":"orset","key":key,"op":"add","value":elem});
            (OpKind::Add { key, elem }, body)
        } else {
            // Read the set at this node, then remove one element it showed, at the same node.
            let key = SETS[rng.random_range(0..SETS.len())].to_owned();
            let Ok(Some(J::Array(elems))) = read(&agent, http, "orset", &key) else {
                continue;
            };
            let elems: Vec<String> = elems
                .iter()
                .filter_map(|e| e.as_str().map(str::to_owned))
                .collect();
            if elems.is_empty() {
                continue;
            }
            let elem = elems[rng.random_range(0..elems.len())].clone();
            let body = json!({"type":"orset","key":key,"op":"remove","value":elem});
            (OpKind::Remove { key, elem }, body)
        };
        let invoke = start.elapsed();
        let outcome = post_op(&agent, http, &body);
        let complete = start.elapsed();
        history.lock().expect("history").push(Op {
            client: id,
            node,
            kind,
            invoke,
            complete,
            outcome,
        });
        if outcome != Outcome::Ok {
            // Do not hammer a dead or paused node.
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}
