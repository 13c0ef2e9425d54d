//! An owner's gates against the GateTemplates they name: each template read once, and each gate
//! resolved with its owner's Inconclusive policy where neither the gate nor its template sets
//! one. A gate that cannot be resolved (its template missing or unreadable, a field that does
//! not parse) comes back with why, the message of the Inconclusive verdict
//! [`unevaluated`](crate::unevaluated) records for it.
//!
//! Owns the rules every operator that gates applies alike. Never reads the cluster itself: the
//! owner passes the read (`Api::<GateTemplate>::get_opt`), and the owner decides what a failed
//! read means (a retried reconcile, or the gates naming that template held as unevaluated).

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt,
    future::Future,
};

use sluice_api::v1alpha1::{
    Gate, GateResolveError, GateTemplateSpec, InconclusivePolicy, ResolvedGate,
};

/// `gate` resolved against `template`, the GateTemplate it names (`None` when it names none, or
/// when that template does not exist: then [`GateResolveError::TemplateMissing`]). The owner's
/// `inconclusive` policy applies where neither the gate nor the template sets one; a locked
/// template keeps its own policy (or the default), as nothing the gate sets applies beside it.
/// `None`: the resolved gate's own default applies.
pub fn resolve_gate(
    gate: &Gate,
    template: Option<&GateTemplateSpec>,
    inconclusive: Option<&InconclusivePolicy>,
) -> Result<ResolvedGate, GateResolveError> {
    let owner_policy = inconclusive.filter(|_| {
        gate.definition.inconclusive.is_none()
            && template.is_none_or(|t| t.definition.inconclusive.is_none() && !t.locked)
    });
    match owner_policy {
        Some(policy) => {
            let mut g = gate.clone();
            g.definition.inconclusive = Some(policy.clone());
            g.resolve(template)
        }
        None => gate.resolve(template),
    }
}

/// The names of the GateTemplates `gates` name, each once, in order of name.
pub fn template_names<'g>(gates: impl IntoIterator<Item = &'g Gate>) -> BTreeSet<&'g str> {
    gates
        .into_iter()
        .filter_map(|g| g.template_ref.as_deref())
        .collect()
}

/// Reads each GateTemplate `gates` name once with `read` (`Ok(None)`: it does not exist), in
/// order of name, and stops at the first failed read: for an owner whose reconcile is retried
/// when a read fails. A template that does not exist is absent from the map.
pub async fn read_templates<'g, E, F, Fut>(
    gates: impl IntoIterator<Item = &'g Gate>,
    mut read: F,
) -> Result<BTreeMap<String, GateTemplateSpec>, E>
where
    F: FnMut(String) -> Fut,
    Fut: Future<Output = Result<Option<GateTemplateSpec>, E>>,
{
    let mut found = BTreeMap::new();
    for name in template_names(gates) {
        if let Some(t) = read(name.to_owned()).await? {
            found.insert(name.to_owned(), t);
        }
    }
    Ok(found)
}

/// The GateTemplates an owner's gates name, each read once, a failed read kept for the gates
/// naming that template: for an owner that judges the other gates all the same.
#[derive(Debug)]
pub struct GateTemplates<E> {
    /// The templates read, by name (one that does not exist is absent).
    pub found: BTreeMap<String, GateTemplateSpec>,
    /// The templates that could not be read, by name, with the error.
    pub unreadable: BTreeMap<String, E>,
}

