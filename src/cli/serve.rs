//! `tidemark serve`: open the node, serve HTTP, stop cleanly on Ctrl-C / SIGTERM.

use super::config::{Config, LogFormat, set_key};
use anyhow::Context;
use std::net::SocketAddr;
use std::path::PathBuf;
use tidemark::Node;
use tidemark::StoreError;
use tidemark::http::HttpServer;

/// Flags of `tidemark serve` (each overrides the config file).
#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    /// TOML config file (unknown keys are rejected).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Data directory [default: ./tidemark-data].
    #[arg(long, value_name = "DIR")]
    pub data: Option<PathBuf>,
    /// HTTP listen address [default: 127.0.0.1:7700].
    #[arg(long, value_name = "ADDR")]
    pub http: Option<SocketAddr>,
    /// Peer (QUIC) listen address [default: 127.0.0.1:7701].
    #[arg(long, value_name = "ADDR")]
    pub peer_listen: Option<SocketAddr>,
    /// Directory written by `tidemark certs issue` (CA cert, node cert and key).
    #[arg(long, value_name = "DIR")]
    pub tls: Option<PathBuf>,
    /// Address peers dial to reach this node [default: the peer listen address]; required when
    /// `--peer-listen` binds every interface (0.0.0.0).
    #[arg(long, value_name = "ADDR")]
    pub advertise: Option<SocketAddr>,
    /// A peer to join (repeatable): a seed for joining the cluster; afterwards SWIM membership
    /// decides whom to connect to.
    #[arg(long, value_name = "ADDR")]
    pub join: Vec<String>,
    /// Evict a member SWIM declared down from replication after this many ms (`peer.down_grace_ms`,
    /// default 30,000).
    #[arg(long, value_name = "MS")]
    pub down_grace_ms: Option<u64>,
    /// Bearer token required by the HTTP API. On the command line it is visible to every user
    /// of the machine (`ps`): prefer `--token-file` or the TIDEMARK_TOKEN environment variable.
    #[arg(long, env = "TIDEMARK_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Read the bearer token from this file (its first line; keep the file mode 0600).
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    /// Durability: immediate (fsync before ack) or relaxed.
    #[arg(long, value_enum)]
    pub durability: Option<super::config::DurabilityName>,
    /// Log format.
    #[arg(long, value_enum)]
    pub log_format: Option<LogFormat>,
    /// Set any config key: `--set http.concurrency_max=64` (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
    /// Print the effective config and exit.
    #[arg(long)]
    pub print_config: bool,
    /// Create the data directory from this snapshot file first (it must not exist or be
    /// empty), under a NEW replica id, then serve it.
    #[arg(long, value_name = "FILE")]
    pub restore: Option<PathBuf>,
}

impl ServeArgs {
    /// The effective config: file, then flags.
    pub fn config(&self) -> anyhow::Result<Config> {
        let mut table = Config::load_table(self.config.as_deref())?;
        let s = |v: &dyn std::fmt::Display| toml::Value::String(v.to_string());
        if let Some(d) = &self.data {
            set_key(&mut table, "data_dir", s(&d.display()))?;
        }
        if let Some(a) = &self.http {
            set_key(&mut table, "http.listen", s(a))?;
        }
        if let Some(a) = &self.peer_listen {
            set_key(&mut table, "peer.listen", s(a))?;
        }
        if let Some(t) = &self.tls {
            set_key(&mut table, "peer.tls", s(&t.display()))?;
        }
        if let Some(a) = &self.advertise {
            set_key(&mut table, "peer.advertise", s(a))?;
        }
        if let Some(ms) = self.down_grace_ms {
            set_key(
                &mut table,
                "peer.down_grace_ms",
                toml::Value::Integer(i64::try_from(ms).unwrap_or(i64::MAX)),
            )?;
        }
        if !self.join.is_empty() {
            let peers = self.join.iter().map(|j| s(j)).collect();
            set_key(&mut table, "peer.join", toml::Value::Array(peers))?;
        }
        if let Some(file) = &self.token_file {
            if self.token_on_command_line() {
                anyhow::bail!("give --token or --token-file, not both");
            }
            set_key(&mut table, "http.token", s(&read_token_file(file)?))?;
        } else if let Some(t) = &self.token {
            set_key(&mut table, "http.token", s(t))?;
        }
        if let Some(d) = self.durability {
            let name = if d == super::config::DurabilityName::Relaxed {
                "relaxed"
            } else {
                "immediate"
            };
            set_key(&mut table, "durability", s(&name))?;
        }
        if let Some(f) = self.log_format {
            let name = if f == LogFormat::Json { "json" } else { "text" };
            set_key(&mut table, "log.format", s(&name))?;
        }
        for assignment in &self.set {
            super::config::set_assignment(&mut table, assignment)?;
        }
        Config::from_table(table)
    }

