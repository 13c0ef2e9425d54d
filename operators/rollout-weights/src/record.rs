//! The pure record: what carrying out a decision left behind, folded into the status the decision
//! returned. The reconcile's act step reports each effect as an [`Outcome`]; only this module
//! writes those into the status, so the I/O side never edits a decided status by hand.
//!
//! Owns: the owned route's last written resourceVersion and the instant a weight came into force,
//! the instant an abort's route was reverted and its detect → revert figure in milliseconds, and
//! forgetting a released route; the same per additional route, with an abort reverted only once
//! every route is (the figure runs to the last). Never performs I/O and never decides anything.

use std::time::Duration;

use k8s_openapi::{apimachinery::pkg::apis::meta::v1::Time, jiff::Timestamp};
use sluice_api::v1alpha1::{
    RolloutPhase, RolloutStatus,
    rollout::{OwnedRouteStatus, RouteKindName},
};

use crate::decide::is_route;

/// One effect of a decision, carried out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// A route write of the decision was accepted (or the route was already in that state).
    RouteWritten {
        /// The route's resourceVersion after the write.
        resource_version: Option<String>,
        /// When the API server accepted it.
        at: Timestamp,
        /// Whether it was the abort's write (canary weight 0, cohort and mirror rules removed).
        abort: bool,
    },
    /// The route the weights were written to was aborted on and handed back (its target changed).
    Released,
    /// A write of the decision to one of `spec.additionalRoutes` was accepted (or that route was
    /// already in that state).
    AdditionalRouteWritten {
        /// Its kind.
        kind: RouteKindName,
        /// Its name.
        name: String,
        /// Its resourceVersion after the write.
        resource_version: Option<String>,
        /// When the API server accepted it.
        at: Timestamp,
        /// Whether it was the abort's write (canary weight 0).
        abort: bool,
    },
    /// An additional route was aborted on and handed back (it left `spec.additionalRoutes`, or
    /// the Services changed).
    AdditionalReleased {
        /// Its kind.
        kind: RouteKindName,
        /// Its name.
        name: String,
    },
}

/// An abort's route revert, recorded for the first time: the figures its metrics and log carry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reverted {
    /// From the first failing evaluation to the revert, when the abort came from a gate.
    pub from_first_failure: Option<Duration>,
    /// From the abort decision (the failing verdict's return) to the revert.
    pub from_decision: Duration,
}

/// Folds `outcome` into `status`. Returns the abort's figures the first time its revert is
/// recorded, `None` otherwise.
pub fn record(status: &mut RolloutStatus, outcome: &Outcome) -> Option<Reverted> {
    match outcome {
        Outcome::Released => {
            // The next reconcile takes the new target from Pending.
            status.owned_route = None;
            None
        }
        Outcome::RouteWritten {
            resource_version,
            at,
            abort,
        } => {
            let owned = status.owned_route.get_or_insert_with(Default::default);
            owned.last_written_resource_version = resource_version.clone();
            // The weight is in force from here (cleared by the decision when it changed).
            if owned.weight_written_at.is_none() {
                owned.weight_written_at = Some(Time(*at));
            }
            // Several routes have no atomic write: the revert is the last route's.
            if !abort
                || status.phase != RolloutPhase::Aborted
                || !status.additional_owned_routes.iter().all(written_zero)
            {
                return None;
            }
            reverted_at(status, *at)
        }
        Outcome::AdditionalRouteWritten {
            kind,
            name,
            resource_version,
            at,
            abort,
        } => {
            let owned = status
                .additional_owned_routes
                .iter_mut()
                .find(|o| is_route(o, *kind, name))?;
            owned.last_written_resource_version = resource_version.clone();
            if owned.weight_written_at.is_none() {
                owned.weight_written_at = Some(Time(*at));
            }
            let primary = status.owned_route.as_ref().is_none_or(written_zero);
            if !abort
                || status.phase != RolloutPhase::Aborted
                || !primary
                || !status.additional_owned_routes.iter().all(written_zero)
            {
                return None;
            }
            reverted_at(status, *at)
        }
        Outcome::AdditionalReleased { kind, name } => {
            status
                .additional_owned_routes
                .retain(|o| !is_route(o, *kind, name));
            None
        }
    }
}

