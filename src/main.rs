//! `tidemark`: run a node (`serve`) or talk to one over HTTP (the client commands).
//!
//! Exit status: 0 on success, 1 when the node rejected the request (message on stderr) or
//! could not be reached, 2 on usage errors.
#![forbid(unsafe_code)]

mod cli;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use cli::client::{self, Client, KeyArg, parse_key};
use cli::output::Output;
use serde_json::json;
use std::process::ExitCode;

/// Tidemark: a replicated stream state store.
#[derive(Debug, Parser)]
#[command(name = "tidemark", version, about, propagate_version = true)]
struct Cli {
    /// The node to talk to (client commands): http://HOST[:PORT] or HOST[:PORT], e.g.
    /// localhost:7700; without a port, the node's default 7700 (not 80).
    #[arg(
        long,
        global = true,
        env = "TIDEMARK_URL",
        default_value = "http://127.0.0.1:7700",
        value_parser = client::parse_url
    )]
    url: String,
    /// Bearer token for a node with `http.token` set (client commands).
    #[arg(long, global = true, env = "TIDEMARK_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// Read the bearer token from this file, its first line (client commands; keeps the token
    /// out of `ps`). One of `--token` and `--token-file` (or their environment variables).
    #[arg(long, global = true, env = "TIDEMARK_TOKEN_FILE", value_name = "PATH")]
    token_file: Option<std::path::PathBuf>,
    /// Print JSON instead of tables.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run a node: a single node in ./tidemark-data with HTTP on 127.0.0.1:7700 by default.
    Serve(cli::serve::ServeArgs),
    /// Cluster certificates: `certs init --out DIR`, `certs issue --ca DIR --name NODE --out DIR`.
    #[command(subcommand)]
    Certs(cli::certs::CertsCommand),
    /// Snapshot a node: `snapshot --data DIR --out FILE` (a stopped node's directory, or the
    /// running daemon's over HTTP at --url), `snapshot --out FILE` (the node at --url), or
    /// `snapshot --verify FILE`. Verified, atomic. Restore with `serve --restore FILE`.
    Snapshot(cli::snapshot::SnapshotArgs),
    /// Increment a counter: `inc gcounter/visits 3` (a negative BY decrements a pncounter).
    Inc {
        /// The counter, TYPE/NAME with TYPE gcounter or pncounter, e.g. gcounter/visits.
        #[arg(value_parser = parse_key, value_name = "KEY")]
        key: KeyArg,
        /// How much to add, e.g. 3 (a negative amount decrements a pncounter).
        #[arg(default_value_t = 1, allow_negative_numbers = true)]
        by: i64,
    },
    /// Decrement a pncounter: `dec pncounter/stock 2`.
    Dec {
        /// The counter, pncounter/NAME, e.g. pncounter/stock.
        #[arg(value_parser = parse_key, value_name = "KEY")]
        key: KeyArg,
        /// How much to subtract, e.g. 2.
        #[arg(default_value_t = 1)]
        by: i64,
    },
    /// Add an element to an orset: `add orset/online alice`.
    Add {
        /// The set, orset/NAME, e.g. orset/online.
        #[arg(value_parser = parse_key, value_name = "KEY")]
        key: KeyArg,
        /// The element, e.g. alice (a JSON number or quoted string is taken as such: 42, '"42"').
        value: String,
    },
    /// Remove an element from an orset: `remove orset/online alice`.
    Remove {
        /// The set, orset/NAME, e.g. orset/online.
        #[arg(value_parser = parse_key, value_name = "KEY")]
        key: KeyArg,
        /// The element, e.g. alice (as for `add`).
        value: String,
    },
    /// Write a register (lww or mvreg) with a JSON value: `set lww/config '{"mode":"fast"}'`.
    Set {
        /// The register, lww/NAME or mvreg/NAME, e.g. lww/config.
        #[arg(value_parser = parse_key, value_name = "KEY")]
        key: KeyArg,
        /// The value, as JSON, e.g. '{"mode":"fast"}' or '"text"'.
        #[arg(value_name = "JSON")]
        value: String,
    },
    /// Delete an orset, lww or mvreg key: `delete orset/online`.
    Delete {
        /// The key, TYPE/NAME with TYPE orset, lww or mvreg, e.g. orset/online.
        #[arg(value_parser = parse_key, value_name = "KEY")]
        key: KeyArg,
    },
    /// Read one key: `get orset/online` (exit status 1 when the node holds nothing for it).
    Get {
        /// The key, TYPE/NAME (gcounter, pncounter, orset, lww, mvreg), e.g. orset/online.
        #[arg(value_parser = parse_key, value_name = "KEY")]
        key: KeyArg,
    },
    /// List keys (paged).
    List {
        /// Only this type.
        #[arg(long = "type", value_parser = KIND_NAMES)]
        kind: Option<String>,
        /// Only names starting with this.
        #[arg(long, default_value = "")]
        prefix: String,
        /// Page size (1..=1000).
        #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u16).range(1..=1000))]
        limit: u16,
        /// Continue after this cursor (the `next` of the previous page).
        #[arg(long)]
        after: Option<String>,
        /// Also list the node's internal keys (every name under `~`: `~view/...`, `~wm/...`,
        /// `~gone/...`).
        #[arg(long)]
        internal: bool,
    },
    /// Ingest NDJSON events into a stream from FILE or `-` (stdin).
    Ingest {
        /// The stream.
        #[arg(long)]
        stream: String,
        /// NDJSON file, or `-` for stdin, e.g. events.ndjson.
        #[arg(value_name = "FILE")]
        input: String,
    },
    /// Print every change of matching keys as it commits, each with its cursor (resume with
    /// --from CURSOR: every later change exactly once, or a reset notice, never a gap).
    Watch {
        /// Only this type.
        #[arg(long = "type", value_parser = KIND_NAMES)]
        kind: Option<String>,
        /// Only names starting with this.
        #[arg(long, default_value = "")]
        prefix: String,
        /// Resume after this cursor (the last one printed), e.g. 3f9c2a1b0d4e5f60-42.
        #[arg(long, value_name = "CURSOR")]
        from: Option<String>,
        /// First print the current value of every matching key, then the changes after it.
        #[arg(long)]
        snapshot: bool,
    },
    /// Show the node (with its version), its peers and readiness.
    Status,
    /// List every member known (alive, suspect, down, left, decommissioned) with its lag and
    /// last contact; `members remove NAME` removes a member for good.
    Members {
        #[command(subcommand)]
        action: Option<MembersAction>,
    },
    /// List the configured views with their watermarks and counters.
    Views,
    /// Print this program's version.
    Version,
    /// Print a shell completion script: `tidemark completions bash > ~/.local/share/bash-completion/completions/tidemark`.
    Completions {
        /// The shell, e.g. bash (also zsh, fish, elvish, powershell).
        shell: clap_complete::Shell,
    },
    /// Show a stream's late lane: events this node acknowledged but applied to no view for
    /// being late (`late clicks`; `--after ID` continues a page).
    Late {
        /// The stream, e.g. clicks.
        #[arg(value_name = "STREAM")]
        stream: String,
        /// Continue after this record id (the `--after` a page prints).
        #[arg(long)]
        after: Option<u64>,
        /// Most records (1..=1000; default 1000).
        #[arg(long, value_parser = clap::value_parser!(u16).range(1..=1000))]
        limit: Option<u16>,
    },
    /// Follow a view's final-window feed: each window once, when it is final on the node,
    /// with its cursor (resume with --from CURSOR).
    Tail {
        /// The view's name (a windowed `[[views]]` name of the node's config), e.g. clicks_per_minute.
        #[arg(value_name = "VIEW")]
        name: String,
        /// Follow final windows (the only feed `tail` reads; required, so the command says what it does).
        #[arg(long = "final", required = true)]
        final_windows: bool,
        /// Resume after this cursor (the last one printed), e.g. 3030303030303030303030303030303036303030302f5b5d.
        #[arg(long, value_name = "CURSOR")]
        from: Option<String>,
        /// Stop once every window final now was printed, instead of waiting for more.
        #[arg(long)]
        no_follow: bool,
    },
    /// Read a stream view.
    View {
        /// The view's name (a `[[views]]` name of the node's config), e.g. clicks_per_minute.
        #[arg(value_name = "VIEW")]
        name: String,
        /// Only this group: FIELD=VALUE (repeatable; VALUE as JSON when it parses, e.g. 3).
        #[arg(long = "group", value_name = "FIELD=VALUE")]
        group: Vec<String>,
        /// Only windows starting at or after this time (epoch ms or RFC 3339).
        #[arg(long)]
        from: Option<String>,
        /// Only windows starting before this time (epoch ms or RFC 3339).
        #[arg(long)]
        to: Option<String>,
        /// Most rows (1..=10000; default 1000).
        #[arg(long, value_parser = clap::value_parser!(u16).range(1..=10000))]
        limit: Option<u16>,
        /// Continue after this cursor (a page's `next`).
        #[arg(long)]
        after: Option<String>,
    },
}

