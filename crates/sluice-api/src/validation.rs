//! Pure validation of sluice.dev objects: everything the CRD's CEL rules check (so an operator
//! refuses a bad object even where the API server did not run them) and what CEL cannot express
//! (step ordering, PromQL template variables, the free-form PromQL policy, selector shape).
//!
//! Owns [`FieldError`] and the `validate` methods of every kind. Never reads the cluster and
//! never resolves GateTemplates (a missing template is the operator's runtime condition).

use std::collections::BTreeSet;
use std::fmt;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use crate::v1alpha1::bundle_pin::{BundlePin, BundlePinSpec};
use crate::v1alpha1::common::{DurationString, is_digest};
use crate::v1alpha1::gate::{
    Comparison, Gate, GateDefinition, KNOWN_VARIABLES, template_variables,
};
use crate::v1alpha1::gate_template::{GateTemplate, GateTemplateSpec};
use crate::v1alpha1::revision_upgrade::{RevisionUpgrade, RevisionUpgradeSpec};
use crate::v1alpha1::rollout::{Rollout, RolloutSpec, StepKind};
use crate::v1alpha1::wave_gate::{DriftExporter, WaveGate, WaveGateSpec};

/// One problem in an object, located by its field path (e.g. `spec.steps[2].setWeight.weight`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldError {
    /// Path of the offending field, from the object root.
    pub path: String,
    /// What is wrong and what to do about it.
    pub message: String,
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path, self.message)
    }
}

impl std::error::Error for FieldError {}

/// Joins errors into one condition message (`; `-separated, in order).
pub fn join(errors: &[FieldError]) -> String {
    errors
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

#[derive(Default)]
struct Errors(Vec<FieldError>);

impl Errors {
    fn push(&mut self, path: impl Into<String>, message: impl Into<String>) {
        self.0.push(FieldError {
            path: path.into(),
            message: message.into(),
        });
    }

    fn duration(&mut self, path: &str, d: &DurationString, positive: bool) {
        match d.parse() {
            Err(e) => self.push(path, e.to_string()),
            Ok(v) if positive && v.is_zero() => {
                self.push(path, "must be greater than 0; write e.g. 30s")
            }
            Ok(_) => {}
        }
    }

    fn non_empty(&mut self, path: &str, s: &str, what: &str) {
        if s.trim().is_empty() {
            self.push(path, format!("{what} is required; it must not be empty"));
        }
    }

    fn digest(&mut self, path: &str, s: &str) {
        if !is_digest(s) {
            self.push(
                path,
                format!(
                    "{s:?} is not a manifest digest; write sha256: followed by 64 lowercase hex digits (a tag is never accepted)"
                ),
            );
        }
    }
}

fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

fn is_identifier(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_lowercase())
        && chars.all(|c| c.is_ascii_alphanumeric())
        && s.len() <= 63
}

/// Whether an OCI repository reference names no tag and no digest.
fn repository_without_tag(repo: &str) -> bool {
    let path = repo.strip_prefix("oci://").unwrap_or(repo);
    if path.contains('@') {
        return false;
    }
    let Some((host, rest)) = path.split_once('/') else {
        return false;
    };
    !host.is_empty()
        && !rest.is_empty()
        && !rest.contains(':')
        && !rest.split('/').any(str::is_empty)
}

fn validate_comparison(errs: &mut Errors, path: &str, c: &Comparison) {
    let set = [
        c.absolute.is_some(),
        c.relative.is_some(),
        c.share.is_some(),
    ]
    .iter()
    .filter(|b| **b)
    .count();
    if set != 1 {
        errs.push(path, "set exactly one of absolute, relative or share");
    }
    if let Some(a) = &c.absolute
        && !a.value.is_finite()
    {
        errs.push(format!("{path}.absolute.value"), "must be a finite number");
    }
    if let Some(r) = &c.relative {
        if !(r.factor.is_finite() && r.factor > 0.0) {
            errs.push(
                format!("{path}.relative.factor"),
                "must be a finite number greater than 0 (e.g. 1.5 for at most 1.5× the baseline)",
            );
        }
        if let Some(s) = r.slack
            && !(s.is_finite() && s >= 0.0)
        {
            errs.push(
                format!("{path}.relative.slack"),
                "must be a finite number ≥ 0",
            );
        }
    }
    if let Some(s) = &c.share
        && let Some(t) = s.tolerance_percent
        && !(1..=100).contains(&t)
    {
        errs.push(
            format!("{path}.share.tolerancePercent"),
            "must be between 1 and 100",
        );
    }
}

/// Checks the fields of a definition that are the same for inline gates and templates.
fn validate_definition(
    errs: &mut Errors,
    path: &str,
    d: &GateDefinition,
    declared: &BTreeSet<&str>,
) {
    if let Some(q) = &d.promql {
        if q.trim().is_empty() {
            errs.push(format!("{path}.promql"), "must not be empty");
        }
        for var in template_variables(q) {
            if !KNOWN_VARIABLES.contains(&var.as_str()) && !declared.contains(var.as_str()) {
                errs.push(
                    format!("{path}.promql"),
                    format!(
                        "unknown template variable {{{{{var}}}}}; use one of {} or declare it in variables",
                        KNOWN_VARIABLES.join(", ")
                    ),
                );
            }
        }
    }
    if let Some(c) = &d.comparison {
        validate_comparison(errs, &format!("{path}.comparison"), c);
    }
    if let Some(w) = &d.window {
        errs.duration(&format!("{path}.window"), w, true);
    }
    if let Some(i) = &d.interval {
        errs.duration(&format!("{path}.interval"), i, true);
    }
    if let Some(p) = &d.inconclusive {
        errs.duration(&format!("{path}.inconclusive.after"), &p.after, false);
    }
    if d.consecutive_failures == Some(0) {
        errs.push(format!("{path}.consecutiveFailures"), "must be at least 1");
    }
}

fn validate_variables<'a>(
    errs: &mut Errors,
    path: &str,
    vars: impl Iterator<Item = &'a String>,
) -> BTreeSet<&'a str> {
    let mut declared = BTreeSet::new();
    for k in vars {
        if !is_identifier(k) {
            errs.push(
                format!("{path}.variables.{k}"),
                "variable names are lowerCamelCase identifiers (letters and digits, starting with a lowercase letter)",
            );
        } else if KNOWN_VARIABLES.contains(&k.as_str()) {
            errs.push(
                format!("{path}.variables.{k}"),
                "this variable is filled in by the operator from the object and cannot be overridden; remove it",
            );
        }
        declared.insert(k.as_str());
    }
    declared
}

