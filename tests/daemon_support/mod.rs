//! Starting `tidemark serve` as a child process in tests, and what the tests of the binary
//! share: the [`Daemon`] wrapper, output helpers, issuing cluster certificates, and finding a
//! headless Chromium. Each test crate uses some of it (hence `dead_code` allowed).
#![allow(dead_code)]

use std::ffi::OsStr;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};

/// The binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_tidemark");

/// `tidemark serve ARGS...` (stderr discarded); returns the child, the HTTP URL it prints on its
/// first stdout line, and that line. Panics (killing the child) when no URL is printed.
pub fn spawn_serve<S: AsRef<OsStr>>(args: &[S]) -> (Child, String, String) {
    spawn_serve_to(args, Stdio::null())
}

/// [`spawn_serve`] with the daemon's stderr (its log) appended to the file `log`.
pub fn spawn_serve_logged<S: AsRef<OsStr>>(args: &[S], log: &Path) -> (Child, String, String) {
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .expect("log file");
    spawn_serve_to(args, Stdio::from(file))
}

/// [`spawn_serve_logged`] with another `tidemark` binary than the one under test (an earlier
/// build, for upgrade tests).
pub fn spawn_serve_bin_logged<S: AsRef<OsStr>>(
    bin: &Path,
    args: &[S],
    log: &Path,
) -> (Child, String, String) {
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .expect("log file");
    spawn_serve_with(bin.as_os_str(), args, Stdio::from(file))
}

fn spawn_serve_to<S: AsRef<OsStr>>(args: &[S], stderr: Stdio) -> (Child, String, String) {
    spawn_serve_with(BIN.as_ref(), args, stderr)
}

fn spawn_serve_with<S: AsRef<OsStr>>(
    bin: &OsStr,
    args: &[S],
    stderr: Stdio,
) -> (Child, String, String) {
    let mut child = Command::new(bin)
        .arg("serve")
        .args(args)
        .stdout(Stdio::piped())
        .stderr(stderr)
        .spawn()
        .expect("spawn serve");
    let mut line = String::new();
    if let Some(stdout) = child.stdout.take() {
        let _ = BufReader::new(stdout).read_line(&mut line);
    }
    let Some(url) = line.split_whitespace().find(|w| w.starts_with("http://")) else {
        let _ = child.kill();
        let _ = child.wait();
        panic!("no address in {line:?}");
    };
    let url = url.to_owned();
    (child, url, line)
}

/// A `tidemark serve` child and the HTTP URL it serves on. On drop: SIGCONT (in case a test
/// stopped it), SIGKILL, wait.
pub struct Daemon {
    /// The child process.
    pub child: Child,
    /// `http://127.0.0.1:PORT`.
    pub url: String,
}

impl Daemon {
    /// `serve --http 127.0.0.1:0 --peer-listen 127.0.0.1:0 --data DATA EXTRA...`.
    pub fn start(data: &Path, extra: &[&str]) -> Self {
        let mut args: Vec<&OsStr> = vec![
            "--http".as_ref(),
            "127.0.0.1:0".as_ref(),
            "--peer-listen".as_ref(),
            "127.0.0.1:0".as_ref(),
            "--data".as_ref(),
            data.as_os_str(),
        ];
        args.extend(extra.iter().map(OsStr::new));
        Self::spawn(&args).0
    }

    /// `serve ARGS...` as given; the daemon and its first stdout line.
    pub fn spawn<S: AsRef<OsStr>>(args: &[S]) -> (Self, String) {
        let (child, url, line) = spawn_serve(args);
        (Self { child, url }, line)
    }

    /// `tidemark --url URL ARGS...` (stdin empty).
    pub fn run(&self, args: &[&str]) -> Output {
        self.run_with_input(args, None)
    }

    /// `tidemark --url URL ARGS...` with `input` on stdin (empty when `None`).
    pub fn run_with_input(&self, args: &[&str], input: Option<&[u8]>) -> Output {
        let mut child = Command::new(BIN)
            .arg("--url")
            .arg(&self.url)
            .args(args)
            .stdin(if input.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn client");
        if let (Some(data), Some(mut stdin)) = (input, child.stdin.take()) {
            stdin.write_all(data).expect("stdin");
        }
        child.wait_with_output().expect("client")
    }

    /// SIGTERM, then the exit status.
    pub fn terminate(mut self) -> ExitStatus {
        let pid = self.child.id().to_string();
        let _ = Command::new("kill").args(["-TERM", &pid]).status();
        let status = self.child.wait().expect("wait");
        std::mem::forget(self);
        status
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-CONT", &self.child.id().to_string()])
            .stderr(Stdio::null())
            .status();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A command's stdout as text.
pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// A command's stderr as text.
pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// `tidemark certs init --out DIR/ca`, then `certs issue` for each name into `DIR/NAME-tls`
/// (what `serve --tls` takes); returns the CA directory. Panics on a failure.
pub fn issue_certs(dir: &Path, names: &[&str]) -> PathBuf {
    let certs = |args: &[&OsStr]| {
        let o = Command::new(BIN)
            .arg("certs")
            .args(args)
            .output()
            .expect("certs");
        assert!(o.status.success(), "certs {args:?}: {}", stderr(&o));
    };
    let ca = dir.join("ca");
    certs(&["init".as_ref(), "--out".as_ref(), ca.as_os_str()]);
    for name in names {
        let out = dir.join(format!("{name}-tls"));
        certs(&[
            "issue".as_ref(),
            "--ca".as_ref(),
            ca.as_os_str(),
            "--name".as_ref(),
            name.as_ref(),
            "--out".as_ref(),
            out.as_os_str(),
        ]);
    }
    ca
}

/// A headless-capable Chromium on `PATH` (Debian package `chromium`), if any.
pub fn chromium() -> Option<&'static str> {
    ["chromium", "chromium-browser", "google-chrome"]
        .into_iter()
        .find(|b| {
            Command::new(b)
                .arg("--version")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        })
}
