//! Why a peer connection failed, in the words an operator acts on, and a rate limit on saying
//! so: a node with the wrong CA redials every few seconds, and each failure must not be a line.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The operator's reading of a connection or handshake error's text (quinn's and rustls's
/// messages; a TLS alert sent by the other side arrives as its number).
pub(crate) fn reason(error: &str) -> &'static str {
    let has = |s: &str| error.contains(s);
    if has("UnknownIssuer") || has("error 48") || has("BadSignature") {
        "certificate from another CA"
    } else if has("NotValidForName") || has("NotValidForNameContext") {
        "name mismatch: the certificate does not name this peer"
    } else if has("Expired") || has("error 45") {
        "certificate expired"
    } else if has("NotValidYet") {
        "certificate not valid yet (clock?)"
    } else if has("NoCertificatesPresented") || has("error 116") {
        "no certificate presented"
    } else if has("cryptographic handshake failed") || has("invalid peer certificate") {
        "TLS handshake refused"
    } else if has("timed out") {
        "no answer (timed out)"
    } else {
        "connection failed"
    }
}

/// Is a failure with this reason one of configuration (certificates, names) rather than a peer
/// that is down or unreachable?
pub(crate) fn is_misconfiguration(reason: &str) -> bool {
    !matches!(reason, "no answer (timed out)" | "connection failed")
}

/// At most one warning per (remote, reason) per period.
#[derive(Debug)]
pub(crate) struct WarnLimiter {
    every: Duration,
    last: Mutex<HashMap<(String, &'static str), Instant>>,
}

/// Distinct (remote, reason) pairs remembered before starting over (a bound on memory).
const REMEMBERED_MAX: usize = 1024;

impl WarnLimiter {
    pub(crate) fn new(every: Duration) -> Self {
        Self {
            every,
            last: Mutex::new(HashMap::new()),
        }
    }

    /// True when a warning for `remote` and `reason` is due now (and records it).
    pub(crate) fn due(&self, remote: &str, reason: &'static str) -> bool {
        let Ok(mut last) = self.last.lock() else {
            return true;
        };
        let now = Instant::now();
        if last.len() >= REMEMBERED_MAX {
            last.retain(|_, at| now.duration_since(*at) < self.every);
            if last.len() >= REMEMBERED_MAX {
                last.clear();
            }
        }
        match last.get_mut(&(remote.to_owned(), reason)) {
            Some(at) if now.duration_since(*at) < self.every => false,
            Some(at) => {
                *at = now;
                true
            }
            None => {
                last.insert((remote.to_owned(), reason), now);
                true
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tls_failures_read_as_what_to_fix() {
        let cases = [
            (
                "the cryptographic handshake failed: error 48: invalid peer certificate: UnknownIssuer",
                "certificate from another CA",
            ),
            (
                "aborted by peer: the cryptographic handshake failed: error 48",
                "certificate from another CA",
            ),
            (
                "invalid peer certificate: NotValidForNameContext { expected: .. }",
                "name mismatch: the certificate does not name this peer",
            ),
            (
                "the cryptographic handshake failed: error 45",
                "certificate expired",
            ),
            (
                "peer sent no certificates: NoCertificatesPresented",
                "no certificate presented",
            ),
            ("timed out", "no answer (timed out)"),
            ("connection lost", "connection failed"),
        ];
        for (text, want) in cases {
            assert_eq!(reason(text), want, "{text}");
        }
        assert!(is_misconfiguration(reason("error 48")));
        assert!(!is_misconfiguration(reason("timed out")));
    }

    #[test]
    fn warnings_are_limited_per_remote_and_reason() {
        let w = WarnLimiter::new(Duration::from_secs(60));
        assert!(w.due("10.0.0.1:7701", "certificate from another CA"));
        assert!(!w.due("10.0.0.1:7701", "certificate from another CA"));
        assert!(w.due("10.0.0.2:7701", "certificate from another CA"));
        assert!(w.due("10.0.0.1:7701", "certificate expired"));
        let w = WarnLimiter::new(Duration::ZERO);
        assert!(w.due("a", "connection failed"));
        assert!(w.due("a", "connection failed"));
        // Bounded: many remotes start the memory over instead of growing it.
        let w = WarnLimiter::new(Duration::from_secs(60));
        for i in 0..5 * REMEMBERED_MAX {
            w.due(&i.to_string(), "connection failed");
        }
        assert!(w.last.lock().map(|l| l.len()).unwrap_or(0) <= REMEMBERED_MAX);
    }
}
