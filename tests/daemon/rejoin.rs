//! A cluster's life across restarts, with real daemons over QUIC + mTLS on loopback: a seed
//! (started without `--join`) that restarts cleanly rejoins the members it knew, so writes
//! flow both ways again without restarting anyone else; a restarted node still lists the
//! members it knew that are down or removed for good, and can still name them.

use crate::daemon_support;

use daemon_support::{Daemon, issue_certs, spawn_serve_logged};
use serde_json::Value as J;
use std::path::Path;
use std::time::{Duration, Instant};

fn free_udp_port() -> u16 {
    std::net::UdpSocket::bind("127.0.0.1:0")
        .and_then(|s| s.local_addr())
        .expect("free port")
        .port()
}

fn serve(dir: &Path, name: &str, peer: &str, join: Option<&str>) -> Daemon {
    let p = |n: &str| dir.join(n).to_string_lossy().into_owned();
    let mut args = vec![
        "--http".to_owned(),
        "127.0.0.1:0".to_owned(),
        "--peer-listen".to_owned(),
        peer.to_owned(),
        "--tls".to_owned(),
        p(&format!("{name}-tls")),
        "--data".to_owned(),
        p(name),
    ];
    if let Some(seed) = join {
        args.extend(["--join".to_owned(), seed.to_owned()]);
    }
    let (child, url, _) = spawn_serve_logged(&args, &dir.join(format!("{name}.log")));
    Daemon { child, url }
}

fn json(d: &Daemon, args: &[&str]) -> J {
    let mut all = vec!["--json"];
    all.extend_from_slice(args);
    let o = d.run(&all);
    serde_json::from_slice(&o.stdout).unwrap_or(J::Null)
}

fn eventually(what: &str, secs: u64, mut check: impl FnMut() -> bool) {
    let started = Instant::now();
    while !check() {
        assert!(
            started.elapsed() < Duration::from_secs(secs),
            "timed out: {what}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn counter(d: &Daemon, key: &str) -> Option<u64> {
    json(d, &["get", &format!("gcounter/{key}")])["value"].as_u64()
}

fn member<'a>(status: &'a J, name: &str) -> Option<&'a J> {
    status["cluster"]["members"]
        .as_array()?
        .iter()
        .find(|m| m["name"] == name)
}

