//! Spot availability traces in the public JSON format of `skypilot-org/spot-traces`
//! (`{"metadata": {"gap_seconds": N, ...}, "data": [v0, v1, ...]}`, v = instances available
//! during tick i). Loading, lookup by time, and the statistics tests compare with the data.

use std::fmt;

/// One availability trace.
#[derive(Clone, Debug, PartialEq)]
pub struct SpotTrace {
    /// Seconds per tick.
    pub gap_seconds: u64,
    /// Instances available per tick.
    pub values: Vec<u32>,
    /// `metadata.kind` (`availability` or `preemption`), if given.
    pub kind: String,
}

/// Why a trace could not be read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceError(pub String);

impl fmt::Display for TraceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for TraceError {}

impl SpotTrace {
    /// Parses the JSON text of a trace.
    pub fn parse(text: &str) -> Result<SpotTrace, TraceError> {
        let value: serde_json::Value =
            serde_json::from_str(text).map_err(|e| TraceError(format!("invalid JSON: {e}")))?;
        let gap = value
            .pointer("/metadata/gap_seconds")
            .and_then(serde_json::Value::as_u64)
            .filter(|g| *g > 0)
            .ok_or_else(|| {
                TraceError("expected `metadata.gap_seconds`, a positive integer".into())
            })?;
        let data = value
            .get("data")
            .and_then(serde_json::Value::as_array)
            .ok_or_else(|| TraceError("expected `data`, a list of counts".into()))?;
        let mut values = Vec::with_capacity(data.len());
        for (i, v) in data.iter().enumerate() {
            let n = v
                .as_u64()
                .filter(|n| *n <= u64::from(u32::MAX))
                .ok_or_else(|| TraceError(format!("data[{i}]: expected a count, found {v}")))?;
            values.push(n as u32);
        }
        if values.is_empty() {
            return Err(TraceError("`data` is empty".into()));
        }
        let kind = value
            .pointer("/metadata/kind")
            .and_then(serde_json::Value::as_str)
            .unwrap_or("")
            .to_owned();
        Ok(SpotTrace {
            gap_seconds: gap,
            values,
            kind,
        })
    }

    /// Instances available at `secs` after the trace start (the trace repeats).
    pub fn at(&self, secs: u64) -> u32 {
        self.values[((secs / self.gap_seconds) as usize) % self.values.len()]
    }

    /// Length of one pass through the trace, in seconds.
    pub fn period_seconds(&self) -> u64 {
        self.gap_seconds * self.values.len() as u64
    }

    /// Fraction of ticks with at least one instance available.
    pub fn availability(&self) -> f64 {
        self.values.iter().filter(|v| **v > 0).count() as f64 / self.values.len() as f64
    }

    /// Number of transitions from a positive count to zero.
    pub fn drops_to_zero(&self) -> usize {
        self.values
            .windows(2)
            .filter(|w| w[0] > 0 && w[1] == 0)
            .count()
    }

    /// The largest count.
    pub fn peak(&self) -> u32 {
        self.values.iter().copied().max().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_counts() {
        let t = SpotTrace::parse(r#"{"metadata": {"gap_seconds": 60, "kind": "availability"}, "data": [1, 1, 0, 0, 1, 0]}"#).unwrap();
        assert_eq!(t.at(0), 1);
        assert_eq!(t.at(125), 0);
        assert_eq!(t.at(360), 1);
        assert_eq!(t.drops_to_zero(), 2);
        assert!((t.availability() - 0.5).abs() < 1e-9);
        assert!(SpotTrace::parse(r#"{"data": [1]}"#).is_err());
        assert!(SpotTrace::parse(r#"{"metadata": {"gap_seconds": 1}, "data": [1, -2]}"#).is_err());
    }
}
