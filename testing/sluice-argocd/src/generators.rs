//! ApplicationSet generation, pure: the cluster generator's and the clusterDecisionResource
//! generator's parameters, template rendering (`{{name}}` fasttemplate, or `{{.name}}` with
//! `goTemplate: true` for plain field references), and the plan of Application writes under
//! `applicationsSync` and `ignoreApplicationDifferences`. It must never do I/O.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Map, Value};

use crate::diff;
use crate::types::{ApplicationMatchExpression, ClusterGenerator, DuckGenerator};

/// One parameter set (Argo CD's non-Go-template parameters are flat strings).
pub type Params = BTreeMap<String, String>;

/// A cluster as the generators see it (from its cluster Secret).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ClusterInfo {
    /// `name` of the Secret's data.
    pub name: String,
    /// `server` of the Secret's data.
    pub server: String,
    /// The Secret's labels.
    pub labels: BTreeMap<String, String>,
    /// The Secret's annotations.
    pub annotations: BTreeMap<String, String>,
}

/// The cluster generator: one parameter set per cluster Secret the selector matches.
pub fn cluster_params(generator: &ClusterGenerator, clusters: &[ClusterInfo]) -> Vec<Params> {
    clusters
        .iter()
        .filter(|c| generator.selector.matches(&c.labels))
        .map(|c| {
            let mut p = Params::new();
            p.insert("name".into(), c.name.clone());
            p.insert("nameNormalized".into(), normalize_name(&c.name));
            p.insert("server".into(), c.server.clone());
            for (k, v) in &c.labels {
                p.insert(format!("metadata.labels.{k}"), v.clone());
            }
            for (k, v) in &c.annotations {
                p.insert(format!("metadata.annotations.{k}"), v.clone());
            }
            for (k, v) in &generator.values {
                p.insert(format!("values.{k}"), v.clone());
            }
            p
        })
        .collect()
}

fn normalize_name(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect()
}

/// The duck-type ConfigMap's settings.
#[derive(Clone, Debug, PartialEq)]
pub struct DuckConfig {
    /// `group/version` of the decision resource.
    pub api_version: String,
    /// Plural resource name (Argo CD puts it in the `kind` key).
    pub resource: String,
    /// Key of the status list (default `clusters`).
    pub status_list_key: String,
    /// Key matched against cluster names.
    pub match_key: String,
}

/// Reads the duck ConfigMap's `data`, as Argo CD does (an apiVersion without a group is refused).
pub fn duck_config(
    config_map: &str,
    data: &BTreeMap<String, String>,
) -> Result<DuckConfig, String> {
    let api_version = data.get("apiVersion").cloned().unwrap_or_default();
    let resource = data.get("kind").cloned().unwrap_or_default();
    if resource.is_empty() || api_version.find('/').is_none_or(|i| i < 1) {
        return Err(format!(
            "ConfigMap {config_map} must give apiVersion as group/version and kind as the plural resource name (got apiVersion {api_version:?}, kind {resource:?})"
        ));
    }
    Ok(DuckConfig {
        api_version,
        resource,
        status_list_key: data
            .get("statusListKey")
            .filter(|s| !s.is_empty())
            .cloned()
            .unwrap_or_else(|| "clusters".into()),
        match_key: data.get("matchKey").cloned().unwrap_or_default(),
    })
}

/// Checks the generator names exactly one of `name` and `labelSelector`.
pub fn check_duck_selection(generator: &DuckGenerator) -> Result<(), String> {
    let by_name = !generator.name.is_empty();
    let by_selector = !generator.label_selector.is_empty();
    if by_name == by_selector {
        return Err(
            "clusterDecisionResource must set exactly one of name and labelSelector".into(),
        );
    }
    Ok(())
}

