//! The SVID issuance counters: one certificate per newly injected pod, as istiod's CA issues
//! one for each new sidecar. Like a real control plane, each revision runs several istiod
//! replicas, each with its own counter (a CSR reaches one of them); a replica that restarts
//! starts its counter again from 0. Owns the counts; the total never resets.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// istiod replicas per revision (the Istio charts' production default is 3 or more).
pub const ISTIOD_REPLICAS: usize = 3;
/// The revision label of certificates issued without a revision (another CA client).
pub const DEFAULT_REVISION: &str = "default";

#[derive(Debug, Default)]
struct Inner {
    total: AtomicU64,
    /// Per revision: each replica's exported counter, and the replica the next CSR goes to.
    replicas: Mutex<BTreeMap<String, (Vec<u64>, usize)>>,
}

/// A shared count of SVIDs issued in one cluster, split over the istiod replicas of each
/// revision. Cloning shares the count. Exported to Prometheus as
/// `citadel_server_success_cert_issuance_count{cluster, revision, pod}`, one series per replica.
#[derive(Debug, Clone, Default)]
pub struct SvidCounter(Arc<Inner>);

/// The pod name of replica `index` of `revision`'s istiod.
pub fn istiod_pod(revision: &str, index: usize) -> String {
    format!("istiod-{revision}-{index}")
}

impl SvidCounter {
    /// A counter at 0.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records one SVID issued by no particular revision ([`DEFAULT_REVISION`]).
    pub fn issue(&self) {
        self.issue_by(DEFAULT_REVISION);
    }

    /// Records one SVID issued by `revision`'s istiod: the replicas take CSRs in turn.
    pub fn issue_by(&self, revision: &str) {
        self.0.total.fetch_add(1, Ordering::Relaxed);
        let mut r = self.0.replicas.lock().expect("svid lock");
        let (counts, next) = r
            .entry(revision.to_owned())
            .or_insert_with(|| (vec![0; ISTIOD_REPLICAS], 0));
        counts[*next] += 1;
        *next = (*next + 1) % counts.len();
    }

    /// Restarts replica `index` of `revision`'s istiod: its counter starts again from 0 (the
    /// certificates it issued still count in the total).
    pub fn restart_replica(&self, revision: &str, index: usize) {
        let mut r = self.0.replicas.lock().expect("svid lock");
        if let Some(c) = r.get_mut(revision).and_then(|(c, _)| c.get_mut(index)) {
            *c = 0;
        }
    }

    /// SVIDs issued so far, over every replica and revision, restarts included.
    pub fn get(&self) -> u64 {
        self.0.total.load(Ordering::Relaxed)
    }

    /// Each replica's counter as exported: (revision, istiod pod) → count.
    pub fn by_replica(&self) -> BTreeMap<(String, String), u64> {
        let r = self.0.replicas.lock().expect("svid lock");
        r.iter()
            .flat_map(|(rev, (counts, _))| {
                counts
                    .iter()
                    .enumerate()
                    .map(move |(i, n)| ((rev.clone(), istiod_pod(rev, i)), *n))
            })
            .collect()
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

    #[test]
    fn each_revision_spreads_over_its_replicas_and_a_restart_resets_one() {
        let c = SvidCounter::new();
        for _ in 0..7 {
            c.issue_by("1-27");
        }
        c.issue_by("1-28");
        let by = c.by_replica();
        let of = |rev: &str, i: usize| by[&(rev.to_owned(), istiod_pod(rev, i))];
        assert_eq!((of("1-27", 0), of("1-27", 1), of("1-27", 2)), (3, 2, 2));
        assert_eq!(of("1-28", 0), 1);
        assert_eq!(by.len(), 2 * ISTIOD_REPLICAS);
        c.restart_replica("1-27", 0);
        assert_eq!(
            c.by_replica()[&("1-27".to_owned(), istiod_pod("1-27", 0))],
            0
        );
        assert_eq!(
            c.get(),
            8,
            "the total keeps what a restarted replica issued"
        );
    }
}
