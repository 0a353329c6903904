//! The binary's conventions (the operator's view): the ingest progress bar on a
//! terminal at 80 columns, line and op numbers as the HTTP API gives them, flags shown only
//! where they apply, every positional documented, exit status 2 for usage errors, and failures
//! that say how to proceed (a directory in use names its holder; a restore cut short is named
//! as such on the next start).

use crate::daemon_support;

use daemon_support::{BIN, Daemon, spawn_serve, stderr, stdout};
use serde_json::{Value as J, json};
use std::process::{Command, Output, Stdio};

/// `POST path` to `d` with `body`: the status and the JSON answer.
fn post(d: &Daemon, path: &str, content_type: &str, body: &[u8]) -> (u16, J) {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .into();
    let mut resp = agent
        .post(format!("{}{path}", d.url))
        .content_type(content_type)
        .send(body)
        .expect("post");
    let status = resp.status().as_u16();
    let text = resp.body_mut().read_to_string().expect("body");
    (status, serde_json::from_str(&text).expect("a JSON answer"))
}

fn tidemark(args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run tidemark")
}

/// Runs `cmd` with its `fd` ("stdout" or "stderr") on a pseudo-terminal of 80 columns (the
/// other streams are this process's pipes; stdin is `input`); returns the child's output
/// (the terminal's bytes in place of the stream on it) and the terminal's bytes.
fn on_terminal(fd: &str, cmd: &[&str], input: &[u8]) -> (Output, Vec<u8>) {
    const HARNESS: &str = r#"
import fcntl, os, pty, struct, subprocess, sys, termios
fd, out_path, cmd = sys.argv[1], sys.argv[2], sys.argv[3:]
master, slave = pty.openpty()
fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
env = dict(os.environ, COLUMNS="80", LINES="24", TERM="xterm")
child = subprocess.Popen(cmd, env=env, **{fd: slave})
os.close(slave)
seen = []
while True:
    try:
        data = os.read(master, 65536)
    except OSError:
        break
    if not data:
        break
    seen.append(data)
code = child.wait()
with open(out_path, "wb") as f:
    f.write(b"".join(seen))
sys.exit(code if code >= 0 else 128 - code)
"#;
    let dir = tempfile::tempdir().expect("tempdir");
    let seen = dir.path().join("terminal.out");
    let mut child = Command::new("python3")
        .arg("-c")
        .arg(HARNESS)
        .arg(fd)
        .arg(&seen)
        .args(cmd)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3 (the pseudo-terminal harness)");
    if let Some(mut stdin) = child.stdin.take() {
        std::io::Write::write_all(&mut stdin, input).expect("stdin");
    }
    let out = child.wait_with_output().expect("harness");
    let bytes = std::fs::read(&seen).unwrap_or_default();
    (out, bytes)
}

/// The text a terminal shows for `bytes`, as the lines drawn one after another: escape
/// sequences removed, split at carriage returns and newlines.
fn drawn_lines(bytes: &[u8]) -> Vec<String> {
    let text = String::from_utf8_lossy(bytes);
    let mut plain = String::new();
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // CSI: ESC [ params final-byte; other escapes: ESC + one char.
            if chars.next_if_eq(&'[').is_some() {
                for c in chars.by_ref() {
                    if ('@'..='~').contains(&c) {
                        break;
                    }
                }
            } else {
                chars.next();
            }
        } else {
            plain.push(c);
        }
    }
    plain
        .split(['\r', '\n'])
        .map(str::to_owned)
        .filter(|l| !l.trim().is_empty())
        .collect()
}

/// `n` NDJSON events of the source `source`.
fn events(source: &str, n: usize) -> String {
    (1..=n)
        .map(|seq| format!("{{\"source\":\"{source}\",\"seq\":{seq},\"page\":\"/p/{seq}\"}}\n"))
        .collect()
}