/// The bearer token of a client command: `--token` or `--token-file`, a flag given on the
/// command line before either environment variable (`TIDEMARK_TOKEN`, `TIDEMARK_TOKEN_FILE`).
/// Both given at the same level, or a token file that cannot be read or holds no token, is a
/// usage error.
fn client_token(cli: &Cli) -> Result<Option<String>, Usage> {
    let from_env = |var: &str, value: Option<std::ffi::OsString>| {
        value.is_some() && std::env::var_os(var) == value
    };
    let token_env = from_env(
        "TIDEMARK_TOKEN",
        cli.token.as_ref().map(std::ffi::OsString::from),
    );
    let file_env = from_env(
        "TIDEMARK_TOKEN_FILE",
        cli.token_file.as_ref().map(|p| p.as_os_str().to_owned()),
    );
    let read = |file: &std::path::Path| {
        cli::serve::read_token_file(file)
            .map(Some)
            .map_err(|e| Usage(format!("{e:#}")))
    };
    match (&cli.token, &cli.token_file) {
        (Some(_), Some(_)) if token_env == file_env => Err(Usage(
            "give the token one way: --token (TIDEMARK_TOKEN) or --token-file \
             (TIDEMARK_TOKEN_FILE), not both"
                .into(),
        )),
        // One of them on the command line: it wins over the other's environment variable.
        (Some(t), Some(_)) if file_env => Ok(Some(t.clone())),
        (_, Some(file)) => read(file),
        (t, None) => Ok(t.clone()),
    }
}