#[test]
fn a_restarted_seed_rejoins_and_restarted_nodes_keep_listing_their_members() {
    let dir = tempfile::tempdir().expect("tempdir");
    issue_certs(dir.path(), &["alpha", "beta", "gamma"]);
    let alpha_peer = format!("127.0.0.1:{}", free_udp_port());
    let alpha = serve(dir.path(), "alpha", &alpha_peer, None);
    let beta = serve(dir.path(), "beta", "127.0.0.1:0", Some(&alpha_peer));
    let gamma = serve(dir.path(), "gamma", "127.0.0.1:0", Some(&alpha_peer));
    assert!(alpha.run(&["inc", "gcounter/hits", "1"]).status.success());
    eventually("beta and gamma have alpha's write", 30, || {
        counter(&beta, "hits") == Some(1) && counter(&gamma, "hits") == Some(1)
    });
    let gamma_replica = json(&gamma, &["status"])["cluster"]["node"]["replica"]
        .as_str()
        .map(str::to_owned)
        .expect("gamma's replica");

    // The seed restarts cleanly: the others see it leave and stop dialling it; it dials them.
    assert_eq!(alpha.terminate().code(), Some(0));
    eventually("beta and gamma see alpha gone", 30, || {
        [&beta, &gamma].iter().all(|d| {
            let s = json(d, &["status"]);
            member(&s, "alpha").is_some_and(|m| m["state"] == "left" || m["state"] == "down")
        })
    });
    // Long enough for their SWIM to stop probing it.
    std::thread::sleep(Duration::from_secs(2));
    let alpha = serve(dir.path(), "alpha", &alpha_peer, None);
    assert!(alpha.run(&["inc", "gcounter/after", "1"]).status.success());
    assert!(beta.run(&["inc", "gcounter/back", "1"]).status.success());
    eventually("writes flow both ways after the seed's restart", 30, || {
        counter(&beta, "after") == Some(1)
            && counter(&gamma, "after") == Some(1)
            && counter(&alpha, "back") == Some(1)
    });
    // It dialled the members it knew (kept in its data directory), as seeds.
    let log = std::fs::read_to_string(dir.path().join("alpha.log")).unwrap_or_default();
    assert!(
        log.contains("rejoining the members known from the last run members=2"),
        "{log}"
    );
    eventually("alpha lists beta and gamma alive again", 30, || {
        let s = json(&alpha, &["status"]);
        ["beta", "gamma"]
            .iter()
            .all(|n| member(&s, n).is_some_and(|m| m["state"] == "alive"))
    });

    // gamma dies for good (kill -9) and is removed; beta dies too. alpha restarts: it still
    // lists both (down / decommissioned) and can still name them.
    drop(gamma);
    drop(beta);
    let removed = json(&alpha, &["members", "remove", "gamma", "--force"]);
    assert_eq!(removed["removed"], gamma_replica.as_str(), "{removed}");
    assert_eq!(alpha.terminate().code(), Some(0));
    let alpha = serve(dir.path(), "alpha", &alpha_peer, None);
    let s = json(&alpha, &["status"]);
    let b = member(&s, "beta").unwrap_or_else(|| {
        panic!(
            "beta not listed after a restart: {s}\nmembers.json: {:?}\nlog: {}",
            std::fs::read_to_string(dir.path().join("alpha/members.json")),
            std::fs::read_to_string(dir.path().join("alpha.log")).unwrap_or_default()
        )
    });
    assert_eq!(b["state"], "down", "{b}");
    assert_eq!(b["last_contact"], J::Null, "{b}");
    let g = member(&s, "gamma").unwrap_or_else(|| panic!("gamma not listed: {s}"));
    assert_eq!(g["state"], "decommissioned", "{g}");
    let text = ureq::get(&format!("{}/metrics", alpha.url))
        .call()
        .expect("metrics")
        .body_mut()
        .read_to_string()
        .expect("metrics text");
    assert!(
        text.contains("tidemark_member_state{member=\"beta\",state=\"down\"} 1"),
        "{text}"
    );
    // Named after the restart: beta (down) can be removed by name, gamma answers its record.
    let again = json(&alpha, &["members", "remove", "gamma"]);
    assert_eq!(again["already"], true, "{again}");
    let upper = json(
        &alpha,
        &["members", "remove", &gamma_replica.to_uppercase()],
    );
    assert_eq!(upper["already"], true, "replica ids in any case: {upper}");
    let b = json(&alpha, &["members", "remove", "beta"]);
    assert_eq!(b["already"], false, "{b}");
    assert_eq!(b["name"], "beta", "{b}");
    assert_eq!(alpha.terminate().code(), Some(0));
}

/// A node started to join (`--join`) that reaches no member is not ready: an unreachable
/// seed, or a seed whose certificates come from another CA (this node runs without `--tls`).
/// A node started alone is ready at once.
#[test]
fn a_joining_node_that_reaches_no_member_is_not_ready() {
    let dir = tempfile::tempdir().expect("tempdir");
    issue_certs(dir.path(), &["alpha"]);
    let ready = |d: &Daemon| {
        let r = ureq::get(&format!("{}/readyz", d.url)).call();
        match r {
            Ok(_) => (200, String::new()),
            Err(ureq::Error::StatusCode(code)) => (code, String::new()),
            Err(e) => (0, e.to_string()),
        }
    };
    let alone = Daemon::start(&dir.path().join("alone"), &[]);
    eventually("a node started alone is ready", 10, || {
        ready(&alone).0 == 200
    });
    let nowhere = format!("127.0.0.1:{}", free_udp_port());
    let lost = Daemon::start(&dir.path().join("lost"), &["--join", &nowhere]);
    let alpha_peer = format!("127.0.0.1:{}", free_udp_port());
    let alpha = serve(dir.path(), "alpha", &alpha_peer, None);
    let stranger = Daemon::start(&dir.path().join("stranger"), &["--join", &alpha_peer]);
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(ready(&lost).0, 503, "unreachable seed");
    assert_eq!(ready(&stranger).0, 503, "a seed from another CA");
    let s = json(&lost, &["status"]);
    assert_eq!(s["ready"], false, "{s}");
    assert_eq!(ready(&alpha).0, 200);
}
