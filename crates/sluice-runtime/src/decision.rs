//! The shape of every operator's pure decide step: from spec, status, observations and the time,
//! a [`Decision`] — the effects to carry out, the next status, and when to look again.
//!
//! Every operator's pure machine writes into one [`Decision`] as it goes: effects pushed in order,
//! Events with [`Decision::event`], the next look with [`Decision::wake`], conditions with
//! [`Decision::condition`]. Three operators hold it in a `Machine` beside what their phases
//! read (spec, observations, time); revert's phases are functions over `&mut Decision`.
//!
//! Owns only that shape and the conversion of [`Requeue`] into the controller's action; what an
//! operator's effects are and in which order it carries them out stay with the operator.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::runtime::controller::Action;

/// When an object is reconciled again, besides on a change of what it watches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Requeue {
    /// Only when the object (or something it watches) changes.
    AwaitChange,
    /// After this long, even without a change.
    After(Duration),
}

impl Requeue {
    /// The earlier of two requeues (waiting for a change is the latest).
    pub fn sooner(self, other: Requeue) -> Requeue {
        match (self, other) {
            (Requeue::After(x), Requeue::After(y)) => Requeue::After(x.min(y)),
            (Requeue::After(x), Requeue::AwaitChange)
            | (Requeue::AwaitChange, Requeue::After(x)) => Requeue::After(x),
            (Requeue::AwaitChange, Requeue::AwaitChange) => Requeue::AwaitChange,
        }
    }

    /// The delay, if any.
    pub fn after(self) -> Option<Duration> {
        match self {
            Requeue::AwaitChange => None,
            Requeue::After(d) => Some(d),
        }
    }

    /// The controller's action, `spent` (the time the reconcile took) already counted, and
    /// never sooner than `floor` from now, so a decision that is due again at once does not
    /// spin.
    pub fn action(self, spent: Duration, floor: Duration) -> Action {
        match self {
            Requeue::AwaitChange => Action::await_change(),
            Requeue::After(d) => Action::requeue(d.saturating_sub(spent).max(floor)),
        }
    }
}

/// Declares an operator's decision types over its status and its action enum (whose Events are
/// its `Event(Notice)` variant): `Decision` (this module's [`Decision`] of the two, with the
/// doc given first, which says in what order the operator carries it out), `Requeue`,
/// [`crate::events::Announces`] and [`Acts`] for the action.
///
/// ```text
/// sluice_runtime::decision_types! {
///     /// The outcome of `decide`: effects are carried out after the status write succeeded.
///     WaveGateStatus, Action
/// }
/// ```
#[macro_export]
macro_rules! decision_types {
    ($(#[$doc:meta])* $status:ty, $action:ident) => {
        $crate::announces!($action);

        impl $crate::decision::Acts for $action {
            type Status = $status;

            fn conditions(
                status: &mut $status,
            ) -> &mut Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition> {
                &mut status.conditions
            }
        }

        /// When to look at the object again.
        pub use $crate::decision::Requeue;

        $(#[$doc])*
        pub type Decision = $crate::decision::Decision<$status, $action>;
    };
}

/// What an operator's decide step returns.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision<S, A> {
    /// Effects (and Events) to carry out, in order.
    pub actions: Vec<A>,
    /// The next status (equal to the current one when nothing changed).
    pub status: S,
    /// When to reconcile again.
    pub requeue: Requeue,
}

impl<S, A> Decision<S, A> {
    /// The decision to start a decide step from: `status` as it is, no effect, and nothing to
    /// look at again until a change.
    pub fn starting_from(status: S) -> Self {
        Decision {
            actions: Vec::new(),
            status,
            requeue: Requeue::AwaitChange,
        }
    }

    /// Looks again after `after` at the latest: the sooner of this and any earlier ask.
    pub fn wake(&mut self, after: Duration) {
        self.requeue = self.requeue.sooner(Requeue::After(after));
    }
}

/// An operator's action enum tied to its kind's status: where that status keeps its conditions.
/// [`decision_types!`](crate::decision_types) implements it (every sluice status has
/// `conditions`).
pub trait Acts: crate::events::Announces {
    /// The status of the kind the operator decides on.
    type Status;

    /// The status' conditions.
    fn conditions(status: &mut Self::Status) -> &mut Vec<Condition>;
}

impl<A: Acts> Decision<A::Status, A> {
    /// Sets the condition `type_` of the next status as of `stamp` (see
    /// [`crate::conditions::Stamp::set`]); true when its status, reason, message or observed
    /// generation changed.
    pub fn condition(
        &mut self,
        stamp: crate::conditions::Stamp,
        type_: &str,
        status: crate::conditions::Status,
        reason: &str,
        message: impl Into<String>,
    ) -> bool {
        stamp.set(
            A::conditions(&mut self.status),
            type_,
            status,
            reason,
            message,
        )
    }
}

impl<S, A: crate::events::Announces> Decision<S, A> {
    /// Publishes `notice` (after the effects queued before it).
    pub fn event(&mut self, notice: crate::events::Notice) {
        self.actions.push(A::announce(notice));
    }

    /// The reasons of the Events the decision publishes, in order.
    pub fn event_reasons(&self) -> Vec<&'static str> {
        self.actions
            .iter()
            .filter_map(crate::events::Announces::event_reason)
            .collect()
    }
}

