//! The controller lease and epoch (§2.1): at most one controller acts at a time, and a
//! controller from an older deployment (stale epoch) can never act again. Pure decisions on
//! the lease document; the store applies them transactionally.

use serde::{Deserialize, Serialize};

use super::time::Timestamp;

/// The lease document (`locks/controller`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    /// Holder.
    pub owner: String,
    /// Epoch of the holder's deployment.
    pub epoch: String,
    /// When it was (re)acquired.
    pub acquired_at: Timestamp,
    /// When it lapses unless renewed.
    pub expires_at: Timestamp,
}

/// Why a lease was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The caller's epoch is not the current deployment's.
    StaleEpoch {
        /// The current epoch.
        current: String,
    },
    /// Another live controller holds it.
    Held {
        /// Its owner.
        owner: String,
        /// Until when.
        until: Timestamp,
    },
}

/// Acquires or renews the lease for `owner` of `epoch`. The current epoch (if set) must equal
/// the caller's, even when nobody holds the lease; a live lease of another owner is never
/// taken (a new epoch waits for it to lapse or be released).
pub fn acquire(
    lease: Option<&Lease>,
    current_epoch: Option<&str>,
    owner: &str,
    epoch: &str,
    ttl_secs: i64,
    now: Timestamp,
) -> Result<Lease, Refusal> {
    if let Some(current) = current_epoch
        && current != epoch
    {
        return Err(Refusal::StaleEpoch {
            current: current.to_owned(),
        });
    }
    if let Some(l) = lease
        && l.owner != owner
        && l.expires_at > now
    {
        return Err(Refusal::Held {
            owner: l.owner.clone(),
            until: l.expires_at,
        });
    }
    Ok(Lease {
        owner: owner.to_owned(),
        epoch: epoch.to_owned(),
        acquired_at: now,
        expires_at: now.plus_secs(ttl_secs),
    })
}

/// Releases the lease only if `owner` holds it; returns the document to keep.
pub fn release(lease: Option<Lease>, owner: &str) -> Option<Lease> {
    lease.filter(|l| l.owner != owner)
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: Timestamp = Timestamp::from_secs(1_000);

    #[test]
    fn epochs_and_owners() {
        let held = acquire(None, Some("e2"), "a", "e2", 900, T0).unwrap();
        // A stale epoch never acts, even on a free lease.
        assert!(matches!(
            acquire(None, Some("e2"), "old", "e1", 900, T0),
            Err(Refusal::StaleEpoch { .. })
        ));
        // Another owner cannot take a live lease, even with the right epoch.
        assert!(matches!(
            acquire(Some(&held), Some("e2"), "b", "e2", 900, T0.plus_secs(10)),
            Err(Refusal::Held { .. })
        ));
        // The holder renews; others take it once it lapsed.
        assert!(acquire(Some(&held), Some("e2"), "a", "e2", 900, T0.plus_secs(10)).is_ok());
        assert!(acquire(Some(&held), Some("e2"), "b", "e2", 900, T0.plus_secs(901)).is_ok());
        // Release only by the owner.
        assert!(release(Some(held.clone()), "b").is_some());
        assert!(release(Some(held), "a").is_none());
    }
}
