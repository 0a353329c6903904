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
    } else if has("certificate names another node") {
        "name mismatch: the certificate does not name this peer"
    } else if has("claims our own name") {
        "the peer claims this node's name"
    } else if has("no client certificate") {
        "no certificate presented"
    } else if has("cryptographic handshake failed") || has("invalid peer certificate") {
        "TLS handshake refused"
    } else if has("timed out") || has("no hello in time") {
        TIMED_OUT
    } else if has("authentication failed") {
        // quinn's words for an Initial packet that does not decrypt: a stale or corrupt
        // packet (a peer paused then resumed, a restart, a garbled datagram), not certificates.
        UNREADABLE
    } else if has("reset by peer")
        || has("connection lost")
        || has("closed by peer")
        || has("closed before its hello")
    {
        RESET
    } else {
        "connection failed"
    }
}

/// The peer did not answer in time (down, paused, unreachable).
const TIMED_OUT: &str = "no answer (timed out)";
/// An Initial packet that did not decrypt: stale or corrupt, not a certificate problem.
const UNREADABLE: &str = "unreadable packet (stale or corrupt: a peer paused or restarted)";
/// The connection was reset or closed under the handshake (a peer restarting or resuming).
const RESET: &str = "connection reset (the peer restarted or resumed)";

/// Is a failure with this reason one of configuration (certificates, names) rather than a peer
/// that is down, paused, restarting or unreachable? Failed dials are warned about only then.
pub(crate) fn is_misconfiguration(reason: &str) -> bool {
    !is_transient(reason) && reason != "connection failed"
}

/// Is a failure with this reason a peer pausing, restarting or timing out (it reconnects by
/// itself): never a refusal worth a warning, and never an authentication failure?
pub(crate) fn is_transient(reason: &str) -> bool {
    [TIMED_OUT, UNREADABLE, RESET].contains(&reason)
}

/// At most one warning per (remote, reason) per period; the ones held back are counted and
/// the next warning says how many.
#[derive(Debug)]
pub(crate) struct WarnLimiter {
    every: Duration,
    /// Per (remote, reason): when it was last logged, and how many were held back since.
    last: Mutex<HashMap<WarnKey, (Instant, u64)>>,
}

/// A (remote address, reason) pair of [`WarnLimiter`].
type WarnKey = (String, &'static str);

/// Distinct (remote, reason) pairs remembered before starting over (a bound on memory).
const REMEMBERED_MAX: usize = 1024;

impl WarnLimiter {
    pub(crate) fn new(every: Duration) -> Self {
        Self {
            every,
            last: Mutex::new(HashMap::new()),
        }
    }

    /// `Some(held back)` when a warning for `remote` and `reason` is due now (and records it):
    /// how many were not logged since the last one; `None` (and counted) otherwise.
    pub(crate) fn due(&self, remote: &str, reason: &'static str) -> Option<u64> {
        let Ok(mut last) = self.last.lock() else {
            return Some(0);
        };
        let now = Instant::now();
        if last.len() >= REMEMBERED_MAX {
            last.retain(|_, (at, _)| now.duration_since(*at) < self.every);
            if last.len() >= REMEMBERED_MAX {
                last.clear();
            }
        }
        match last.get_mut(&(remote.to_owned(), reason)) {
            Some((at, held)) if now.duration_since(*at) < self.every => {
                *held += 1;
                None
            }
            Some((at, held)) => {
                *at = now;
                Some(std::mem::take(held))
            }
            None => {
                last.insert((remote.to_owned(), reason), (now, 0));
                Some(0)
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
            ("connect: timed out", "no answer (timed out)"),
            (
                "peer identity refused: no hello in time",
                "no answer (timed out)",
            ),
            ("connection lost", RESET),
            ("peer identity refused: reset by peer", RESET),
            ("unreachable network", "connection failed"),
        ];
        for (text, want) in cases {
            assert_eq!(reason(text), want, "{text}");
        }
        assert!(is_misconfiguration(reason("error 48")));
        assert!(!is_misconfiguration(reason("timed out")));
    }

    /// A peer SIGSTOPped then resumed: its stale Initial packets fail to decrypt ("the
    /// authentication failed" of quinn) and its handshakes time out or reset. None of that is
    /// a certificate problem, and none is warned about as a refusal.
    #[test]
    fn a_paused_peer_is_no_authentication_failure() {
        for text in [
            "detected an error with protocol compliance that was not covered by more specific \
             error codes: authentication failed",
            "peer identity refused: no hello in time",
            "reset by peer",
            "peer identity refused: timed out",
        ] {
            let why = reason(text);
            assert!(
                !why.contains("certificate") && !why.contains("TLS"),
                "{text}: {why}"
            );
            assert!(
                !is_misconfiguration(why) && is_transient(why),
                "{text}: {why}"
            );
        }
        // An identity that does not match is still a refusal to warn about.
        for text in [
            "peer identity refused: peer claims to be \"b\" but its certificate names another node",
            "peer identity refused: peer claims our own name",
            "peer identity refused: no client certificate",
        ] {
            assert!(!is_transient(reason(text)), "{text}");
            assert!(is_misconfiguration(reason(text)), "{text}");
        }
        assert_eq!(
            reason("...: authentication failed"),
            "unreadable packet (stale or corrupt: a peer paused or restarted)"
        );
    }

    #[test]
    fn warnings_are_limited_per_remote_and_reason() {
        let w = WarnLimiter::new(Duration::from_secs(60));
        assert_eq!(
            w.due("10.0.0.1:7701", "certificate from another CA"),
            Some(0)
        );
        assert_eq!(w.due("10.0.0.1:7701", "certificate from another CA"), None);
        assert_eq!(
            w.due("10.0.0.2:7701", "certificate from another CA"),
            Some(0)
        );
        assert_eq!(w.due("10.0.0.1:7701", "certificate expired"), Some(0));
        let w = WarnLimiter::new(Duration::ZERO);
        assert_eq!(w.due("a", "connection failed"), Some(0));
        assert_eq!(w.due("a", "connection failed"), Some(0));
        // The ones held back are counted into the next warning.
        let w = WarnLimiter::new(Duration::from_millis(50));
        assert_eq!(w.due("a", "x"), Some(0));
        assert_eq!(w.due("a", "x"), None);
        assert_eq!(w.due("a", "x"), None);
        std::thread::sleep(Duration::from_millis(60));
        assert_eq!(w.due("a", "x"), Some(2));
        // Bounded: many remotes start the memory over instead of growing it.
        let w = WarnLimiter::new(Duration::from_secs(60));
        for i in 0..5 * REMEMBERED_MAX {
            w.due(&i.to_string(), "connection failed");
        }
        assert!(w.last.lock().map(|l| l.len()).unwrap_or(0) <= REMEMBERED_MAX);
    }
}
