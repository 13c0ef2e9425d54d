//! What a watch event of an operator's own kind changed, and whether it starts a reconcile.
//!
//! Owns the classification of each event of the primary watch (listed, a change of what the
//! object asks for, or a change of its status alone) and the rule that an operator may ignore
//! status-only changes: its own status writes come back through its own watch, and at a thousand
//! objects those echoes are most of its reconciles. Pure, no I/O; the stream wiring is in
//! [`crate::operator`].

use std::{
    collections::hash_map::DefaultHasher,
    hash::{Hash, Hasher},
};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// Which changes of an operator's own objects start a reconcile.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PrimaryChanges {
    /// Every event of the watch (kube-runtime's default).
    #[default]
    Every,
    /// Every event except a change of the status alone: the spec (generation), labels,
    /// annotations, finalizers and the deletion start a reconcile, a status write does not. An
    /// operator that chooses this requeues itself whenever its own status write leaves it more to
    /// do.
    IgnoreStatusOnly,
}

/// What one watch event changed, compared with the version of the object seen before.
#[derive(Clone, Copy, Debug, PartialEq, Eq, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
pub enum Change {
    /// Listed by the watch's (re)list: nothing to compare with.
    Listed,
    /// First seen after the list, or a change of the spec, labels, annotations, finalizers or
    /// deletion.
    Control,
    /// Only the status (or another field that moves neither the generation nor the metadata
    /// above) changed.
    StatusOnly,
}

impl Change {
    /// The metric label of this change.
    pub fn label(self) -> &'static str {
        self.into()
    }
}

/// A fingerprint of what is asked of an object: its generation (the spec, for a kind with a
/// status subresource), labels, annotations, finalizers and whether it is being deleted.
pub fn control_fingerprint(meta: &ObjectMeta) -> u64 {
    let mut h = DefaultHasher::new();
    meta.generation.hash(&mut h);
    meta.labels.hash(&mut h);
    meta.annotations.hash(&mut h);
    meta.finalizers.hash(&mut h);
    meta.deletion_timestamp.is_some().hash(&mut h);
    h.finish()
}

/// The change an applied object makes after `before` (its previous fingerprint, if seen since the
/// last list).
pub fn classify(before: Option<u64>, now: u64) -> Change {
    match before {
        Some(b) if b == now => Change::StatusOnly,
        _ => Change::Control,
    }
}

impl PrimaryChanges {
    /// Whether `change` starts a reconcile.
    pub fn reconciles(self, change: Change) -> bool {
        match self {
            PrimaryChanges::Every => true,
            PrimaryChanges::IgnoreStatusOnly => change != Change::StatusOnly,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    use super::*;

    fn meta() -> ObjectMeta {
        ObjectMeta {
            name: Some("checkout".into()),
            generation: Some(3),
            resource_version: Some("100".into()),
            labels: Some(BTreeMap::from([("team".into(), "pay".into())])),
            annotations: Some(BTreeMap::from([("a".into(), "1".into())])),
            finalizers: Some(vec!["sluice.dev/route".into()]),
            ..ObjectMeta::default()
        }
    }

    #[test]
    fn a_status_write_is_status_only_and_everything_a_user_asks_is_not() {
        let before = control_fingerprint(&meta());
        // A status write moves the resourceVersion and managedFields, nothing else here.
        let mut status_write = meta();
        status_write.resource_version = Some("101".into());
        assert_eq!(
            classify(Some(before), control_fingerprint(&status_write)),
            Change::StatusOnly
        );

        type Edit = fn(&mut ObjectMeta);
        let edits: [(&str, Edit); 5] = [
            ("spec", |m| m.generation = Some(4)),
            ("label", |m| {
                m.labels
                    .get_or_insert_default()
                    .insert("x".into(), "y".into());
            }),
            ("annotation", |m| {
                m.annotations
                    .get_or_insert_default()
                    .insert("a".into(), "2".into());
            }),
            ("finalizer", |m| m.finalizers = None),
            ("deletion", |m| {
                m.deletion_timestamp = Some(Time(jiff::Timestamp::UNIX_EPOCH));
            }),
        ];
        for (what, edit) in edits {
            let mut m = meta();
            edit(&mut m);
            assert_eq!(
                classify(Some(before), control_fingerprint(&m)),
                Change::Control,
                "{what}"
            );
        }
        assert_eq!(classify(None, before), Change::Control, "first seen");
    }

    #[test]
    fn only_the_ignoring_mode_skips_status_only_changes() {
        for change in [Change::Listed, Change::Control, Change::StatusOnly] {
            assert!(PrimaryChanges::Every.reconciles(change));
        }
        assert!(PrimaryChanges::IgnoreStatusOnly.reconciles(Change::Listed));
        assert!(PrimaryChanges::IgnoreStatusOnly.reconciles(Change::Control));
        assert!(!PrimaryChanges::IgnoreStatusOnly.reconciles(Change::StatusOnly));
        assert_eq!(Change::StatusOnly.label(), "status_only");
    }
}
