//! Readable trees of a sluice object's status for `kubectl sluice status`, and the one-line
//! rows of `kubectl sluice get`: Rollout steps with desired weight vs applied share and gate
//! verdicts, WaveGate waves per site with their readings, BundlePin applications, upgrade
//! progress by proxies per revision.
//!
//! Owns formatting only: pure functions of the object as read (JSON, so `-o json|yaml` stays the
//! server's object); the parts it interprets (Rollout steps, WaveGate decisions, BundlePin
//! applications, upgrade proxy counts, namespaces and issuance budget, GateTemplate
//! definitions) are read through sluice-api's types.
//! No I/O, no clock (ages are printed as timestamps).

use std::fmt::Write;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sluice_api::v1alpha1::bundle_pin::PinnedApplication;
use sluice_api::v1alpha1::revision_upgrade::{
    IssuanceBudgetStatus, NamespaceProgress, ProxyCounts,
};
use sluice_api::v1alpha1::{ClusterDecision, GateDefinition, GateTemplateSpec, RolloutStep};

use crate::kinds::Kind;

fn s<'a>(v: &'a Value, pointer: &str) -> Option<&'a str> {
    v.pointer(pointer).and_then(Value::as_str)
}

fn n(v: &Value, pointer: &str) -> Option<f64> {
    v.pointer(pointer).and_then(Value::as_f64)
}

fn arr<'a>(v: &'a Value, pointer: &str) -> &'a [Value] {
    v.pointer(pointer)
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or(&[])
}

/// The object at `pointer` of `v` read as the API's `T`; `None` when absent (or not a `T`,
/// which the CRD's schema refuses).
fn at<T: DeserializeOwned>(v: &Value, pointer: &str) -> Option<T> {
    T::deserialize(v.pointer(pointer)?).ok()
}

/// The list at `pointer` of `v` read as the API's `T`; empty when absent (or not a list of
/// `T`, which the CRD's schema refuses).
pub(crate) fn list_at<T: DeserializeOwned>(v: &Value, pointer: &str) -> Vec<T> {
    v.pointer(pointer)
        .and_then(|list| Vec::<T>::deserialize(list).ok())
        .unwrap_or_default()
}

/// An API enum's value as the API spells it (`Passed`, `MeshErrorRatio`).
pub(crate) fn api_name(value: &impl Serialize) -> String {
    match serde_json::to_value(value) {
        Ok(Value::String(name)) => name,
        _ => "?".to_string(),
    }
}

/// A GateTemplate's spec as the API defines it (`None` before it has one).
fn gate_template_spec(v: &Value) -> Option<GateTemplateSpec> {
    at(v, "/spec")
}

fn num(x: f64) -> String {
    if x.fract() == 0.0 && x.abs() < 1e15 {
        format!("{x:.0}")
    } else {
        let t = format!("{x:.4}");
        t.trim_end_matches('0').trim_end_matches('.').to_string()
    }
}

fn pct(share: f64) -> String {
    format!("{}%", num((share * 1000.0).round() / 10.0))
}

/// A tree under construction: lines with box-drawing branches.
struct Tree {
    out: String,
}

impl Tree {
    fn new(head: String) -> Tree {
        Tree { out: head + "\n" }
    }

    /// Adds the children `items` under a node at `prefix`.
    fn node(&mut self, prefix: &str, last: bool, text: &str) -> String {
        let (branch, next) = if last {
            ("└─ ", "   ")
        } else {
            ("├─ ", "│  ")
        };
        let _ = writeln!(self.out, "{prefix}{branch}{text}");
        format!("{prefix}{next}")
    }

    fn list(&mut self, prefix: &str, last: bool, title: &str, items: &[String]) {
        let inner = self.node(prefix, last, title);
        for (i, item) in items.iter().enumerate() {
            self.node(&inner, i + 1 == items.len(), item);
        }
    }

