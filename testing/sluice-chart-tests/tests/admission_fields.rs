//! charts/sluice/admission/fields.yaml lists, for each CRD kind an operator's admission policy
//! holds unchanged around the field it owns, every other field of the released CRD
//! (.tools/crds). A new field in a schema the chart is installed against fails here, so the
//! policy never silently lets it change. `SLUICE_WRITE_ADMISSION_FIELDS=1` rewrites the `crd:`
//! lists after a deliberate CRD upgrade (read the new fields first: each is one an operator may
//! then not change). The built-in kinds' lists are checked against a real kube-apiserver's
//! OpenAPI by e2e/suite/tests/admission.rs.

use std::path::PathBuf;

use serde_json::Value;
use sluice_testkit::prereq::{self, Upstream};

fn fields_file() -> PathBuf {
    prereq::repo_root().join("charts/sluice/admission/fields.yaml")
}

/// The properties of the object schema at `path` (property names) of `file`'s storage version.
fn properties(file: &str, path: &[&str]) -> Option<Vec<String>> {
    let set = if file.starts_with("gateway") {
        Upstream::GatewayApi
    } else {
        Upstream::ArgoCd
    };
    let file = prereq::or_skip(prereq::upstream_file(set, file))?;
    let crd: Value = serde_yaml::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    let version = crd["spec"]["versions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["storage"] == true)
        .unwrap();
    let mut schema = &version["schema"]["openAPIV3Schema"];
    for p in path {
        schema = &schema["properties"][*p];
    }
    let mut names: Vec<String> = schema["properties"]
        .as_object()
        .unwrap_or_else(|| panic!("{}: no object at {path:?}", file.display()))
        .keys()
        .cloned()
        .collect();
    names.sort();
    Some(names)
}

/// (key in fields.yaml `crd:`, CRD file, path to the object, the field the operator owns).
const LISTS: &[(&str, &str, &[&str], &str)] = &[
    (
        "applicationSpec",
        "application-crd.yaml",
        &["spec"],
        "syncPolicy",
    ),
    (
        "applicationSyncPolicy",
        "application-crd.yaml",
        &["spec", "syncPolicy"],
        "automated",
    ),
    (
        "applicationAutomated",
        "application-crd.yaml",
        &["spec", "syncPolicy", "automated"],
        "enabled",
    ),
    (
        "applicationStatus",
        "application-crd.yaml",
        &["status"],
        "operationState",
    ),
    (
        "applicationOperationState",
        "application-crd.yaml",
        &["status", "operationState"],
        "phase",
    ),
    (
        "httpRouteSpec",
        "gateway.networking.k8s.io_httproutes.yaml",
        &["spec"],
        "rules",
    ),
    (
        "grpcRouteSpec",
        "gateway.networking.k8s.io_grpcroutes.yaml",
        &["spec"],
        "rules",
    ),
];

/// One line per list of `listed` that differs from its CRD (with the rewritten line), or `None`
/// when the released CRDs are not installed (reported by prereq).
fn mismatches(listed: &Value, text: &str) -> Option<Vec<(String, String, String)>> {
    let mut wrong = Vec::new();
    for (key, file, path, owned) in LISTS {
        let all = properties(file, path)?;
        assert!(
            all.iter().any(|f| f == owned),
            "{file} has no {owned} under {path:?}: the operator's owned field moved; fix the policy"
        );
        let want: Vec<String> = all.into_iter().filter(|f| f != owned).collect();
        let have: Vec<String> = listed["crd"][key]
            .as_array()
            .unwrap_or_else(|| panic!("fields.yaml has no crd.{key}"))
            .iter()
            .map(|v| v.as_str().unwrap().to_owned())
            .collect();
        if want != have {
            let line = text
                .lines()
                .find(|l| l.trim_start().starts_with(&format!("{key}:")))
                .unwrap();
            let comment = line.find('#').map(|i| &line[i..]).unwrap_or_default();
            wrong.push((
                format!("crd.{key}: fields.yaml lists {have:?}, {file} {path:?} has {want:?} besides {owned}"),
                line.to_owned(),
                format!("  {key}: [{}]  {comment}", want.join(", ")),
            ));
        }
    }
    Some(wrong)
}

#[test]
fn the_admission_field_lists_name_every_other_field_of_the_released_crds() {
    let text = std::fs::read_to_string(fields_file()).unwrap();
    let listed: Value = serde_yaml::from_str(&text).unwrap();
    let Some(wrong) = mismatches(&listed, &text) else {
        return;
    };
    if !wrong.is_empty() && std::env::var("SLUICE_WRITE_ADMISSION_FIELDS").is_ok_and(|v| v == "1") {
        let mut rewritten = text.clone();
        for (_, old, new) in &wrong {
            rewritten = rewritten.replace(old, new);
        }
        std::fs::write(fields_file(), rewritten).unwrap();
        return;
    }
    let lines: Vec<&str> = wrong.iter().map(|(m, _, _)| m.as_str()).collect();
    assert!(
        lines.is_empty(),
        "a schema gained or lost a field the admission policies must hold unchanged:\n{}\n\
         read each new field, then run SLUICE_WRITE_ADMISSION_FIELDS=1 cargo test -p sluice-chart-tests --test admission_fields",
        lines.join("\n")
    );
}

/// A list that lacks a field of its CRD (as after a CRD upgrade that added one) is reported.
#[test]
fn a_field_the_list_lacks_is_reported() {
    let text = std::fs::read_to_string(fields_file()).unwrap();
    let mut listed: Value = serde_yaml::from_str(&text).unwrap();
    listed["crd"]["applicationSpec"]
        .as_array_mut()
        .unwrap()
        .retain(|f| f != "source");
    let Some(wrong) = mismatches(&listed, &text) else {
        return;
    };
    assert_eq!(wrong.len(), 1, "{wrong:?}");
    assert!(
        wrong[0]
            .0
            .starts_with("crd.applicationSpec: fields.yaml lists"),
        "{}",
        wrong[0].0
    );
    assert!(
        wrong[0]
            .2
            .contains("project, revisionHistoryLimit, source, sourceHydrator"),
        "{}",
        wrong[0].2
    );
}
