//! The shared Kubernetes Event recorder: one reporter per operator, Events about the objects it
//! reconciles.
//!
//! Owns the Event shape (type, CamelCase reason, action, bounded note) and the rule that a
//! failed Event never fails a reconcile (it is logged instead). Must never put secrets into a
//! note and never block a reconcile on Event delivery errors.

use k8s_openapi::api::core::v1::ObjectReference;
use kube::{
    Client, Resource,
    runtime::events::{Event, EventType, Recorder, Reporter},
};

/// Largest note the Events API accepts, in bytes.
pub const MAX_NOTE_BYTES: usize = 1024;
/// Largest reason or action the Events API accepts, in characters.
pub const MAX_REASON_CHARS: usize = 128;

/// Severity of an Event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Severity {
    /// Normal progress.
    Normal,
    /// Something needs attention.
    Warning,
}

/// One Event a decide step asks for about the object it decided on; the reconcile publishes it
/// with [`EventRecorder::announce`]. Every operator's actions carry their Events as this one type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notice {
    /// Normal or Warning.
    pub severity: Severity,
    /// CamelCase reason.
    pub reason: &'static str,
    /// CamelCase action.
    pub action: &'static str,
    /// Human-readable note.
    pub note: String,
}

impl Notice {
    /// A Normal Event.
    pub fn normal(
        reason: &'static str,
        action: impl Into<&'static str>,
        note: impl Into<String>,
    ) -> Self {
        Self {
            severity: Severity::Normal,
            reason,
            action: action.into(),
            note: note.into(),
        }
    }

    /// A Warning Event.
    pub fn warning(
        reason: &'static str,
        action: impl Into<&'static str>,
        note: impl Into<String>,
    ) -> Self {
        Self {
            severity: Severity::Warning,
            reason,
            action: action.into(),
            note: note.into(),
        }
    }
}

/// An operator's action type, some of whose actions are Events.
pub trait Announces: Sized {
    /// The action that publishes `notice`.
    fn announce(notice: Notice) -> Self;

    /// The Event this action is; `None` for an effect.
    fn notice(&self) -> Option<&Notice>;

    /// The reason of the Event this action is; `None` for an effect.
    fn event_reason(&self) -> Option<&'static str> {
        self.notice().map(|n| n.reason)
    }
}

/// Implements [`Announces`] for an operator's action enum, whose Events are its
/// `Event(Notice)` variant: `sluice_runtime::announces!(Action);`.
#[macro_export]
macro_rules! announces {
    ($action:ident) => {
        impl $crate::events::Announces for $action {
            fn announce(notice: $crate::events::Notice) -> Self {
                $action::Event(notice)
            }

            fn notice(&self) -> Option<&$crate::events::Notice> {
                match self {
                    $action::Event(notice) => Some(notice),
                    _ => None,
                }
            }
        }
    };
}

/// Records Events for one operator (the reporting controller), optionally naming the pod as
/// the reporting instance.
#[derive(Clone)]
pub struct EventRecorder {
    recorder: Recorder,
}

impl std::fmt::Debug for EventRecorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventRecorder").finish_non_exhaustive()
    }
}

/// Builds an Event with the API's size limits applied (reason and action cut to 128
/// characters, note cut to 1 KiB on a character boundary).
pub fn build(severity: Severity, reason: &str, action: &str, note: &str) -> Event {
    Event {
        type_: match severity {
            Severity::Normal => EventType::Normal,
            Severity::Warning => EventType::Warning,
        },
        reason: reason.chars().take(MAX_REASON_CHARS).collect(),
        action: action.chars().take(MAX_REASON_CHARS).collect(),
        note: (!note.is_empty()).then(|| truncate_bytes(note, MAX_NOTE_BYTES)),
        secondary: None,
    }
}

fn truncate_bytes(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_owned();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_owned()
}

impl EventRecorder {
    /// A recorder reporting as `controller` (the operator's name); the pod name from `POD_NAME`
    /// becomes the reporting instance when set.
    pub fn new(client: Client, controller: &str) -> Self {
        let reporter = Reporter {
            controller: controller.to_owned(),
            instance: std::env::var("POD_NAME").ok().filter(|s| !s.is_empty()),
        };
        Self {
            recorder: Recorder::new(client, reporter),
        }
    }