/// Appends `entry` to a status's history and drops the oldest entries beyond `max`, so a
/// long-lived object's status stays bounded.
pub fn record_bounded<T>(history: &mut Vec<T>, entry: T, max: usize) {
    history.push(entry);
    let excess = history.len().saturating_sub(max);
    history.drain(..excess);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sooner_takes_the_earlier_and_waiting_is_the_latest() {
        let s = Duration::from_secs;
        let table = [
            (
                Requeue::After(s(3)),
                Requeue::After(s(5)),
                Requeue::After(s(3)),
            ),
            (
                Requeue::AwaitChange,
                Requeue::After(s(5)),
                Requeue::After(s(5)),
            ),
            (
                Requeue::After(s(3)),
                Requeue::AwaitChange,
                Requeue::After(s(3)),
            ),
            (
                Requeue::AwaitChange,
                Requeue::AwaitChange,
                Requeue::AwaitChange,
            ),
        ];
        for (a, b, want) in table {
            assert_eq!(a.sooner(b), want, "{a:?} vs {b:?}");
            assert_eq!(b.sooner(a), want, "{b:?} vs {a:?}");
        }
    }

    #[test]
    fn the_action_counts_the_time_spent_and_never_spins() {
        let ms = Duration::from_millis;
        assert_eq!(
            Requeue::After(ms(1000)).action(ms(300), ms(50)),
            Action::requeue(ms(700))
        );
        assert_eq!(
            Requeue::After(ms(100)).action(ms(300), ms(50)),
            Action::requeue(ms(50)),
            "overdue: the floor"
        );
        assert_eq!(
            Requeue::AwaitChange.action(ms(300), ms(50)),
            Action::await_change()
        );
        assert_eq!(Requeue::After(ms(5)).after(), Some(ms(5)));
        assert_eq!(Requeue::AwaitChange.after(), None);
    }

    #[test]
    fn a_bounded_history_keeps_the_newest_entries() {
        let mut history = vec![1, 2, 3];
        record_bounded(&mut history, 4, 3);
        assert_eq!(history, vec![2, 3, 4]);
        record_bounded(&mut history, 5, 5);
        assert_eq!(history, vec![2, 3, 4, 5]);
        record_bounded(&mut history, 6, 0);
        assert!(history.is_empty());
    }

    mod toy {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

        use crate::events::Notice;

        #[derive(Debug, Clone, Default, PartialEq)]
        pub struct ToyStatus {
            pub conditions: Vec<Condition>,
        }

        #[derive(Debug, Clone, PartialEq)]
        pub enum Action {
            Write(u32),
            Event(Notice),
        }

        crate::decision_types! {
            /// A toy operator's decision.
            ToyStatus, Action
        }
    }

    #[test]
    fn a_decision_collects_effects_events_conditions_and_the_soonest_look_in_order() {
        use crate::{
            conditions::{Stamp, Status},
            events::Notice,
        };
        use toy::{Action, Decision};

        let ms = Duration::from_millis;
        let now = k8s_openapi::jiff::Timestamp::from_second(1_800_000_000).unwrap();
        let mut d = Decision::starting_from(toy::ToyStatus::default());
        assert_eq!(d.requeue, toy::Requeue::AwaitChange);
        d.actions.push(Action::Write(1));
        d.event(Notice::normal("Started", "Step", "step 0"));
        d.wake(ms(3000));
        d.wake(ms(1000));
        d.wake(ms(2000));
        let stamp = Stamp::new(Some(4), now);
        assert!(d.condition(stamp, "Ready", Status::True, "Valid", "ok"));
        assert!(!d.condition(stamp, "Ready", Status::True, "Valid", "ok"));
        assert_eq!(d.requeue, Requeue::After(ms(1000)));
        assert_eq!(d.event_reasons(), vec!["Started"]);
        assert_eq!(d.actions[0], Action::Write(1));
        assert_eq!(d.status.conditions.len(), 1);
        assert_eq!(d.status.conditions[0].observed_generation, Some(4));
    }
}
