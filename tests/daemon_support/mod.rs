//! Starting `tidemark serve` as a child process in tests.

use std::ffi::OsStr;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

/// `tidemark serve ARGS...` (stderr discarded); returns the child, the HTTP URL it prints on its
/// first stdout line, and that line. Panics (killing the child) when no URL is printed.
pub fn spawn_serve<S: AsRef<OsStr>>(args: &[S]) -> (Child, String, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_tidemark"))
        .arg("serve")
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
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
