//! The `tidemark` binary against a served node: `serve` (config, flags, SIGTERM), every client
//! command with its output and exit status (0 / 1 rejected / 2 usage), and `ingest` with
//! rejected lines, duplicates and retries.

use crate::daemon_support;

use daemon_support::{BIN, Daemon, issue_certs, spawn_serve, stderr, stdout};
use serde_json::{Value as J, json};
use std::io::Write;
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

fn ok(o: &Output) -> String {
    assert_eq!(
        o.status.code(),
        Some(0),
        "stdout {} stderr {}",
        stdout(o),
        stderr(o)
    );
    stdout(o)
}

fn json_of(o: &Output) -> J {
    serde_json::from_str(ok(o).trim()).expect("json output")
}

#[test]
fn client_commands_print_tables_json_and_exit_codes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = Daemon::start(dir.path(), &[]);
    assert!(ok(&d.run(&["inc", "gcounter/visits", "3"])).contains("applied 1"));
    ok(&d.run(&["inc", "pncounter/stock", "5"]));
    ok(&d.run(&["dec", "pncounter/stock", "7"]));
    ok(&d.run(&["add", "orset/online", "alice"]));
    ok(&d.run(&["add", "orset/online", "bob"]));
    ok(&d.run(&["remove", "orset/online", "alice"]));
    ok(&d.run(&["set", "lww/config", r#"{"mode":"fast"}"#]));
    assert_eq!(
        json_of(&d.run(&["--json", "get", "gcounter/visits"])),
        json!({"type":"gcounter","key":"visits","value":3})
    );
    assert_eq!(
        json_of(&d.run(&["get", "--json", "pncounter/stock"]))["value"],
        -2
    );
    assert_eq!(
        json_of(&d.run(&["--json", "get", "orset/online"]))["value"],
        json!(["bob"])
    );
    assert_eq!(
        json_of(&d.run(&["--json", "get", "lww/config"]))["value"],
        json!({"mode":"fast"})
    );
    let table = ok(&d.run(&["get", "orset/online"]));
    assert_eq!(
        table.lines().collect::<Vec<_>>(),
        ["TYPE   KEY     VALUE", r#"orset  online  ["bob"]"#]
    );
    let list = ok(&d.run(&["list"]));
    assert_eq!(list.lines().count(), 5, "{list}");
    let listed = json_of(&d.run(&["--json", "list", "--type", "orset"]));
    assert_eq!(listed["keys"][0]["key"], "online");
    ok(&d.run(&["delete", "orset/online"]));
    // A deleted key holds nothing: the node answers 404, the command exits 1.
    let o = d.run(&["--json", "get", "orset/online"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("key_not_found"), "{}", stderr(&o));
    let status = ok(&d.run(&["status"]));
    assert!(
        status.contains("NODE") && status.contains("true"),
        "{status}"
    );
    assert_eq!(json_of(&d.run(&["--json", "status"]))["ready"], true);
    // Rejected by the node: exit 1, the message on stderr.
    let o = d.run(&["add", "gcounter/visits", "x"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("type_mismatch"), "{}", stderr(&o));
    let o = d.run(&["delete", "gcounter/visits"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("counter_not_deletable"));
    let o = d.run(&["view", "clicks_per_page"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("view_not_found"));
    // Usage errors: exit 2.
    assert_eq!(d.run(&["get", "visits"]).status.code(), Some(2));
    assert_eq!(d.run(&["get", "sparkles/x"]).status.code(), Some(2));
    assert_eq!(d.run(&["frobnicate"]).status.code(), Some(2));
    assert_eq!(d.run(&["set", "lww/x", "not json"]).status.code(), Some(2));
    // Unreachable node: exit 1.
    let o = Command::new(BIN)
        .args(["--url", "http://127.0.0.1:9", "get", "gcounter/x"])
        .output()
        .expect("run");
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(d.terminate().code(), Some(0));
}

#[test]
fn ingest_reports_accepted_duplicates_and_rejected_lines() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = Daemon::start(dir.path(), &[]);
    let mut file = String::new();
    for seq in 1..=2500 {
        if seq == 700 {
            file.push_str("{\"source\":\"app\",\"seq\":\"seven hundred\"}\n");
        } else if seq == 1800 {
            file.push_str("{not json\n");
        } else {
            file.push_str(&format!(
                "{{\"source\":\"app\",\"seq\":{seq},\"ops\":[{{\"type\":\"gcounter\",\"key\":\"events\",\"op\":\"inc\"}}]}}\n"
            ));
        }
    }
    let path = dir.path().join("events.ndjson");
    std::fs::write(&path, &file).expect("write");
    let path = path.to_string_lossy().into_owned();
    let o = d.run(&["ingest", "--stream", "clicks", &path]);
    assert_eq!(
        o.status.code(),
        Some(1),
        "rejected lines make the exit status 1"
    );
    assert!(
        stdout(&o).starts_with("accepted 2498, duplicates 0, late 0, rejected 2"),
        "{}",
        stdout(&o)
    );
    let err = stderr(&o);
    assert!(
        err.contains("rejected line 700:") && err.contains("field seq"),
        "{err}"
    );
    assert!(
        err.contains("rejected line 1800:") && err.contains("invalid_json"),
        "{err}"
    );
    assert_eq!(
        json_of(&d.run(&["--json", "get", "gcounter/events"]))["value"],
        2498
    );
    // Again from stdin, as JSON: everything is a duplicate now.
    let o = d.run_with_input(
        &["--json", "ingest", "--stream", "clicks", "-"],
        Some(file.as_bytes()),
    );
    assert_eq!(o.status.code(), Some(1));
    let summary: J = serde_json::from_str(stdout(&o).trim()).expect("json");
    assert_eq!(summary["accepted"], 0);
    assert_eq!(summary["duplicates"], 2498);
    assert_eq!(summary["rejected"].as_array().map(Vec::len), Some(2));
    assert_eq!(summary["rejected"][0]["line"], 700);
    // Not a terminal: no progress bar escape codes on stdout.
    assert!(!stdout(&o).contains('\u{1b}'));
    assert_eq!(
        json_of(&d.run(&["--json", "get", "gcounter/events"]))["value"],
        2498
    );
    // A clean file: exit 0.
    let o = d.run_with_input(
        &["ingest", "--stream", "clicks", "-"],
        Some(b"{\"source\":\"other\",\"seq\":1}\n"),
    );
    assert!(ok(&o).starts_with("accepted 1, duplicates 0, late 0, rejected 0"));
}

/// A raw HTTP/1.1 exchange (`Connection: close`): the whole answer.
fn raw(url: &str, request: &str) -> String {
    use std::io::Read;
    let addr = url.trim_start_matches("http://");
    let mut c = std::net::TcpStream::connect(addr).expect("connect");
    c.write_all(request.as_bytes()).expect("send");
    let mut out = String::new();
    let _ = c.read_to_string(&mut out);
    out
}

#[test]
fn ingest_retries_429_until_accepted() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = Daemon::start(dir.path(), &["--set", "http.concurrency_max=1"]);
    // Hold the only request slot with an ingest whose body has not ended (its first line
    // takes the slot).
    let addr = d.url.trim_start_matches("http://").to_owned();
    let mut hold = std::net::TcpStream::connect(&addr).expect("connect");
    let line = "{\"source\":\"h\",\"seq\":1}\n";
    write!(
        hold,
        "POST /v1/streams/h/events HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/x-ndjson\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n{line}\r\n",
        line.len()
    )
    .expect("send");
    let body: String = (1..=100)
        .map(|seq| {
            format!(
                "{{\"source\":\"c\",\"seq\":{seq},\"ops\":[{{\"type\":\"gcounter\",\"key\":\"n\",\"op\":\"inc\"}}]}}\n"
            )
        })
        .collect();
    let mut child = Command::new(BIN)
        .args(["--url", &d.url, "ingest", "--stream", "s", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(body.as_bytes())
        .expect("stdin");
    // Wait until the node has refused the client at least twice (it is retrying).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let metrics = raw(
            &d.url,
            &format!("GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"),
        );
        let refused = metrics
            .lines()
            .find(|l| l.starts_with("tidemark_http_rejected_total{reason=\"concurrency\"}"))
            .and_then(|l| l.split_whitespace().last())
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0);
        if refused >= 2 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the client was never refused"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    // Release the slot: the client's retry gets through.
    write!(hold, "0\r\n\r\n").expect("finish");
    let o = child.wait_with_output().expect("wait");
    assert!(
        ok(&o).starts_with("accepted 100, duplicates 0"),
        "{}",
        stdout(&o)
    );
    assert_eq!(
        json_of(&d.run(&["--json", "get", "gcounter/n"]))["value"],
        100
    );
}

#[test]
fn serve_config_token_and_clean_restart() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    // --print-config shows the effective config (file, then flags), token redacted.
    let conf = dir.path().join("tidemark.toml");
    std::fs::write(&conf, "[http]\ntoken = \"s3cret\"\nconcurrency_max = 7\n").expect("write");
    let o = Command::new(BIN)
        .args(["serve", "--print-config", "--config"])
        .arg(&conf)
        .args(["--set", "limits.batch_ops_max=500"])
        .output()
        .expect("run");
    let printed = ok(&o);
    assert!(printed.contains("concurrency_max = 7"), "{printed}");
    assert!(printed.contains("batch_ops_max = 500"), "{printed}");
    assert!(printed.contains("token = \"<redacted>\""), "{printed}");
    // Unknown keys are rejected by name, as usage errors.
    std::fs::write(
        dir.path().join("bad.toml"),
        "[http]\nlisten = \"127.0.0.1:0\"\ncolour = 1\n",
    )
    .expect("write");
    let o = Command::new(BIN)
        .args(["serve", "--config"])
        .arg(dir.path().join("bad.toml"))
        .output()
        .expect("run");
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("`http.colour`"), "{}", stderr(&o));
    // With the token: the client needs --token.
    let d = Daemon::start(&data, &["--config", &conf.to_string_lossy()]);
    let o = d.run(&["inc", "gcounter/x"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("401"), "{}", stderr(&o));
    ok(&d.run(&["--token", "s3cret", "inc", "gcounter/x", "41"]));
    ok(&d.run(&["--token", "s3cret", "inc", "gcounter/x"]));
    // SIGTERM: exit 0 after a durable close; a restart sees every acknowledged write.
    assert_eq!(d.terminate().code(), Some(0));
    let d = Daemon::start(&data, &[]);
    assert_eq!(
        json_of(&d.run(&["--json", "get", "gcounter/x"]))["value"],
        42
    );
    // The data directory is locked while the node runs.
    let o = Command::new(BIN)
        .args([
            "serve",
            "--http",
            "127.0.0.1:0",
            "--peer-listen",
            "127.0.0.1:0",
            "--data",
        ])
        .arg(&data)
        .stdout(Stdio::null())
        .output()
        .expect("run");
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("is in use by another tidemark (pid"),
        "{}",
        stderr(&o)
    );
    assert_eq!(d.terminate().code(), Some(0));
    let _ = Duration::ZERO;
}

#[test]
fn two_daemons_with_issued_certificates_converge() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = |name: &str| dir.path().join(name).to_string_lossy().into_owned();
    issue_certs(dir.path(), &["alpha", "beta"]);
    // Refuses to overwrite a CA.
    let again = Command::new(BIN)
        .args(["certs", "init", "--out", &p("ca")])
        .output()
        .expect("run");
    assert_eq!(again.status.code(), Some(1));
    // alpha on a fixed free port so beta can join it.
    let port = std::net::UdpSocket::bind("127.0.0.1:0")
        .and_then(|s| s.local_addr())
        .expect("free port")
        .port();
    let alpha_peer = format!("127.0.0.1:{port}");
    let (alpha, alpha_url, line) = spawn_serve(&[
        "--http",
        "127.0.0.1:0",
        "--peer-listen",
        &alpha_peer,
        "--tls",
        &p("alpha-tls"),
        "--data",
        &p("alpha"),
    ]);
    let alpha = Daemon {
        child: alpha,
        url: alpha_url,
    };
    assert!(line.contains("node alpha"), "{line}");
    let beta = Daemon::start(
        &dir.path().join("beta"),
        &["--tls", &p("beta-tls"), "--join", &alpha_peer],
    );
    ok(&alpha.run(&["inc", "gcounter/hits", "2"]));
    ok(&beta.run(&["inc", "gcounter/hits", "3"]));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    for d in [&alpha, &beta] {
        loop {
            let v = json_of(&d.run(&["--json", "get", "gcounter/hits"]))["value"].clone();
            if v == 5 {
                break;
            }
            assert!(std::time::Instant::now() < deadline, "no convergence: {v}");
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }
    let cluster = json_of(&beta.run(&["--json", "status"]));
    assert_eq!(cluster["cluster"]["node"]["name"], "beta");
    assert_eq!(
        cluster["cluster"]["members"][0]["name"], "alpha",
        "{cluster}"
    );
    assert_eq!(
        cluster["cluster"]["members"][0]["state"], "alive",
        "{cluster}"
    );
    // Members exchange their build version (in their SWIM identity).
    assert_eq!(
        cluster["cluster"]["members"][0]["version"],
        env!("CARGO_PKG_VERSION"),
        "{cluster}"
    );
    let table = ok(&beta.run(&["members"]));
    let mut lines = table.lines();
    let header = lines.next().unwrap_or_default();
    assert!(
        header.starts_with("MEMBER")
            && header.contains("VERSION")
            && header.contains("LAG (BYTES)"),
        "{table}"
    );
    let alpha_row: Vec<&str> = lines
        .find(|l| l.starts_with("alpha"))
        .unwrap_or_else(|| panic!("no alpha row: {table}"))
        .split_whitespace()
        .collect();
    assert_eq!(alpha_row[1], "alive", "{table}");
    assert_eq!(alpha_row[2], env!("CARGO_PKG_VERSION"), "{table}");
    // A member that still answers is not removed without --force; a node never removes itself.
    let o = alpha.run(&["members", "remove", "beta"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("member_alive"), "{}", stderr(&o));
    let o = alpha.run(&["members", "remove", "alpha"]);
    assert!(stderr(&o).contains("invalid_member"), "{}", stderr(&o));
    // beta dies without a goodbye: alpha keeps listing it, suspect then down, with when it was
    // last heard from, in /v1/cluster and in `tidemark status`.
    let mut beta = beta;
    beta.child.kill().expect("kill beta");
    beta.child.wait().expect("wait beta");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let mut seen = Vec::new();
    let member = loop {
        let c = json_of(&alpha.run(&["--json", "status"]));
        let members = c["cluster"]["members"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let b = members
            .into_iter()
            .find(|m| m["name"] == "beta")
            .unwrap_or_else(|| panic!("beta is no longer listed: {c}"));
        let state = b["state"].as_str().unwrap_or_default().to_owned();
        assert!(
            ["alive", "suspect", "down"].contains(&state.as_str()),
            "{b}"
        );
        if seen.last() != Some(&state) {
            seen.push(state.clone());
        }
        if state == "down" {
            break b;
        }
        assert!(std::time::Instant::now() < deadline, "beta never down: {c}");
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    assert_eq!(member["connected"], false, "{member}");
    assert!(
        member["last_contact"].as_f64().is_some_and(|s| s > 0.5),
        "{member}"
    );
    // What it last acknowledged is kept while it is down, and its lag counts from there:
    // never `acked: null` beside a computed lag.
    let c = json_of(&alpha.run(&["--json", "status"]));
    let b = c["cluster"]["members"]
        .as_array()
        .and_then(|m| m.iter().find(|m| m["name"] == "beta").cloned())
        .unwrap_or_else(|| panic!("no beta: {c}"));
    let acked = b["acked"]
        .as_u64()
        .unwrap_or_else(|| panic!("acked unknown while lag is shown: {b}"));
    let end = c["cluster"]["node"]["log"]["end"]
        .as_u64()
        .unwrap_or_default();
    assert_eq!(b["lag_entries"].as_u64(), Some(end - acked), "{b} {c}");
    // Writes beta never sees: its lag in entries, bytes and seconds grows while it is down.
    // (What it lacked already depends on when its last acknowledgement came: the baseline.)
    let entries_before = member["lag_entries"]
        .as_u64()
        .expect("lag entries while down");
    let bytes_before = member["lag_bytes"].as_u64().expect("lag bytes while down");
    ok(&alpha.run(&["inc", "gcounter/hits", "1"]));
    ok(&alpha.run(&["set", "lww/note", "\"written while beta is down\""]));
    std::thread::sleep(std::time::Duration::from_millis(1200));
    let c = json_of(&alpha.run(&["--json", "status"]));
    let member = c["cluster"]["members"]
        .as_array()
        .and_then(|m| m.iter().find(|m| m["name"] == "beta").cloned())
        .unwrap_or_else(|| panic!("beta is no longer listed: {c}"));
    assert_eq!(member["state"], "down", "{member}");
    assert_eq!(member["version"], env!("CARGO_PKG_VERSION"), "{member}");
    let entries = entries_before + 2;
    assert_eq!(member["lag_entries"], entries, "{member}");
    let lag_bytes = member["lag_bytes"].as_u64().unwrap_or_default();
    // The second write alone holds a 28-byte value.
    assert!(
        (bytes_before + 40..bytes_before + 2000).contains(&lag_bytes),
        "{member} after {bytes_before}"
    );
    assert_eq!(member["lag_bytes_exact"], true, "{member}");
    assert!(
        member["lag_seconds"].as_f64().is_some_and(|s| s >= 1.0),
        "{member}"
    );
    let text = ok(&alpha.run(&["status"]));
    let line = text
        .lines()
        .find(|l| l.starts_with("beta"))
        .unwrap_or_else(|| panic!("status does not list beta: {text}"));
    assert!(line.contains("down") && line.contains("s ago"), "{text}");
    let cells: Vec<&str> = line.split_whitespace().collect();
    // MEMBER STATE VERSION PEER-ADDR CONNECTED LAG(ENTRIES) LAG(BYTES) ...
    assert_eq!(cells[2], env!("CARGO_PKG_VERSION"), "{text}");
    assert_eq!(cells[5], entries.to_string(), "{text}");
    assert_eq!(cells[6], lag_bytes.to_string(), "{text}");
    assert!(!text.contains("single node"), "{text}");
    let addr = alpha.url.trim_start_matches("http://").to_owned();
    let metrics = raw(
        &alpha.url,
        &format!("GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"),
    );
    assert!(
        metrics.contains("\ntidemark_peer_name_conflicts_total 0\n"),
        "{metrics}"
    );
    // The per-peer replication samples of the member that is down, joinable to its member
    // state by the `member` label.
    let beta_sample = |family: &str| {
        metrics
            .lines()
            .find(|l| l.starts_with(&format!("{family}{{")) && l.contains("member=\"beta\""))
            .and_then(|l| l.rsplit_once(' '))
            .and_then(|(_, v)| v.trim().parse::<f64>().ok())
            .unwrap_or_else(|| panic!("no {family} sample for beta: {metrics}"))
    };
    assert_eq!(
        beta_sample("tidemark_replication_lag_entries"),
        entries as f64
    );
    assert_eq!(
        beta_sample("tidemark_replication_lag_bytes"),
        lag_bytes as f64
    );
    assert!(beta_sample("tidemark_replication_lag_seconds") >= 1.0);
    assert!(
        metrics.contains("tidemark_member_state{member=\"beta\",state=\"down\"} 1"),
        "{metrics}"
    );
    // beta is gone for good: removed by name, listed as decommissioned; an unknown name is
    // refused (exit 1, the node's 404 named).
    let o = alpha.run(&["members", "remove", "nobody"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("member_not_found"), "{}", stderr(&o));
    let text = ok(&alpha.run(&["members", "remove", "beta"]));
    assert!(text.starts_with("removed beta (replica "), "{text}");
    let table = ok(&alpha.run(&["members"]));
    let row: Vec<&str> = table
        .lines()
        .find(|l| l.starts_with("beta"))
        .unwrap_or_else(|| panic!("no beta row: {table}"))
        .split_whitespace()
        .collect();
    assert_eq!(row[1], "decommissioned", "{table}");
    assert_eq!(alpha.terminate().code(), Some(0));
}

#[test]
fn usage_errors_exit_2_urls_without_scheme_version_and_completions() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = Daemon::start(dir.path(), &[]);
    // A command that cannot take its arguments is a usage error (2), found before any request.
    let o = d.run(&["inc", "orset/online"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("gcounter or pncounter"),
        "{}",
        stderr(&o)
    );
    for args in [
        &["list", "--type", "sparkles"][..],
        &["list", "--limit", "0"],
        &["watch", "--type", "sparkles"],
        &["view", "v", "--limit", "0"],
        &["completions", "tcsh"],
    ] {
        let o = d.run(args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
    }
    for url in ["ftp://127.0.0.1:7700", "", "http://"] {
        let o = Command::new(BIN)
            .args(["--url", url, "get", "gcounter/x"])
            .output()
            .expect("run");
        assert_eq!(o.status.code(), Some(2), "--url {url:?}: {}", stderr(&o));
        assert!(
            stderr(&o).contains("localhost:7700"),
            "the hint shows the form: {}",
            stderr(&o)
        );
    }
    // `--url HOST:PORT` without a scheme, by address and by name.
    ok(&d.run(&["inc", "gcounter/visits"]));
    let hostport = d.url.trim_start_matches("http://").to_owned();
    let port = hostport.rsplit(':').next().unwrap_or_default().to_owned();
    for url in [hostport.clone(), format!("localhost:{port}")] {
        let o = Command::new(BIN)
            .args(["--url", &url, "--json", "get", "gcounter/visits"])
            .output()
            .expect("run");
        assert_eq!(json_of(&o)["value"], 1, "--url {url}");
    }
    // A key the node holds nothing for: 404 key_not_found, exit 1.
    let o = d.run(&["get", "gcounter/never-written"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("404 key_not_found"), "{}", stderr(&o));
    // The version: of the program, and of the node in `status`.
    let version = env!("CARGO_PKG_VERSION");
    assert_eq!(
        ok(&Command::new(BIN).arg("version").output().expect("run")).trim(),
        format!("tidemark {version}")
    );
    assert_eq!(
        json_of(
            &Command::new(BIN)
                .args(["version", "--json"])
                .output()
                .expect("run")
        ),
        json!({"version": version})
    );
    let status = ok(&d.run(&["status"]));
    assert!(
        status.lines().next().is_some_and(|l| l.contains("VERSION")) && status.contains(version),
        "{status}"
    );
    assert_eq!(
        json_of(&d.run(&["--json", "status"]))["cluster"]["node"]["version"],
        version
    );
    // Completion scripts for each shell; bash's parses.
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let script = ok(&Command::new(BIN)
            .args(["completions", shell])
            .output()
            .expect("run"));
        assert!(
            script.contains("tidemark") && script.contains("snapshot"),
            "{shell}: {script}"
        );
    }
    let script = dir.path().join("tidemark.bash");
    std::fs::write(
        &script,
        ok(&Command::new(BIN)
            .args(["completions", "bash"])
            .output()
            .expect("run")),
    )
    .expect("write");
    let o = Command::new("bash")
        .arg("-c")
        .arg(format!(
            "source {} && complete -p tidemark",
            script.display()
        ))
        .output()
        .expect("bash");
    assert!(
        stdout(&o).contains("tidemark"),
        "{} {}",
        stdout(&o),
        stderr(&o)
    );
    assert_eq!(d.terminate().code(), Some(0));
}

/// `tidemark serve ARGS` with stdout piped and stderr written to `log`.
fn serve_logged(args: &[&str], log: &std::path::Path) -> Child {
    Command::new(BIN)
        .arg("serve")
        .args(args)
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(log).expect("log file"))
        .spawn()
        .expect("spawn serve")
}

/// The `http://` URL the `serve` banner line names (without a trailing `/`).
fn url_in(banner: &str) -> Option<String> {
    banner
        .split_whitespace()
        .find(|w| w.starts_with("http://"))
        .map(|u| u.trim_end_matches('/').to_owned())
}

/// The first stdout line of a `serve_logged` child.
fn first_line(child: &mut Child) -> String {
    let mut line = String::new();
    if let Some(out) = child.stdout.as_mut() {
        let _ = std::io::BufRead::read_line(&mut std::io::BufReader::new(out), &mut line);
    }
    line
}

fn sigterm(child: &mut Child) -> std::process::ExitStatus {
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    child.wait().expect("wait")
}

#[test]
fn a_busy_port_fails_in_one_line_before_anything_is_created() {
    let dir = tempfile::tempdir().expect("tempdir");
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let http = taken.local_addr().expect("addr").to_string();
    let data = dir.path().join("data");
    let missing_snapshot = dir.path().join("backup.tmsnap");
    for restore in [false, true] {
        let mut cmd = Command::new(BIN);
        cmd.args([
            "serve",
            "--http",
            &http,
            "--peer-listen",
            "127.0.0.1:0",
            "--data",
        ])
        .arg(&data);
        if restore {
            cmd.arg("--restore").arg(&missing_snapshot);
        }
        let o = cmd.output().expect("run");
        assert_eq!(o.status.code(), Some(1));
        assert_eq!(
            stderr(&o),
            format!(
                "tidemark: cannot listen on {http}: address already in use — is another tidemark \
                 running? use --http ADDR\n"
            ),
            "restore {restore}"
        );
        assert!(
            !data.exists(),
            "the data directory was created (restore {restore})"
        );
    }
    let udp = std::net::UdpSocket::bind("127.0.0.1:0").expect("bind udp");
    let peer = udp.local_addr().expect("addr").to_string();
    let o = Command::new(BIN)
        .args([
            "serve",
            "--http",
            "127.0.0.1:0",
            "--peer-listen",
            &peer,
            "--data",
        ])
        .arg(&data)
        .output()
        .expect("run");
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(
        stderr(&o),
        format!(
            "tidemark: cannot listen on {peer}: address already in use — is another tidemark \
             running? use --peer-listen ADDR\n"
        )
    );
    assert!(!data.exists());
}

#[test]
fn logs_have_an_access_line_per_request_no_colour_and_json_throughout() {
    let dir = tempfile::tempdir().expect("tempdir");
    let base = ["--http", "127.0.0.1:0", "--peer-listen", "127.0.0.1:0"];
    // Text: stderr is a file, so no ANSI colour codes; one access line per request.
    let log = dir.path().join("text.log");
    let data = dir.path().join("a").to_string_lossy().into_owned();
    let mut args = base.to_vec();
    args.extend(["--data", &data]);
    let mut child = serve_logged(&args, &log);
    let url = url_in(&first_line(&mut child)).expect("url");
    let get = |url: &str, key: &str| {
        Command::new(BIN)
            .args(["--url", url, "get", key])
            .output()
            .expect("run")
    };
    assert_eq!(get(&url, "gcounter/missing").status.code(), Some(1));
    assert_eq!(sigterm(&mut child).code(), Some(0));
    let text = std::fs::read_to_string(&log).expect("log");
    assert!(
        !text.contains('\u{1b}'),
        "ANSI codes in a log file: {text:?}"
    );
    let access: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("tidemark::http::access"))
        .collect();
    assert_eq!(access.len(), 1, "{text}");
    for field in [
        "method=GET",
        "route=/v1/keys/{type}/{*name}",
        "status=404",
        "duration_ms=",
        "bytes=",
    ] {
        assert!(access[0].contains(field), "{field} missing: {}", access[0]);
    }
    assert!(access[0].contains(" INFO "), "{}", access[0]);
    // JSON: every line on both streams is a JSON object, the banner and the access line too.
    let log = dir.path().join("json.log");
    let data = dir.path().join("b").to_string_lossy().into_owned();
    let mut args = base.to_vec();
    args.extend(["--data", &data, "--log-format", "json"]);
    let mut child = serve_logged(&args, &log);
    let banner: J = serde_json::from_str(&first_line(&mut child)).expect("a JSON banner");
    let url = banner["http"].as_str().expect("http").to_owned();
    assert!(url.starts_with("http://127.0.0.1:"), "{banner}");
    assert_eq!(banner["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(get(&url, "gcounter/missing").status.code(), Some(1));
    assert_eq!(sigterm(&mut child).code(), Some(0));
    let mut rest = String::new();
    if let Some(mut out) = child.stdout.take() {
        let _ = std::io::Read::read_to_string(&mut out, &mut rest);
    }
    let text = std::fs::read_to_string(&log).expect("log");
    let mut saw_access = false;
    for line in text.lines().chain(rest.lines()).filter(|l| !l.is_empty()) {
        let v: J = serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line:?}"));
        if v["target"] == "tidemark::http::access" {
            assert_eq!(v["fields"]["route"], "/v1/keys/{type}/{*name}", "{v}");
            assert_eq!(v["fields"]["status"], 404, "{v}");
            saw_access = true;
        }
    }
    assert!(saw_access, "{text}");
    // A serve error in JSON mode is a JSON line as well.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let http = taken.local_addr().expect("addr").to_string();
    let o = Command::new(BIN)
        .args([
            "serve",
            "--log-format",
            "json",
            "--peer-listen",
            "127.0.0.1:0",
            "--http",
            &http,
        ])
        .arg("--data")
        .arg(dir.path().join("c"))
        .output()
        .expect("run");
    assert_eq!(o.status.code(), Some(1));
    let err: J = serde_json::from_str(stderr(&o).trim()).expect("a JSON error line");
    assert!(
        err["fields"]["error"]
            .as_str()
            .is_some_and(|e| e.contains("address already in use")),
        "{err}"
    );
    // http.access_log = false: no access lines.
    let log = dir.path().join("quiet.log");
    let mut args = base.to_vec();
    args.extend(["--data", &data, "--set", "http.access_log=false"]);
    let mut child = serve_logged(&args, &log);
    let url = url_in(&first_line(&mut child)).expect("url");
    assert_eq!(get(&url, "gcounter/missing").status.code(), Some(1));
    assert_eq!(sigterm(&mut child).code(), Some(0));
    let text = std::fs::read_to_string(&log).expect("log");
    assert!(!text.contains("tidemark::http::access"), "{text}");
}

#[test]
fn the_quickstart_example_keeps_out_of_the_daemons_data_directory() {
    // `cargo test` builds the examples beside the binary; `cargo test --test cli_commands`
    // alone does not (the example is then checked by `.ci/run`, which runs every example).
    let Some(example) = std::path::Path::new(BIN)
        .parent()
        .map(|d| d.join("examples").join("quickstart"))
        .filter(|p| p.is_file())
    else {
        eprintln!(
            "examples/quickstart is not built (run `cargo test` or `cargo build --examples`): skipped"
        );
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let serve_in = |data: &str| {
        let mut child = Command::new(BIN)
            .current_dir(dir.path())
            .args([
                "serve",
                "--http",
                "127.0.0.1:0",
                "--peer-listen",
                "127.0.0.1:0",
                "--data",
                data,
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("serve");
        assert!(first_line(&mut child).contains("serving HTTP"));
        child
    };
    let quickstart = || {
        Command::new(&example)
            .current_dir(dir.path())
            .output()
            .expect("quickstart")
    };
    // The daemon's default directory in use: the example runs beside it.
    let mut daemon = serve_in("./tidemark-data");
    let o = quickstart();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(stdout(&o), "online = [\"alice\"]\n");
    // Its own directory in use: one readable line, not the error's Debug form.
    let mut holder = serve_in("./quickstart-data");
    let o = quickstart();
    assert_eq!(o.status.code(), Some(1));
    let err = stderr(&o);
    assert!(
        err.starts_with("quickstart: data directory")
            && err.contains("in use")
            && err.lines().count() == 1,
        "{err}"
    );
    assert!(!err.contains("AlreadyOpen"), "{err}");
    assert_eq!(sigterm(&mut holder).code(), Some(0));
    assert_eq!(sigterm(&mut daemon).code(), Some(0));
}

/// `tidemark serve` with `args` and `env`, stderr into a file; returns the child, its URL and
/// the stderr file.
fn serve_with_token_source(
    dir: &std::path::Path,
    args: &[&std::ffi::OsStr],
    env: Option<&str>,
) -> (Child, String, std::path::PathBuf) {
    let log = dir.join("stderr.log");
    let mut cmd = Command::new(BIN);
    cmd.arg("serve")
        .args([
            "--http",
            "127.0.0.1:0",
            "--peer-listen",
            "127.0.0.1:0",
            "--data",
        ])
        .arg(dir.join("data"))
        .args(args)
        .env_remove("TIDEMARK_TOKEN")
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&log).expect("log"));
    if let Some(t) = env {
        cmd.env("TIDEMARK_TOKEN", t);
    }
    let mut child = cmd.spawn().expect("spawn");
    let mut line = String::new();
    if let Some(out) = child.stdout.take() {
        let _ = std::io::BufRead::read_line(&mut std::io::BufReader::new(out), &mut line);
    }
    let url = url_in(&line);
    let Some(url) = url else {
        let _ = child.kill();
        let _ = child.wait();
        panic!(
            "no URL in {line:?}: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
    };
    (child, url, log)
}

fn status_with(url: &str, token: Option<&str>) -> u16 {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .into();
    let mut req = agent.get(format!("{url}/v1/keys"));
    if let Some(t) = token {
        req = req.header("Authorization", format!("Bearer {t}"));
    }
    req.call().map(|r| r.status().as_u16()).unwrap_or(0)
}

#[test]
fn the_token_comes_from_a_file_or_the_environment_and_the_command_line_warns() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("token");
    std::fs::write(&file, "s3cret-file\n").expect("token file");
    let (mut child, url, log) = serve_with_token_source(
        dir.path(),
        &["--token-file".as_ref(), file.as_os_str()],
        None,
    );
    assert_eq!(status_with(&url, None), 401);
    assert_eq!(status_with(&url, Some("s3cret-file")), 200);
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(!text.contains("visible to other users"), "{text}");

    // Client commands read it from a file too: --token-file or TIDEMARK_TOKEN_FILE.
    let client = |args: &[&std::ffi::OsStr], env: &[(&str, &std::ffi::OsStr)]| {
        let mut c = Command::new(BIN);
        c.args(["--url", &url]).env_remove("TIDEMARK_TOKEN");
        c.env_remove("TIDEMARK_TOKEN_FILE");
        for (k, v) in env {
            c.env(k, v);
        }
        c.args(args)
            .args(["inc", "gcounter/token-file"])
            .output()
            .expect("client")
    };
    let o = client(&[], &[]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("401"), "{}", stderr(&o));
    let o = client(&["--token-file".as_ref(), file.as_os_str()], &[]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let o = client(&[], &[("TIDEMARK_TOKEN_FILE", file.as_os_str())]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    // A flag wins over the other source's environment variable.
    let o = client(
        &["--token-file".as_ref(), file.as_os_str()],
        &[("TIDEMARK_TOKEN", "wrong".as_ref())],
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let o = client(
        &["--token".as_ref(), "s3cret-file".as_ref()],
        &[("TIDEMARK_TOKEN_FILE", dir.path().join("absent").as_os_str())],
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    // Both flags, or a file that cannot be read: usage errors, before any request.
    let o = client(
        &[
            "--token".as_ref(),
            "s3cret-file".as_ref(),
            "--token-file".as_ref(),
            file.as_os_str(),
        ],
        &[],
    );
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("not both"), "{}", stderr(&o));
    let absent = dir.path().join("absent");
    let o = client(&["--token-file".as_ref(), absent.as_os_str()], &[]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("cannot read --token-file"),
        "{}",
        stderr(&o)
    );
    let got = Command::new(BIN)
        .args(["--url", &url, "--token", "s3cret-file", "--json", "get"])
        .arg("gcounter/token-file")
        .output()
        .expect("get");
    assert_eq!(json_of(&got)["value"], 4, "the four accepted increments");
    let _ = child.kill();
    let _ = child.wait();

    let (mut child, url, log) = serve_with_token_source(dir.path(), &[], Some("s3cret-env"));
    assert_eq!(status_with(&url, None), 401);
    assert_eq!(status_with(&url, Some("s3cret-env")), 200);
    let _ = child.kill();
    let _ = child.wait();
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(!text.contains("visible to other users"), "{text}");

    let (mut child, url, log) = serve_with_token_source(
        dir.path(),
        &["--token".as_ref(), "s3cret-cli".as_ref()],
        None,
    );
    assert_eq!(status_with(&url, Some("s3cret-cli")), 200);
    let _ = child.kill();
    let _ = child.wait();
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        text.contains("WARN") && text.contains("visible to other users"),
        "no warning for --token on the command line: {text}"
    );
}

/// A node whose certificate comes from another CA joins a cluster: both sides say so at WARN,
/// with the reason, once (not per redial), and the refusal is counted.
#[test]
fn a_peer_from_another_ca_is_refused_with_a_warning_on_both_sides() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = |name: &str| dir.path().join(name).to_string_lossy().into_owned();
    let certs = |args: &[&str]| {
        ok(&Command::new(BIN)
            .arg("certs")
            .args(args)
            .output()
            .expect("certs"))
    };
    certs(&["init", "--out", &p("ca1")]);
    certs(&["init", "--out", &p("ca2")]);
    certs(&[
        "issue",
        "--ca",
        &p("ca1"),
        "--name",
        "alpha",
        "--out",
        &p("alpha-tls"),
    ]);
    certs(&[
        "issue",
        "--ca",
        &p("ca2"),
        "--name",
        "beta",
        "--out",
        &p("beta-tls"),
    ]);
    let port = std::net::UdpSocket::bind("127.0.0.1:0")
        .and_then(|s| s.local_addr())
        .expect("free port")
        .port();
    let alpha_peer = format!("127.0.0.1:{port}");
    let (alpha_log, beta_log) = (dir.path().join("alpha.log"), dir.path().join("beta.log"));
    let mut alpha = serve_logged(
        &[
            "--http",
            "127.0.0.1:0",
            "--peer-listen",
            &alpha_peer,
            "--tls",
            &p("alpha-tls"),
            "--data",
            &p("alpha"),
        ],
        &alpha_log,
    );
    let alpha_url = url_in(&first_line(&mut alpha)).expect("alpha url");
    let mut beta = serve_logged(
        &[
            "--http",
            "127.0.0.1:0",
            "--peer-listen",
            "127.0.0.1:0",
            "--tls",
            &p("beta-tls"),
            "--data",
            &p("beta"),
            "--join",
            &alpha_peer,
        ],
        &beta_log,
    );
    first_line(&mut beta);
    let warned = |log: &std::path::Path| {
        std::fs::read_to_string(log)
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains("WARN") && l.contains("certificate from another CA"))
            .count()
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while warned(&alpha_log) == 0 || warned(&beta_log) == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "no warning naming the CA\nalpha:\n{}\nbeta:\n{}",
            std::fs::read_to_string(&alpha_log).unwrap_or_default(),
            std::fs::read_to_string(&beta_log).unwrap_or_default()
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    // beta keeps redialling (a few times in these seconds); each side still warned once.
    std::thread::sleep(std::time::Duration::from_secs(5));
    assert_eq!((warned(&alpha_log), warned(&beta_log)), (1, 1));
    let m = ureq::get(&format!("{alpha_url}/metrics"))
        .call()
        .expect("metrics")
        .into_body()
        .read_to_string()
        .expect("body");
    let refused = m
        .lines()
        .find(|l| l.starts_with("tidemark_peer_connections_total{result=\"refused\"}"))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|n| n.parse::<u64>().ok())
        .unwrap_or(0);
    assert!(refused >= 1, "{m}");
    for mut c in [alpha, beta] {
        sigterm(&mut c);
    }
}

/// The lines of a daemon's log file that contain every one of `needles`.
fn log_lines(log: &std::path::Path, needles: &[&str]) -> Vec<String> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter(|l| needles.iter().all(|n| l.contains(n)))
        .map(str::to_owned)
        .collect()
}

/// Waits (up to 30 s) until `check` holds.
fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !check() {
        assert!(std::time::Instant::now() < deadline, "never: {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_removed_member_is_decommissioned_everywhere_and_removed_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = |name: &str| dir.path().join(name).to_string_lossy().into_owned();
    issue_certs(dir.path(), &["alpha", "beta"]);
    let port = std::net::UdpSocket::bind("127.0.0.1:0")
        .and_then(|s| s.local_addr())
        .expect("free port")
        .port();
    let alpha_peer = format!("127.0.0.1:{port}");
    let (alpha_log, beta_log) = (dir.path().join("alpha.log"), dir.path().join("beta.log"));
    let (child, url, _) = daemon_support::spawn_serve_logged(
        &[
            "--http",
            "127.0.0.1:0",
            "--peer-listen",
            &alpha_peer,
            "--tls",
            &p("alpha-tls"),
            "--data",
            &p("alpha"),
        ],
        &alpha_log,
    );
    let alpha = Daemon { child, url };
    let (child, url, _) = daemon_support::spawn_serve_logged(
        &[
            "--http",
            "127.0.0.1:0",
            "--peer-listen",
            "127.0.0.1:0",
            "--tls",
            &p("beta-tls"),
            "--data",
            &p("beta"),
            "--join",
            &alpha_peer,
        ],
        &beta_log,
    );
    let beta = Daemon { child, url };
    ok(&alpha.run(&["inc", "gcounter/hits", "2"]));
    eventually("beta has alpha's write", || {
        let o = beta.run(&["--json", "get", "gcounter/hits"]);
        o.status.success() && serde_json::from_slice::<J>(&o.stdout).is_ok_and(|v| v["value"] == 2)
    });
    eventually("beta ready", || {
        beta.run(&["status"]).status.success() && {
            json_of(&beta.run(&["--json", "status"]))["ready"] == true
        }
    });
    // Removed (forced: it still answers). Logged at INFO where it was asked.
    let o = alpha.run(&["--json", "members", "remove", "beta", "--force"]);
    let first = json_of(&o);
    assert_eq!(first["already"], false, "{first}");
    let log_end = |d: &Daemon| {
        json_of(&d.run(&["--json", "status"]))["cluster"]["node"]["log"]["end"].clone()
    };
    let end = log_end(&alpha);
    // A repeat writes nothing and answers with the record there is (also without --force).
    let again = json_of(&alpha.run(&["--json", "members", "remove", "beta"]));
    assert_eq!(again["already"], true, "{again}");
    assert_eq!(again["at_ms"], first["at_ms"], "{again} vs {first}");
    assert_eq!(again["by"], first["by"], "{again}");
    let text = ok(&alpha.run(&["members", "remove", "beta"]));
    assert!(text.contains("was already removed"), "{text}");
    assert_eq!(log_end(&alpha), end, "a repeated remove wrote again");
    eventually("alpha logs the removal at INFO", || {
        log_lines(
            &alpha_log,
            &["INFO", "member removed from the cluster for good"],
        )
        .len()
            == 1
    });
    // beta learns it was removed: it says so in status, /v1/cluster and /readyz, and logs a
    // WARN once.
    eventually("beta knows it was removed", || {
        json_of(&beta.run(&["--json", "status"]))["cluster"]["node"]["decommissioned"] == true
    });
    let status = json_of(&beta.run(&["--json", "status"]));
    assert_eq!(status["ready"], false, "{status}");
    let text = ok(&beta.run(&["status"]));
    assert!(
        text.contains("removed from the cluster for good (decommissioned)"),
        "{text}"
    );
    let addr = beta.url.trim_start_matches("http://").to_owned();
    let ready = raw(
        &beta.url,
        &format!("GET /readyz HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"),
    );
    assert!(ready.starts_with("HTTP/1.1 503"), "{ready}");
    assert!(ready.contains("\"code\":\"decommissioned\""), "{ready}");
    eventually("beta warns about itself", || {
        !log_lines(
            &beta_log,
            &["WARN", "this node was removed from the cluster for good"],
        )
        .is_empty()
    });
    std::thread::sleep(Duration::from_millis(1200));
    assert_eq!(
        log_lines(
            &beta_log,
            &["WARN", "this node was removed from the cluster for good"]
        )
        .len(),
        1,
        "{}",
        std::fs::read_to_string(&beta_log).unwrap_or_default()
    );
    // alpha: beta's state is decommissioned in /metrics and /v1/cluster, and its lag series
    // are gone (nothing waits for it), however much alpha writes.
    ok(&alpha.run(&["inc", "gcounter/hits", "1"]));
    let addr = alpha.url.trim_start_matches("http://").to_owned();
    let metrics = raw(
        &alpha.url,
        &format!("GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"),
    );
    assert!(
        metrics.contains("tidemark_member_state{member=\"beta\",state=\"decommissioned\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("tidemark_member_state{member=\"beta\",state=\"alive\"} 0"),
        "{metrics}"
    );
    assert!(
        !metrics
            .lines()
            .any(|l| l.starts_with("tidemark_replication_lag") && l.contains("member=\"beta\"")),
        "{metrics}"
    );
    let c = json_of(&alpha.run(&["--json", "status"]));
    let b = c["cluster"]["members"]
        .as_array()
        .and_then(|m| m.iter().find(|m| m["name"] == "beta").cloned())
        .unwrap_or_else(|| panic!("no beta: {c}"));
    assert_eq!(b["state"], "decommissioned", "{b}");
    // Nothing waits for it: its cursor and its lag are unknown together.
    for field in ["acked", "lag_entries", "lag_bytes", "lag_seconds"] {
        assert_eq!(b[field], J::Null, "{field}: {b}");
    }
    assert_eq!(c["cluster"]["node"]["decommissioned"], false, "{c}");
    drop(beta);
    assert_eq!(alpha.terminate().code(), Some(0));
    // After a restart SWIM no longer knows beta; the record keeps its name, so removing it
    // again by name still answers with that record (nothing written).
    let (child, url, _) = daemon_support::spawn_serve_logged(
        &[
            "--http",
            "127.0.0.1:0",
            "--peer-listen",
            &alpha_peer,
            "--tls",
            &p("alpha-tls"),
            "--data",
            &p("alpha"),
        ],
        &alpha_log,
    );
    let alpha = Daemon { child, url };
    let end = log_end(&alpha);
    let again = json_of(&alpha.run(&["--json", "members", "remove", "beta"]));
    assert_eq!(again["already"], true, "{again}");
    assert_eq!(again["name"], "beta", "{again}");
    assert_eq!(again["at_ms"], first["at_ms"], "{again} vs {first}");
    assert_eq!(again["removed"], first["removed"], "{again} vs {first}");
    assert_eq!(log_end(&alpha), end, "a repeated remove wrote again");
    assert_eq!(alpha.terminate().code(), Some(0));
}

/// A command whose stdout is closed early (`tidemark list | head -1`) ends quietly: no panic,
/// exit 0, nothing on stderr.
#[test]
fn a_closed_stdout_ends_commands_quietly() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = Daemon::start(dir.path(), &[]);
    for i in 0..3 {
        ok(&d.run(&["inc", &format!("gcounter/k{i}")]));
    }
    for args in [
        &["list"][..],
        &["--json", "list"],
        &["status"],
        &["members"],
        &["get", "gcounter/k1"],
        &["version"],
        &["completions", "bash"],
    ] {
        let mut child = Command::new(BIN)
            .arg("--url")
            .arg(&d.url)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn");
        // The reader goes away before anything is written.
        drop(child.stdout.take());
        let o = child.wait_with_output().expect("wait");
        let err = stderr(&o);
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        assert_eq!(o.status.code(), Some(0), "{args:?}: {err}");
        assert!(err.trim().is_empty(), "{args:?}: {err}");
    }
    assert_eq!(d.terminate().code(), Some(0));
}