    /// The `waves (N)` node of a WaveGate or RevisionUpgrade `v`: each wave of `spec.waves`
    /// with its state from `status.waves` (Pending when absent; ▶ marks `status.currentWave`)
    /// and under it the lines `items` gives for (the spec wave, its status entry).
    fn waves(&mut self, v: &Value, items: impl Fn(&Value, Option<&Value>) -> Vec<String>) {
        let status_waves = arr(v, "/status/waves");
        let waves = arr(v, "/spec/waves");
        let inner = self.node("", false, &format!("waves ({})", waves.len()));
        for (i, wave) in waves.iter().enumerate() {
            let name = s(wave, "/name").unwrap_or("?");
            let st = status_waves.iter().find(|w| s(w, "/name") == Some(name));
            let state = st.and_then(|w| s(w, "/state")).unwrap_or("Pending");
            let marker = if s(v, "/status/currentWave") == Some(name) {
                "▶ "
            } else {
                ""
            };
            let prefix = self.node(
                &inner,
                i + 1 == waves.len(),
                &format!("{marker}{name}  {state}"),
            );
            let lines = items(wave, st);
            for (j, line) in lines.iter().enumerate() {
                self.node(&prefix, j + 1 == lines.len(), line);
            }
        }
    }
}

fn gate_line(g: &Value) -> String {
    let mut line = format!(
        "{}: {} ({})",
        s(g, "/gate").unwrap_or("?"),
        s(g, "/verdict").unwrap_or("?"),
        s(g, "/reason").unwrap_or("?")
    );
    if let Some(value) = n(g, "/value") {
        let _ = write!(line, " value {}", num(value));
        if let Some(t) = n(g, "/threshold") {
            let _ = write!(line, " vs threshold {}", num(t));
        }
        if let Some(b) = n(g, "/baseline") {
            let _ = write!(line, " (baseline {})", num(b));
        }
    }
    if let Some(samples) = n(g, "/samples") {
        let _ = write!(line, ", samples {}", num(samples));
        if let Some(min) = n(g, "/minSamples") {
            let _ = write!(line, "/{}", num(min));
        }
    }
    if let Some(m) = s(g, "/message") {
        let _ = write!(line, " — {m}");
    }
    line
}

fn conditions(v: &Value) -> Vec<String> {
    arr(v, "/status/conditions")
        .iter()
        .map(|c| {
            let mut line = format!(
                "{} {} {}",
                s(c, "/type").unwrap_or("?"),
                s(c, "/status").unwrap_or("?"),
                s(c, "/reason").unwrap_or("")
            );
            if let Some(m) = s(c, "/message").filter(|m| !m.is_empty()) {
                let _ = write!(line, ": {m}");
            }
            line
        })
        .collect()
}

fn head(kind: Kind, v: &Value) -> String {
    let name = s(v, "/metadata/name").unwrap_or("?");
    let id = match s(v, "/metadata/namespace") {
        Some(ns) => format!("{ns}/{name}"),
        None => name.to_string(),
    };
    let phase = s(v, "/status/phase").unwrap_or("(no status yet)");
    let mut line = format!("{kind} {id}  {phase}");
    let generation = n(v, "/metadata/generation");
    let observed = n(v, "/status/observedGeneration");
    if let (Some(g), Some(o)) = (generation, observed)
        && o < g
    {
        let _ = write!(
            line,
            "  (status is for generation {}, spec is at {})",
            num(o),
            num(g)
        );
    }
    line
}

/// One step of `spec.steps` as the API defines it (the destructuring names every kind, so a
/// new step kind does not compile until it is printed here); `?` when it is not a step.
fn step_text(step: &Value) -> String {
    let Ok(RolloutStep {
        mirror,
        header_cohort,
        set_weight,
        pause,
        promote,
    }) = RolloutStep::deserialize(step)
    else {
        return "?".to_string();
    };
    if let Some(w) = set_weight {
        format!("setWeight {}%", num(f64::from(w.weight)))
    } else if let Some(m) = mirror {
        format!("mirror {}%", num(f64::from(m.percent)))
    } else if let Some(c) = header_cohort {
        format!("headerCohort {}: {}", c.header.name, c.header.value)
    } else if let Some(p) = pause {
        match p.duration {
            Some(d) => format!("pause {}", d.0),
            None => "pause until promoted".to_string(),
        }
    } else if promote.is_some() {
        "promote".to_string()
    } else {
        "?".to_string()
    }
}

/// What a Rollout's status says of one route it owns (`status.ownedRoute` or an entry of
/// `status.additionalOwnedRoutes`): the canary weight it last wrote there, and that it owns it.
fn ownership(owned: Option<&Value>) -> String {
    let mut text = String::new();
    if let Some(o) = owned {
        if let Some(w) = n(o, "/writtenWeight") {
            let _ = write!(text, ", written canary weight {}", num(w));
        }
        text.push_str(", owned");
    }
    text
}