impl<E: fmt::Display> GateTemplates<E> {
    /// Reads each GateTemplate `gates` name once with `read` (`Ok(None)`: it does not exist), in
    /// order of name; a failed read does not stop the others.
    pub async fn read<'g, F, Fut>(gates: impl IntoIterator<Item = &'g Gate>, mut read: F) -> Self
    where
        F: FnMut(String) -> Fut,
        Fut: Future<Output = Result<Option<GateTemplateSpec>, E>>,
    {
        let mut out = GateTemplates {
            found: BTreeMap::new(),
            unreadable: BTreeMap::new(),
        };
        for name in template_names(gates) {
            match read(name.to_owned()).await {
                Ok(Some(t)) => {
                    out.found.insert(name.to_owned(), t);
                }
                Ok(None) => {}
                Err(e) => {
                    out.unreadable.insert(name.to_owned(), e);
                }
            }
        }
        out
    }

    /// `gate` resolved as [`resolve_gate`] does, or why it cannot be evaluated: its template
    /// could not be read (`reading GateTemplate <name>: <error>`), or the gate does not resolve
    /// (the [`GateResolveError`]'s message).
    pub fn resolve(
        &self,
        gate: &Gate,
        inconclusive: Option<&InconclusivePolicy>,
    ) -> Result<ResolvedGate, String> {
        if let Some(name) = gate.template_ref.as_deref()
            && let Some(e) = self.unreadable.get(name)
        {
            return Err(format!("reading GateTemplate {name}: {e}"));
        }
        let template = gate
            .template_ref
            .as_deref()
            .and_then(|name| self.found.get(name));
        resolve_gate(gate, template, inconclusive).map_err(|e| e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use std::{cell::RefCell, time::Duration};

    use sluice_api::v1alpha1::InconclusiveAction;

    use super::*;

    fn gate(json: serde_json::Value) -> Gate {
        serde_json::from_value(json).unwrap()
    }

    fn template(json: serde_json::Value) -> GateTemplateSpec {
        serde_json::from_value(json).unwrap()
    }

    fn policy(action: InconclusiveAction, after: &str) -> InconclusivePolicy {
        serde_json::from_value(serde_json::json!({"action": action, "after": after})).unwrap()
    }

    #[test]
    fn whose_inconclusive_policy_applies_table() {
        let owner = policy(InconclusiveAction::Abort, "1m");
        let own = serde_json::json!({"action": "Continue", "after": "2m"});
        let open = template(serde_json::json!({"builtin": "ErrorRatioVsStable"}));
        let open_with_policy = template(serde_json::json!({
            "builtin": "ErrorRatioVsStable", "inconclusive": own
        }));
        let locked = template(serde_json::json!({
            "builtin": "ErrorRatioVsStable", "locked": true
        }));
        let inline = gate(serde_json::json!({"name": "g", "builtin": "ErrorRatioVsStable"}));
        let inline_with_policy = gate(serde_json::json!({
            "name": "g", "builtin": "ErrorRatioVsStable", "inconclusive": own
        }));
        let by_ref = gate(serde_json::json!({"name": "g", "templateRef": "t"}));
        let by_ref_with_policy = gate(serde_json::json!({
            "name": "g", "templateRef": "t", "inconclusive": own
        }));
        let owners = (InconclusiveAction::Abort, Duration::from_secs(60));
        let gates = (InconclusiveAction::Continue, Duration::from_secs(120));
        let default = (InconclusiveAction::Pause, Duration::from_secs(300));
        let cases = [
            ("inline gate, owner's", &inline, None, Some(&owner), owners),
            ("inline gate, no owner policy", &inline, None, None, default),
            ("gate's own", &inline_with_policy, None, Some(&owner), gates),
            (
                "open template, owner's",
                &by_ref,
                Some(&open),
                Some(&owner),
                owners,
            ),
            (
                "template's own",
                &by_ref,
                Some(&open_with_policy),
                Some(&owner),
                gates,
            ),
            (
                "gate's own over an open template",
                &by_ref_with_policy,
                Some(&open),
                Some(&owner),
                gates,
            ),
            (
                "locked template keeps the default",
                &by_ref,
                Some(&locked),
                Some(&owner),
                default,
            ),
            (
                "locked template ignores the gate's",
                &by_ref_with_policy,
                Some(&locked),
                Some(&owner),
                default,
            ),
        ];
        for (what, g, t, p, (action, after)) in cases {
            let r = resolve_gate(g, t, p).unwrap_or_else(|e| panic!("{what}: {e}"));
            assert_eq!(
                (r.inconclusive_action, r.inconclusive_after),
                (action, after),
                "{what}"
            );
        }
    }

    #[test]
    fn a_missing_template_does_not_resolve() {
        let g = gate(serde_json::json!({"name": "g", "templateRef": "absent"}));
        let owner = InconclusivePolicy::default();
        for p in [None, Some(&owner)] {
            assert!(matches!(
                resolve_gate(&g, None, p),
                Err(GateResolveError::TemplateMissing { ref gate, ref template })
                    if gate == "g" && template == "absent"
            ));
        }
    }

    #[tokio::test]
    async fn each_template_is_read_once_and_a_failed_read_holds_only_its_gates() {
        let gates = [
            gate(serde_json::json!({"name": "a", "templateRef": "t"})),
            gate(serde_json::json!({"name": "b", "templateRef": "t"})),
            gate(serde_json::json!({"name": "c", "templateRef": "broken"})),
            gate(serde_json::json!({"name": "d", "templateRef": "absent"})),
            gate(serde_json::json!({"name": "e", "builtin": "ErrorRatioVsStable"})),
        ];
        let reads = RefCell::new(Vec::new());
        let read = |name: String| {
            reads.borrow_mut().push(name.clone());
            async move {
                match name.as_str() {
                    "t" => Ok(Some(template(
                        serde_json::json!({"builtin": "LatencyP99VsStable"}),
                    ))),
                    "broken" => Err("connection refused"),
                    _ => Ok(None),
                }
            }
        };
        let templates = GateTemplates::read(&gates, read).await;
        assert_eq!(*reads.borrow(), ["absent", "broken", "t"]);
        let resolved: Vec<Result<String, String>> = gates
            .iter()
            .map(|g| templates.resolve(g, None).map(|r| r.name))
            .collect();
        assert_eq!(resolved[0], Ok("a".to_owned()));
        assert_eq!(resolved[1], Ok("b".to_owned()));
        assert_eq!(
            resolved[2],
            Err("reading GateTemplate broken: connection refused".to_owned())
        );
        let missing = resolve_gate(&gates[3], None, None).unwrap_err().to_string();
        assert_eq!(resolved[3], Err(missing));
        assert_eq!(resolved[4], Ok("e".to_owned()));
    }

    #[tokio::test]
    async fn reading_for_a_retried_reconcile_stops_at_the_first_failure() {
        let gates = [
            gate(serde_json::json!({"name": "a", "templateRef": "t1"})),
            gate(serde_json::json!({"name": "b", "templateRef": "t2"})),
            gate(serde_json::json!({"name": "c", "templateRef": "t3"})),
            gate(serde_json::json!({"name": "d", "templateRef": "t1"})),
        ];
        let reads = RefCell::new(Vec::new());
        let found = read_templates(&gates, |name: String| {
            reads.borrow_mut().push(name.clone());
            async move {
                match name.as_str() {
                    "t1" => Ok(Some(template(
                        serde_json::json!({"builtin": "ErrorRatioVsStable"}),
                    ))),
                    "t2" => Ok(None),
                    _ => Err("forbidden"),
                }
            }
        })
        .await;
        assert_eq!(found, Err("forbidden"));
        assert_eq!(*reads.borrow(), ["t1", "t2", "t3"]);
        let found = read_templates(&gates[..2], |name: String| async move {
            Ok::<_, &str>(
                (name == "t1")
                    .then(|| template(serde_json::json!({"builtin": "ErrorRatioVsStable"}))),
            )
        })
        .await
        .unwrap();
        assert_eq!(found.keys().collect::<Vec<_>>(), ["t1"]);
    }
}