#[test]
fn the_ingest_bar_is_drawn_on_a_terminal_stderr_and_fits_80_columns() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = Daemon::start(&dir.path().join("data"), &[]);
    // ~3 MB in ~100 requests: long enough for the bar to be drawn several times.
    let file = dir.path().join("events.ndjson");
    std::fs::write(&file, events("bar", 100_000)).expect("write");
    let file = file.to_string_lossy().into_owned();
    let cmd = [BIN, "--url", &d.url, "ingest", "--stream", "s", &file];
    // stderr a terminal, stdout a pipe: the bar is drawn (on stderr).
    let (out, seen) = on_terminal("stderr", &cmd, b"");
    assert_eq!(out.status.code(), Some(0), "{}", stdout(&out));
    assert!(
        stdout(&out).starts_with("accepted 100000,") && !stdout(&out).contains('\u{1b}'),
        "the summary on stdout, without escapes: {}",
        stdout(&out)
    );
    let lines = drawn_lines(&seen);
    let bars: Vec<&String> = lines.iter().filter(|l| l.contains("ETA")).collect();
    assert!(!bars.is_empty(), "no bar with an ETA was drawn: {lines:#?}");
    for bar in &bars {
        let width = bar.chars().count();
        assert!(width <= 80, "{width} columns: {bar:?}");
        let inside = bar
            .split_once('[')
            .and_then(|(_, rest)| rest.split_once(']'))
            .map_or(0, |(cells, _)| cells.chars().count());
        assert!(inside >= 20, "a bar of {inside} cells: {bar:?}");
        assert!(bar.contains("B/s") && bar.contains('%'), "{bar:?}");
    }
    // stdout a terminal, stderr a pipe: no bar (and no escapes) on stderr.
    let (out, seen) = on_terminal("stdout", &cmd, b"");
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        !stderr(&out).contains('\u{1b}') && !stderr(&out).contains("ETA"),
        "{}",
        stderr(&out)
    );
    assert!(
        String::from_utf8_lossy(&seen).contains("accepted 0, duplicates 100000"),
        "{}",
        String::from_utf8_lossy(&seen)
    );
}

#[test]
fn the_ingest_of_stdin_shows_a_spinner_with_counts() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = Daemon::start(&dir.path().join("data"), &[]);
    let input = events("spin", 100_000);
    let cmd = [BIN, "--url", &d.url, "ingest", "--stream", "s", "-"];
    let (out, seen) = on_terminal("stderr", &cmd, input.as_bytes());
    assert_eq!(out.status.code(), Some(0), "{}", stdout(&out));
    assert!(
        stdout(&out).starts_with("accepted 100000,"),
        "{}",
        stdout(&out)
    );
    let lines = drawn_lines(&seen);
    let spinners: Vec<&String> = lines.iter().filter(|l| l.contains(" events")).collect();
    assert!(!spinners.is_empty(), "no counts were drawn: {lines:#?}");
    for line in spinners {
        assert!(line.chars().count() <= 80, "{line:?}");
        assert!(
            line.contains("events/s") && line.contains("B/s") && !line.contains("ETA"),
            "{line:?}"
        );
    }
}

/// The `at` of an error answer.
fn at(answer: &J) -> &str {
    answer["error"]["at"].as_str().unwrap_or_default()
}