/// Validates a list of gates at `path` (e.g. `spec.gates`).
pub fn validate_gates(gates: &[Gate], path: &str, allow_free_form: bool) -> Vec<FieldError> {
    let mut errs = Errors::default();
    gates_into(&mut errs, gates, path, allow_free_form);
    errs.0
}

fn gates_into(errs: &mut Errors, gates: &[Gate], path: &str, allow_free_form: bool) {
    if gates.len() > 16 {
        errs.push(
            path,
            "at most 16 gates; move shared checks into GateTemplates",
        );
    }
    let mut names = BTreeSet::new();
    for (i, g) in gates.iter().enumerate() {
        let p = format!("{path}[{i}]");
        if !is_dns_label(&g.name) {
            errs.push(
                format!("{p}.name"),
                "must be a DNS label (lowercase letters, digits, '-', at most 63 characters)",
            );
        }
        if !names.insert(g.name.as_str()) {
            errs.push(
                format!("{p}.name"),
                format!("gate name {:?} is used twice; names must be unique", g.name),
            );
        }
        let d = &g.definition;
        let set = [
            g.template_ref.is_some(),
            d.promql.is_some(),
            d.builtin.is_some(),
        ]
        .iter()
        .filter(|b| **b)
        .count();
        if set != 1 {
            errs.push(
                p.clone(),
                "set exactly one of templateRef (a GateTemplate's name), promql or builtin",
            );
        }
        if d.promql.is_some() && !allow_free_form {
            errs.push(
                format!("{p}.promql"),
                "free-form PromQL is disabled for namespaced objects (it would run with the operator's view of every team's metrics); reference a GateTemplate with templateRef, or ask the platform team to enable free-form PromQL",
            );
        }
        if let Some(t) = &g.template_ref
            && t.trim().is_empty()
        {
            errs.push(format!("{p}.templateRef"), "must name a GateTemplate");
        }
        if let Some(b) = d.builtin
            && d.comparison.is_none()
            && b.default_comparison().is_none()
        {
            errs.push(
                format!("{p}.comparison"),
                format!("built-in gate {b} has no default judgement; set comparison"),
            );
        }
        if d.promql.is_some() && d.comparison.is_none() {
            errs.push(
                format!("{p}.comparison"),
                "a PromQL gate needs a comparison",
            );
        }
        let declared = validate_variables(errs, &p, g.variables.keys());
        // With a templateRef the template may declare more variables: only inline PromQL is
        // checked here; the template's own validation covers its PromQL.
        validate_definition(errs, &p, d, &declared);
    }
}

impl GateTemplateSpec {
    /// Validates a template (cluster-scoped: free-form PromQL is the point of a template).
    pub fn validate(&self) -> Vec<FieldError> {
        let mut errs = Errors::default();
        let d = &self.definition;
        match (d.promql.is_some(), d.builtin.is_some()) {
            (true, true) | (false, false) => {
                errs.push("spec", "set exactly one of promql or builtin")
            }
            _ => {}
        }
        if let Some(b) = d.builtin
            && d.comparison.is_none()
            && b.default_comparison().is_none()
        {
            errs.push(
                "spec.comparison",
                format!("built-in gate {b} has no default judgement; set comparison"),
            );
        }
        if d.promql.is_some() && d.comparison.is_none() {
            errs.push("spec.comparison", "a PromQL template needs a comparison");
        }
        let declared = validate_variables(&mut errs, "spec", self.variables.keys());
        validate_definition(&mut errs, "spec", d, &declared);
        errs.0
    }
}

impl GateTemplate {
    /// Validates the object; see [`GateTemplateSpec::validate`].
    pub fn validate(&self) -> Vec<FieldError> {
        self.spec.validate()
    }
}