/// The status tree of a Rollout.
pub fn rollout(v: &Value) -> String {
    let mut t = Tree::new(head(Kind::Rollout, v));
    let route = s(v, "/spec/routeRef/name").unwrap_or("?");
    let mut route_line = format!(
        "route {} {route}: stable {} / canary {}",
        s(v, "/spec/routeRef/kind").unwrap_or("HTTPRoute"),
        s(v, "/spec/stableService/name").unwrap_or("?"),
        s(v, "/spec/canaryService/name").unwrap_or("?")
    );
    route_line.push_str(&ownership(v.pointer("/status/ownedRoute")));
    t.node("", false, &route_line);
    // spec.additionalRoutes: the same plan on every one of them, each with its own ownership.
    let owned_extra = arr(v, "/status/additionalOwnedRoutes");
    for r in arr(v, "/spec/additionalRoutes") {
        let kind = s(r, "/kind").unwrap_or("HTTPRoute");
        let name = s(r, "/name").unwrap_or("?");
        let owned = owned_extra
            .iter()
            .find(|o| s(o, "/name") == Some(name) && s(o, "/kind").unwrap_or("HTTPRoute") == kind);
        let line = format!("route {kind} {name} (additional){}", ownership(owned));
        t.node("", false, &line);
    }
    let mut traffic = String::from("traffic: desired weight ");
    match n(v, "/status/desiredWeight") {
        Some(w) => traffic.push_str(&format!("{}%", num(w))),
        None => traffic.push('-'),
    }
    traffic.push_str(", applied share ");
    match n(v, "/status/appliedShare") {
        Some(a) => {
            traffic.push_str(&pct(a));
            if let Some(at) = s(v, "/status/appliedShareObservedAt") {
                let _ = write!(traffic, " (observed {at})");
            }
        }
        None => traffic.push_str("not measured yet"),
    }
    if v.pointer("/status/cohortActive") == Some(&Value::Bool(true)) {
        traffic.push_str(", cohort rule active");
    }
    if v.pointer("/status/mirrorActive") == Some(&Value::Bool(true)) {
        traffic.push_str(", mirror rule active");
    }
    t.node("", false, &traffic);

    let current = n(v, "/status/currentStepIndex").map(|c| c as usize);
    let history = arr(v, "/status/history");
    let steps: Vec<String> = arr(v, "/spec/steps")
        .iter()
        .enumerate()
        .map(|(i, step)| {
            let record = history
                .iter()
                .rev()
                .find(|r| n(r, "/index").map(|x| x as usize) == Some(i));
            let state = match (current, record.and_then(|r| s(r, "/outcome"))) {
                (_, Some(outcome)) => outcome.to_string(),
                (Some(c), None) if c == i => {
                    let mut st = String::from("current");
                    if let Some(at) = s(v, "/status/currentStepStartedAt") {
                        let _ = write!(st, ", since {at}");
                    }
                    st
                }
                (Some(c), None) if c > i => "done".to_string(),
                _ => "pending".to_string(),
            };
            let marker = if current == Some(i) { "▶ " } else { "" };
            format!("{marker}{i} {}  {state}", step_text(step))
        })
        .collect();
    t.list("", false, &format!("steps ({})", steps.len()), &steps);

    let gates: Vec<String> = arr(v, "/status/gates").iter().map(gate_line).collect();
    if gates.is_empty() {
        t.node("", false, "verdicts: none yet");
    } else {
        t.list("", false, "verdicts", &gates);
    }
    if let Some(a) = v.pointer("/status/abort") {
        let mut items = vec![format!("reason {}", s(a, "/reason").unwrap_or("?"))];
        if let Some(m) = s(a, "/message") {
            items.push(m.to_string());
        }
        for (label, key) in [
            ("decided", "/decidedAt"),
            ("route reverted", "/routeRevertedAt"),
            ("revert verified", "/revertVerifiedAt"),
        ] {
            if let Some(at) = s(a, key) {
                items.push(format!("{label} {at}"));
            }
        }
        t.list("", false, "abort", &items);
    }
    if let Some(at) = s(v, "/status/promotedAt") {
        t.node(
            "",
            false,
            &format!("promoted {at}: waiting for hand-back (delete the Rollout through Git)"),
        );
    }
    t.list("", true, "conditions", &conditions(v));
    t.out
}