fn run(cli: Cli) -> anyhow::Result<bool> {
    let out = Output { json: cli.json };
    if let Command::Serve(args) = &cli.command {
        let config = match args.config() {
            Ok(config) => config,
            // With JSON logs asked for, a configuration error is a JSON line too (exit 2).
            Err(e) if args.json_logs_asked() => {
                cli::serve::init_logging(cli::config::LogFormat::Json);
                tracing::error!(
                    error = format!("{e:#}"),
                    "tidemark serve: invalid configuration"
                );
                return Err(Logged { usage: true }.into());
            }
            Err(e) => return Err(Usage(format!("{e:#}")).into()),
        };
        if args.print_config {
            cli::output::write_out(config.to_toml()?.as_bytes())?;
            return Ok(true);
        }
        cli::serve::init_logging(config.log.format);
        for warning in args.warnings() {
            tracing::warn!("{warning}");
        }
        let json_logs = config.log.format == cli::config::LogFormat::Json;
        let served = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .thread_name("tidemark")
            .build()
            .map_err(anyhow::Error::from)
            .and_then(|runtime| runtime.block_on(cli::serve::run(config, args.restore.clone())));
        return match served {
            // With JSON logs every line on stderr is JSON, the last error's too; a usage
            // error still exits 2.
            Err(e) if json_logs => {
                tracing::error!(error = format!("{e:#}"), "tidemark serve failed");
                Err(Logged {
                    usage: e.downcast_ref::<Usage>().is_some(),
                }
                .into())
            }
            other => other.map(|()| true),
        };
    }
    if let Command::Snapshot(args) = &cli.command {
        cli::snapshot::run(args, cli.json, &Client::new(&cli.url, client_token(&cli)?))?;
        return Ok(true);
    }
    if let Command::Certs(cmd) = &cli.command {
        cli::certs::run(cmd)?;
        return Ok(true);
    }
    if let Command::Version = &cli.command {
        let version = env!("CARGO_PKG_VERSION");
        if out.json {
            crate::outln!("{}", json!({"version": version}))?;
        } else {
            crate::outln!("tidemark {version}")?;
        }
        return Ok(true);
    }
    if let Command::Completions { shell } = &cli.command {
        let mut script = Vec::new();
        clap_complete::generate(*shell, &mut command(), "tidemark", &mut script);
        cli::output::write_out(&script)?;
        return Ok(true);
    }
    let c = Client::new(&cli.url, client_token(&cli)?);
    let op = |key: &KeyArg, op: &str, extra: serde_json::Value| {
        let mut o = json!({"type": key.kind, "key": key.name, "op": op});
        if let (Some(o), Some(extra)) = (o.as_object_mut(), extra.as_object()) {
            o.extend(extra.clone());
        }
        o
    };
    match &cli.command {
        Command::Serve(_)
        | Command::Certs(_)
        | Command::Snapshot(_)
        | Command::Version
        | Command::Completions { .. } => {}
        Command::Inc { key, by } => {
            client::write_ops(&c, &out, &[client::counter_op(key, "inc", *by)?])?
        }
        Command::Dec { key, by } => {
            client::write_ops(&c, &out, &[client::counter_op(key, "dec", *by)?])?
        }
        Command::Add { key, value } => {
            client::write_ops(
                &c,
                &out,
                &[op(key, "add", json!({"value": client::element(value)}))],
            )?;
        }
        Command::Remove { key, value } => {
            client::write_ops(
                &c,
                &out,
                &[op(key, "remove", json!({"value": client::element(value)}))],
            )?;
        }
        Command::Set { key, value: text } => {
            let value: serde_json::Value = serde_json::from_str(text).map_err(|e| {
                Usage(format!(
                    "the value must be JSON (quote strings: '\"text\"'): {e}"
                ))
            })?;
            client::write_ops(&c, &out, &[op(key, "set", json!({"value": value}))])?;
        }
        Command::Delete { key } => client::write_ops(&c, &out, &[op(key, "delete", json!({}))])?,
        Command::Get { key } => client::get(&c, &out, key)?,
        Command::List {
            kind,
            prefix,
            limit,
            after,
            internal,
        } => {
            let limit = usize::from(*limit);
            let after = after.as_deref();
            client::list(&c, &out, kind.as_deref(), prefix, limit, after, *internal)?;
        }
        Command::Ingest { stream, input } => return cli::ingest::run(&c, &out, stream, input),
        Command::Watch {
            kind,
            prefix,
            from,
            snapshot,
        } => client::watch(
            &c,
            &out,
            &client::WatchArgs {
                kind: kind.as_deref(),
                prefix,
                from: from.as_deref(),
                snapshot: *snapshot,
            },
        )?,
        Command::Status => client::status(&c, &out)?,
        Command::Members { action: None } => client::members(&c, &out)?,
        Command::Members {
            action: Some(MembersAction::Remove { name, force }),
        } => client::remove_member(&c, &out, name, *force)?,
        Command::Views => cli::views::views(&c, &out)?,
        Command::Late {
            stream,
            after,
            limit,
        } => cli::late::late(&c, &out, stream, *after, *limit)?,
        Command::Tail {
            name,
            final_windows: _,
            from,
            no_follow,
        } => client::tail_final(&c, &out, name, from.as_deref(), !*no_follow)?,
        Command::View {
            name,
            group,
            from,
            to,
            limit,
            after,
        } => {
            let mut query: Vec<(String, String)> = Vec::new();
            for g in group {
                let (field, value) = g
                    .split_once('=')
                    .ok_or_else(|| Usage(format!("--group {g:?}: expected FIELD=VALUE")))?;
                query.push((format!("group.{field}"), value.to_owned()));
            }
            let optional = [
                ("from", from.clone()),
                ("to", to.clone()),
                ("limit", limit.map(|n| n.to_string())),
                ("after", after.clone()),
            ];
            query.extend(
                optional
                    .into_iter()
                    .filter_map(|(k, v)| v.map(|v| (k.to_owned(), v))),
            );
            let query: Vec<(&str, String)> =
                query.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
            client::view(&c, &out, name, &query)?;
        }
    }
    Ok(true)
}

