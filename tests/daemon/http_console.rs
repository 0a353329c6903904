//! The web console in real headless Chromium (Debian package `chromium`): the page loads
//! without script errors, shows the members of a 3-node cluster, and a key written through the
//! API after the page listed its keys appears through the live watch.
//!
//! Skipped, with a message, where no `chromium` binary is installed.

use crate::daemon_support;
use crate::http_support;

use daemon_support::chromium;
use http_support::{Served, get, post};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use tidemark::net::ClusterCa;

/// The value of a counter line in Prometheus text.
fn metric(s: &Served, prefix: &str) -> u64 {
    get(&s.url("/metrics"))
        .text
        .lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.split_whitespace().last())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

#[test]
fn console_shows_members_and_live_values_in_chromium() {
    let Some(browser) = chromium() else {
        // CI installs chromium and sets this, so a missing install step fails instead of
        // silently skipping the browser test.
        assert!(
            std::env::var_os("TIDEMARK_REQUIRE_CHROMIUM").is_none(),
            "TIDEMARK_REQUIRE_CHROMIUM is set but no chromium binary was found"
        );
        eprintln!(
            "chromium is not installed: console browser test skipped (apt-get install chromium)"
        );
        return;
    };
    let nodes: Vec<Served> = (0..3).map(|_| Served::start()).collect();
    // Peer endpoints on a runtime owned by the test, certificates from one CA.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let ca = ClusterCa::generate().expect("ca");
    let names = ["alpha", "beta", "gamma"];
    let mut peer_addrs = Vec::new();
    for (s, name) in nodes.iter().zip(names) {
        let tls = ca.issue(name).expect("issue");
        let addr = rt
            .block_on(s.node.listen("127.0.0.1:0".parse().expect("addr"), tls))
            .expect("listen");
        peer_addrs.push(addr);
    }
    let _in_runtime = rt.enter();
    for s in &nodes[1..] {
        s.node.join_peer(peer_addrs[0]).expect("join");
    }
    nodes[2].node.join_peer(peer_addrs[1]).expect("join");
    let deadline = Instant::now() + Duration::from_secs(30);
    while get(&nodes[0].url("/v1/cluster")).json["members"]
        .as_array()
        .map_or(0, Vec::len)
        < 2
    {
        assert!(Instant::now() < deadline, "the cluster never formed");
        std::thread::sleep(Duration::from_millis(50));
    }
    let s = &nodes[0];
    assert_eq!(
        post(
            &s.url("/v1/ops"),
            r#"[{"type":"orset","key":"online","op":"add","value":"alice"}]"#
        )
        .status,
        200
    );
    let profile = tempfile::tempdir().expect("profile");
    let child = Command::new(browser)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--virtual-time-budget=10000",
            "--dump-dom",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .arg(s.url("/"))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("chromium");
    // Once the page has listed its keys (after opening its watch), write a new value: only the
    // live watch can bring it into the page.
    let deadline = Instant::now() + Duration::from_secs(30);
    while metric(
        s,
        "tidemark_http_requests_total{route=\"/v1/keys\",status=\"200\"}",
    ) == 0
    {
        assert!(Instant::now() < deadline, "the page never listed keys");
        std::thread::sleep(Duration::from_millis(20));
    }
    // An internal key changes too (a removal record under `~gone/`): the watch brings it, the
    // page must not list it.
    std::thread::scope(|sc| {
        sc.spawn(|| rt.block_on(s.node.decommission(tidemark::ReplicaId(0xdead_beef))))
            .join()
    })
    .expect("decommission thread")
    .expect("decommission");
    assert_eq!(
        post(
            &s.url("/v1/ops"),
            r#"[{"type":"orset","key":"online","op":"add","value":"live-bob"}]"#
        )
        .status,
        200
    );
    let out = child.wait_with_output().expect("chromium output");
    let dom = String::from_utf8_lossy(&out.stdout);
    assert!(
        dom.contains(r#"<span class="node err" id="errors"></span>"#),
        "script errors: {dom}"
    );
    let row = |needle: &str| {
        dom.split("<tr")
            .find(|r| r.contains(needle))
            .unwrap_or_else(|| panic!("no row with {needle}: {dom}"))
            .to_owned()
    };
    // This node's state is named as the API names it.
    let me = row("(this node)</td>");
    assert!(
        me.contains(r#"<span class="pill">alive</span>"#),
        "this node not shown alive: {me}"
    );
    for name in ["beta", "gamma"] {
        let r = row(&format!("<td>{name}</td>"));
        // Its version, from its SWIM identity.
        assert!(
            r.contains(&format!("<td>{}</td>", env!("CARGO_PKG_VERSION"))),
            "member {name} without its version: {r}"
        );
    }
    assert!(
        dom.contains(r#"["alice","live-bob"]"#),
        "the live value did not reach the page: {dom}"
    );
    assert!(!dom.contains(">~gone/"), "an internal key is listed: {dom}");
    drop(rt);
}

/// The console hides internal keys by the reserved prefix itself (every name under `~`), not
/// by a list of the prefixes in use (which missed `~gone/`).
#[test]
fn the_console_hides_internal_keys_by_the_reserved_prefix() {
    let s = Served::start();
    let page = get(&s.url("/")).text;
    assert!(
        page.contains(&format!(
            "const RESERVED_PREFIX = \"{}\";",
            tidemark::model::RESERVED_PREFIX
        )),
        "the console's reserved prefix is not the node's"
    );
    assert!(
        page.contains("const isInternal = name => name.startsWith(RESERVED_PREFIX);"),
        "internal keys are not recognised by the reserved prefix"
    );
}