#[test]
fn lines_and_ops_are_numbered_as_the_http_api_numbers_them() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = Daemon::start(&dir.path().join("data"), &[]);
    // Line 1 is blank, line 3 has a bad time, line 1203 too (in the CLI's second request).
    let mut file = String::from("\n");
    for seq in 1..=1300 {
        if seq == 2 || seq == 1202 {
            file.push_str(&format!(
                "{{\"source\":\"n\",\"seq\":{seq},\"time\":\"noon\"}}\n"
            ));
        } else {
            file.push_str(&format!("{{\"source\":\"n\",\"seq\":{seq}}}\n"));
        }
    }
    let (status, answer) = post(
        &d,
        "/v1/streams/http/events",
        "application/x-ndjson",
        file.as_bytes(),
    );
    assert_eq!(
        (status, at(&answer)),
        (400, "line 3, field time"),
        "{answer}"
    );
    let path = dir.path().join("events.ndjson");
    std::fs::write(&path, &file).expect("write");
    let o = d.run(&["ingest", "--stream", "cli", &path.to_string_lossy()]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(
        err.contains("rejected line 3: ") && err.contains("(at line 3, field time)"),
        "{err}"
    );
    assert!(
        err.contains("rejected line 1203: ") && err.contains("(at line 1203, field time)"),
        "{err}"
    );
    assert!(!err.contains("at line 2,"), "{err}");
    // An op of an event, refused when the batch commits: the line in the message too, not the
    // node's batch index.
    let events = concat!(
        "{\"source\":\"o\",\"seq\":1,\"ops\":[{\"type\":\"gcounter\",\"key\":\"g\",\"op\":\"inc\"}]}\n",
        "{\"source\":\"o\",\"seq\":2}\n",
        "{\"source\":\"o\",\"seq\":3,\"ops\":[{\"type\":\"gcounter\",\"key\":\"g\",\"op\":\"inc\"},",
        "{\"type\":\"gcounter\",\"key\":\"g\",\"op\":\"add\",\"value\":1}]}\n",
    );
    let (status, answer) = post(
        &d,
        "/v1/streams/ops/events",
        "application/x-ndjson",
        events.as_bytes(),
    );
    let message = answer["error"]["message"].as_str().unwrap_or_default();
    assert_eq!((status, at(&answer)), (409, "line 3, field op"), "{answer}");
    assert!(
        message.starts_with("line 3: ") && !message.contains("op 2"),
        "{answer}"
    );
    let path = dir.path().join("ops.ndjson");
    std::fs::write(&path, events).expect("write");
    let o = d.run(&["ingest", "--stream", "ops2", &path.to_string_lossy()]);
    assert!(
        stderr(&o).contains(&format!(
            "rejected line 3: 409 type_mismatch: {message} (at line 3, field op)"
        )),
        "{}",
        stderr(&o)
    );
    // NDJSON ops: a blank line, then a counter delete on line 3.
    let (status, answer) = post(&d,
        "/v1/ops",
        "application/x-ndjson",
        b"\n{\"type\":\"gcounter\",\"key\":\"g\",\"op\":\"inc\"}\n{\"type\":\"gcounter\",\"key\":\"g\",\"op\":\"delete\"}\n",
    );
    assert_eq!((status, at(&answer)), (409, "line 3, field op"), "{answer}");
    assert!(
        answer["error"]["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("line 3: ")),
        "{answer}"
    );
    // A JSON array: op 0 is index 0, in the API and in the CLI's message alike.
    let op = json!([{"type": "gcounter", "key": "g", "op": "add", "value": "x"}]);
    let (status, answer) = post(&d, "/v1/ops", "application/json", op.to_string().as_bytes());
    let message = answer["error"]["message"].as_str().unwrap_or_default();
    assert_eq!(
        (status, at(&answer)),
        (409, "index 0, field op"),
        "{answer}"
    );
    assert!(message.starts_with("op 0: "), "{answer}");
    let o = d.run(&["add", "gcounter/g", "x"]);
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(
        stderr(&o).trim(),
        format!("tidemark: 409 type_mismatch: {message} (at index 0, field op)")
    );
}

#[test]
fn flags_show_only_on_the_commands_that_read_them() {
    let help = |args: &[&str]| {
        let o = tidemark(args);
        assert_eq!(o.status.code(), Some(0), "{args:?}: {}", stderr(&o));
        stdout(&o)
    };
    let serve = help(&["serve", "--help"]);
    assert!(
        !serve.contains("--url") && !serve.contains("--json"),
        "{serve}"
    );
    assert!(
        serve.contains("--token-file") && serve.contains("--data"),
        "{serve}"
    );
    for client in ["status", "get", "ingest", "snapshot"] {
        let text = help(&[client, "--help"]);
        for flag in ["--url", "--token", "--token-file", "--json"] {
            assert!(text.contains(flag), "{client} --help lacks {flag}: {text}");
        }
        assert!(!text.contains("--peer-listen"), "{client}: {text}");
    }
    for other in [&["certs", "init", "--help"][..], &["completions", "--help"]] {
        let text = help(other);
        assert!(
            !text.contains("--url") && !text.contains("--json") && !text.contains("--token"),
            "{text}"
        );
    }
    let version = help(&["version", "--help"]);
    assert!(
        version.contains("--json") && !version.contains("--url") && !version.contains("--token"),
        "{version}"
    );
    // The README's form: a global flag before the command still parses, for every command.
    help(&["--url", "localhost:7710", "serve", "--help"]);
    help(&["--url", "localhost:7710", "status", "--help"]);
}

/// The commands `tidemark -h` lists (without `help`).
fn commands(help: &str) -> Vec<String> {
    help.lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| *c != "help")
        .map(str::to_owned)
        .collect()
}