/// The status tree of a WaveGate: waves per site with their readings.
pub fn wave_gate(v: &Value) -> String {
    let mut t = Tree::new(head(Kind::WaveGate, v));
    t.node(
        "",
        false,
        &format!(
            "site {}: revision {} (previous {})",
            s(v, "/spec/site").unwrap_or("?"),
            s(v, "/status/currentRevision").unwrap_or("-"),
            s(v, "/status/previousRevision").unwrap_or("-")
        ),
    );
    let decisions: Vec<ClusterDecision> = list_at(v, "/status/decisions");
    t.waves(v, |wave, st| {
        let mut items: Vec<String> = arr(wave, "/clusters")
            .iter()
            .filter_map(Value::as_str)
            .map(|c| {
                let rev = decisions
                    .iter()
                    .find(|d| d.cluster_name == c)
                    .map_or("-", |d| d.revision.as_str());
                format!("cluster {c}: {rev}")
            })
            .collect();
        if let Some(w) = st {
            if let Some(apps) = w.get("applications") {
                items.push(format!(
                    "applications {}/{} synced, {}/{} healthy",
                    num(n(apps, "/synced").unwrap_or(0.0)),
                    num(n(apps, "/total").unwrap_or(0.0)),
                    num(n(apps, "/healthy").unwrap_or(0.0)),
                    num(n(apps, "/total").unwrap_or(0.0))
                ));
            }
            if let Some(p) = n(w, "/proxiesBehind") {
                items.push(format!("proxies behind {}", num(p)));
            }
            if let Some(x) = s(w, "/waitingFor") {
                items.push(format!("waiting for {x}"));
            }
            items.extend(arr(w, "/gates").iter().map(gate_line));
        }
        items
    });
    if let Some(h) = v.pointer("/status/halt") {
        let mut items = vec![format!(
            "{} in wave {}",
            s(h, "/reason").unwrap_or("?"),
            s(h, "/wave").unwrap_or("?")
        )];
        if let Some(m) = s(h, "/message") {
            items.push(m.to_string());
        }
        let pins: Vec<&str> = arr(h, "/pins").iter().filter_map(Value::as_str).collect();
        if !pins.is_empty() {
            items.push(format!("pins {}", pins.join(", ")));
        }
        t.list("", false, "halt", &items);
    }
    t.list("", true, "conditions", &conditions(v));
    t.out
}

/// The status tree of a BundlePin: what is pinned where.
pub fn bundle_pin(v: &Value) -> String {
    let mut t = Tree::new(head(Kind::BundlePin, v));
    t.node(
        "",
        false,
        &format!(
            "bundle {}@{}",
            s(v, "/spec/bundle/repository").unwrap_or("?"),
            s(v, "/spec/bundle/digest").unwrap_or("?")
        ),
    );
    t.node(
        "",
        false,
        &format!("reason: {}", s(v, "/spec/reason").unwrap_or("-")),
    );
    let mut summary = format!(
        "from {} to {}",
        s(v, "/status/fromDigest").unwrap_or("-"),
        s(v, "/status/toDigest").unwrap_or("-")
    );
    if let Some(at) = s(v, "/status/pinnedAt") {
        let _ = write!(summary, ", pinned {at}");
    }
    if let Some(at) = s(v, "/status/releasedAt") {
        let _ = write!(summary, ", released {at}");
    }
    t.node("", false, &summary);
    let apps: Vec<String> = list_at::<PinnedApplication>(v, "/status/applications")
        .iter()
        .map(|a| {
            let mut line = format!(
                "{}/{}  {}  applied {}, pruned {}",
                a.namespace,
                a.name,
                api_name(&a.state),
                a.applied_objects,
                a.pruned_objects
            );
            if let Some(m) = &a.message {
                let _ = write!(line, " — {m}");
            }
            line
        })
        .collect();
    if apps.is_empty() {
        let targets: Vec<String> = arr(v, "/spec/targets")
            .iter()
            .map(|a| format!("{}  not pinned yet", s(a, "/name").unwrap_or("?")))
            .collect();
        t.list("", false, "applications", &targets);
    } else {
        t.list("", false, "applications", &apps);
    }
    if let Some(g) = v.pointer("/status/gitRevert") {
        let line = format!(
            "git revert branch {} {}",
            s(g, "/branch").unwrap_or("-"),
            s(g, "/pullRequestUrl").unwrap_or("")
        );
        t.node("", false, line.trim_end());
    }
    t.list("", true, "conditions", &conditions(v));
    t.out
}