/// The key types, as `--type` takes them.
const KIND_NAMES: [&str; 5] = ["gcounter", "pncounter", "orset", "lww", "mvreg"];

/// A usage error found after parsing (bad config file or `--set`, an argument the command
/// cannot take): exit status 2.
#[derive(Debug)]
struct Usage(String);

impl std::fmt::Display for Usage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Usage {}

/// An error already logged (as a JSON line, with `--log-format json`): `main` prints nothing
/// more and exits 2 for a usage error, 1 otherwise.
#[derive(Debug)]
struct Logged {
    usage: bool,
}

impl std::fmt::Display for Logged {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("logged")
    }
}

impl std::error::Error for Logged {}

/// The global flags each command does not read: kept accepted (`tidemark --url U serve` still
/// parses) but hidden from its help and completions. `serve` has a `--token` of its own.
const UNREAD_GLOBALS: [(&str, &[&str]); 4] = [
    ("serve", &["url", "json"]),
    ("certs", &["url", "token", "token_file", "json"]),
    ("completions", &["url", "token", "token_file", "json"]),
    ("version", &["url", "token", "token_file"]),
];

/// The command line: [`Cli`] with the global flags hidden where they do not apply.
fn command() -> clap::Command {
    let cmd = Cli::command();
    let globals: Vec<clap::Arg> = cmd.get_arguments().cloned().collect();
    cmd.mut_subcommands(|mut sub| {
        let ids = UNREAD_GLOBALS
            .iter()
            .find(|(name, _)| sub.get_name() == *name)
            .map_or(&[][..], |(_, ids)| *ids);
        // A command that defines a global's id itself is not given the global's copy (clap
        // propagates only missing ids): a hidden copy takes its place, and passes it on
        // hidden to the command's own subcommands.
        for arg in globals
            .iter()
            .filter(|a| ids.contains(&a.get_id().as_str()))
        {
            sub = sub.arg(arg.clone().hide(true));
        }
        sub
    })
}