    /// Publishes an Event about `obj`. Delivery failures are logged, never returned.
    pub async fn publish<K>(
        &self,
        obj: &K,
        severity: Severity,
        reason: &str,
        action: &str,
        note: &str,
    ) where
        K: Resource<DynamicType = ()>,
    {
        let reference: ObjectReference = obj.object_ref(&());
        let event = build(severity, reason, action, note);
        if let Err(err) = self.recorder.publish(&event, &reference).await {
            tracing::warn!(
                error = %err,
                reason,
                kind = reference.kind.as_deref().unwrap_or_default(),
                namespace = reference.namespace.as_deref().unwrap_or_default(),
                name = reference.name.as_deref().unwrap_or_default(),
                "could not publish Event; check the operator's RBAC for events.k8s.io/events"
            );
        }
    }

    /// Publishes an Event about the object `reference` names (for work that outlives the
    /// reconcile holding the object, e.g. a notification delivered in the background). Delivery
    /// failures are logged, never returned.
    pub async fn publish_ref(
        &self,
        reference: &ObjectReference,
        severity: Severity,
        reason: &str,
        action: &str,
        note: &str,
    ) {
        let event = build(severity, reason, action, note);
        if let Err(err) = self.recorder.publish(&event, reference).await {
            tracing::warn!(
                error = %err,
                reason,
                kind = reference.kind.as_deref().unwrap_or_default(),
                namespace = reference.namespace.as_deref().unwrap_or_default(),
                name = reference.name.as_deref().unwrap_or_default(),
                "could not publish Event; check the operator's RBAC for events.k8s.io/events"
            );
        }
    }

    /// Publishes the Event a decide step asked for about `obj`.
    pub async fn announce<K>(&self, obj: &K, notice: &Notice)
    where
        K: Resource<DynamicType = ()>,
    {
        self.publish(
            obj,
            notice.severity,
            notice.reason,
            notice.action,
            &notice.note,
        )
        .await;
    }

    /// Publishes, in order, every Event among a decision's actions.
    pub async fn announce_all<K, A>(&self, obj: &K, actions: &[A])
    where
        K: Resource<DynamicType = ()>,
        A: Announces,
    {
        for notice in actions.iter().filter_map(A::notice) {
            self.announce(obj, notice).await;
        }
    }

    /// Publishes a Normal Event.
    pub async fn normal<K: Resource<DynamicType = ()>>(
        &self,
        obj: &K,
        reason: &str,
        action: &str,
        note: &str,
    ) {
        self.publish(obj, Severity::Normal, reason, action, note)
            .await;
    }

    /// Publishes a Warning Event.
    pub async fn warning<K: Resource<DynamicType = ()>>(
        &self,
        obj: &K,
        reason: &str,
        action: &str,
        note: &str,
    ) {
        self.publish(obj, Severity::Warning, reason, action, note)
            .await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_notice_is_found_among_actions_and_keeps_its_fields() {
        enum Act {
            Event(Notice),
            Write,
        }
        crate::announces!(Act);
        let acts = [
            Act::Write,
            Act::Event(Notice::warning("Aborted", "Abort", "gate failed")),
        ];
        let found: Vec<_> = acts.iter().filter_map(Announces::notice).collect();
        assert_eq!(
            found,
            [&Notice {
                severity: Severity::Warning,
                reason: "Aborted",
                action: "Abort",
                note: "gate failed".into(),
            }]
        );
        assert_eq!(acts[0].event_reason(), None);
        assert_eq!(acts[1].event_reason(), Some("Aborted"));
        assert_eq!(Notice::normal("R", "A", "n").severity, Severity::Normal);
    }

    #[test]
    fn limits_are_applied() {
        let long_reason = "R".repeat(300);
        let long_note = "é".repeat(1000); // 2 bytes each: 2000 bytes
        let table = [
            ("Ready", "Reconcile", "ok", 5, Some(2)),
            (long_reason.as_str(), "A", "", 128, None),
            ("Invalid", "Validate", long_note.as_str(), 7, Some(1024)),
        ];
        for (reason, action, note, want_reason_len, want_note_len) in table {
            let ev = build(Severity::Warning, reason, action, note);
            assert_eq!(ev.reason.chars().count(), want_reason_len);
            assert_eq!(ev.note.as_ref().map(String::len), want_note_len);
            assert_eq!(ev.type_, EventType::Warning);
        }
    }
}