/// The clusterDecisionResource generator over the listed decision resources.
///
/// As Argo CD: no decision resource at all is an error (nothing changes); a resource without
/// status, or a status without the list, contributes no decision; no decision in total yields no
/// parameters (so generated Applications are deleted where the policy allows); a decision whose
/// match key names no known cluster is skipped; every key of a decision becomes a parameter, and
/// a non-string value is an error.
pub fn duck_params(
    generator: &DuckGenerator,
    config: &DuckConfig,
    resources: &[Value],
    clusters: &[ClusterInfo],
) -> Result<Vec<Params>, String> {
    if resources.is_empty() {
        return Err(format!(
            "no clusterDecisionResources found ({} {} {})",
            config.api_version,
            config.resource,
            if generator.name.is_empty() {
                format!("selected by {}", generator.label_selector.to_query())
            } else {
                format!("named {}", generator.name)
            }
        ));
    }
    if config.match_key.is_empty() {
        return Ok(Vec::new());
    }
    let mut decisions: Vec<&Value> = Vec::new();
    for resource in resources {
        if let Some(list) = resource
            .get("status")
            .and_then(|s| s.get(&config.status_list_key))
            .and_then(Value::as_array)
        {
            decisions.extend(list);
        }
    }
    let mut out = Vec::new();
    for decision in decisions {
        let Some(entry) = decision.as_object() else {
            return Err(format!(
                "status.{} holds a non-object entry {decision}; every decision must be an object of strings",
                config.status_list_key
            ));
        };
        let Some(matched) = entry
            .get(&config.match_key)
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
        else {
            continue;
        };
        let Some(cluster) = clusters.iter().find(|c| c.name == matched) else {
            continue;
        };
        let mut p = Params::new();
        p.insert("name".into(), cluster.name.clone());
        p.insert("server".into(), cluster.server.clone());
        for (k, v) in entry {
            match v {
                Value::String(s) => {
                    p.insert(k.clone(), s.clone());
                }
                other => {
                    return Err(format!(
                        "decision for {matched:?}: key {k:?} has the non-string value {other}; every value of a decision must be a string"
                    ));
                }
            }
        }
        for (k, v) in &generator.values {
            p.insert(format!("values.{k}"), v.clone());
        }
        out.push(p);
    }
    Ok(out)
}

/// Deep-merges a generator's template override over the ApplicationSet's template.
pub fn merge_template(base: &Value, over: &Value) -> Value {
    match (base, over) {
        (Value::Object(b), Value::Object(o)) => {
            let mut out = b.clone();
            for (k, v) in o {
                let merged = match out.get(k) {
                    Some(existing) => merge_template(existing, v),
                    None => v.clone(),
                };
                out.insert(k.clone(), merged);
            }
            Value::Object(out)
        }
        (_, Value::Null) => base.clone(),
        (_, o) => o.clone(),
    }
}

/// Renders every string of `template` with `params`.
pub fn render(template: &Value, params: &Params, go_template: bool) -> Result<Value, String> {
    Ok(match template {
        Value::String(s) => Value::String(render_str(s, params, go_template)?),
        Value::Array(a) => Value::Array(
            a.iter()
                .map(|v| render(v, params, go_template))
                .collect::<Result<_, _>>()?,
        ),
        Value::Object(m) => {
            let mut out = Map::new();
            for (k, v) in m {
                out.insert(
                    render_str(k, params, go_template)?,
                    render(v, params, go_template)?,
                );
            }
            Value::Object(out)
        }
        other => other.clone(),
    })
}

fn render_str(s: &str, params: &Params, go_template: bool) -> Result<String, String> {
    let mut out = String::new();
    let mut rest = s;
    while let Some(start) = rest.find("{{") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let Some(end) = after.find("}}") else {
            out.push_str(&rest[start..]);
            return Ok(out);
        };
        let tag = after[..end].trim();
        if go_template {
            let Some(path) = tag.strip_prefix('.').filter(|p| {
                !p.is_empty()
                    && p.chars()
                        .all(|c| c.is_ascii_alphanumeric() || "._-/".contains(c))
            }) else {
                return Err(format!(
                    "template expression {{{{{tag}}}}} is not a plain field reference ({{{{.name}}}}); the simulation renders only those"
                ));
            };
            match params.get(path) {
                Some(v) => out.push_str(v),
                None => {
                    return Err(format!(
                        "map has no entry for key {path:?} (missingkey=error)"
                    ));
                }
            }
        } else {
            match params.get(tag) {
                Some(v) => out.push_str(v),
                // fasttemplate leaves an unknown tag as it is.
                None => out.push_str(&rest[start..start + 2 + end + 2]),
            }
        }
        rest = &after[end + 2..];
    }
    out.push_str(rest);
    Ok(out)
}

