//! The pieces of the `tidemark` binary: config, `serve`, and the client commands.

/// `println!` for the commands: writes through [`output::write_line`] and evaluates to its
/// `anyhow::Result` (a closed stdout is [`output::StdoutClosed`], never a panic).
#[macro_export]
macro_rules! outln {
    () => {
        $crate::cli::output::write_line(format_args!(""))
    };
    ($($arg:tt)*) => {
        $crate::cli::output::write_line(format_args!($($arg)*))
    };
}

pub mod certs;
pub mod client;
pub mod config;
pub mod ingest;
pub mod late;
pub mod output;
pub mod serve;
pub mod snapshot;
pub mod views;
