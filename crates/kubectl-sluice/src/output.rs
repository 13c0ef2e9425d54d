//! Machine-readable output of `get`, `status` and `waves` (`-o json|yaml`): objects as the API
//! server returns them, without `metadata.managedFields` (as kubectl prints them by default);
//! several objects as a `v1` `List`, like `kubectl get -o json`.
//!
//! Owns serialisation only; no I/O but the returned text.

use clap::ValueEnum;
use serde_json::{Value, json};

use crate::error::CliError;

/// `-o` formats.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// JSON, indented.
    Json,
    /// YAML.
    Yaml,
}

/// The object without `metadata.managedFields`.
pub fn clean(object: &Value) -> Value {
    let mut object = object.clone();
    if let Some(meta) = object.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.remove("managedFields");
    }
    object
}

/// A `v1` `List` of the objects, as `kubectl get -o json` prints several objects.
pub fn list(objects: &[Value]) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "List",
        "metadata": {"resourceVersion": ""},
        "items": objects.iter().map(clean).collect::<Vec<_>>(),
    })
}

/// `value` in `format`, ending with a newline.
pub fn render(format: Format, value: &Value) -> Result<String, CliError> {
    let mut text = match format {
        Format::Json => serde_json::to_string_pretty(value).map_err(|e| CliError::Usage {
            message: format!("cannot print JSON: {e}"),
        })?,
        Format::Yaml => serde_saphyr::to_string(value).map_err(|e| CliError::Usage {
            message: format!("cannot print YAML: {e}"),
        })?,
    };
    if !text.ends_with('\n') {
        text.push('\n');
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn objects_print_without_managed_fields_and_yaml_reads_back() {
        let obj = json!({
            "apiVersion": "sluice.dev/v1alpha1", "kind": "WaveGate",
            "metadata": {"name": "eu", "managedFields": [{"manager": "x"}], "labels": {"a": "1"}},
            "spec": {"site": "eu-west", "revision": "sha256:00", "waves": [{"name": "canary", "clusters": ["eu-1"]}]},
            "status": {"phase": "Soaking", "appliedShare": 0.25, "note": "yes: no # not a comment"}
        });
        let want = clean(&obj);
        assert!(want["metadata"].get("managedFields").is_none());
        let text = render(Format::Json, &obj).unwrap();
        assert_eq!(serde_json::from_str::<Value>(&text).unwrap(), obj);
        let yaml = render(Format::Yaml, &want).unwrap();
        assert_eq!(
            serde_saphyr::from_str::<Value>(&yaml).unwrap(),
            want,
            "{yaml}"
        );
        let all = list(&[obj.clone(), obj]);
        assert_eq!(all["kind"], "List");
        assert_eq!(all["items"][1], want);
    }
}
