//! `tidemark certs init|issue`: the cluster CA and node certificates (`--tls DIR` material).

use anyhow::Context;
use std::path::PathBuf;

/// `tidemark certs ...`.
#[derive(Debug, clap::Subcommand)]
pub enum CertsCommand {
    /// Create a cluster CA: writes `ca.pem` and `ca.key` (0600) into DIR.
    Init {
        /// Where to write the CA.
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
    },
    /// Issue a node certificate with the CA in `--ca`: writes `ca.pem`, `node.pem` and
    /// `node.key` (0600) into DIR, the directory `serve --tls` takes.
    Issue {
        /// The CA directory (from `certs init`).
        #[arg(long, value_name = "DIR")]
        ca: PathBuf,
        /// The node's name (carried in its certificate).
        #[arg(long, value_name = "NODE")]
        name: String,
        /// Where to write the node's TLS material.
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
    },
}

/// Runs a certs command.
pub fn run(cmd: &CertsCommand) -> anyhow::Result<()> {
    match cmd {
        CertsCommand::Init { out } => {
            tidemark::net::certs::init_ca(out)
                .with_context(|| format!("creating a cluster CA in {}", out.display()))?;
            crate::outln!(
                "cluster CA written to {} (keep ca.key secret; issue nodes with `tidemark certs issue --ca {}`)",
                out.display(),
                out.display()
            )?;
        }
        CertsCommand::Issue { ca, name, out } => {
            let tls = tidemark::net::certs::issue_node(ca, name, out)
                .with_context(|| format!("issuing a certificate for {name:?}"))?;
            crate::outln!(
                "certificate for node {} written to {} (start it with `tidemark serve --tls {}`)",
                tls.name(),
                out.display(),
                out.display()
            )?;
        }
    }
    Ok(())
}
