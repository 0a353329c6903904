//! A `redis-server` child for the benches' Redis anchors: its own temp data directory, a free
//! loopback port, an append-only file with the given `appendfsync`, no RDB snapshots; killed
//! on drop. Included by path (`#[path = "support/redis_server.rs"]`) into each bench that
//! compares with Redis.

use std::io::{Read, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running `redis-server`, killed (and its data directory removed) on drop.
pub(crate) struct RedisServer {
    child: Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl RedisServer {
    /// Starts `server` (a path or a name on `PATH`) with `appendfsync <fsync>` (`always` or
    /// `everysec`), its data in a new temp directory under `parent` (the system's temp
    /// directory when `None`), and waits until it answers `PING` (10 s at most).
    pub(crate) fn start(server: &Path, fsync: &str, parent: Option<&Path>) -> Result<Self, String> {
        let dir = match parent {
            Some(p) => tempfile::tempdir_in(p),
            None => tempfile::tempdir(),
        }
        .map_err(|e| format!("tempdir: {e}"))?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| format!("free port: {e}"))?
            .port();
        let child = Command::new(server)
            .args(["--bind", "127.0.0.1", "--port", &port.to_string()])
            .args(["--save", "", "--appendonly", "yes", "--appendfsync", fsync])
            .arg("--dir")
            .arg(dir.path())
            .args(["--daemonize", "no", "--loglevel", "warning"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("spawn {}: {e}", server.display()))?;
        let server = Self {
            child,
            port,
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) {
                let mut buf = [0u8; 7];
                if s.write_all(b"PING\r\n").is_ok()
                    && s.read_exact(&mut buf).is_ok()
                    && &buf == b"+PONG\r\n"
                {
                    return Ok(server);
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Err("redis-server did not answer PING within 10 s".into())
    }

    /// Its loopback port.
    pub(crate) fn port(&self) -> u16 {
        self.port
    }

    /// Its process id (for its CPU time).
    #[allow(dead_code)] // not every bench reads the server's CPU time
    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
