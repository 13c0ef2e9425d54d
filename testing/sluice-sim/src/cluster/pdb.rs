//! PodDisruptionBudget status arithmetic, as the disruption controller computes it: expected pods,
//! desired and current healthy, disruptions allowed. Pure; the PDB controller in
//! [`super::controllers`] gathers the inputs and writes the status. Never decides evictions (the
//! API server does, from the status written here).

use super::rolling::scaled;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

/// The numbers of a PodDisruptionBudget's status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PdbNumbers {
    /// `status.expectedPods`.
    pub expected_pods: i32,
    /// `status.desiredHealthy`.
    pub desired_healthy: i32,
    /// `status.currentHealthy`.
    pub current_healthy: i32,
    /// `status.disruptionsAllowed`.
    pub disruptions_allowed: i32,
}

/// Computes PDB status numbers.
///
/// `matching_pods` is the number of non-terminating pods the selector matches, `healthy` how many
/// of them are Ready, `owner_scale` the summed desired replicas of their controllers (pods without
/// a controller count one each). As in Kubernetes: an integer `minAvailable` is compared with the
/// matching pods; a percentage `minAvailable` (rounded up) and `maxUnavailable` (int or percentage,
/// rounded up) are taken of the controllers' scale. With neither set nothing is protected.
pub fn pdb_numbers(
    min_available: Option<&IntOrString>,
    max_unavailable: Option<&IntOrString>,
    matching_pods: i32,
    healthy: i32,
    owner_scale: i32,
) -> PdbNumbers {
    let (expected, desired) = match (max_unavailable, min_available) {
        (Some(mu), _) => {
            let unavailable = scaled(mu, owner_scale, true);
            (owner_scale, (owner_scale - unavailable).max(0))
        }
        (None, Some(IntOrString::Int(n))) => (matching_pods, *n),
        (None, Some(pct)) => (owner_scale, scaled(pct, owner_scale, true)),
        (None, None) => (matching_pods, 0),
    };
    PdbNumbers {
        expected_pods: expected,
        desired_healthy: desired,
        current_healthy: healthy,
        disruptions_allowed: (healthy - desired).max(0),
    }
}

/// How long an eviction the API server recorded in `status.disruptedPods` keeps the pod out of
/// the healthy count if the pod is not deleted (Kubernetes' `DeletionTimeout`, 2 minutes).
pub const DISRUPTION_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(120);

/// Which entries of `status.disruptedPods` still hold: the pod is still there and not yet
/// terminating, and the eviction was recorded less than [`DISRUPTION_TIMEOUT`] ago (an
/// unparsable time counts as recent). Such pods are not healthy, like the disruption
/// controller treats them, so a status computed between an eviction and the pod's deletion does
/// not hand the spent disruption back.
pub fn pending_disruptions(
    disrupted: &std::collections::BTreeMap<String, String>,
    live_not_terminating: &std::collections::BTreeSet<String>,
    now: jiff::Timestamp,
) -> std::collections::BTreeSet<String> {
    disrupted
        .iter()
        .filter(|(pod, _)| live_not_terminating.contains(*pod))
        .filter(|(_, at)| {
            at.parse::<jiff::Timestamp>().map_or(true, |at| {
                now.duration_since(at).unsigned_abs() < DISRUPTION_TIMEOUT
            })
        })
        .map(|(pod, _)| pod.clone())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pending_disruptions_table() {
        use std::collections::{BTreeMap, BTreeSet};
        let now: jiff::Timestamp = "2026-11-30T02:00:00Z".parse().unwrap();
        let disrupted = BTreeMap::from([
            ("recent".to_string(), "2026-11-30T01:59:30Z".to_string()),
            ("old".to_string(), "2026-11-30T01:50:00Z".to_string()),
            ("gone".to_string(), "2026-11-30T01:59:59Z".to_string()),
            ("garbled".to_string(), "yesterday".to_string()),
        ]);
        let live: BTreeSet<String> = ["recent", "old", "garbled", "other"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let got = pending_disruptions(&disrupted, &live, now);
        let want: BTreeSet<String> = ["recent", "garbled"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        assert_eq!(got, want);
    }

    #[test]
    fn pdb_table() {
        let int = IntOrString::Int;
        let pct = |s: &str| IntOrString::String(s.to_string());
        // (minAvailable, maxUnavailable, matching, healthy, scale) -> (expected, desired, allowed)
        let cases = [
            (Some(int(2)), None, 3, 3, 3, (3, 2, 1)),
            (Some(int(2)), None, 3, 2, 3, (3, 2, 0)),
            (Some(int(5)), None, 3, 3, 3, (3, 5, 0)),
            (Some(pct("50%")), None, 3, 3, 3, (3, 2, 1)),
            (None, Some(int(1)), 4, 4, 4, (4, 3, 1)),
            (None, Some(int(1)), 4, 3, 4, (4, 3, 0)),
            (None, Some(pct("25%")), 10, 10, 10, (10, 7, 3)),
            (None, Some(int(0)), 2, 2, 2, (2, 2, 0)),
            (None, None, 2, 2, 2, (2, 0, 2)),
        ];
        for (min, max, matching, healthy, scale, (e, d, a)) in cases {
            let n = pdb_numbers(min.as_ref(), max.as_ref(), matching, healthy, scale);
            assert_eq!(
                (n.expected_pods, n.desired_healthy, n.disruptions_allowed),
                (e, d, a),
                "min={min:?} max={max:?} matching={matching} healthy={healthy} scale={scale}"
            );
            assert_eq!(n.current_healthy, healthy);
        }
    }
}