    /// True when JSON logs were asked for, as far as that can be told without the whole
    /// config: `--log-format`, else the last `--set log.format=`, else the config file's
    /// `log.format` (when it reads). What a configuration error is logged as.
    pub fn json_logs_asked(&self) -> bool {
        if let Some(f) = self.log_format {
            return f == LogFormat::Json;
        }
        if let Some(v) = self
            .set
            .iter()
            .rev()
            .find_map(|a| a.trim().strip_prefix("log.format="))
        {
            return v.trim().trim_matches('"') == "json";
        }
        Config::load_table(self.config.as_deref())
            .ok()
            .and_then(|t| Some(t.get("log")?.get("format")?.as_str()? == "json"))
            .unwrap_or(false)
    }

    /// True when `--token` was given on the command line (not through TIDEMARK_TOKEN).
    fn token_on_command_line(&self) -> bool {
        self.token.is_some() && std::env::var("TIDEMARK_TOKEN").ok() != self.token
    }

    /// Warnings about how the node was started, logged once logging is up.
    pub fn warnings(&self) -> Vec<String> {
        let mut out = Vec::new();
        if self.token_on_command_line() && self.token_file.is_none() {
            out.push(
                "--token on the command line is visible to other users of this machine (ps, \
                 /proc); use --token-file FILE or the TIDEMARK_TOKEN environment variable"
                    .to_owned(),
            );
        }
        out
    }
}

/// The token in `file`: its first line without surrounding whitespace.
pub fn read_token_file(file: &std::path::Path) -> anyhow::Result<String> {
    let text = std::fs::read_to_string(file)
        .with_context(|| format!("cannot read --token-file {}", file.display()))?;
    let token = text.lines().next().unwrap_or("").trim().to_owned();
    if token.is_empty() {
        anyhow::bail!("--token-file {} holds no token", file.display());
    }
    Ok(token)
}

/// Creates the configured data directory from the snapshot `file` under a new replica id
/// (`serve --restore`); refuses a non-empty data directory.
pub fn restore(config: &Config, file: &std::path::Path) -> anyhow::Result<()> {
    let info = tidemark::restore_snapshot(file, &config.data_dir, None, &config.limits)
        .with_context(|| {
            format!(
                "cannot restore {} into {}",
                file.display(),
                config.data_dir.display()
            )
        })?;
    tracing::info!(
        source = %info.source_replica,
        dir = %config.data_dir.display(),
        "restored the snapshot under a new replica id"
    );
    Ok(())
}

/// True when the command line runs `serve` with `--log-format json` (`--log-format=json`):
/// read from the raw arguments, for errors found before they parse.
pub fn json_logs_in_args(args: &[std::ffi::OsString]) -> bool {
    let Some(at) = args.iter().position(|a| a == "serve") else {
        return false;
    };
    let rest = args.get(at + 1..).unwrap_or_default();
    rest.iter().enumerate().any(|(i, a)| {
        a == "--log-format=json"
            || (a == "--log-format" && rest.get(i + 1).is_some_and(|v| v == "json"))
    })
}

/// Logs to stderr through `tracing` (`RUST_LOG`, default `info`); text lines are coloured
/// only when stderr is a terminal (and `NO_COLOR` is unset).
pub fn init_logging(format: LogFormat) {
    use std::io::IsTerminal;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let colour = std::io::stderr().is_terminal()
        && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(colour && format == LogFormat::Text)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Json => builder.json().try_init(),
        LogFormat::Text => builder.try_init(),
    };
}

/// Completes on Ctrl-C or SIGTERM.
async fn stop_signal() {
    let ctrl_c = async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => tracing::info!("Ctrl-C: shutting down"),
        () = term => tracing::info!("SIGTERM: shutting down"),
    }
}

