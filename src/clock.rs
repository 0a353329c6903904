//! The wall clock, read in one place (milliseconds since the Unix epoch).

/// Milliseconds since the Unix epoch; 0 for a clock set before it, saturating far after it.
pub(crate) fn wall_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}