impl RolloutSpec {
    /// Validates the spec. `allow_free_form`: whether inline PromQL gates are permitted (the
    /// platform's setting; off by default).
    pub fn validate(&self, allow_free_form: bool) -> Vec<FieldError> {
        let mut errs = Errors::default();
        if self.stable_service.name == self.canary_service.name {
            errs.push(
                "spec.canaryService.name",
                "must differ from stableService.name: stable and canary are separate Services",
            );
        }
        errs.non_empty(
            "spec.routeRef.name",
            &self.route_ref.name,
            "the HTTPRoute name",
        );
        errs.non_empty(
            "spec.canaryWorkload.name",
            &self.canary_workload.name,
            "the canary workload name",
        );
        if self.steps.is_empty() {
            errs.push("spec.steps", "at least one step is required");
        }
        if self.steps.len() > 32 {
            errs.push("spec.steps", "at most 32 steps");
        }
        let mut last_weight: Option<u32> = None;
        let mut seen_weight = false;
        for (i, step) in self.steps.iter().enumerate() {
            let p = format!("spec.steps[{i}]");
            let Some(kind) = step.kind() else {
                errs.push(
                    p,
                    "a step sets exactly one of mirror, headerCohort, setWeight, pause or promote",
                );
                continue;
            };
            match kind {
                StepKind::Mirror => {
                    let m = step.mirror.as_ref().expect("kind is Mirror");
                    if seen_weight {
                        errs.push(
                            format!("{p}.mirror"),
                            "mirror steps must come before the first setWeight step (mirroring ends when live weights start); move it earlier",
                        );
                    }
                    if !(1..=100).contains(&m.percent) {
                        errs.push(format!("{p}.mirror.percent"), "must be between 1 and 100");
                    }
                    if m.methods.is_empty() {
                        errs.push(
                            format!("{p}.mirror.methods"),
                            "name at least one of GET, HEAD, OPTIONS, TRACE",
                        );
                    }
                    let mut seen = BTreeSet::new();
                    for (j, method) in m.methods.iter().enumerate() {
                        if !method.is_idempotent_read() {
                            errs.push(
                                format!("{p}.mirror.methods[{j}]"),
                                format!(
                                    "{} cannot be mirrored (a mirrored write would be applied twice); use GET, HEAD, OPTIONS or TRACE",
                                    method.as_str()
                                ),
                            );
                        }
                        if !seen.insert(method.as_str()) {
                            errs.push(format!("{p}.mirror.methods[{j}]"), "is listed twice");
                        }
                    }
                    if m.grpc_methods.len() > 16 {
                        errs.push(format!("{p}.mirror.grpcMethods"), "at most 16 methods");
                    }
                    let mut seen = BTreeSet::new();
                    for (j, g) in m.grpc_methods.iter().enumerate() {
                        let at = format!("{p}.mirror.grpcMethods[{j}]");
                        if !is_grpc_service(&g.service) {
                            errs.push(
                                format!("{at}.service"),
                                "must be a fully qualified gRPC service (e.g. pay.v1.Ledger): dot-separated identifiers of letters, digits and _",
                            );
                        }
                        if !is_grpc_identifier(&g.method) {
                            errs.push(
                                format!("{at}.method"),
                                "must be a gRPC method name (e.g. GetBalance): letters, digits and _, not starting with a digit",
                            );
                        }
                        if !seen.insert((g.service.as_str(), g.method.as_str())) {
                            errs.push(at, "is listed twice");
                        }
                    }
                    if let Some(d) = &m.duration {
                        errs.duration(&format!("{p}.mirror.duration"), d, true);
                    }
                }
                StepKind::HeaderCohort => {
                    let c = step.header_cohort.as_ref().expect("kind is HeaderCohort");
                    if seen_weight {
                        errs.push(
                            format!("{p}.headerCohort"),
                            "header-cohort steps must come before the first setWeight step; move it earlier",
                        );
                    }
                    let name_ok = !c.header.name.is_empty()
                        && c.header
                            .name
                            .bytes()
                            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b));
                    if !name_ok {
                        errs.push(
                            format!("{p}.headerCohort.header.name"),
                            "must be an HTTP header name (letters, digits and !#$%&'*+-.^_`|~)",
                        );
                    }
                    errs.non_empty(
                        &format!("{p}.headerCohort.header.value"),
                        &c.header.value,
                        "the header value",
                    );
                    if let Some(d) = &c.duration {
                        errs.duration(&format!("{p}.headerCohort.duration"), d, true);
                    }
                }
                StepKind::SetWeight => {
                    let w = step.set_weight.as_ref().expect("kind is SetWeight");
                    seen_weight = true;
                    if w.weight > 100 {
                        errs.push(
                            format!("{p}.setWeight.weight"),
                            "must be between 0 and 100 (percent)",
                        );
                    }
                    if let Some(prev) = last_weight
                        && w.weight <= prev
                    {
                        errs.push(
                            format!("{p}.setWeight.weight"),
                            format!(
                                "setWeight steps must be strictly increasing: {} follows {prev}; reorder or remove it",
                                w.weight
                            ),
                        );
                    }
                    last_weight = Some(w.weight);
                    if let Some(d) = &w.duration {
                        errs.duration(&format!("{p}.setWeight.duration"), d, true);
                    }
                }
                StepKind::Pause => {
                    let pause = step.pause.as_ref().expect("kind is Pause");
                    let until = pause.until_promoted == Some(true);
                    match (&pause.duration, until) {
                        (Some(d), false) => errs.duration(&format!("{p}.pause.duration"), d, true),
                        (None, true) => {}
                        _ => errs.push(
                            format!("{p}.pause"),
                            "set either duration or untilPromoted: true",
                        ),
                    }
                }
                StepKind::Promote => {
                    if i + 1 != self.steps.len() {
                        errs.push(format!("{p}.promote"), "promote must be the last step");
                    }
                }
            }
        }
        if let Some(n) = self.promote_through_step
            && n as usize >= self.steps.len()
        {
            errs.push(
                "spec.promoteThroughStep",
                format!(
                    "{n} is not a step index: spec.steps has {} steps (0-based)",
                    self.steps.len()
                ),
            );
        }
        if !(1..=100).contains(&self.applied_share_tolerance_percent) {
            errs.push(
                "spec.appliedShareTolerancePercent",
                "must be between 1 and 100",
            );
        }
        errs.duration("spec.analysisInterval", &self.analysis_interval, true);
        errs.duration(
            "spec.appliedShareDeadline",
            &self.applied_share_deadline,
            true,
        );
        errs.duration("spec.stepDuration", &self.step_duration, true);
        errs.duration(
            "spec.canaryReadyDeadline",
            &self.canary_ready_deadline,
            true,
        );
        errs.duration("spec.handBackDeadline", &self.hand_back_deadline, true);
        errs.duration("spec.inconclusive.after", &self.inconclusive.after, false);
        gates_into(&mut errs, &self.gates, "spec.gates", allow_free_form);
        errs.0
    }
}

impl Rollout {
    /// Validates the object; see [`RolloutSpec::validate`].
    pub fn validate(&self, allow_free_form: bool) -> Vec<FieldError> {
        self.spec.validate(allow_free_form)
    }
}