const ADVERTISE_NEEDS_TLS: &str = "peer.advertise needs peer.tls: a node without cluster \
     certificates is reachable on loopback only";

/// Starts the peer endpoint: with `--tls DIR` the cluster identity in it, else a local CA in the
/// data directory (loopback only); then dials every `--join` address.
async fn start_peers(
    node: &Node,
    config: &Config,
    tls: Option<tidemark::net::TlsDir>,
) -> anyhow::Result<SocketAddr> {
    let listen = config.peer.listen;
    let bound = match tls {
        Some(tls) => {
            let mut opts = tidemark::net::NetOptions::new(config.limits.frame_bytes_max);
            opts.advertise = config.peer.advertise;
            node.listen_with(listen, tls, opts).await
        }
        None => {
            if config.peer.advertise.is_some() {
                anyhow::bail!(ADVERTISE_NEEDS_TLS);
            }
            node.listen_local(listen).await
        }
    }
    .with_context(|| format!("cannot start the peer endpoint on {listen}"))?;
    for peer in &config.peer.join {
        let addrs: Vec<SocketAddr> = tokio::net::lookup_host(peer.as_str())
            .await
            .with_context(|| format!("cannot resolve --join {peer}"))?
            .collect();
        let addr = addrs
            .first()
            .copied()
            .with_context(|| format!("--join {peer} resolves to no address"))?;
        node.join_peer(addr)
            .with_context(|| format!("cannot join {peer}"))?;
        tracing::info!(%peer, %addr, "joining");
    }
    // The members known from earlier runs are dialled too, so a restarted node (a seed
    // included) rejoins its cluster without --join.
    match node.rejoin_known() {
        Ok(0) => {}
        Ok(n) => tracing::info!(members = n, "rejoining the members known from the last run"),
        Err(e) => tracing::warn!(error = %e, "cannot rejoin the known members"),
    }
    Ok(bound)
}

/// Descriptors kept back from HTTP connections for the store, the peer endpoint and its
/// connections, snapshots, logs and the runtime.
const FDS_RESERVED: u64 = 256;

/// Raises the soft open-file limit to the hard one where allowed, and caps
/// `http.connections_max` to what the limit leaves after [`FDS_RESERVED`] (logged): past the
/// limit, accepting fails and every request (and the store) starves for descriptors.
fn fit_descriptors(config: &mut Config) {
    #[cfg(unix)]
    {
        use rustix::process::{Resource, getrlimit, setrlimit};
        let mut limit = getrlimit(Resource::Nofile);
        if limit.current.is_some() && limit.current != limit.maximum {
            let raised = rustix::process::Rlimit {
                current: limit.maximum,
                maximum: limit.maximum,
            };
            match setrlimit(Resource::Nofile, raised) {
                Ok(()) => {
                    tracing::info!(
                        from = limit.current,
                        to = limit.maximum,
                        "raised the open file limit to its hard limit"
                    );
                    limit = getrlimit(Resource::Nofile);
                }
                Err(e) => tracing::debug!(error = %e, "cannot raise the open file limit"),
            }
        }
        if let Some(soft) = limit.current {
            let room =
                usize::try_from(soft.saturating_sub(FDS_RESERVED).max(16)).unwrap_or(usize::MAX);
            if config.http.connections_max > room {
                tracing::warn!(
                    open_files_max = soft,
                    configured = config.http.connections_max,
                    connections_max = room,
                    "http.connections_max lowered to fit the open file limit (raise it with ulimit -n)"
                );
                config.http.connections_max = room;
            }
        }
    }
}

/// One line saying why `addr` cannot be listened on and which flag picks another address
/// (the I/O error's own text only when it is not one of the usual causes).
fn listen_error(addr: SocketAddr, flag: &str, e: &std::io::Error) -> anyhow::Error {
    let why = match e.kind() {
        std::io::ErrorKind::AddrInUse => {
            "address already in use — is another tidemark running?".to_owned()
        }
        std::io::ErrorKind::PermissionDenied => {
            "permission denied (ports below 1024 need privileges);".to_owned()
        }
        std::io::ErrorKind::AddrNotAvailable => {
            "no interface of this machine has that address;".to_owned()
        }
        _ => format!("{e};"),
    };
    anyhow::anyhow!("cannot listen on {addr}: {why} use {flag} ADDR")
}