/// What `tidemark members` does besides listing.
#[derive(Debug, Subcommand)]
enum MembersAction {
    /// Remove a member for good (decommission: its disk is lost, or a restored copy replaced
    /// it). No node waits for its watermark any more; if it comes back it applies nothing to
    /// windows. Example: `tidemark members remove gamma`.
    Remove {
        /// The member's name (as `tidemark members` lists it) or its replica id, e.g. gamma.
        name: String,
        /// Remove it even though it still answers (it will apply nothing to windows).
        #[arg(long)]
        force: bool,
    },
}

fn main() -> ExitCode {
    // Usage errors exit with status 2.
    let mut cmd = command();
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let parsed = cmd
        .try_get_matches_from_mut(&args)
        .and_then(|mut matches| Cli::from_arg_matches_mut(&mut matches));
    let cli = match parsed {
        Ok(cli) => cli,
        Err(e) => {
            let e = e.format(&mut cmd);
            let shown = matches!(
                e.kind(),
                clap::error::ErrorKind::DisplayHelp
                    | clap::error::ErrorKind::DisplayVersion
                    | clap::error::ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
            );
            // `serve --log-format json`: every line on stderr is JSON, a usage error's too.
            if !shown && cli::serve::json_logs_in_args(&args) {
                cli::serve::init_logging(cli::config::LogFormat::Json);
                let text = e.render().to_string();
                tracing::error!(error = text.trim(), "tidemark serve: invalid command line");
                return ExitCode::from(u8::try_from(e.exit_code()).unwrap_or(2));
            }
            e.exit()
        }
    };
    match run(cli) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        // The reader of stdout went away (`tidemark list | head -1`): it has what it wanted.
        Err(e) if e.downcast_ref::<cli::output::StdoutClosed>().is_some() => ExitCode::SUCCESS,
        Err(e) if e.downcast_ref::<Logged>().is_some() => {
            if e.downcast_ref::<Logged>().is_some_and(|l| l.usage) {
                ExitCode::from(2)
            } else {
                ExitCode::from(1)
            }
        }
        Err(e) => {
            eprintln!("tidemark: {e:#}");
            let refused_argument = e
                .downcast_ref::<cli::client::Rejected>()
                .is_some_and(cli::client::Rejected::is_usage);
            if e.downcast_ref::<Usage>().is_some() || refused_argument {
                ExitCode::from(2)
            } else {
                ExitCode::from(1)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every positional argument of every command says what it is and shows an example.
    #[test]
    fn every_positional_is_documented_with_an_example() {
        fn walk(cmd: &clap::Command, path: &str, missing: &mut Vec<String>) {
            for arg in cmd.get_positionals() {
                let help = arg.get_help().map(ToString::to_string).unwrap_or_default();
                if !help.contains("e.g.") {
                    missing.push(format!("{path} <{}>: {help:?}", arg.get_id()));
                }
            }
            for sub in cmd.get_subcommands() {
                walk(sub, &format!("{path} {}", sub.get_name()), missing);
            }
        }
        let mut missing = Vec::new();
        walk(&command(), "tidemark", &mut missing);
        assert!(
            missing.is_empty(),
            "positionals without an example: {missing:#?}"
        );
    }

    #[test]
    fn the_cli_definition_is_consistent() {
        Cli::command().debug_assert();
        command().debug_assert();
    }
}