#[test]
fn every_positional_has_help_with_an_example() {
    let mut paths: Vec<Vec<String>> = commands(&stdout(&tidemark(&["-h"])))
        .into_iter()
        .map(|c| vec![c])
        .collect();
    assert!(paths.len() >= 15, "{paths:?}");
    let mut checked = 0;
    while let Some(path) = paths.pop() {
        let mut args: Vec<&str> = path.iter().map(String::as_str).collect();
        args.push("-h");
        let help = stdout(&tidemark(&args));
        for sub in commands(&help) {
            let mut deeper = path.clone();
            deeper.push(sub);
            paths.push(deeper);
        }
        // `Arguments:` lines are `  <NAME>  help`.
        for line in help
            .lines()
            .skip_while(|l| !l.starts_with("Arguments:"))
            .skip(1)
            .take_while(|l| l.starts_with("  "))
        {
            let line = line.trim_start();
            let Some((name, text)) = line.split_once("  ") else {
                panic!("{path:?}: {line:?} has no help");
            };
            assert!(
                text.trim().contains("e.g."),
                "{path:?} {name}: {text:?} shows no example"
            );
            checked += 1;
        }
    }
    assert!(checked >= 12, "only {checked} positionals seen");
}

#[test]
fn usage_errors_exit_2_before_anything_is_done() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("never");
    let data_arg = data.to_string_lossy().into_owned();
    let serve = |extra: &[&str]| {
        let mut args = vec![
            "serve",
            "--http",
            "127.0.0.1:0",
            "--peer-listen",
            "127.0.0.1:0",
            "--data",
            &data_arg,
        ];
        args.extend_from_slice(extra);
        tidemark(&args)
    };
    let missing = dir.path().join("missing.toml");
    let snapshot = dir.path().join("missing.tmsnap");
    let existing = dir.path().join("existing.tmsnap");
    std::fs::write(&existing, b"not mine to overwrite").expect("existing file");
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, "t\n").expect("token file");
    // View definitions that group by `.`, `..` or one field twice (also in another case):
    // refused while the configuration is read, `--print-config` too.
    let bad_views: Vec<(String, std::path::PathBuf)> = [
        r#"["."]"#,
        r#"[".."]"#,
        r#"["page", "user", "page"]"#,
        r#"["page", "Page"]"#,
    ]
    .iter()
    .enumerate()
    .map(|(i, group_by)| {
        let path = dir.path().join(format!("views{i}.toml"));
        std::fs::write(
            &path,
            format!(
                "[[views]]\nname = \"v\"\nstream = \"s\"\nkind = \"count\"\ngroup_by = {group_by}\n"
            ),
        )
        .expect("config");
        ((*group_by).to_owned(), path)
    })
    .collect();
    for (group_by, path) in &bad_views {
        for extra in [&[][..], &["--print-config"][..]] {
            let mut args = vec!["--config", path.to_str().expect("utf-8 path")];
            args.extend_from_slice(extra);
            let o = serve(&args);
            assert_eq!(
                o.status.code(),
                Some(2),
                "group_by {group_by} {extra:?}: {}",
                stderr(&o)
            );
            assert!(
                stderr(&o).contains("field `group_by`"),
                "group_by {group_by}: {}",
                stderr(&o)
            );
        }
    }
    // With JSON logs a usage error is one JSON line on stderr, and still exits 2.
    let o = serve(&["--log-format", "json", "--advertise", "127.0.0.1:7701"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let err = stderr(&o);
    let lines: Vec<serde_json::Value> = err
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l:?}")))
        .collect();
    let line = lines.last().cloned().unwrap_or_default();
    assert_eq!(line["level"], "ERROR", "{err}");
    assert!(
        line["fields"]["error"]
            .as_str()
            .is_some_and(|e| e.contains("peer.advertise needs peer.tls")),
        "{line}"
    );
    for (what, o) in [
        (
            "--advertise without --tls, JSON logs",
            serve(&["--log-format", "json", "--advertise", "127.0.0.1:7701"]),
        ),
        (
            "--log-format json with a bad --set",
            serve(&["--log-format", "json", "--set", "no_such_key=1"]),
        ),
        (
            "--log-format json with an unknown flag",
            serve(&["--log-format", "json", "--no-such-flag"]),
        ),
        (
            "snapshot --out an existing file",
            tidemark(&["snapshot", "--out", &existing.to_string_lossy()]),
        ),
        (
            "--token and --token-file",
            tidemark(&[
                "--token",
                "t",
                "--token-file",
                &token_file.to_string_lossy(),
                "get",
                "gcounter/x",
            ]),
        ),
        (
            "a --token-file that cannot be read",
            tidemark(&[
                "--token-file",
                &missing.to_string_lossy(),
                "get",
                "gcounter/x",
            ]),
        ),
        ("a bad --set", serve(&["--set", "no_such_key=1"])),
        (
            "a missing --config",
            serve(&["--config", &missing.to_string_lossy()]),
        ),
        (
            "--advertise without --tls, with --restore",
            serve(&[
                "--advertise",
                "127.0.0.1:7701",
                "--restore",
                &snapshot.to_string_lossy(),
            ]),
        ),
        (
            "a value that is not JSON",
            tidemark(&["set", "lww/x", "not json"]),
        ),
        (
            "--group without =",
            tidemark(&["view", "v", "--group", "page"]),
        ),
        ("inc of a set", tidemark(&["inc", "orset/x"])),
        (
            "a port that is none",
            tidemark(&["--url", "127.0.0.1:99999", "status"]),
        ),
        (
            "an empty port",
            tidemark(&["--url", "127.0.0.1:", "status"]),
        ),
        (
            "ingest of a missing file",
            tidemark(&["ingest", "--stream", "s", &missing.to_string_lossy()]),
        ),
        ("a bad key", tidemark(&["get", "x"])),
        ("no --out", tidemark(&["snapshot"])),
        ("no command", tidemark(&[])),
    ] {
        assert_eq!(o.status.code(), Some(2), "{what}: {}", stderr(&o));
        assert!(!stderr(&o).is_empty(), "{what}: no message");
    }
    assert!(!data.exists(), "a usage error created the data directory");
    // A --tls directory that cannot be read fails before the data directory is created, and
    // says the OS error once.
    let o = serve(&["--tls", &dir.path().join("no-such-certs").to_string_lossy()]);
    assert_ne!(o.status.code(), Some(0), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(err.contains("--tls"), "{err}");
    assert_eq!(
        err.matches("No such file or directory").count(),
        1,
        "the OS error once: {err}"
    );
    assert!(!data.exists(), "a bad --tls created the data directory");
    // A key of another node, and a certificate of another CA: refused before anything is
    // created, naming the file that is wrong.
    let one = dir.path().join("ca-one");
    let two = dir.path().join("ca-two");
    std::fs::create_dir_all(&one).expect("mkdir");
    std::fs::create_dir_all(&two).expect("mkdir");
    daemon_support::issue_certs(&one, &["alpha", "beta"]);
    daemon_support::issue_certs(&two, &["alpha"]);
    let mixed = dir.path().join("mixed-tls");
    std::fs::create_dir_all(&mixed).expect("mkdir");
    for (file, from) in [
        ("ca.pem", one.join("alpha-tls")),
        ("node.pem", one.join("alpha-tls")),
        ("node.key", one.join("beta-tls")),
    ] {
        std::fs::copy(from.join(file), mixed.join(file)).expect("copy");
    }
    let stranger = dir.path().join("stranger-tls");
    std::fs::create_dir_all(&stranger).expect("mkdir");
    for (file, from) in [
        ("ca.pem", one.join("alpha-tls")),
        ("node.pem", two.join("alpha-tls")),
        ("node.key", two.join("alpha-tls")),
    ] {
        std::fs::copy(from.join(file), stranger.join(file)).expect("copy");
    }
    for (tls, says) in [
        (&mixed, "node.key"),
        (&stranger, "not issued by the ca.pem"),
    ] {
        let o = serve(&["--tls", &tls.to_string_lossy()]);
        assert_ne!(o.status.code(), Some(0), "{}", stderr(&o));
        assert!(stderr(&o).contains(says), "{}", stderr(&o));
        assert!(!data.exists(), "a bad --tls created the data directory");
    }
    assert_eq!(
        std::fs::read(&existing).expect("existing"),
        b"not mine to overwrite"
    );
}

#[test]
fn a_directory_in_use_names_the_process_holding_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let d = Daemon::start(&data, &[]);
    let o = tidemark(&[
        "serve",
        "--http",
        "127.0.0.1:0",
        "--peer-listen",
        "127.0.0.1:0",
        "--data",
        &data.to_string_lossy(),
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let expected = format!(
        "tidemark: data directory {} is in use by another tidemark (pid {}) — stop it or use \
         --data DIR",
        data.display(),
        d.child.id()
    );
    assert_eq!(stderr(&o).trim(), expected);
    // The daemon was not disturbed.
    assert_eq!(d.run(&["status"]).status.code(), Some(0));
}

#[test]
fn a_restore_cut_short_is_named_on_the_next_start_and_nothing_is_removed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let snapshot = dir.path().join("node.tmsnap");
    {
        let d = Daemon::start(&dir.path().join("source"), &[]);
        // ~2 MB of values, so writing the restored copy takes many file extensions.
        let big = "v".repeat(60 * 1024);
        for batch in 0..4 {
            let ops: Vec<J> = (0..8)
                .map(|i| json!({"type": "lww", "key": format!("k{batch}-{i}"), "op": "set", "value": &big}))
                .collect();
            let (status, answer) = post(
                &d,
                "/v1/ops",
                "application/json",
                J::from(ops).to_string().as_bytes(),
            );
            assert_eq!(status, 200, "{answer}");
        }
        let o = d.run(&["snapshot", "--out", &snapshot.to_string_lossy()]);
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    }
    let restored = dir.path().join("restored");
    let (snap_arg, restored_arg) = (
        snapshot.to_string_lossy().into_owned(),
        restored.to_string_lossy().into_owned(),
    );
    let serve_args = [
        "serve",
        "--http",
        "127.0.0.1:0",
        "--peer-listen",
        "127.0.0.1:0",
        "--restore",
        &snap_arg,
        "--data",
        &restored_arg,
    ];
    // A restore cut short: the file size limit kills the process (SIGXFSZ) half way through
    // writing the restored database, as a kill or a crash would.
    let o = Command::new("sh")
        .arg("-c")
        .arg("ulimit -f 256 && exec \"$@\"")
        .arg("sh")
        .arg(BIN)
        .args(serve_args)
        .stdin(Stdio::null())
        .output()
        .expect("sh");
    assert!(
        !o.status.success(),
        "the restore was not cut short: {}",
        stderr(&o)
    );
    assert!(
        restored.join(tidemark::store::RESTORE_MARKER).is_file(),
        "no marker left: {}",
        stderr(&o)
    );
    // The next start says what the directory is and how to proceed; it removes nothing.
    let left: Vec<_> = std::fs::read_dir(&restored)
        .expect("read_dir")
        .filter_map(Result::ok)
        .map(|e| e.file_name())
        .collect();
    let o = tidemark(&serve_args);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(
        err.contains(&format!(
            "{restored_arg} was left by a restore that did not finish"
        )) && err.contains(&format!("of {snap_arg}, started at "))
            && err.contains(&format!(
                "remove it (rm -r {restored_arg}) and restore again"
            )),
        "{err}"
    );
    // Served without --restore, it is not taken for a store (an empty node beside the remains).
    let o = tidemark(
        &serve_args[..5]
            .iter()
            .chain(&serve_args[7..])
            .copied()
            .collect::<Vec<_>>(),
    );
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("was left by a restore that did not finish"),
        "{}",
        stderr(&o)
    );
    let still: Vec<_> = std::fs::read_dir(&restored)
        .expect("read_dir")
        .filter_map(Result::ok)
        .map(|e| e.file_name())
        .collect();
    assert_eq!(still.len(), left.len(), "{left:?} became {still:?}");
    // As told: remove it and restore again.
    std::fs::remove_dir_all(&restored).expect("rm -r");
    let (child, url, _) = spawn_serve(&serve_args[1..]);
    let d = Daemon { child, url };
    let o = d.run(&["--json", "get", "lww/k3-7"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(!restored.join(tidemark::store::RESTORE_MARKER).exists());
    drop(d);
    // A complete restore is no restore target: the message says to serve it instead.
    let o = tidemark(&serve_args);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("is not empty: it holds a node's data (serve it without restoring)"),
        "{}",
        stderr(&o)
    );
}

/// With `--log-format json`, every line `serve` writes on stderr is JSON, the fatal error of a
/// bad flag value or an unreadable config file included (usage errors: exit 2).
#[test]
fn json_logs_cover_configuration_errors() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("d").to_string_lossy().into_owned();
    let missing = dir
        .path()
        .join("missing.toml")
        .to_string_lossy()
        .into_owned();
    let bad_toml = dir.path().join("bad.toml");
    std::fs::write(&bad_toml, "[log]\nformat = \"json\"\nhttp = {").expect("write");
    let bad_toml = bad_toml.to_string_lossy().into_owned();
    let cases: Vec<Vec<&str>> = vec![
        vec!["serve", "--log-format", "json", "--durability", "sparkles"],
        vec!["serve", "--log-format=json", "--http", "not-an-address"],
        vec![
            "serve",
            "--log-format",
            "json",
            "--config",
            &missing,
            "--data",
            &data,
        ],
        vec![
            "serve",
            "--config",
            &bad_toml,
            "--log-format",
            "json",
            "--data",
            &data,
        ],
        vec![
            "serve",
            "--log-format",
            "json",
            "--set",
            "http.nonsense=1",
            "--data",
            &data,
        ],
        vec![
            "serve",
            "--log-format",
            "json",
            "--set",
            "views=[{name=\"v\",stream=\"s\",kind=\"count\",group_by=[\"a\",\"a\"]}]",
            "--data",
            &data,
            "--http",
            "127.0.0.1:0",
            "--peer-listen",
            "127.0.0.1:0",
        ],
    ];
    for args in &cases {
        let o = tidemark(args);
        assert_ne!(o.status.code(), Some(0), "{args:?}");
        let err = stderr(&o);
        assert!(!err.trim().is_empty(), "{args:?}: nothing on stderr");
        for line in err.lines().filter(|l| !l.trim().is_empty()) {
            let v: J = serde_json::from_str(line)
                .unwrap_or_else(|_| panic!("{args:?}: not a JSON line: {line:?}\n{err}"));
            assert!(v.get("level").is_some(), "{args:?}: {line}");
        }
        assert!(err.contains("\"level\":\"ERROR\""), "{args:?}: {err}");
    }
    // A bad flag value is still a usage error (exit 2), named in the JSON line.
    let o = tidemark(&cases[0]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("sparkles"), "{}", stderr(&o));
    // Without JSON logs, errors stay plain text.
    let o = tidemark(&["serve", "--durability", "sparkles"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(!stderr(&o).trim_start().starts_with('{'), "{}", stderr(&o));
    // `--help` is no error: shown as text.
    let o = tidemark(&["serve", "--log-format", "json", "--help"]);
    assert_eq!(o.status.code(), Some(0));
    assert!(stdout(&o).contains("Usage"), "{}", stdout(&o));
}

/// `--url HOST` without a port means the node's default port 7700 (not HTTP's 80), and
/// `--help` says so.
#[test]
fn a_url_without_a_port_is_the_default_node_port() {
    for url in ["localhost", "http://localhost", "http://localhost/"] {
        let o = tidemark(&["--url", url, "--token", "x", "get", "gcounter/none"]);
        // No node listens on 7700 here (or one does: either way the URL names port 7700).
        let err = stderr(&o);
        if o.status.success() {
            continue;
        }
        assert!(
            err.contains("http://localhost:7700") || err.contains("404"),
            "--url {url}: {err}"
        );
        assert!(!err.contains("localhost:80"), "--url {url}: {err}");
    }
    let help = stdout(&tidemark(&["--help"]));
    assert!(help.contains("the node's default 7700"), "{help}");
}
