//! Engine time: a UTC instant in milliseconds, written as RFC 3339. The engine only ever
//! receives time as an argument; nothing here reads a clock.

use std::fmt;

use serde::{Deserialize, Serialize};

/// A UTC instant, milliseconds since the Unix epoch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Timestamp(pub i64);

impl Timestamp {
    /// The instant `secs` seconds after the epoch.
    pub const fn from_secs(secs: i64) -> Timestamp {
        Timestamp(secs * 1000)
    }

    /// Whole seconds since the epoch (rounded down).
    pub fn as_secs(self) -> i64 {
        self.0.div_euclid(1000)
    }

    /// This instant plus `secs` seconds (saturating).
    pub fn plus_secs(self, secs: i64) -> Timestamp {
        Timestamp(self.0.saturating_add(secs.saturating_mul(1000)))
    }

    /// This instant plus `ms` milliseconds (saturating).
    pub fn plus_millis(self, ms: i64) -> Timestamp {
        Timestamp(self.0.saturating_add(ms))
    }

    /// Seconds from `earlier` to `self` (negative if `earlier` is later), as a float.
    pub fn secs_since(self, earlier: Timestamp) -> f64 {
        (self.0 - earlier.0) as f64 / 1000.0
    }

    /// True when at least `secs` seconds have passed since `earlier`.
    pub fn elapsed_since(self, earlier: Timestamp, secs: i64) -> bool {
        self.0 - earlier.0 >= secs.saturating_mul(1000)
    }

    /// Parses RFC 3339 (`2026-11-30T01:02:03Z`, `…+00:00`); a time without offset is UTC, as
    /// the original reads naive times.
    pub fn parse(text: &str) -> Result<Timestamp, String> {
        let text = text.trim();
        // Instants outside RFC 3339's years are written as milliseconds (see `Display`).
        if let Some(ms) = text.strip_suffix("ms").and_then(|n| n.parse::<i64>().ok()) {
            return Ok(Timestamp(ms));
        }
        if let Ok(ts) = text.parse::<jiff::Timestamp>() {
            return Ok(Timestamp(ts.as_millisecond()));
        }
        format!("{text}Z")
            .parse::<jiff::Timestamp>()
            .ok()
            .map(|ts| Timestamp(ts.as_millisecond()))
            .ok_or_else(|| {
                format!("expected an RFC 3339 time such as `2026-11-30T12:00:00Z`, found {text:?}")
            })
    }
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match jiff::Timestamp::from_millisecond(self.0) {
            Ok(ts) => write!(f, "{ts}"),
            Err(_) => write!(f, "{}ms", self.0),
        }
    }
}

impl Serialize for Timestamp {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Timestamp {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        Timestamp::parse(&text).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_reads_naive_times_as_utc() {
        let t = Timestamp::parse("2026-11-30T03:04:05.123456+00:00").unwrap();
        assert_eq!(t.to_string(), "2026-11-30T03:04:05.123Z");
        assert_eq!(Timestamp::parse("2026-11-30T03:04:05.123").unwrap(), t);
        assert!(Timestamp::parse("yesterday").is_err());
        // Far instants are written as milliseconds and read back.
        let far = Timestamp(i64::MAX / 2);
        assert_eq!(Timestamp::parse(&far.to_string()), Ok(far));
    }
}