/// `applicationsSync` as permissions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Policy {
    /// Existing Applications may be updated.
    pub update: bool,
    /// Applications no longer generated may be deleted.
    pub delete: bool,
}

/// Reads `applicationsSync` (absent or `sync`: everything allowed).
pub fn policy(applications_sync: Option<&str>) -> Result<Policy, String> {
    match applications_sync.unwrap_or("sync") {
        "sync" | "" => Ok(Policy {
            update: true,
            delete: true,
        }),
        "create-only" => Ok(Policy {
            update: false,
            delete: false,
        }),
        "create-update" => Ok(Policy {
            update: true,
            delete: false,
        }),
        "create-delete" => Ok(Policy {
            update: false,
            delete: true,
        }),
        other => Err(format!(
            "applicationsSync {other:?} is not one of create-only, create-update, create-delete, sync"
        )),
    }
}

/// One write the ApplicationSet controller makes.
#[derive(Clone, Debug, PartialEq)]
pub enum AppAction {
    /// Create this Application.
    Create(Value),
    /// Replace the generated fields of an existing Application with this object.
    Update(Value),
    /// Delete the Application of this name.
    Delete(String),
}

/// Keeps the live value of every ignored field in the generated Application.
pub fn apply_ignore_differences(
    generated: &Value,
    live: &Value,
    rules: &[ApplicationMatchExpression],
) -> Value {
    let name = generated
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let mut out = generated.clone();
    for rule in rules.iter().filter(|r| r.name.is_empty() || r.name == name) {
        let pointers = rule.json_pointers.iter().cloned().chain(
            rule.jq_path_expressions
                .iter()
                .filter_map(|e| diff::jq_to_pointer(e)),
        );
        for pointer in pointers {
            match diff::get_pointer(live, &pointer) {
                Some(v) => diff::set_pointer(&mut out, &pointer, v.clone()),
                None => diff::remove_pointer(&mut out, &pointer),
            }
        }
    }
    out
}

/// The fields of an Application the ApplicationSet controller owns.
fn generated_part(app: &Value) -> Value {
    let mut out = serde_json::json!({"spec": app.get("spec").cloned().unwrap_or(Value::Null)});
    for key in ["labels", "annotations", "finalizers"] {
        if let Some(v) = app.pointer(&format!("/metadata/{key}")) {
            out["metadata"][key] = v.clone();
        }
    }
    out
}