impl WaveGateSpec {
    /// Validates the spec. `allow_free_form`: whether inline PromQL gates are permitted.
    pub fn validate(&self, allow_free_form: bool) -> Vec<FieldError> {
        let mut errs = Errors::default();
        if !is_dns_label(&self.site) {
            errs.push(
                "spec.site",
                "must be a DNS label (lowercase letters, digits, '-')",
            );
        }
        errs.non_empty(
            "spec.applicationSetRef.name",
            &self.application_set_ref.name,
            "the ApplicationSet name",
        );
        if !repository_without_tag(&self.repository) {
            errs.push(
                "spec.repository",
                "must be an OCI repository (oci://host[:port]/path) without tag or digest",
            );
        }
        errs.digest("spec.revision", &self.revision);
        if let Some(prev) = &self.previous_revision {
            errs.digest("spec.previousRevision", prev);
            if prev == &self.revision {
                errs.push("spec.previousRevision", "must differ from spec.revision");
            }
        }
        if self.waves.is_empty() {
            errs.push(
                "spec.waves",
                "at least one wave is required, naming every cluster of the site",
            );
        }
        let mut wave_names = BTreeSet::new();
        let mut cluster_wave: std::collections::BTreeMap<&str, usize> = Default::default();
        for (i, w) in self.waves.iter().enumerate() {
            let p = format!("spec.waves[{i}]");
            if !is_dns_label(&w.name) {
                errs.push(
                    format!("{p}.name"),
                    "must be a DNS label (lowercase letters, digits, '-')",
                );
            }
            if !wave_names.insert(w.name.as_str()) {
                errs.push(
                    format!("{p}.name"),
                    format!("wave name {:?} is used twice", w.name),
                );
            }
            if w.clusters.is_empty() {
                errs.push(format!("{p}.clusters"), "a wave names at least one cluster");
            }
            for (j, c) in w.clusters.iter().enumerate() {
                errs.non_empty(&format!("{p}.clusters[{j}]"), c, "the cluster name");
                if let Some(first) = cluster_wave.insert(c.as_str(), i) {
                    errs.push(
                        format!("{p}.clusters[{j}]"),
                        format!(
                            "cluster {c:?} is already in spec.waves[{first}]; a cluster belongs to exactly one wave"
                        ),
                    );
                }
            }
            if let Some(s) = &w.soak {
                errs.duration(&format!("{p}.soak"), s, false);
            }
            for (j, wait) in w.wait_for.iter().enumerate() {
                if wait.site == self.site {
                    errs.push(
                        format!("{p}.waitFor[{j}].site"),
                        "a wave cannot wait for its own site; name another site",
                    );
                }
                errs.non_empty(
                    &format!("{p}.waitFor[{j}].wave"),
                    &wait.wave,
                    "the other site's wave name",
                );
            }
        }
        match (self.drift_gate.exporter, &self.drift_gate.metric) {
            (DriftExporter::Platform, None) => errs.push(
                "spec.driftGate.metric",
                "name the drift exporter's metric, or set exporter: None to skip the drift gate (it is then reported, never passed)",
            ),
            (DriftExporter::None, Some(_)) => errs.push(
                "spec.driftGate.metric",
                "exporter is None, so no metric is read; remove metric or set exporter: Platform",
            ),
            (DriftExporter::Platform, Some(m)) => {
                let ok = m
                    .chars()
                    .next()
                    .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
                    && m.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':');
                if !ok {
                    errs.push("spec.driftGate.metric", "must be a Prometheus metric name");
                }
            }
            (DriftExporter::None, None) => {}
        }
        // An emergency naming another revision is not an error here: Argo CD keeps one an action
        // wrote when Git moves spec.revision, and wave-gate ignores it. The CRD's transition rule
        // refuses writing or changing one for another revision (it needs the old object).
        if let Some(e) = &self.emergency {
            errs.digest("spec.emergency.revision", &e.revision);
            errs.non_empty(
                "spec.emergency.reason",
                &e.reason,
                "the emergency reason (audited)",
            );
        }
        for (i, r) in self.wait_releases.iter().enumerate() {
            errs.digest(&format!("spec.waitReleases[{i}].revision"), &r.revision);
            errs.non_empty(
                &format!("spec.waitReleases[{i}].reason"),
                &r.reason,
                "the release reason (audited)",
            );
        }
        errs.non_empty(
            "spec.pin.publicKeysSecretRef.name",
            &self.pin.public_keys_secret_ref.name,
            "the cosign public keys Secret",
        );
        errs.duration("spec.defaultSoak", &self.default_soak, false);
        errs.duration("spec.convergenceTimeout", &self.convergence_timeout, true);
        errs.duration("spec.analysisInterval", &self.analysis_interval, true);
        errs.duration("spec.inconclusive.after", &self.inconclusive.after, false);
        gates_into(&mut errs, &self.gates, "spec.gates", allow_free_form);
        errs.0
    }
}

impl WaveGate {
    /// Validates the object; see [`WaveGateSpec::validate`].
    pub fn validate(&self, allow_free_form: bool) -> Vec<FieldError> {
        self.spec.validate(allow_free_form)
    }
}

impl BundlePinSpec {
    /// Validates the spec.
    pub fn validate(&self) -> Vec<FieldError> {
        let mut errs = Errors::default();
        if self.targets.is_empty() {
            errs.push("spec.targets", "name at least one Argo CD Application");
        }
        let mut seen = BTreeSet::new();
        for (i, t) in self.targets.iter().enumerate() {
            errs.non_empty(
                &format!("spec.targets[{i}].name"),
                &t.name,
                "the Application name",
            );
            if !seen.insert((t.namespace.as_deref(), t.name.as_str())) {
                errs.push(
                    format!("spec.targets[{i}]"),
                    format!("Application {:?} is listed twice", t.name),
                );
            }
        }
        if !repository_without_tag(&self.bundle.repository) {
            errs.push(
                "spec.bundle.repository",
                "must be an OCI repository (oci://host[:port]/path) without tag or digest; put the digest in spec.bundle.digest",
            );
        }
        errs.digest("spec.bundle.digest", &self.bundle.digest);
        errs.non_empty(
            "spec.publicKeysSecretRef.name",
            &self.public_keys_secret_ref.name,
            "the cosign public keys Secret",
        );
        if let Some(keyless) = &self.keyless {
            if keyless.identities.is_empty() {
                errs.push(
                    "spec.keyless.identities",
                    "name at least one certificate identity and issuer",
                );
            }
            for (i, id) in keyless.identities.iter().enumerate() {
                for (exact, pattern, what) in [
                    (&id.subject, &id.subject_reg_exp, "subject"),
                    (&id.issuer, &id.issuer_reg_exp, "issuer"),
                ] {
                    let path = format!("spec.keyless.identities[{i}]");
                    match (exact, pattern) {
                        // An expression that does not compile is refused by revert, which
                        // compiles it (RE2 syntax).
                        (Some(_), None) | (None, Some(_)) => {}
                        _ => errs.push(path, format!("give exactly one of {what} or {what}RegExp")),
                    }
                }
            }
        }
        errs.non_empty(
            "spec.reason",
            &self.reason,
            "the reason for the pin (audited)",
        );
        if self.release
            && self
                .release_reason
                .as_deref()
                .is_none_or(|r| r.trim().is_empty())
        {
            errs.push(
                "spec.releaseReason",
                "is required when spec.release is true (audited)",
            );
        }
        let mut kinds = BTreeSet::new();
        for (i, k) in self.allowed_kinds.iter().enumerate() {
            errs.non_empty(&format!("spec.allowedKinds[{i}].kind"), &k.kind, "the kind");
            if !kinds.insert((k.group.as_str(), k.kind.as_str())) {
                errs.push(format!("spec.allowedKinds[{i}]"), "is listed twice");
            }
        }
        if let Some(g) = &self.git_revert {
            let ok = (7..=64).contains(&g.commit.len())
                && g.commit
                    .bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
            if !ok {
                errs.push(
                    "spec.gitRevert.commit",
                    "must be a commit sha (7 to 64 lowercase hex digits)",
                );
            }
            errs.non_empty(
                "spec.gitRevert.baseBranch",
                &g.base_branch,
                "the base branch",
            );
            if g.base_branch.starts_with('-') {
                errs.push(
                    "spec.gitRevert.baseBranch",
                    "must not start with '-' (git would read it as an option)",
                );
            } else if !g
                .base_branch
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b".-_/".contains(&b))
            {
                errs.push(
                    "spec.gitRevert.baseBranch",
                    "must be a branch name of letters, digits, '.', '_', '/' and '-'",
                );
            }
        }
        errs.0
    }
}

