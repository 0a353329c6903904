//! nftables partitions on loopback UDP peer ports: one table per test run, removed on drop
//! (also while unwinding from a panic), stale tables of dead test processes removed at start.

use std::io::Write;
use std::process::{Command, Stdio};

/// Prefix of every table this harness creates (`<prefix><pid>_<tag>`).
const PREFIX: &str = "tidemark_nemesis_";

/// Why partitions cannot run here, if they cannot.
pub fn unavailable() -> Option<String> {
    let root = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .map(|l| l.split_whitespace().nth(1) == Some("0"))
        })
        .unwrap_or(false);
    if !root {
        return Some("not running as root".into());
    }
    match Command::new("nft").args(["list", "tables"]).output() {
        Err(e) => Some(format!(
            "`nft` not runnable ({e}); install the nftables package"
        )),
        Ok(o) if !o.status.success() => Some(format!(
            "`nft list tables` failed: {}",
            String::from_utf8_lossy(&o.stderr).trim()
        )),
        Ok(_) => None,
    }
}

fn nft_script(script: &str) -> Result<(), String> {
    let mut child = Command::new("nft")
        .args(["-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("spawn nft: {e}"))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(script.as_bytes())
            .map_err(|e| format!("nft stdin: {e}"))?;
    }
    let out = child.wait_with_output().map_err(|e| format!("nft: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "nft -f failed: {}\nscript:\n{script}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Deletes tables left behind by test processes that no longer exist (a SIGKILLed run cannot
/// run its drop guard).
fn remove_stale() {
    let Ok(out) = Command::new("nft").args(["list", "tables"]).output() else {
        return;
    };
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Some(name) = line.strip_prefix("table inet ") else {
            continue;
        };
        let Some(rest) = name.strip_prefix(PREFIX) else {
            continue;
        };
        let pid = rest.split('_').next().unwrap_or("");
        if !pid.is_empty() && !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            let _ = nft_script(&format!("delete table inet {name}\n"));
        }
    }
}

/// One nft table (`inet`, an output-hook chain) owned by this test run.
#[derive(Debug)]
pub struct NftTable {
    name: String,
}

impl NftTable {
    /// Creates the table `tidemark_nemesis_<pid>_<tag>` with an empty, accepting output chain.
    pub fn create(tag: &str) -> Result<Self, String> {
        remove_stale();
        let name = format!("{PREFIX}{}_{tag}", std::process::id());
        // Leftover from an earlier run of this very process (cannot happen twice normally).
        let _ = nft_script(&format!("delete table inet {name}\n"));
        nft_script(&format!(
            "add table inet {name}\n\
             add chain inet {name} out {{ type filter hook output priority 0; policy accept; }}\n"
        ))?;
        Ok(Self { name })
    }

    /// The table's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Drops every UDP datagram between a port of `a` and a port of `b`, both directions, in
    /// one atomic nft transaction. Each node has one UDP socket for dialing and accepting, so
    /// this cuts every QUIC connection between the two sides.
    pub fn partition(&self, a: &[u16], b: &[u16]) -> Result<(), String> {
        let mut script = String::new();
        for pa in a {
            for pb in b {
                for (s, d) in [(pa, pb), (pb, pa)] {
                    script.push_str(&format!(
                        "add rule inet {} out udp sport {s} udp dport {d} drop\n",
                        self.name
                    ));
                }
            }
        }
        nft_script(&script)
    }

    /// Removes every rule (the network is whole again).
    pub fn heal(&self) -> Result<(), String> {
        nft_script(&format!("flush chain inet {} out\n", self.name))
    }

    /// The rules currently installed (for messages).
    pub fn rules(&self) -> String {
        Command::new("nft")
            .args(["list", "table", "inet", &self.name])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default()
    }
}

impl Drop for NftTable {
    fn drop(&mut self) {
        if let Err(e) = nft_script(&format!("delete table inet {}\n", self.name)) {
            eprintln!("nemesis: could not remove nft table {}: {e}", self.name);
        }
    }
}