/// The status tree of a RevisionUpgrade: proxies per revision, waves, namespaces, budget.
pub fn revision_upgrade(v: &Value) -> String {
    let mut t = Tree::new(head(Kind::RevisionUpgrade, v));
    t.node(
        "",
        false,
        &format!(
            "{} ({}) → {} ({})",
            s(v, "/spec/fromTag").unwrap_or("?"),
            s(v, "/spec/fromRevision").unwrap_or("?"),
            s(v, "/spec/toTag").unwrap_or("?"),
            s(v, "/spec/toRevision").unwrap_or("?")
        ),
    );
    match at::<ProxyCounts>(v, "/status/proxies") {
        Some(p) => {
            let total = f64::from(p.old) + f64::from(p.new) + f64::from(p.other);
            let share = if total > 0.0 {
                pct(f64::from(p.new) / total)
            } else {
                "-".into()
            };
            t.node(
                "",
                false,
                &format!(
                    "proxies: {} new, {} old, {} other ({share} moved)",
                    p.new, p.old, p.other
                ),
            );
        }
        None => {
            t.node("", false, "proxies: not counted yet");
        }
    }
    if let Some(b) = at::<IssuanceBudgetStatus>(v, "/status/issuanceBudget") {
        t.node(
            "",
            false,
            &format!(
                "issuance budget: {} tokens, observed {}/s, background {}/s{}",
                num(b.tokens.floor()),
                num(b.observed_rate),
                num(b.background_rate),
                if b.throttled { ", throttled" } else { "" }
            ),
        );
    }
    let namespaces: Vec<NamespaceProgress> = list_at(v, "/status/namespaces");
    t.waves(v, |wave, st| {
        let name = s(wave, "/name").unwrap_or("?");
        let mut items: Vec<String> = namespaces
            .iter()
            .filter(|ns| ns.wave == name)
            .map(|ns| {
                format!(
                    "namespace {}  {}  {}/{} pods",
                    ns.name,
                    api_name(&ns.state),
                    ns.pods_done,
                    ns.pods
                )
            })
            .collect();
        if let Some(w) = st {
            items.extend(arr(w, "/gates").iter().map(gate_line));
        }
        items
    });
    let legacy: Vec<String> = arr(v, "/status/injectionEnabledNamespaces")
        .iter()
        .filter_map(Value::as_str)
        .map(|ns| format!("{ns}: istio-injection=enabled ignores istio.io/rev"))
        .collect();
    if !legacy.is_empty() {
        t.list("", false, "not moved", &legacy);
    }
    t.list("", true, "conditions", &conditions(v));
    t.out
}

/// The status tree of a GateTemplate (it has no status: its definition).
pub fn gate_template(v: &Value) -> String {
    let mut t = Tree::new(format!(
        "GateTemplate {}",
        s(v, "/metadata/name").unwrap_or("?")
    ));
    let spec = gate_template_spec(v);
    if let Some(d) = spec.as_ref().and_then(|spec| spec.description.as_deref()) {
        t.node("", false, d);
    }
    let definition = spec.map(|spec| spec.definition).unwrap_or_default();
    let what = match (definition.builtin, definition.promql) {
        (Some(b), _) => format!("builtin {}", api_name(&b)),
        (None, Some(q)) => format!("promql {q}"),
        _ => "no definition".to_string(),
    };
    t.node("", true, &what);
    t.out
}

/// The status tree of any sluice object.
pub fn status(kind: Kind, v: &Value) -> String {
    match kind {
        Kind::Rollout => rollout(v),
        Kind::WaveGate => wave_gate(v),
        Kind::BundlePin => bundle_pin(v),
        Kind::RevisionUpgrade => revision_upgrade(v),
        Kind::GateTemplate => gate_template(v),
    }
}