impl BundlePin {
    /// Validates the object; see [`BundlePinSpec::validate`].
    pub fn validate(&self) -> Vec<FieldError> {
        self.spec.validate()
    }
}

fn selector_is_empty(s: &LabelSelector) -> bool {
    s.match_labels.as_ref().is_none_or(|m| m.is_empty())
        && s.match_expressions.as_ref().is_none_or(|m| m.is_empty())
}

fn validate_selector(errs: &mut Errors, path: &str, s: &LabelSelector) {
    for (i, e) in s.match_expressions.iter().flatten().enumerate() {
        let p = format!("{path}.matchExpressions[{i}]");
        match e.operator.as_str() {
            "In" | "NotIn" => {
                if e.values.as_ref().is_none_or(|v| v.is_empty()) {
                    errs.push(
                        format!("{p}.values"),
                        format!("operator {} needs at least one value", e.operator),
                    );
                }
            }
            "Exists" | "DoesNotExist" => {
                if e.values.as_ref().is_some_and(|v| !v.is_empty()) {
                    errs.push(
                        format!("{p}.values"),
                        format!("operator {} takes no values; remove them", e.operator),
                    );
                }
            }
            other => errs.push(
                format!("{p}.operator"),
                format!(
                    "{other:?} is not a selector operator; use In, NotIn, Exists or DoesNotExist"
                ),
            ),
        }
    }
}

impl RevisionUpgradeSpec {
    /// Validates the spec. `allow_free_form`: whether inline PromQL gates are permitted.
    pub fn validate(&self, allow_free_form: bool) -> Vec<FieldError> {
        let mut errs = Errors::default();
        for (path, v) in [
            ("spec.fromTag", &self.from_tag),
            ("spec.fromRevision", &self.from_revision),
            ("spec.toTag", &self.to_tag),
            ("spec.toRevision", &self.to_revision),
        ] {
            if !is_dns_label(v) {
                errs.push(path, "must be a DNS label (e.g. stable, canary, 1-28)");
            }
        }
        if self.from_tag == self.to_tag {
            errs.push(
                "spec.toTag",
                "must differ from spec.fromTag: namespaces move between two tags",
            );
        }
        if self.from_revision == self.to_revision {
            errs.push(
                "spec.toRevision",
                "must differ from spec.fromRevision: an upgrade never happens in place",
            );
        }
        if self.waves.is_empty() {
            errs.push("spec.waves", "at least one wave is required");
        }
        let mut names = BTreeSet::new();
        for (i, w) in self.waves.iter().enumerate() {
            let p = format!("spec.waves[{i}]");
            if !is_dns_label(&w.name) {
                errs.push(
                    format!("{p}.name"),
                    "must be a DNS label (lowercase letters, digits, '-')",
                );
            }
            if !names.insert(w.name.as_str()) {
                errs.push(
                    format!("{p}.name"),
                    format!("wave name {:?} is used twice", w.name),
                );
            }
            if selector_is_empty(&w.namespace_selector) && i + 1 != self.waves.len() {
                errs.push(
                    format!("{p}.namespaceSelector"),
                    "an empty selector takes every remaining namespace, leaving later waves empty; only the last wave may have one",
                );
            }
            validate_selector(
                &mut errs,
                &format!("{p}.namespaceSelector"),
                &w.namespace_selector,
            );
            if let Some(s) = &w.soak {
                errs.duration(&format!("{p}.soak"), s, false);
            }
        }
        let b = &self.issuance_budget;
        if b.rate == 0 {
            errs.push(
                "spec.issuanceBudget.rate",
                "must be greater than 0 (SVIDs per second)",
            );
        }
        if b.depth == 0 {
            errs.push(
                "spec.issuanceBudget.depth",
                "must be greater than 0 (SVIDs)",
            );
        }
        if b.peak_per_second < b.rate {
            errs.push(
                "spec.issuanceBudget.peakPerSecond",
                format!("must be at least rate ({}): the cap per second cannot be below the sustained rate", b.rate),
            );
        }
        errs.duration("spec.analysisInterval", &self.analysis_interval, true);
        errs.duration("spec.inconclusive.after", &self.inconclusive.after, false);
        gates_into(&mut errs, &self.gates, "spec.gates", allow_free_form);
        errs.0
    }
}

impl RevisionUpgrade {
    /// Validates the object; see [`RevisionUpgradeSpec::validate`].
    pub fn validate(&self, allow_free_form: bool) -> Vec<FieldError> {
        self.spec.validate(allow_free_form)
    }
}