/// The writes that bring the existing generated Applications to the desired ones.
pub fn plan(
    desired: &[Value],
    existing: &[Value],
    policy: Policy,
    ignore: &[ApplicationMatchExpression],
) -> Vec<AppAction> {
    let name_of = |v: &Value| {
        v.pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    };
    let existing_by_name: BTreeMap<String, &Value> =
        existing.iter().map(|v| (name_of(v), v)).collect();
    let mut actions = Vec::new();
    let mut wanted = BTreeSet::new();
    for app in desired {
        let name = name_of(app);
        wanted.insert(name.clone());
        match existing_by_name.get(&name) {
            None => actions.push(AppAction::Create(app.clone())),
            Some(live) => {
                if !policy.update || live.pointer("/metadata/deletionTimestamp").is_some() {
                    continue;
                }
                let target = apply_ignore_differences(app, live, ignore);
                if !diff::contained_in(&generated_part(&target), live)
                    || generated_part(&target)["spec"]
                        != live.get("spec").cloned().unwrap_or(Value::Null)
                {
                    actions.push(AppAction::Update(target));
                }
            }
        }
    }
    if policy.delete {
        for name in existing_by_name.keys() {
            if !wanted.contains(name) {
                actions.push(AppAction::Delete(name.clone()));
            }
        }
    }
    actions
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn clusters() -> Vec<ClusterInfo> {
        vec![
            ClusterInfo {
                name: "east-1".into(),
                server: "http://127.0.0.1:1".into(),
                labels: [("env".to_string(), "prod".to_string())]
                    .into_iter()
                    .collect(),
                annotations: [("team".to_string(), "mesh".to_string())]
                    .into_iter()
                    .collect(),
            },
            ClusterInfo {
                name: "east-2".into(),
                server: "http://127.0.0.1:2".into(),
                labels: [("env".to_string(), "dev".to_string())]
                    .into_iter()
                    .collect(),
                annotations: BTreeMap::new(),
            },
        ]
    }

    #[test]
    fn cluster_generator_params() {
        let g: ClusterGenerator = serde_json::from_value(
            json!({"selector": {"matchLabels": {"env": "prod"}}, "values": {"x": "y"}}),
        )
        .unwrap();
        let p = cluster_params(&g, &clusters());
        assert_eq!(p.len(), 1);
        assert_eq!(p[0]["name"], "east-1");
        assert_eq!(p[0]["server"], "http://127.0.0.1:1");
        assert_eq!(p[0]["metadata.labels.env"], "prod");
        assert_eq!(p[0]["metadata.annotations.team"], "mesh");
        assert_eq!(p[0]["values.x"], "y");
        assert_eq!(
            cluster_params(&ClusterGenerator::default(), &clusters()).len(),
            2
        );
    }

    fn config() -> DuckConfig {
        duck_config(
            "duck",
            &[
                ("apiVersion", "sluice.dev/v1alpha1"),
                ("kind", "wavegates"),
                ("statusListKey", "decisions"),
                ("matchKey", "clusterName"),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        )
        .unwrap()
    }

    #[test]
    fn duck_generator_table() {
        let g = DuckGenerator {
            name: "site".into(),
            ..Default::default()
        };
        let with = |status: Value| vec![json!({"metadata": {"name": "site"}, "status": status})];
        type Case = (&'static str, Vec<Value>, Result<usize, &'static str>);
        let cases: Vec<Case> = vec![
            (
                "no resource",
                vec![],
                Err("no clusterDecisionResources found"),
            ),
            (
                "no status",
                vec![json!({"metadata": {"name": "site"}})],
                Ok(0),
            ),
            ("no list", with(json!({"other": 1})), Ok(0)),
            ("empty list", with(json!({"decisions": []})), Ok(0)),
            (
                "two decisions",
                with(
                    json!({"decisions": [{"clusterName": "east-1", "revision": "sha256:a", "wave": "1"}, {"clusterName": "east-2", "revision": "sha256:b", "wave": "2"}]}),
                ),
                Ok(2),
            ),
            (
                "unknown cluster skipped",
                with(json!({"decisions": [{"clusterName": "west-9", "revision": "sha256:a"}]})),
                Ok(0),
            ),
            (
                "non-string value",
                with(json!({"decisions": [{"clusterName": "east-1", "wave": 1}]})),
                Err("non-string value"),
            ),
        ];
        for (name, resources, want) in cases {
            let got = duck_params(&g, &config(), &resources, &clusters());
            match (got, want) {
                (Ok(p), Ok(n)) => assert_eq!(p.len(), n, "{name}"),
                (Err(e), Err(w)) => assert!(e.contains(w), "{name}: {e}"),
                (got, want) => panic!("{name}: got {got:?}, want {want:?}"),
            }
        }
        let p = duck_params(
            &g,
            &config(),
            &with(json!({"decisions": [{"clusterName": "east-1", "revision": "sha256:a"}]})),
            &clusters(),
        )
        .unwrap();
        assert_eq!(p[0]["revision"], "sha256:a");
        assert_eq!(p[0]["clusterName"], "east-1");
        assert_eq!(p[0]["server"], "http://127.0.0.1:1");
        assert!(duck_config("d", &BTreeMap::new()).is_err());
        assert!(check_duck_selection(&DuckGenerator::default()).is_err());
        assert!(check_duck_selection(&g).is_ok());
    }

    #[test]
    fn rendering_table() {
        let p: Params = [("name", "east-1"), ("revision", "sha256:a")]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let t = json!({"metadata": {"name": "mesh-{{name}}"}, "spec": {"source": {"targetRevision": "{{ revision }}"}, "x": "{{unknown}}", "n": 3}});
        let r = render(&t, &p, false).unwrap();
        assert_eq!(
            r,
            json!({"metadata": {"name": "mesh-east-1"}, "spec": {"source": {"targetRevision": "sha256:a"}, "x": "{{unknown}}", "n": 3}})
        );
        let g = json!({"metadata": {"name": "mesh-{{ .name }}"}});
        assert_eq!(
            render(&g, &p, true).unwrap(),
            json!({"metadata": {"name": "mesh-east-1"}})
        );
        assert!(render(&json!("{{.missing}}"), &p, true).is_err());
        assert!(render(&json!("{{ if .name }}x{{ end }}"), &p, true).is_err());
    }

    #[test]
    fn policy_table() {
        assert_eq!(
            policy(None).unwrap(),
            Policy {
                update: true,
                delete: true
            }
        );
        assert_eq!(
            policy(Some("create-update")).unwrap(),
            Policy {
                update: true,
                delete: false
            }
        );
        assert_eq!(
            policy(Some("create-only")).unwrap(),
            Policy {
                update: false,
                delete: false
            }
        );
        assert_eq!(
            policy(Some("create-delete")).unwrap(),
            Policy {
                update: false,
                delete: true
            }
        );
        assert!(policy(Some("bogus")).is_err());
    }

    fn app(name: &str, rev: &str, automated: Value) -> Value {
        json!({"metadata": {"name": name}, "spec": {"source": {"targetRevision": rev}, "syncPolicy": {"automated": automated}}})
    }

    #[test]
    fn plan_table() {
        let all = policy(None).unwrap();
        let cu = policy(Some("create-update")).unwrap();
        let co = policy(Some("create-only")).unwrap();
        let existing = vec![
            app("a", "r1", json!({"selfHeal": true})),
            app("gone", "r1", json!({})),
        ];
        let desired = vec![
            app("a", "r2", json!({"selfHeal": true})),
            app("new", "r2", json!({})),
        ];
        let kinds = |actions: &[AppAction]| -> Vec<String> {
            actions
                .iter()
                .map(|a| match a {
                    AppAction::Create(v) => {
                        format!("create {}", v["metadata"]["name"].as_str().unwrap())
                    }
                    AppAction::Update(v) => {
                        format!("update {}", v["metadata"]["name"].as_str().unwrap())
                    }
                    AppAction::Delete(n) => format!("delete {n}"),
                })
                .collect()
        };
        assert_eq!(
            kinds(&plan(&desired, &existing, all, &[])),
            vec!["update a", "create new", "delete gone"]
        );
        assert_eq!(
            kinds(&plan(&desired, &existing, cu, &[])),
            vec!["update a", "create new"]
        );
        assert_eq!(
            kinds(&plan(&desired, &existing, co, &[])),
            vec!["create new"]
        );
        assert_eq!(
            kinds(&plan(&existing, &existing, all, &[])),
            Vec::<String>::new()
        );
        // A hand-edited syncPolicy is kept under ignoreApplicationDifferences.
        let edited = vec![app("a", "r1", json!({"enabled": false}))];
        let ignore: Vec<ApplicationMatchExpression> =
            vec![serde_json::from_value(json!({"jsonPointers": ["/spec/syncPolicy"]})).unwrap()];
        let same_rev = vec![app("a", "r1", json!({"selfHeal": true}))];
        assert!(plan(&same_rev, &edited, all, &ignore).is_empty());
        let actions = plan(
            &[app("a", "r2", json!({"selfHeal": true}))],
            &edited,
            all,
            &ignore,
        );
        match &actions[..] {
            [AppAction::Update(v)] => {
                assert_eq!(v["spec"]["source"]["targetRevision"], "r2");
                assert_eq!(
                    v["spec"]["syncPolicy"]["automated"],
                    json!({"enabled": false})
                );
            }
            other => panic!("{other:?}"),
        }
        // Without the rule the edit is reverted.
        assert_eq!(kinds(&plan(&same_rev, &edited, all, &[])), vec!["update a"]);
    }
}
