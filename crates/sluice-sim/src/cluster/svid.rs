//! The SVID issuance counter: one certificate per newly injected pod, as istiod's CA issues one
//! for each new sidecar. Owns the count; never resets it.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// A shared, monotonically increasing count of SVIDs issued in one cluster. Cloning shares the
/// count. Exported to Prometheus as `citadel_server_success_cert_issuance_count`.
#[derive(Debug, Clone, Default)]
pub struct SvidCounter(Arc<AtomicU64>);

impl SvidCounter {
    /// A counter at 0.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records one issued SVID.
    pub fn issue(&self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }

    /// SVIDs issued so far.
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clones_share_the_count() {
        let a = SvidCounter::new();
        let b = a.clone();
        a.issue();
        b.issue();
        assert_eq!(a.get(), 2);
        assert_eq!(b.get(), 2);
    }
}