/// Whether the route `owned` records has canary weight 0 in force (its abort write accepted).
fn written_zero(owned: &OwnedRouteStatus) -> bool {
    owned.written_weight == Some(0) && owned.weight_written_at.is_some()
}

/// Records the abort's revert at `at` unless it already is; its figures the first time.
fn reverted_at(status: &mut RolloutStatus, at: Timestamp) -> Option<Reverted> {
    let a = status.abort.as_mut()?;
    if a.route_reverted_at.is_some() {
        return None;
    }
    a.route_reverted_at = Some(Time(at));
    let took = |from: Timestamp| at.duration_since(from).unsigned_abs();
    // The decision is taken the moment the failing verdict comes back.
    let reverted = Reverted {
        from_first_failure: a.first_failed_at.as_ref().map(|t| took(t.0)),
        from_decision: took(a.decided_at.0),
    };
    // Stored as a duration: the times above are kept to the second.
    status.abort_detect_to_revert_ms = Some(millis(reverted.from_decision));
    Some(reverted)
}

/// Whole milliseconds of `d`, saturating.
pub fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_api::v1alpha1::rollout::{AbortReason, AbortStatus, OwnedRouteStatus};

    fn t(ms: i64) -> Timestamp {
        Timestamp::from_millisecond(1_800_000_000_000 + ms).unwrap()
    }

    fn aborted() -> RolloutStatus {
        RolloutStatus {
            phase: RolloutPhase::Aborted,
            abort: Some(AbortStatus {
                reason: AbortReason::GateFailed,
                message: None,
                gate: None,
                step_index: Some(1),
                first_failed_at: Some(Time(t(-2_000))),
                decided_at: Time(t(0)),
                route_reverted_at: None,
                revert_verified_at: None,
            }),
            owned_route: Some(OwnedRouteStatus {
                name: "checkout".into(),
                written_weight: Some(0),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn written(at: i64, abort: bool) -> Outcome {
        Outcome::RouteWritten {
            resource_version: Some(format!("{at}")),
            at: t(at),
            abort,
        }
    }

    #[test]
    fn an_aborts_revert_is_recorded_once_with_its_millisecond_figure() {
        let mut st = aborted();
        let r = record(&mut st, &written(37, true));
        assert_eq!(
            r,
            Some(Reverted {
                from_first_failure: Some(Duration::from_millis(2_037)),
                from_decision: Duration::from_millis(37),
            })
        );
        let a = st.abort.as_ref().unwrap();
        assert_eq!(a.route_reverted_at, Some(Time(t(37))));
        assert_eq!(st.abort_detect_to_revert_ms, Some(37));
        let o = st.owned_route.as_ref().unwrap();
        assert_eq!(o.last_written_resource_version.as_deref(), Some("37"));
        assert_eq!(o.weight_written_at, Some(Time(t(37))));

        // A later write of the same abort (a retry, a route found already reverted) keeps the
        // first revert's figures and records the new resourceVersion.
        assert_eq!(record(&mut st, &written(900, true)), None);
        assert_eq!(
            st.abort.as_ref().unwrap().route_reverted_at,
            Some(Time(t(37)))
        );
        assert_eq!(st.abort_detect_to_revert_ms, Some(37));
        assert_eq!(
            st.owned_route
                .as_ref()
                .unwrap()
                .last_written_resource_version
                .as_deref(),
            Some("900")
        );
    }

    #[test]
    fn a_weight_write_records_the_route_and_when_the_weight_came_into_force() {
        let mut st = RolloutStatus {
            phase: RolloutPhase::Progressing,
            owned_route: Some(OwnedRouteStatus {
                written_weight: Some(5),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(record(&mut st, &written(10, false)), None);
        assert_eq!(
            st.owned_route.as_ref().unwrap().weight_written_at,
            Some(Time(t(10)))
        );
        // The same weight written again (another rule, a re-take) does not move its start.
        record(&mut st, &written(20, false));
        let o = st.owned_route.as_ref().unwrap();
        assert_eq!(o.weight_written_at, Some(Time(t(10))));
        assert_eq!(o.last_written_resource_version.as_deref(), Some("20"));
        assert!(st.abort_detect_to_revert_ms.is_none());
    }

    #[test]
    fn a_route_write_outside_an_abort_records_no_revert() {
        // Not the abort's write (a hand-back's weights), or not Aborted: no revert recorded.
        let mut st = aborted();
        assert_eq!(record(&mut st, &written(5, false)), None);
        assert!(st.abort.as_ref().unwrap().route_reverted_at.is_none());
        let mut st = aborted();
        st.phase = RolloutPhase::Promoted;
        assert_eq!(record(&mut st, &written(5, true)), None);
        assert!(st.abort.as_ref().unwrap().route_reverted_at.is_none());
    }

    #[test]
    fn a_released_route_is_forgotten() {
        let mut st = aborted();
        assert_eq!(record(&mut st, &Outcome::Released), None);
        assert!(st.owned_route.is_none());
    }

    fn extra(at: i64, abort: bool, name: &str) -> Outcome {
        Outcome::AdditionalRouteWritten {
            kind: RouteKindName::HttpRoute,
            name: name.into(),
            resource_version: Some(format!("{name}-{at}")),
            at: t(at),
            abort,
        }
    }

    fn aborted_on_three_routes() -> RolloutStatus {
        let mut st = aborted();
        for name in ["checkout-mesh", "checkout-edge"] {
            st.additional_owned_routes.push(OwnedRouteStatus {
                name: name.into(),
                kind: Some(RouteKindName::HttpRoute),
                written_weight: Some(0),
                ..Default::default()
            });
        }
        st
    }

    #[test]
    fn with_several_routes_the_revert_is_the_last_routes_even_after_a_failed_write() {
        let mut st = aborted_on_three_routes();
        // First reconcile: the primary and one additional route reverted, the other's write
        // failed (no outcome): not reverted yet.
        assert_eq!(record(&mut st, &written(10, true)), None);
        assert_eq!(record(&mut st, &extra(20, true, "checkout-mesh")), None);
        assert!(st.abort.as_ref().unwrap().route_reverted_at.is_none());
        assert!(st.abort_detect_to_revert_ms.is_none());
        // The retry, from the status: the failed route reverts at 500; the figure runs to it.
        assert_eq!(record(&mut st, &written(500, true)), None);
        assert_eq!(record(&mut st, &extra(500, true, "checkout-mesh")), None);
        let r = record(&mut st, &extra(510, true, "checkout-edge"));
        assert_eq!(r.map(|r| r.from_decision), Some(Duration::from_millis(510)));
        assert_eq!(
            st.abort.as_ref().unwrap().route_reverted_at,
            Some(Time(t(510)))
        );
        assert_eq!(st.abort_detect_to_revert_ms, Some(510));
        let mesh = &st.additional_owned_routes[0];
        assert_eq!(mesh.weight_written_at, Some(Time(t(20))));
        assert_eq!(
            mesh.last_written_resource_version.as_deref(),
            Some("checkout-mesh-500")
        );
    }

    #[test]
    fn the_primarys_write_last_completes_the_revert_too() {
        let mut st = aborted_on_three_routes();
        assert_eq!(record(&mut st, &extra(5, true, "checkout-mesh")), None);
        assert_eq!(record(&mut st, &extra(6, true, "checkout-edge")), None);
        let r = record(&mut st, &written(40, true));
        assert_eq!(r.map(|r| r.from_decision), Some(Duration::from_millis(40)));
        assert_eq!(st.abort_detect_to_revert_ms, Some(40));
    }

    #[test]
    fn a_released_additional_route_is_forgotten_alone() {
        let mut st = aborted_on_three_routes();
        let gone = Outcome::AdditionalReleased {
            kind: RouteKindName::HttpRoute,
            name: "checkout-mesh".into(),
        };
        assert_eq!(record(&mut st, &gone), None);
        let names: Vec<&str> = st
            .additional_owned_routes
            .iter()
            .map(|o| o.name.as_str())
            .collect();
        assert_eq!(names, ["checkout-edge"]);
        assert!(st.owned_route.is_some());
        // A write to a route no longer recorded changes nothing.
        assert_eq!(record(&mut st, &extra(9, true, "checkout-mesh")), None);
        assert_eq!(st.additional_owned_routes.len(), 1);
    }
}
