//! Relabelling: moving a wave's namespaces from the old tag to the new one, noticing when the new
//! label is seen, namespaces relabelled by someone else, and workloads re-injected by the old
//! revision. Never touches a namespace relabelled by someone else.

use std::collections::BTreeSet;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use sluice_api::v1alpha1::revision_upgrade::{
    NamespaceState, RelabelDetection, WorkloadReport, conditions, reasons,
};
use sluice_runtime::{
    conditions::{self as cond, Status},
    events::Notice,
};

use super::model::{
    Action, EventAction, Machine, REINJECTION_GRACE, REPORT_LIMIT, TICK, elapsed, to_ms,
};
use crate::fleet::NamespaceView;

impl Machine<'_> {
    /// Detects namespaces relabelled by someone else after sluice moved them (and clears the
    /// report once the label is back on the new tag).
    pub(super) fn watch_relabels(&mut self) {
        let mut found = Vec::new();
        for n in &self.decision.status.namespaces {
            let moved = matches!(n.state, NamespaceState::Restarting | NamespaceState::Moved)
                && n.relabelled_at.is_some();
            if !moved {
                continue;
            }
            let rev = self
                .ns_view(&n.name)
                .and_then(NamespaceView::rev)
                .unwrap_or("")
                .to_owned();
            if rev != self.spec.to_tag {
                found.push((n.name.clone(), rev));
            }
        }
        let before: BTreeSet<String> = self
            .decision
            .status
            .relabelled_back
            .iter()
            .map(|r| r.namespace.clone())
            .collect();
        let mut list = Vec::new();
        for (namespace, rev) in found {
            if let Some(old) = self
                .decision
                .status
                .relabelled_back
                .iter()
                .find(|r| r.namespace == namespace && r.found == rev)
            {
                list.push(old.clone());
                continue;
            }
            if !before.contains(&namespace) {
                self.decision.event(Notice::warning(reasons::NAMESPACE_RELABELLED_BACK,
                    EventAction::Relabel,
                    format!(
                        "namespace {namespace} was relabelled istio.io/rev={rev:?} by someone else after sluice set {}; its pods are not restarted until the label is {} again (with Argo CD, see the README's ignoreDifferences setting)",
                        self.spec.to_tag, self.spec.to_tag
                    )));
            }
            list.push(RelabelDetection {
                namespace,
                found: rev,
                detected_at: Time(self.now),
            });
        }
        if list.is_empty() {
            self.decision.condition(
                self.stamp(),
                conditions::RELABELLED_BACK,
                Status::False,
                reasons::NAMESPACE_RELABELLED_BACK,
                "every moved namespace keeps the new tag",
            );
        } else {
            let names: Vec<&str> = list.iter().map(|r| r.namespace.as_str()).collect();
            self.decision.condition(
                self.stamp(),
                conditions::RELABELLED_BACK,
                Status::True,
                reasons::NAMESPACE_RELABELLED_BACK,
                format!(
                    "namespace(s) relabelled by someone else after sluice moved them: {}; their wave cannot finish until istio.io/rev={} is restored (with Argo CD, ignore that label's differences)",
                    names.join(", "),
                    self.spec.to_tag
                ),
            );
        }
        self.decision.status.relabelled_back = list;
    }

    pub(super) fn tags_ok(&mut self) -> bool {
        let mut problems = Vec::new();
        for (tag, rev) in [
            (&self.spec.from_tag, &self.spec.from_revision),
            (&self.spec.to_tag, &self.spec.to_revision),
        ] {
            match self.fleet.tags.get(tag) {
                Some(found) if found == rev => {}
                Some(found) => problems.push(format!(
                    "revision tag {tag} points to revision {found}, not {rev}"
                )),
                None => problems.push(format!(
                    "revision tag {tag} has no injector webhook (MutatingWebhookConfiguration istio-revision-tag-{tag})"
                )),
            }
        }
        if problems.is_empty() {
            return true;
        }
        let msg = format!(
            "{}; nothing is moved until the tags point to the spec's revisions (istioctl tag set)",
            problems.join("; ")
        );
        let known = cond::find(&self.decision.status.conditions, conditions::PROGRESSING)
            .is_some_and(|c| c.reason == reasons::TAG_MISMATCH && c.message == msg);
        if !known {
            self.decision.event(Notice::warning(
                reasons::TAG_MISMATCH,
                EventAction::Wave,
                msg.clone(),
            ));
        }
        self.decision.condition(
            self.stamp(),
            conditions::PROGRESSING,
            Status::False,
            reasons::TAG_MISMATCH,
            msg,
        );
        false
    }

    /// Relabels the namespaces of wave `index` (or every rolling-back namespace when `index` is
    /// `usize::MAX`) from `from` to `to`, and records when the new label was first seen.
    pub(super) fn relabel(&mut self, index: usize, from: &str, to: &str) {
        let wave = self
            .decision
            .status
            .waves
            .get(index)
            .map(|w| w.name.clone());
        // When the relabel was asked for (the wave's start, or the abort, which asks at once):
        // it is asked again only a tick later, while the quicker rechecks wait for the watch to
        // show it.
        let asked = match &wave {
            Some(_) => self.decision.status.waves[index].started_at.clone(),
            None => self.decision.status.aborted_at.clone(),
        };
        let asked = asked.as_ref();
        let mut actions = Vec::new();
        for i in 0..self.decision.status.namespaces.len() {
            let n = &self.decision.status.namespaces[i];
            let ours = match &wave {
                Some(w) => &n.wave == w,
                None => n.state == NamespaceState::RollingBack,
            };
            if !ours {
                continue;
            }
            let rev = self
                .fleet
                .namespaces
                .iter()
                .find(|v| v.name == n.name)
                .and_then(NamespaceView::rev)
                .map(str::to_owned);
            let n = &mut self.decision.status.namespaces[i];
            match n.state {
                NamespaceState::Pending => {
                    n.state = NamespaceState::Restarting;
                    actions.push(Action::Relabel {
                        namespace: n.name.clone(),
                        from: from.into(),
                        to: to.into(),
                    });
                }
                NamespaceState::Restarting | NamespaceState::RollingBack
                    if n.relabelled_at.is_none() =>
                {
                    if rev.as_deref() == Some(to) {
                        n.relabelled_at = Some(Time(self.now));
                    } else if rev.as_deref() == Some(from)
                        && asked.is_none_or(|t| t.0 == self.now || elapsed(t, self.now) >= TICK)
                    {
                        // The previous relabel did not land (or not yet): ask again.
                        actions.push(Action::Relabel {
                            namespace: n.name.clone(),
                            from: from.into(),
                            to: to.into(),
                        });
                    }
                }
                _ => {}
            }
        }
        self.decision.actions.extend(actions);
    }

    /// Stops (and reports) every workload of a moving namespace carrying its target label
    /// whose pod created after the new label was seen runs another revision than the target:
    /// its pods would come back on that revision however often they were evicted.
    pub(super) fn detect_reinjection(&mut self, state: NamespaceState, target: &str, label: &str) {
        let grace = REINJECTION_GRACE.as_millis() as i64;
        let mut found: Vec<WorkloadReport> = Vec::new();
        for n in self
            .decision
            .status
            .namespaces
            .iter()
            .filter(|n| n.state == state)
        {
            let Some(seen) = n.relabelled_at.as_ref() else {
                continue;
            };
            if self.ns_view(&n.name).and_then(NamespaceView::rev) != Some(label) {
                continue;
            }
            for p in self.by_ns.get(n.name.as_str()).into_iter().flatten() {
                let Some(w) = &p.workload else { continue };
                let late = p.created_ms.is_some_and(|c| c > to_ms(seen) + grace);
                if !late || p.terminating || p.revision == target || w.kind == "Job" {
                    continue;
                }
                if self.overrides(p, target) {
                    continue; // its own label says so: reported as an override
                }
                let known = |r: &WorkloadReport| {
                    r.namespace == p.namespace && r.kind == w.kind && r.name == w.name
                };
                if self
                    .decision
                    .status
                    .reinjected_by_old_revision
                    .iter()
                    .any(known)
                    || found.iter().any(known)
                {
                    continue;
                }
                found.push(WorkloadReport {
                    namespace: p.namespace.clone(),
                    kind: w.kind.clone(),
                    name: w.name.clone(),
                    pod: p.name.clone(),
                    found: p.revision.clone(),
                    detected_at: Time(self.now),
                });
            }
        }
        for r in found {
            if self.decision.status.reinjected_by_old_revision.len() >= REPORT_LIMIT {
                break;
            }
            self.decision.event(Notice::warning(reasons::REINJECTED_BY_OLD_REVISION,
                EventAction::Relabel,
                format!(
                    "{} {}/{}: pod {} was created after namespace {} carried istio.io/rev={label} and was injected by revision {}, not {target}; the workload is not restarted again (check a pod-level istio.io/rev label added at admission, or the {label} tag's injector)",
                    r.kind, r.namespace, r.name, r.pod, r.namespace, r.found
                )));
            self.decision.status.reinjected_by_old_revision.push(r);
        }
        if self.decision.status.reinjected_by_old_revision.is_empty() {
            self.decision.condition(
                self.stamp(),
                conditions::REINJECTED_BY_OLD_REVISION,
                Status::False,
                reasons::NO_REINJECTION,
                "every replacement came back on its namespace's new revision",
            );
        } else {
            let list: Vec<String> = self
                .decision
                .status
                .reinjected_by_old_revision
                .iter()
                .map(|r| format!("{} {}/{} ({})", r.kind, r.namespace, r.name, r.found))
                .collect();
            self.decision.condition(
                self.stamp(),
                conditions::REINJECTED_BY_OLD_REVISION,
                Status::True,
                reasons::REINJECTED_BY_OLD_REVISION,
                format!(
                    "replacement pods came back on another revision than their namespace's label selects, so these workloads are stopped, not evicted again: {}",
                    list.join(", ")
                ),
            );
        }
    }
}