/// The header of `get` for a kind.
pub fn get_header(kind: Kind, all_namespaces: bool) -> Vec<String> {
    let mut h: Vec<&str> = Vec::new();
    if all_namespaces && kind.namespaced() {
        h.push("NAMESPACE");
    }
    h.push("NAME");
    h.extend(match kind {
        Kind::Rollout => &["PHASE", "STEP", "DESIRED", "APPLIED", "VERDICTS"][..],
        Kind::WaveGate => &["PHASE", "SITE", "REVISION", "WAVE"][..],
        Kind::BundlePin => &["PHASE", "APPLICATIONS", "TO"][..],
        Kind::RevisionUpgrade => &["PHASE", "WAVE", "NEW", "OLD"][..],
        Kind::GateTemplate => &["DEFINITION"][..],
    });
    h.into_iter().map(str::to_string).collect()
}

/// One `get` row for an object.
pub fn get_row(kind: Kind, v: &Value, all_namespaces: bool) -> Vec<String> {
    let dash = || "-".to_string();
    let opt = |x: Option<&str>| x.map(str::to_string).unwrap_or_else(dash);
    let mut row = Vec::new();
    if all_namespaces && kind.namespaced() {
        row.push(opt(s(v, "/metadata/namespace")));
    }
    row.push(opt(s(v, "/metadata/name")));
    let phase = opt(s(v, "/status/phase"));
    match kind {
        Kind::Rollout => {
            let verdicts: Vec<String> = arr(v, "/status/gates")
                .iter()
                .map(|g| {
                    format!(
                        "{}={}",
                        s(g, "/gate").unwrap_or("?"),
                        s(g, "/verdict").unwrap_or("?")
                    )
                })
                .collect();
            row.extend([
                phase,
                n(v, "/status/currentStepIndex")
                    .map(num)
                    .unwrap_or_else(dash),
                n(v, "/status/desiredWeight")
                    .map(|w| format!("{}%", num(w)))
                    .unwrap_or_else(dash),
                n(v, "/status/appliedShare").map(pct).unwrap_or_else(dash),
                if verdicts.is_empty() {
                    dash()
                } else {
                    verdicts.join(",")
                },
            ]);
        }
        Kind::WaveGate => row.extend([
            phase,
            opt(s(v, "/spec/site")),
            opt(s(v, "/status/currentRevision")),
            opt(s(v, "/status/currentWave")),
        ]),
        Kind::BundlePin => row.extend([
            phase,
            arr(v, "/spec/targets").len().to_string(),
            opt(s(v, "/status/toDigest")),
        ]),
        Kind::RevisionUpgrade => {
            let proxies = at::<ProxyCounts>(v, "/status/proxies");
            row.extend([
                phase,
                opt(s(v, "/status/currentWave")),
                proxies.as_ref().map_or_else(dash, |p| p.new.to_string()),
                proxies.as_ref().map_or_else(dash, |p| p.old.to_string()),
            ]);
        }
        Kind::GateTemplate => {
            let definition = gate_template_spec(v).map(|spec| spec.definition);
            row.push(match definition {
                Some(GateDefinition {
                    builtin: Some(b), ..
                }) => api_name(&b),
                Some(GateDefinition {
                    promql: Some(_), ..
                }) => "promql".to_string(),
                _ => dash(),
            });
        }
    }
    row
}