/// A gRPC identifier as the GRPCRoute CRD accepts it: `[A-Za-z_][A-Za-z_0-9]*`, at most 1024.
fn is_grpc_identifier(s: &str) -> bool {
    let mut chars = s.chars();
    s.len() <= 1024
        && chars
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// A fully qualified gRPC service as the GRPCRoute CRD accepts it: identifiers joined by dots,
/// optionally led by one dot, at most 1024 characters.
fn is_grpc_service(s: &str) -> bool {
    let body = s.strip_prefix('.').unwrap_or(s);
    s.len() <= 1024 && body.split('.').all(is_grpc_identifier)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn digest(c: char) -> String {
        format!("sha256:{}", c.to_string().repeat(64))
    }

    fn rollout() -> Value {
        json!({
            "routeRef": {"name": "checkout"},
            "stableService": {"name": "checkout-v1"},
            "canaryService": {"name": "checkout-v2"},
            "canaryWorkload": {"name": "checkout-v2"},
            "steps": [
                {"mirror": {"percent": 10}},
                {"headerCohort": {"header": {"name": "x-cohort", "value": "staff"}}},
                {"setWeight": {"weight": 1}},
                {"setWeight": {"weight": 5}},
                {"pause": {"untilPromoted": true}},
                {"setWeight": {"weight": 50}},
                {"promote": {}}
            ],
            "gates": [
                {"name": "errors", "builtin": "ErrorRatioVsStable"},
                {"name": "latency", "templateRef": "p99-vs-stable", "window": "1m"}
            ]
        })
    }

    fn wave_gate() -> Value {
        json!({
            "site": "eu-west",
            "applicationSetRef": {"name": "mesh-config"},
            "repository": "oci://registry.local:5000/mesh/config",
            "revision": digest('a'),
            "previousRevision": digest('b'),
            "waves": [
                {"name": "canary", "clusters": ["eu-1"]},
                {"name": "rest", "clusters": ["eu-2", "eu-3"], "waitFor": [{"site": "us-east", "wave": "canary"}]}
            ],
            "driftGate": {"exporter": "Platform", "metric": "mesh_config_proxies_behind"},
            "pin": {"publicKeysSecretRef": {"name": "cosign"}}
        })
    }

    fn bundle_pin() -> Value {
        json!({
            "targets": [{"name": "mesh-eu-1"}, {"name": "mesh-eu-2"}],
            "bundle": {"repository": "oci://registry.local:5000/mesh/config", "digest": digest('c')},
            "publicKeysSecretRef": {"name": "cosign"},
            "reason": "5xx after change 42"
        })
    }

    fn upgrade() -> Value {
        json!({"fromTag": "stable", "fromRevision": "1-27", "toTag": "canary", "toRevision": "1-28"})
    }

    /// Sets `value` at a `/`-separated JSON pointer, creating objects as needed.
    fn set(mut v: Value, pointer: &str, value: Value) -> Value {
        let (parent, key) = pointer.rsplit_once('/').unwrap();
        let target = if parent.is_empty() {
            &mut v
        } else {
            v.pointer_mut(parent)
                .unwrap_or_else(|| panic!("no {parent}"))
        };
        match target {
            Value::Array(a) => a[key.parse::<usize>().unwrap()] = value,
            Value::Object(o) => {
                if value.is_null() {
                    o.remove(key);
                } else {
                    o.insert(key.to_owned(), value);
                }
            }
            _ => panic!("cannot set {pointer}"),
        }
        v
    }

    fn paths(errs: &[FieldError]) -> Vec<&str> {
        errs.iter().map(|e| e.path.as_str()).collect()
    }

    #[test]
    fn valid_objects_have_no_errors() {
        let r: RolloutSpec = serde_json::from_value(rollout()).unwrap();
        assert_eq!(r.validate(false), vec![]);
        let w: WaveGateSpec = serde_json::from_value(wave_gate()).unwrap();
        assert_eq!(w.validate(false), vec![]);
        let b: BundlePinSpec = serde_json::from_value(bundle_pin()).unwrap();
        assert_eq!(b.validate(), vec![]);
        let u: RevisionUpgradeSpec = serde_json::from_value(upgrade()).unwrap();
        assert_eq!(u.validate(false), vec![]);
    }

    #[test]
    fn rollout_errors_name_the_field() {
        let cases: Vec<(&str, Value, &str, &str)> = vec![
            (
                "weights not increasing",
                set(rollout(), "/steps/3/setWeight/weight", json!(1)),
                "spec.steps[3].setWeight.weight",
                "strictly increasing",
            ),
            (
                "weight over 100",
                set(rollout(), "/steps/5/setWeight/weight", json!(101)),
                "spec.steps[5].setWeight.weight",
                "between 0 and 100",
            ),
            (
                "mirror POST",
                set(rollout(), "/steps/0/mirror/methods", json!(["GET", "POST"])),
                "spec.steps[0].mirror.methods[1]",
                "cannot be mirrored",
            ),
            (
                "gRPC service with a slash",
                set(
                    rollout(),
                    "/steps/0/mirror/grpcMethods",
                    json!([{"service": "pay.v1/Ledger", "method": "GetBalance"}]),
                ),
                "spec.steps[0].mirror.grpcMethods[0].service",
                "fully qualified gRPC service",
            ),
            (
                "gRPC method starting with a digit",
                set(
                    rollout(),
                    "/steps/0/mirror/grpcMethods",
                    json!([{"service": ".pay.v1.Ledger", "method": "1Get"}]),
                ),
                "spec.steps[0].mirror.grpcMethods[0].method",
                "gRPC method name",
            ),
            (
                "gRPC method twice",
                set(
                    rollout(),
                    "/steps/0/mirror/grpcMethods",
                    json!([
                        {"service": "pay.v1.Ledger", "method": "GetBalance"},
                        {"service": "pay.v1.Ledger", "method": "GetBalance"}
                    ]),
                ),
                "spec.steps[0].mirror.grpcMethods[1]",
                "listed twice",
            ),
            (
                "mirror after weight",
                set(rollout(), "/steps/3", json!({"mirror": {}})),
                "spec.steps[3].mirror",
                "before the first setWeight",
            ),
            (
                "two kinds in a step",
                set(
                    rollout(),
                    "/steps/2",
                    json!({"setWeight": {"weight": 1}, "pause": {"duration": "1m"}}),
                ),
                "spec.steps[2]",
                "exactly one",
            ),
            (
                "pause with neither",
                set(rollout(), "/steps/4", json!({"pause": {}})),
                "spec.steps[4].pause",
                "duration or untilPromoted",
            ),
            (
                "promote not last",
                set(rollout(), "/steps/4", json!({"promote": {}})),
                "spec.steps[4].promote",
                "last step",
            ),
            (
                "bad duration",
                set(rollout(), "/analysisInterval", json!("30 seconds")),
                "spec.analysisInterval",
                "invalid duration",
            ),
            (
                "zero interval",
                set(rollout(), "/analysisInterval", json!("0s")),
                "spec.analysisInterval",
                "greater than 0",
            ),
            (
                "same services",
                set(rollout(), "/canaryService/name", json!("checkout-v1")),
                "spec.canaryService.name",
                "must differ",
            ),
            (
                "promote index",
                set(rollout(), "/promoteThroughStep", json!(7)),
                "spec.promoteThroughStep",
                "not a step index",
            ),
            (
                "free-form promql",
                set(
                    rollout(),
                    "/gates/0",
                    json!({"name": "q", "promql": "sum(x)", "comparison": {"absolute": {"op": "LessThan", "value": 1.0}}}),
                ),
                "spec.gates[0].promql",
                "free-form PromQL is disabled",
            ),
            (
                "gate needs one source",
                set(rollout(), "/gates/0", json!({"name": "q"})),
                "spec.gates[0]",
                "exactly one of templateRef",
            ),
            (
                "templateRef and builtin",
                set(rollout(), "/gates/1/builtin", json!("MeshErrorRatio")),
                "spec.gates[1]",
                "exactly one of templateRef",
            ),
            (
                "duplicate gate",
                set(rollout(), "/gates/1/name", json!("errors")),
                "spec.gates[1].name",
                "used twice",
            ),
            (
                "two comparisons",
                set(
                    rollout(),
                    "/gates/0/comparison",
                    json!({"absolute": {"op": "LessThan", "value": 1.0}, "share": {}}),
                ),
                "spec.gates[0].comparison",
                "exactly one of absolute",
            ),
            (
                "reading without judgement",
                set(rollout(), "/gates/0/builtin", json!("ProxiesPerRevision")),
                "spec.gates[0].comparison",
                "no default judgement",
            ),
            (
                "reserved variable",
                set(
                    rollout(),
                    "/gates/1/variables",
                    json!({"service": "other-team"}),
                ),
                "spec.gates[1].variables.service",
                "cannot be overridden",
            ),
            (
                "bad header",
                set(
                    rollout(),
                    "/steps/1/headerCohort/header/name",
                    json!("x cohort"),
                ),
                "spec.steps[1].headerCohort.header.name",
                "HTTP header name",
            ),
        ];
        for (name, value, path, needle) in cases {
            let spec: RolloutSpec =
                serde_json::from_value(value).unwrap_or_else(|e| panic!("{name}: {e}"));
            let errs = spec.validate(false);
            assert!(
                errs.iter()
                    .any(|e| e.path == path && e.message.contains(needle)),
                "{name}: want {path} ({needle}), got {errs:?}"
            );
        }
    }

    #[test]
    fn free_form_promql_allowed_when_enabled_and_variables_checked() {
        let with = |q: &str, vars: Value| {
            let v = set(
                rollout(),
                "/gates/0",
                json!({"name": "q", "promql": q, "variables": vars, "comparison": {"absolute": {"op": "LessThan", "value": 1.0}}}),
            );
            let spec: RolloutSpec = serde_json::from_value(v).unwrap();
            spec.validate(true)
        };
        assert_eq!(
            with("sum(rate(x{svc=\"{{service}}\"}[{{window}}]))", json!({})),
            vec![]
        );
        assert_eq!(with("x{job=\"{{job}}\"}", json!({"job": "mesh"})), vec![]);
        let errs = with("x{team=\"{{team}}\"}", json!({}));
        assert_eq!(paths(&errs), vec!["spec.gates[0].promql"]);
        assert!(errs[0].message.contains("{{team}}"), "{errs:?}");
    }

    #[test]
    fn wave_gate_errors_name_the_field() {
        let cases: Vec<(&str, Value, &str, &str)> = vec![
            (
                "tag revision",
                set(wave_gate(), "/revision", json!("v1.2.3")),
                "spec.revision",
                "not a manifest digest",
            ),
            (
                "same previous",
                set(wave_gate(), "/previousRevision", json!(digest('a'))),
                "spec.previousRevision",
                "must differ",
            ),
            (
                "no waves",
                set(wave_gate(), "/waves", json!([])),
                "spec.waves",
                "at least one wave",
            ),
            (
                "cluster twice",
                set(wave_gate(), "/waves/1/clusters", json!(["eu-2", "eu-1"])),
                "spec.waves[1].clusters[1]",
                "already in spec.waves[0]",
            ),
            (
                "empty wave",
                set(wave_gate(), "/waves/1/clusters", json!([])),
                "spec.waves[1].clusters",
                "at least one cluster",
            ),
            (
                "wait for self",
                set(wave_gate(), "/waves/1/waitFor/0/site", json!("eu-west")),
                "spec.waves[1].waitFor[0].site",
                "own site",
            ),
            (
                "platform without metric",
                set(wave_gate(), "/driftGate", json!({"exporter": "Platform"})),
                "spec.driftGate.metric",
                "exporter: None",
            ),
            (
                "none with metric",
                set(
                    wave_gate(),
                    "/driftGate",
                    json!({"exporter": "None", "metric": "m"}),
                ),
                "spec.driftGate.metric",
                "remove metric",
            ),
            (
                "emergency revision a tag",
                set(
                    wave_gate(),
                    "/emergency",
                    json!({"revision": "v1.2.3", "reason": "cve"}),
                ),
                "spec.emergency.revision",
                "not a manifest digest",
            ),
            (
                "emergency no reason",
                set(
                    wave_gate(),
                    "/emergency",
                    json!({"revision": digest('a'), "reason": " "}),
                ),
                "spec.emergency.reason",
                "required",
            ),
            (
                "tagged repository",
                set(
                    wave_gate(),
                    "/repository",
                    json!("oci://registry.local:5000/mesh/config:v1"),
                ),
                "spec.repository",
                "without tag",
            ),
            (
                "release without reason",
                set(
                    wave_gate(),
                    "/waitReleases",
                    json!([{"site": "us-east", "revision": digest('a'), "reason": ""}]),
                ),
                "spec.waitReleases[0].reason",
                "required",
            ),
            (
                "bad soak",
                set(wave_gate(), "/waves/0/soak", json!("ten minutes")),
                "spec.waves[0].soak",
                "invalid duration",
            ),
        ];
        for (name, value, path, needle) in cases {
            let spec: WaveGateSpec =
                serde_json::from_value(value).unwrap_or_else(|e| panic!("{name}: {e}"));
            let errs = spec.validate(false);
            assert!(
                errs.iter()
                    .any(|e| e.path == path && e.message.contains(needle)),
                "{name}: want {path} ({needle}), got {errs:?}"
            );
        }
    }

    #[test]
    fn bundle_pin_errors_name_the_field() {
        let cases: Vec<(&str, Value, &str, &str)> = vec![
            (
                "tag digest",
                set(bundle_pin(), "/bundle/digest", json!("latest")),
                "spec.bundle.digest",
                "never accepted",
            ),
            (
                "digest in repository",
                set(
                    bundle_pin(),
                    "/bundle/repository",
                    json!(format!("oci://r.local/m@{}", digest('c'))),
                ),
                "spec.bundle.repository",
                "without tag or digest",
            ),
            (
                "no targets",
                set(bundle_pin(), "/targets", json!([])),
                "spec.targets",
                "at least one",
            ),
            (
                "keyless identity with subject and subjectRegExp",
                set(
                    bundle_pin(),
                    "/keyless",
                    json!({"identities": [{"subject": "a@b", "subjectRegExp": ".*", "issuer": "https://i"}]}),
                ),
                "spec.keyless.identities[0]",
                "exactly one of subject or subjectRegExp",
            ),
            (
                "keyless identity without an issuer",
                set(
                    bundle_pin(),
                    "/keyless",
                    json!({"identities": [{"subject": "a@b"}]}),
                ),
                "spec.keyless.identities[0]",
                "exactly one of issuer or issuerRegExp",
            ),
            (
                "keyless without identities",
                set(bundle_pin(), "/keyless", json!({"identities": []})),
                "spec.keyless.identities",
                "at least one certificate identity",
            ),
            (
                "duplicate target",
                set(bundle_pin(), "/targets/1/name", json!("mesh-eu-1")),
                "spec.targets[1]",
                "listed twice",
            ),
            (
                "release without reason",
                set(bundle_pin(), "/release", json!(true)),
                "spec.releaseReason",
                "required",
            ),
            (
                "empty reason",
                set(bundle_pin(), "/reason", json!("")),
                "spec.reason",
                "required",
            ),
            (
                "bad commit",
                set(bundle_pin(), "/gitRevert", json!({"commit": "HEAD"})),
                "spec.gitRevert.commit",
                "commit sha",
            ),
            (
                "base branch read as an option",
                set(
                    bundle_pin(),
                    "/gitRevert",
                    json!({"commit": "abcdef0", "baseBranch": "--upload-pack=x"}),
                ),
                "spec.gitRevert.baseBranch",
                "must not start with '-'",
            ),
            (
                "base branch with a space",
                set(
                    bundle_pin(),
                    "/gitRevert",
                    json!({"commit": "abcdef0", "baseBranch": "release 1"}),
                ),
                "spec.gitRevert.baseBranch",
                "letters, digits",
            ),
        ];
        for (name, value, path, needle) in cases {
            let spec: BundlePinSpec =
                serde_json::from_value(value).unwrap_or_else(|e| panic!("{name}: {e}"));
            let errs = spec.validate();
            assert!(
                errs.iter()
                    .any(|e| e.path == path && e.message.contains(needle)),
                "{name}: want {path} ({needle}), got {errs:?}"
            );
        }
    }

    #[test]
    fn revision_upgrade_errors_name_the_field() {
        let cases: Vec<(&str, Value, &str, &str)> = vec![
            (
                "same tags",
                set(upgrade(), "/toTag", json!("stable")),
                "spec.toTag",
                "must differ",
            ),
            (
                "same revisions",
                set(upgrade(), "/toRevision", json!("1-27")),
                "spec.toRevision",
                "in place",
            ),
            (
                "zero rate",
                set(upgrade(), "/issuanceBudget", json!({"rate": 0})),
                "spec.issuanceBudget.rate",
                "greater than 0",
            ),
            (
                "zero depth",
                set(upgrade(), "/issuanceBudget", json!({"depth": 0})),
                "spec.issuanceBudget.depth",
                "greater than 0",
            ),
            (
                "peak below rate",
                set(
                    upgrade(),
                    "/issuanceBudget",
                    json!({"rate": 500, "peakPerSecond": 100}),
                ),
                "spec.issuanceBudget.peakPerSecond",
                "at least rate",
            ),
            (
                "no waves",
                set(upgrade(), "/waves", json!([])),
                "spec.waves",
                "at least one",
            ),
            (
                "empty selector first",
                set(
                    upgrade(),
                    "/waves",
                    json!([{"name": "all", "namespaceSelector": {}}, {"name": "t", "namespaceSelector": {"matchLabels": {"a": "b"}}}]),
                ),
                "spec.waves[0].namespaceSelector",
                "only the last wave",
            ),
            (
                "bad operator",
                set(
                    upgrade(),
                    "/waves",
                    json!([{"name": "w", "namespaceSelector": {"matchExpressions": [{"key": "k", "operator": "Equals", "values": ["v"]}]}}]),
                ),
                "spec.waves[0].namespaceSelector.matchExpressions[0].operator",
                "not a selector operator",
            ),
            (
                "bad tag",
                set(upgrade(), "/fromTag", json!("Stable!")),
                "spec.fromTag",
                "DNS label",
            ),
        ];
        for (name, value, path, needle) in cases {
            let spec: RevisionUpgradeSpec =
                serde_json::from_value(value).unwrap_or_else(|e| panic!("{name}: {e}"));
            let errs = spec.validate(false);
            assert!(
                errs.iter()
                    .any(|e| e.path == path && e.message.contains(needle)),
                "{name}: want {path} ({needle}), got {errs:?}"
            );
        }
    }

    #[test]
    fn gate_template_validation() {
        let ok: GateTemplateSpec = serde_json::from_value(json!({
            "promql": "sum(rate(x{ns=\"{{namespace}}\",job=\"{{job}}\"}[{{window}}]))",
            "comparison": {"absolute": {"op": "LessOrEqual", "value": 0.01}},
            "variables": {"job": "mesh"}
        }))
        .unwrap();
        assert_eq!(ok.validate(), vec![]);
        let both: GateTemplateSpec =
            serde_json::from_value(json!({"promql": "up", "builtin": "MeshErrorRatio"})).unwrap();
        assert!(paths(&both.validate()).contains(&"spec"));
        let unknown: GateTemplateSpec = serde_json::from_value(json!({
            "promql": "x{a=\"{{nope}}\"}", "comparison": {"absolute": {"op": "LessThan", "value": 1.0}}
        }))
        .unwrap();
        assert_eq!(paths(&unknown.validate()), vec!["spec.promql"]);
    }

    #[test]
    fn display_names_field_and_fix() {
        let e = FieldError {
            path: "spec.steps[2].setWeight.weight".into(),
            message: "must be between 0 and 100 (percent)".into(),
        };
        assert_eq!(
            e.to_string(),
            "spec.steps[2].setWeight.weight: must be between 0 and 100 (percent)"
        );
        assert_eq!(join(&[e.clone(), e]).matches("; ").count(), 1);
    }

    #[test]
    fn repository_table() {
        for (repo, ok) in [
            ("oci://registry.local:5000/mesh/config", true),
            ("registry.local/mesh", true),
            ("oci://registry.local/mesh:v1", false),
            ("oci://registry.local/mesh@sha256:abc", false),
            ("oci://registry.local", false),
            ("oci://registry.local//x", false),
        ] {
            assert_eq!(repository_without_tag(repo), ok, "{repo}");
        }
    }
}
