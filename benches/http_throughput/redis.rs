//! The Redis side of the comparison: `redis-server` on a free loopback port with an append-only
//! file (`appendfsync always`, then `everysec`), driven by `redis-benchmark`.

use super::redis_server::RedisServer;
use super::{Kind, SADD_RANGE, Workload, secs};
use std::path::Path;
use std::process::{Command, Stdio};

/// `redis-benchmark` of one workload with `n` requests: requests per second.
fn bench(port: u16, w: Workload, n: u64) -> Option<f64> {
    let mut cmd = Command::new("redis-benchmark");
    cmd.args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(["-c", &w.clients.to_string(), "-n", &n.to_string(), "--csv"]);
    if w.batched {
        cmd.args(["-P", "1000"]);
    }
    match w.op {
        Kind::Incr => cmd.args(["-r", "100", "INCRBY", "page:__rand_int__", "1"]),
        Kind::Sadd => cmd.args([
            "-r",
            &SADD_RANGE.to_string(),
            "SADD",
            "members:__rand_int__",
            "e__rand_int__",
        ]),
    };
    let out = cmd.stderr(Stdio::null()).output().ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    // `"test","rps",...` then `"INCRBY ...","123.45",...`.
    text.lines()
        .filter(|l| !l.starts_with("\"test\""))
        .filter_map(|l| l.split("\",\"").nth(1))
        .filter_map(|rps| rps.trim_matches('"').parse::<f64>().ok())
        .next_back()
}

/// Runs a workload for about `secs()` seconds: a short calibration run sizes the real one.
fn timed(port: u16, w: Workload) -> Option<f64> {
    let probe = if w.batched { 100_000 } else { 300 };
    let rate = bench(port, w, probe)?;
    let n = ((rate * secs() as f64) as u64).max(probe);
    bench(port, w, n)
}

/// Both Redis servers (`appendfsync always` and `everysec`), running side by side so each
/// workload is measured on Tidemark and both Redis setups back to back (the machine's load
/// drifts; adjacent runs see the same disk).
pub(crate) struct Servers {
    always: RedisServer,
    everysec: RedisServer,
}

impl Servers {
    /// Starts both, or prints why the Redis comparison is skipped.
    pub(crate) fn start() -> Option<Self> {
        let found = |bin: &str| {
            Command::new(bin)
                .arg("--version")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        };
        if !found("redis-server") || !found("redis-benchmark") {
            println!(
                "skipped: redis-server not found (install the Debian packages redis-server and redis-tools for the Redis comparison)"
            );
            return None;
        }
        let start = |fsync| RedisServer::start(Path::new("redis-server"), fsync, None);
        match (start("always"), start("everysec")) {
            (Ok(always), Ok(everysec)) => Some(Self { always, everysec }),
            (Err(e), _) | (_, Err(e)) => {
                println!("skipped: redis-server did not start: {e}");
                None
            }
        }
    }

    /// Requests/s of `w` on (always, everysec).
    pub(crate) fn measure(&self, w: Workload) -> (Option<f64>, Option<f64>) {
        (timed(self.always.port(), w), timed(self.everysec.port(), w))
    }
}

/// Prints the comparison table (Markdown).
pub(crate) fn table(rows: &[(Workload, f64, Option<f64>, Option<f64>)]) {
    let fmt = |r: Option<f64>| r.map_or("n/a".to_owned(), |r| format!("{r:.0}"));
    let ratio = |t: f64, r: Option<f64>| r.map_or("n/a".to_owned(), |r| format!("{:.2}×", t / r));
    println!();
    println!(
        "| workload (ops/s) | clients | Tidemark HTTP (durable ack) | Redis always | Redis everysec | Tidemark / always | Tidemark / everysec |"
    );
    println!("|---|---|---|---|---|---|---|");
    for (w, t, always, everysec) in rows {
        println!(
            "| {} | {} | {t:.0} | {} | {} | {} | {} |",
            w.name,
            w.clients,
            fmt(*always),
            fmt(*everysec),
            ratio(*t, *always),
            ratio(*t, *everysec)
        );
    }
}
