//! What a tick reports without moving anything: the injection label the upgrade relies on, and
//! workloads or namespaces relabelling cannot move (a pod's own `istio.io/rev`, labels Argo CD
//! manages).

use std::collections::BTreeSet;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use sluice_api::v1alpha1::revision_upgrade::{WorkloadReport, conditions, reasons};
use sluice_runtime::{conditions::Status, events::Notice};

use super::model::{EventAction, Machine, REPORT_LIMIT};
use crate::fleet::{self};

impl Machine<'_> {
    pub(super) fn report_injection_label(&mut self) {
        let legacy = fleet::injection_enabled(&self.fleet.namespaces);
        if legacy.is_empty() {
            self.decision.condition(
                self.stamp(),
                conditions::INJECTION_LABEL_FOUND,
                Status::False,
                reasons::LEGACY_INJECTION_LABEL,
                "no namespace uses istio-injection=enabled",
            );
        } else {
            let msg = format!(
                "{} namespace(s) use istio-injection=enabled, which ignores istio.io/rev, so relabelling cannot move them: {}; replace that label with istio.io/rev={} to include them",
                legacy.len(),
                legacy.join(", "),
                self.spec.from_tag
            );
            if self.decision.status.injection_enabled_namespaces != legacy {
                self.decision.event(Notice::warning(
                    reasons::LEGACY_INJECTION_LABEL,
                    EventAction::Relabel,
                    msg.clone(),
                ));
            }
            self.decision.condition(
                self.stamp(),
                conditions::INJECTION_LABEL_FOUND,
                Status::True,
                reasons::LEGACY_INJECTION_LABEL,
                msg,
            );
        }
        self.decision.status.injection_enabled_namespaces = legacy;
    }

    /// Reports the workloads whose pods pin a revision with their own `istio.io/rev` label
    /// (relabelling the namespace cannot move them; they are not restarted), and the
    /// namespaces whose labels Argo CD manages.
    pub(super) fn report_overrides(&mut self) {
        let ours: BTreeSet<String> = self
            .decision
            .status
            .namespaces
            .iter()
            .map(|n| n.name.clone())
            .chain(
                self.fleet
                    .namespaces
                    .iter()
                    .filter(|n| n.rev() == Some(self.spec.from_tag.as_str()))
                    .map(|n| n.name.clone()),
            )
            .collect();
        let mut overrides: Vec<WorkloadReport> = Vec::new();
        for ns in &ours {
            for p in self.by_ns.get(ns.as_str()).into_iter().flatten() {
                let (Some(w), Some(label)) = (&p.workload, &p.rev_label) else {
                    continue;
                };
                let target = &self.spec.to_revision;
                if p.terminating || !self.overrides(p, target) {
                    continue;
                }
                if overrides
                    .iter()
                    .any(|r| r.namespace == p.namespace && r.kind == w.kind && r.name == w.name)
                {
                    continue;
                }
                let detected_at = self
                    .decision
                    .status
                    .pod_revision_overrides
                    .iter()
                    .find(|r| r.namespace == p.namespace && r.kind == w.kind && r.name == w.name)
                    .map_or(Time(self.now), |r| r.detected_at.clone());
                overrides.push(WorkloadReport {
                    namespace: p.namespace.clone(),
                    kind: w.kind.clone(),
                    name: w.name.clone(),
                    pod: p.name.clone(),
                    found: label.clone(),
                    detected_at,
                });
            }
        }
        overrides.sort_by(|a, b| {
            (&a.namespace, &a.kind, &a.name).cmp(&(&b.namespace, &b.kind, &b.name))
        });
        overrides.truncate(REPORT_LIMIT);
        let new: Vec<String> = overrides
            .iter()
            .filter(|r| {
                !self
                    .decision
                    .status
                    .pod_revision_overrides
                    .iter()
                    .any(|o| o.namespace == r.namespace && o.kind == r.kind && o.name == r.name)
            })
            .map(|r| {
                format!(
                    "{} {}/{} (istio.io/rev={})",
                    r.kind, r.namespace, r.name, r.found
                )
            })
            .collect();
        if !new.is_empty() {
            self.decision.event(Notice::warning(reasons::POD_REVISION_OVERRIDE,
                EventAction::Relabel,
                format!(
                    "pods pin their revision with their own istio.io/rev label, which wins over the namespace's, so they are not restarted: {}; set their label to {} (or remove it) to move them",
                    new.join(", "),
                    self.spec.to_tag
                )));
        }
        if overrides.is_empty() {
            self.decision.condition(
                self.stamp(),
                conditions::POD_REVISION_OVERRIDE,
                Status::False,
                reasons::NO_POD_OVERRIDE,
                "no pod of the upgrade's namespaces pins another revision",
            );
        } else {
            let list: Vec<String> = overrides
                .iter()
                .map(|r| {
                    format!(
                        "{} {}/{} (istio.io/rev={})",
                        r.kind, r.namespace, r.name, r.found
                    )
                })
                .collect();
            self.decision.condition(
                self.stamp(),
                conditions::POD_REVISION_OVERRIDE,
                Status::True,
                reasons::POD_REVISION_OVERRIDE,
                format!(
                    "pods pin their revision with their own istio.io/rev label and are not restarted: {}; set it to {} (or remove it) to move them",
                    list.join(", "),
                    self.spec.to_tag
                ),
            );
        }
        self.decision.status.pod_revision_overrides = overrides;

        let mut argo: Vec<String> = self
            .fleet
            .namespaces
            .iter()
            .filter(|n| n.argo_cd_managed && ours.contains(&n.name))
            .map(|n| n.name.clone())
            .collect();
        argo.sort();
        argo.truncate(REPORT_LIMIT);
        let setting = format!(
            "a self-healing Application puts Git's istio.io/rev back after sluice moves them; in each Application set ignoreDifferences (group \"\", kind Namespace, managedFieldsManagers [{}], or jsonPointers [/metadata/labels/istio.io~1rev]) with syncOptions RespectIgnoreDifferences=true, then change the label in Git to {} once the upgrade completes",
            crate::FIELD_MANAGER.as_str(),
            self.spec.to_tag
        );
        let new: Vec<&String> = argo
            .iter()
            .filter(|n| !self.decision.status.argo_cd_managed_namespaces.contains(n))
            .collect();
        if !new.is_empty() {
            let note = format!(
                "Argo CD manages namespace(s) {}: {setting}",
                new.iter()
                    .map(|s| s.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            self.decision.event(Notice::warning(
                reasons::ARGO_CD_MANAGES_NAMESPACE_LABELS,
                EventAction::Relabel,
                note,
            ));
        }
        if argo.is_empty() {
            self.decision.condition(
                self.stamp(),
                conditions::ARGO_CD_MANAGED_NAMESPACES,
                Status::False,
                reasons::NO_ARGO_CD_NAMESPACES,
                "no namespace of the upgrade carries Argo CD's tracking",
            );
        } else {
            self.decision.condition(
                self.stamp(),
                conditions::ARGO_CD_MANAGED_NAMESPACES,
                Status::True,
                reasons::ARGO_CD_MANAGES_NAMESPACE_LABELS,
                format!(
                    "Argo CD manages namespace(s) {}: {setting}",
                    argo.join(", ")
                ),
            );
        }
        self.decision.status.argo_cd_managed_namespaces = argo;
    }
}