/// Formats rows as aligned columns, like kubectl's tables.
pub fn table(rows: &[Vec<String>]) -> String {
    let cols = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..cols)
        .map(|c| {
            rows.iter()
                .filter_map(|r| r.get(c))
                .map(|x| x.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for row in rows {
        let mut line = String::new();
        for (c, cell) in row.iter().enumerate() {
            if c + 1 == row.len() {
                line.push_str(cell);
            } else {
                let _ = write!(line, "{cell:<width$}   ", width = widths[c]);
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn rollout_obj() -> Value {
        json!({
            "metadata": {"name": "checkout", "namespace": "shop", "generation": 2},
            "spec": {
                "routeRef": {"name": "checkout"},
                "stableService": {"name": "checkout-v1"},
                "canaryService": {"name": "checkout-v2"},
                "steps": [
                    {"headerCohort": {"header": {"name": "x-cohort", "value": "staff"}}},
                    {"setWeight": {"weight": 5}},
                    {"setWeight": {"weight": 25}},
                    {"pause": {}},
                ]
            },
            "status": {
                "observedGeneration": 2,
                "phase": "Progressing",
                "currentStepIndex": 2,
                "desiredWeight": 25,
                "appliedShare": 0.2431,
                "ownedRoute": {"name": "checkout", "writtenWeight": 25},
                "gates": [{"gate": "errors", "verdict": "Pass", "reason": "ThresholdMet", "value": 0.002,
                           "threshold": 0.003, "samples": 1200, "minSamples": 100,
                           "consecutiveFailures": 0, "evaluatedAt": "2026-11-30T04:00:00Z"}],
                "history": [
                    {"index": 0, "kind": "HeaderCohort", "startedAt": "t0", "outcome": "Passed"},
                    {"index": 1, "kind": "SetWeight", "startedAt": "t1", "outcome": "Passed"}
                ],
                "conditions": [{"type": "Ready", "status": "True", "reason": "Valid", "message": ""}]
            }
        })
    }

    #[test]
    fn rollout_tree_shows_steps_weight_share_and_verdicts() {
        let text = rollout(&rollout_obj());
        let want = [
            "Rollout shop/checkout  Progressing",
            "route HTTPRoute checkout: stable checkout-v1 / canary checkout-v2, written canary weight 25, owned",
            "traffic: desired weight 25%, applied share 24.3%",
            "steps (4)",
            "0 headerCohort x-cohort: staff  Passed",
            "1 setWeight 5%  Passed",
            "▶ 2 setWeight 25%  current",
            "3 pause until promoted  pending",
            "errors: Pass (ThresholdMet) value 0.002 vs threshold 0.003, samples 1200/100",
            "└─ conditions",
            "Ready True Valid",
        ];
        for w in want {
            assert!(text.contains(w), "lacks {w:?} in\n{text}");
        }
        let mut stale = rollout_obj();
        stale["metadata"]["generation"] = json!(3);
        assert!(rollout(&stale).contains("(status is for generation 2, spec is at 3)"));
    }

    #[test]
    fn rollout_tree_shows_every_route_of_the_plan_with_its_kind_and_weight() {
        let mut obj = rollout_obj();
        obj["spec"]["routeRef"] = json!({"kind": "GRPCRoute", "name": "payments"});
        obj["spec"]["additionalRoutes"] = json!([
            {"name": "payments-mesh"},
            {"kind": "GRPCRoute", "name": "payments-edge"},
        ]);
        obj["status"]["additionalOwnedRoutes"] = json!([
            {"name": "payments-mesh", "kind": "HTTPRoute", "writtenWeight": 25},
        ]);
        let text = rollout(&obj);
        for w in [
            "route GRPCRoute payments: stable checkout-v1 / canary checkout-v2, written canary weight 25, owned",
            "route HTTPRoute payments-mesh (additional), written canary weight 25, owned",
        ] {
            assert!(text.contains(w), "lacks {w:?} in\n{text}");
        }
        // Not owned yet: named, without a weight.
        assert!(
            text.lines()
                .any(|l| l.ends_with("route GRPCRoute payments-edge (additional)")),
            "{text}"
        );
    }

    #[test]
    fn wave_gate_tree_shows_waves_per_site_with_readings() {
        let v = json!({
            "metadata": {"name": "eu", "namespace": "argocd"},
            "spec": {"site": "eu-west", "waves": [
                {"name": "canary", "clusters": ["eu-1"]},
                {"name": "rest", "clusters": ["eu-2", "eu-3"]}]},
            "status": {"phase": "Soaking", "currentRevision": "sha256:bb", "previousRevision": "sha256:aa",
                "currentWave": "canary",
                "decisions": [
                    {"clusterName": "eu-1", "revision": "sha256:bb", "wave": "canary"},
                    {"clusterName": "eu-2", "revision": "sha256:aa", "wave": "rest"},
                    {"clusterName": "eu-3", "revision": "sha256:aa", "wave": "rest"}],
                "waves": [{"name": "canary", "state": "Soaking", "proxiesBehind": 0,
                           "applications": {"total": 2, "synced": 2, "healthy": 2},
                           "gates": [{"gate": "drift", "verdict": "Pass", "reason": "ThresholdMet", "value": 0}]}]}
        });
        let text = wave_gate(&v);
        for w in [
            "WaveGate argocd/eu  Soaking",
            "site eu-west: revision sha256:bb (previous sha256:aa)",
            "▶ canary  Soaking",
            "cluster eu-1: sha256:bb",
            "applications 2/2 synced, 2/2 healthy",
            "proxies behind 0",
            "drift: Pass (ThresholdMet) value 0",
            "rest  Pending",
            "cluster eu-3: sha256:aa",
        ] {
            assert!(text.contains(w), "lacks {w:?} in\n{text}");
        }
    }

    #[test]
    fn pin_and_upgrade_trees() {
        let pin = json!({
            "metadata": {"name": "p", "namespace": "argocd"},
            "spec": {"bundle": {"repository": "oci://r/m", "digest": "sha256:cc"}, "reason": "5xx",
                     "targets": [{"name": "mesh-eu-1"}]},
            "status": {"phase": "Pinned", "fromDigest": "sha256:dd", "toDigest": "sha256:cc",
                       "applications": [{"name": "mesh-eu-1", "namespace": "argocd", "state": "Pinned",
                                         "appliedObjects": 12, "prunedObjects": 1}]}
        });
        let text = bundle_pin(&pin);
        for w in [
            "BundlePin argocd/p  Pinned",
            "from sha256:dd to sha256:cc",
            "argocd/mesh-eu-1  Pinned  applied 12, pruned 1",
        ] {
            assert!(text.contains(w), "lacks {w:?} in\n{text}");
        }
        let up = json!({
            "metadata": {"name": "to-1-28"},
            "spec": {"fromTag": "stable", "fromRevision": "1-27", "toTag": "canary", "toRevision": "1-28",
                     "waves": [{"name": "low-risk"}, {"name": "tier-1"}]},
            "status": {"phase": "Progressing", "currentWave": "low-risk",
                       "proxies": {"old": 950, "new": 50, "other": 0},
                       "issuanceBudget": {"tokens": 1500.7, "observedRate": 120, "backgroundRate": 30.5, "throttled": false},
                       "namespaces": [{"name": "ads", "wave": "low-risk", "state": "Restarting", "pods": 40, "podsDone": 25}],
                       "injectionEnabledNamespaces": ["legacy"]}
        });
        let text = revision_upgrade(&up);
        for w in [
            "RevisionUpgrade to-1-28  Progressing",
            "stable (1-27) → canary (1-28)",
            "proxies: 50 new, 950 old, 0 other (5% moved)",
            "issuance budget: 1500 tokens, observed 120/s, background 30.5/s",
            "▶ low-risk  Pending",
            "namespace ads  Restarting  25/40 pods",
            "legacy: istio-injection=enabled ignores istio.io/rev",
        ] {
            assert!(text.contains(w), "lacks {w:?} in\n{text}");
        }
    }

    #[test]
    fn get_rows_and_table() {
        let v = rollout_obj();
        let rows = vec![
            get_header(Kind::Rollout, true),
            get_row(Kind::Rollout, &v, true),
        ];
        let text = table(&rows);
        let lines: Vec<&str> = text.lines().collect();
        assert!(
            lines[0].starts_with("NAMESPACE   NAME       PHASE"),
            "{text}"
        );
        assert!(
            lines[1].contains(
                "shop        checkout   Progressing   2      25%       24.3%     errors=Pass"
            ),
            "{text}"
        );
        // A GateTemplate's definition is flattened into its spec (as the CRD has it).
        let builtin =
            json!({"metadata": {"name": "errors"}, "spec": {"builtin": "MeshErrorRatio"}});
        assert_eq!(
            get_row(Kind::GateTemplate, &builtin, false),
            vec!["errors", "MeshErrorRatio"]
        );
        let promql = json!({"metadata": {"name": "p99"}, "spec": {"promql": "sum(x)", "description": "p99 latency"}});
        assert_eq!(
            get_row(Kind::GateTemplate, &promql, false),
            vec!["p99", "promql"]
        );
        let text = gate_template(&promql);
        assert!(text.contains("promql sum(x)"), "{text}");
        assert_eq!(
            get_row(
                Kind::RevisionUpgrade,
                &json!({"metadata": {"name": "u"}}),
                true
            ),
            vec!["u", "-", "-", "-", "-"]
        );
    }
}
