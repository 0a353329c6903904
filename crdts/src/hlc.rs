//! Hybrid logical clock (Kulkarni et al.): timestamps that respect happened-before and stay close
//! to physical time. Pure: the wall clock is always passed in.

use crate::dot::ReplicaId;

/// An HLC timestamp `(physical_ms, logical, replica)`, ordered lexicographically.
///
/// Guarantee: two distinct events never share a timestamp (the replica id breaks ties), so
/// every replica orders any two timestamps the same way.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Timestamp {
    /// Milliseconds since the Unix epoch (the clock's physical part, `l`).
    pub physical_ms: u64,
    /// Logical counter `c` within one physical millisecond.
    pub logical: u32,
    /// The replica that issued the timestamp.
    pub replica: ReplicaId,
}

/// Errors from [`Hlc::now`] and [`Hlc::observe`].
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum HlcError {
    /// The remote physical time is more than `max_drift_ms` ahead of our wall clock; the clock
    /// was left unchanged.
    TooFarAhead {
        /// The remote physical time.
        remote_ms: u64,
        /// Our wall clock.
        wall_ms: u64,
        /// The configured maximum drift.
        max_drift_ms: u64,
    },
    /// The clock would have to pass `(u64::MAX, u32::MAX)`: it has no later timestamp to give
    /// (it never saturates or goes backwards instead). The clock was left unchanged.
    Exhausted,
}

impl core::fmt::Display for HlcError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            HlcError::TooFarAhead {
                remote_ms,
                wall_ms,
                max_drift_ms,
            } => write!(
                f,
                "remote timestamp {remote_ms} ms is more than {max_drift_ms} ms ahead of local clock {wall_ms} ms"
            ),
            HlcError::Exhausted => write!(f, "the hybrid logical clock is at its ceiling"),
        }
    }
}

impl std::error::Error for HlcError {}

/// A replica's hybrid logical clock.
///
/// Guarantees: every timestamp from [`Hlc::now`] is strictly greater than every timestamp this
/// clock issued or observed before (including past `u32::MAX` events in one millisecond, by
/// borrowing the next millisecond), and a remote timestamp too far in the future is rejected
/// without changing the clock. At the ceiling `(u64::MAX, u32::MAX)` both `now` and `observe`
/// return [`HlcError::Exhausted`] and leave the clock unchanged: it never goes backwards.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hlc {
    replica: ReplicaId,
    physical_ms: u64,
    logical: u32,
    max_drift_ms: u64,
}

impl Hlc {
    /// A fresh clock for `replica` that rejects remote times more than `max_drift_ms` ahead.
    pub fn new(replica: ReplicaId, max_drift_ms: u64) -> Self {
        Self {
            replica,
            physical_ms: 0,
            logical: 0,
            max_drift_ms,
        }
    }

    /// A clock restored from a persisted high-water mark (see [`Hlc::mark`]), so timestamps stay
    /// monotonic across restarts even if the wall clock stepped back.
    pub fn restore(replica: ReplicaId, mark: (u64, u32), max_drift_ms: u64) -> Self {
        Self {
            replica,
            physical_ms: mark.0,
            logical: mark.1,
            max_drift_ms,
        }
    }

    /// The high-water mark `(physical_ms, logical)` to persist.
    pub fn mark(&self) -> (u64, u32) {
        (self.physical_ms, self.logical)
    }

    /// The replica this clock stamps for.
    pub fn replica(&self) -> ReplicaId {
        self.replica
    }

    /// Sets `(l, c)` to `(l', c')`, borrowing the next millisecond on logical overflow.
    ///
    /// # Errors
    /// [`HlcError::Exhausted`] when there is no next millisecond; the clock is unchanged.
    fn set(&mut self, l: u64, c: Option<u32>) -> Result<(), HlcError> {
        let (l, c) = match c {
            Some(c) => (l, c),
            None => (l.checked_add(1).ok_or(HlcError::Exhausted)?, 0),
        };
        self.physical_ms = l;
        self.logical = c;
        Ok(())
    }

    /// Local or send event: `l' = max(l, pt)`, `c' = c + 1` if `l' == l` else 0.
    ///
    /// # Errors
    /// [`HlcError::Exhausted`] at the ceiling `(u64::MAX, u32::MAX)`; the clock is unchanged.
    pub fn now(&mut self, wall_ms: u64) -> Result<Timestamp, HlcError> {
        let l = self.physical_ms.max(wall_ms);
        let c = if l == self.physical_ms {
            self.logical.checked_add(1)
        } else {
            Some(0)
        };
        self.set(l, c)?;
        Ok(self.stamp())
    }

    /// The clock's current reading as a timestamp (no tick).
    pub fn stamp(&self) -> Timestamp {
        Timestamp {
            physical_ms: self.physical_ms,
            logical: self.logical,
            replica: self.replica,
        }
    }

    /// Receive event for a remote timestamp `(l_m, c_m)`.
    ///
    /// # Errors
    /// [`HlcError::TooFarAhead`] when `l_m > wall_ms + max_drift_ms`, [`HlcError::Exhausted`]
    /// when the clock would have to pass `(u64::MAX, u32::MAX)`; the clock is unchanged.
    pub fn observe(&mut self, remote: &Timestamp, wall_ms: u64) -> Result<(), HlcError> {
        if remote.physical_ms > wall_ms.saturating_add(self.max_drift_ms) {
            return Err(HlcError::TooFarAhead {
                remote_ms: remote.physical_ms,
                wall_ms,
                max_drift_ms: self.max_drift_ms,
            });
        }
        let (l, c, lm, cm) = (
            self.physical_ms,
            self.logical,
            remote.physical_ms,
            remote.logical,
        );
        let l2 = l.max(lm).max(wall_ms);
        let c2 = if l2 == l && l2 == lm {
            c.max(cm).checked_add(1)
        } else if l2 == l {
            c.checked_add(1)
        } else if l2 == lm {
            cm.checked_add(1)
        } else {
            Some(0)
        };
        self.set(l2, c2)
    }
}
