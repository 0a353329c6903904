//! Five (or n) `tidemark serve` child processes on fixed loopback ports with certificates from
//! `tidemark certs`, each joining all the others; kill -9 / restart (same data dir and ports),
//! SIGSTOP / SIGCONT. Every child is killed on drop; the work directory is removed unless the
//! test is panicking (then its path is printed, with the node logs in it).

use std::fs::OpenOptions;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_tidemark");

/// One node: its addresses, files and (when running) its process.
#[derive(Debug)]
pub struct NodeProc {
    /// Node name (in its certificate).
    pub name: String,
    /// HTTP address.
    pub http: SocketAddr,
    /// Peer (QUIC, UDP) address: one socket for dialing and accepting.
    pub peer: SocketAddr,
    data: PathBuf,
    tls: PathBuf,
    log: PathBuf,
    child: Option<Child>,
    paused: bool,
}

impl NodeProc {
    /// `http://addr`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.http)
    }

    /// Whether a process is running (possibly paused).
    pub fn is_up(&self) -> bool {
        self.child.is_some()
    }

    /// Whether it is stopped with SIGSTOP.
    pub fn is_paused(&self) -> bool {
        self.paused
    }
}

/// The cluster.
#[derive(Debug)]
pub struct Cluster {
    /// Work directory (certificates, data dirs, logs).
    pub dir: PathBuf,
    /// The nodes, in index order.
    pub nodes: Vec<NodeProc>,
}

fn run_ok(cmd: &mut Command) {
    let out = cmd.output().expect("run tidemark");
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn free_ports(n: usize) -> (Vec<u16>, Vec<u16>) {
    // Hold every socket until all are chosen so no port is picked twice.
    let tcp: Vec<_> = (0..n)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").expect("free tcp port"))
        .collect();
    let udp: Vec<_> = (0..n)
        .map(|_| std::net::UdpSocket::bind("127.0.0.1:0").expect("free udp port"))
        .collect();
    let t = tcp
        .iter()
        .map(|s| s.local_addr().expect("addr").port())
        .collect();
    let u = udp
        .iter()
        .map(|s| s.local_addr().expect("addr").port())
        .collect();
    (t, u)
}

fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

fn signal(pid: u32, sig: &str) {
    let _ = Command::new("kill")
        .args([sig, &pid.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

impl Cluster {
    /// Issues certificates and starts `n` nodes named `n0..`, each joining every other; returns
    /// when every node answers `/healthz`.
    pub fn start(n: usize, tag: &str) -> Self {
        let dir =
            std::env::temp_dir().join(format!("tidemark-nemesis-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("work dir");
        let ca = dir.join("ca");
        run_ok(Command::new(BIN).args(["certs", "init", "--out"]).arg(&ca));
        let (http_ports, peer_ports) = free_ports(n);
        let nodes = (0..n)
            .map(|i| {
                let name = format!("n{i}");
                let tls = dir.join(format!("{name}-tls"));
                run_ok(
                    Command::new(BIN)
                        .args(["certs", "issue", "--ca"])
                        .arg(&ca)
                        .args(["--name", &name, "--out"])
                        .arg(&tls),
                );
                NodeProc {
                    http: SocketAddr::from(([127, 0, 0, 1], http_ports[i])),
                    peer: SocketAddr::from(([127, 0, 0, 1], peer_ports[i])),
                    data: dir.join(format!("{name}-data")),
                    log: dir.join(format!("{name}.log")),
                    tls,
                    name,
                    child: None,
                    paused: false,
                }
            })
            .collect();
        let mut cluster = Self { dir, nodes };
        for i in 0..n {
            cluster.spawn(i);
        }
        for i in 0..n {
            cluster.wait_healthy(i);
        }
        cluster
    }

    /// The peer (UDP) port of node `i`.
    pub fn peer_port(&self, i: usize) -> u16 {
        self.nodes[i].peer.port()
    }

    fn spawn(&mut self, i: usize) {
        let joins: Vec<String> = self
            .nodes
            .iter()
            .enumerate()
            .filter(|(j, _)| *j != i)
            .map(|(_, n)| n.peer.to_string())
            .collect();
        let node = &mut self.nodes[i];
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&node.log)
            .expect("log file");
        let mut cmd = Command::new(BIN);
        cmd.arg("serve")
            .arg("--http")
            .arg(node.http.to_string())
            .arg("--peer-listen")
            .arg(node.peer.to_string())
            .arg("--tls")
            .arg(&node.tls)
            .arg("--data")
            .arg(&node.data);
        for j in &joins {
            cmd.arg("--join").arg(j);
        }
        let child = cmd
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log clone"))
            .stderr(log)
            .spawn()
            .expect("spawn tidemark serve");
        node.child = Some(child);
        node.paused = false;
    }

    /// Waits (≤ 60 s) until node `i` answers `/healthz`; panics with its log if it exits.
    pub fn wait_healthy(&mut self, i: usize) {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_millis(500)))
            .build()
            .into();
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let node = &mut self.nodes[i];
            if let Some(child) = node.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                panic!(
                    "node {} exited ({status}) at start:\n{}",
                    node.name,
                    tail(&node.log, 40)
                );
            }
            if let Ok(r) = agent.get(node.url("/healthz")).call()
                && r.status().is_success()
            {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "node {} not healthy in 60 s:\n{}",
                node.name,
                tail(&node.log, 40)
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// SIGKILL node `i` (paused or not) and reap it.
    pub fn kill9(&mut self, i: usize) {
        let node = &mut self.nodes[i];
        if let Some(mut child) = node.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        node.paused = false;
    }

    /// Starts node `i` again with the same data directory, ports and certificates.
    pub fn restart(&mut self, i: usize) {
        assert!(!self.nodes[i].is_up(), "restart of a running node");
        self.spawn(i);
        self.wait_healthy(i);
    }

    /// SIGSTOP node `i`.
    pub fn pause(&mut self, i: usize) {
        let node = &mut self.nodes[i];
        if let Some(child) = &node.child {
            signal(child.id(), "-STOP");
            node.paused = true;
        }
    }

    /// SIGCONT node `i`.
    pub fn resume(&mut self, i: usize) {
        let node = &mut self.nodes[i];
        if let Some(child) = &node.child {
            signal(child.id(), "-CONT");
        }
        node.paused = false;
    }

    /// Resumes every paused node and restarts every killed one.
    pub fn heal_processes(&mut self) {
        for i in 0..self.nodes.len() {
            if self.nodes[i].paused {
                self.resume(i);
            }
            if !self.nodes[i].is_up() {
                self.restart(i);
            }
        }
    }

    /// The last lines of every node's log.
    pub fn logs(&self, lines: usize) -> String {
        self.nodes
            .iter()
            .map(|n| {
                format!(
                    "--- {} ({})\n{}",
                    n.name,
                    n.log.display(),
                    tail(&n.log, lines)
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for node in &mut self.nodes {
            if let Some(mut child) = node.child.take() {
                signal(child.id(), "-CONT");
                let _ = child.kill();
                let _ = child.wait();
            }
        }
        if std::thread::panicking() {
            eprintln!(
                "nemesis: keeping the work directory (data, logs) at {}",
                self.dir.display()
            );
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}