/// Runs the node until a stop signal; every acknowledged write is durable when this returns.
///
/// The HTTP port is bound and the peer port checked first, so a port in use fails before
/// anything is created on disk (no data directory, no replica id, no half-done `restore`).
pub async fn run(mut config: Config, restore_from: Option<PathBuf>) -> anyhow::Result<()> {
    fit_descriptors(&mut config);
    let listener = tokio::net::TcpListener::bind(config.http.listen)
        .await
        .map_err(|e| listen_error(config.http.listen, "--http", &e))?;
    // The peer endpoint binds its UDP socket when the node starts listening; a free port is
    // checked here (released at once) so a busy one is reported before anything is created.
    if config.peer.listen.port() != 0 {
        std::net::UdpSocket::bind(config.peer.listen)
            .map_err(|e| listen_error(config.peer.listen, "--peer-listen", &e))?;
    }
    // Checked before a restore too: a restore is not left behind by a start that cannot serve.
    if config.peer.advertise.is_some() && config.peer.tls.is_none() {
        return Err(crate::Usage(ADVERTISE_NEEDS_TLS.to_owned()).into());
    }
    // The cluster certificates are read before anything is created too: a wrong --tls
    // leaves no data directory behind.
    let tls = match &config.peer.tls {
        Some(dir) => {
            let what = || {
                format!(
                    "cannot load the cluster certificates (--tls {})",
                    dir.display()
                )
            };
            let tls = tidemark::net::TlsDir::load(dir).with_context(what)?;
            tls.check().with_context(what)?;
            Some(tls)
        }
        None => None,
    };
    if let Some(file) = &restore_from {
        restore(&config, file)?;
    }
    let node = match Node::open(config.node_config()).await {
        Ok(node) => node,
        Err(tidemark::Error::Store(StoreError::AlreadyOpen { holder, .. })) => {
            let by = holder.map_or_else(
                || "another tidemark".to_owned(),
                |pid| format!("another tidemark (pid {pid})"),
            );
            anyhow::bail!(
                "data directory {} is in use by {by} — stop it or use --data DIR",
                config.data_dir.display()
            );
        }
        Err(e) => {
            return Err(anyhow::Error::new(e).context(format!(
                "cannot open the node in {}",
                config.data_dir.display()
            )));
        }
    };
    let server = match HttpServer::on_listener(
        node.clone(),
        config.http.clone(),
        listener,
        std::sync::Arc::new(tidemark::http::SingleNode),
    ) {
        Ok(s) => s,
        Err(e) => {
            let _ = node.shutdown().await;
            return Err(e.into());
        }
    };
    let addr = server.local_addr();
    let peer_addr = match start_peers(&node, &config, tls).await {
        Ok(a) => a,
        Err(e) => {
            let _ = node.shutdown().await;
            return Err(e);
        }
    };
    let name = node.net_status().map(|s| s.name).unwrap_or_default();
    let shown = if config.log.format == LogFormat::Json {
        // The same stream may be collected with the logs: one JSON object, like them.
        crate::outln!(
            "{}",
            serde_json::json!({
                "message": "serving",
                "node": name,
                "version": env!("CARGO_PKG_VERSION"),
                "http": format!("http://{addr}"),
                "peer_listen": peer_addr.to_string(),
                "data_dir": config.data_dir.display().to_string(),
                "console": format!("http://{addr}/"),
            })
        )
    } else {
        crate::outln!(
            "tidemark: node {name} serving HTTP on http://{addr} (peers on {peer_addr}; data in {}; console at http://{addr}/)",
            config.data_dir.display()
        )
    };
    // A daemon whose stdout went away (its reader closed it) keeps serving: it logs.
    if let Err(e) = shown {
        tracing::debug!(error = %e, "the serving line was not printed");
    }
    tracing::info!(%addr, replica = %node.replica_id(), "serving");
    let served = server.run(stop_signal()).await;
    tracing::info!("closing the store");
    node.shutdown().await.context("closing the node")?;
    served?;
    tracing::info!("stopped cleanly");
    Ok(())
}
