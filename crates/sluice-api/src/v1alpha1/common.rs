//! Small value types shared by every sluice.dev kind: duration strings, object references.
//!
//! Owns the wire shape of these values and their pure parsing. Never performs I/O and never
//! reads the clock.

use std::borrow::Cow;
use std::fmt;

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Serialize};

/// The pattern every duration string in the sluice.dev API must match: one or more
/// `<digits><unit>` groups with unit `ms`, `s`, `m` or `h` (for example `30s`, `1h30m`, `500ms`).
pub const DURATION_PATTERN: &str = "^([0-9]+(ms|s|m|h))+$";

/// The longest duration string accepted (bounds CEL cost and keeps `kubectl get` readable).
pub const DURATION_MAX_LENGTH: u32 = 32;

/// A duration written as a Go/Prometheus-style string such as `30s`, `10m` or `1h30m`.
///
/// Deserialisation accepts any string (the CRD schema enforces [`DURATION_PATTERN`]); call
/// [`DurationString::parse`] to obtain a [`std::time::Duration`].
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct DurationString(pub String);

/// Why a duration string could not be parsed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DurationParseError {
    /// The offending input.
    pub input: String,
    /// What was wrong with it.
    pub problem: &'static str,
}

impl fmt::Display for DurationParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "invalid duration {:?}: {}; write digits followed by ms, s, m or h, e.g. 30s or 1h30m",
            self.input, self.problem
        )
    }
}

impl std::error::Error for DurationParseError {}

impl DurationString {
    /// Builds a duration string from text (not validated; see [`DurationString::parse`]).
    pub fn new(s: impl Into<String>) -> Self {
        Self(s.into())
    }

    /// Formats a [`std::time::Duration`] as the shortest `h`/`m`/`s`/`ms` string.
    pub fn from_duration(d: std::time::Duration) -> Self {
        let mut ms = d.as_millis();
        if ms == 0 {
            return Self("0s".into());
        }
        let mut out = String::new();
        for (unit, size) in [("h", 3_600_000u128), ("m", 60_000), ("s", 1_000), ("ms", 1)] {
            if ms >= size {
                out.push_str(&format!("{}{}", ms / size, unit));
                ms %= size;
            }
        }
        Self(out)
    }

    /// The raw text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Parses the string into a [`std::time::Duration`].
    pub fn parse(&self) -> Result<std::time::Duration, DurationParseError> {
        parse_duration(&self.0)
    }
}

impl fmt::Display for DurationString {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<&str> for DurationString {
    fn from(s: &str) -> Self {
        Self(s.to_owned())
    }
}

impl JsonSchema for DurationString {
    fn inline_schema() -> bool {
        true
    }

    fn schema_name() -> Cow<'static, str> {
        "DurationString".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "type": "string",
            "pattern": DURATION_PATTERN,
            "maxLength": DURATION_MAX_LENGTH,
        })
    }
}

/// Parses a duration string matching [`DURATION_PATTERN`].
pub fn parse_duration(input: &str) -> Result<std::time::Duration, DurationParseError> {
    let err = |problem| DurationParseError {
        input: input.to_owned(),
        problem,
    };
    if input.is_empty() {
        return Err(err("it is empty"));
    }
    if input.len() > DURATION_MAX_LENGTH as usize {
        return Err(err("it is longer than 32 characters"));
    }
    let bytes = input.as_bytes();
    let mut i = 0;
    let mut total: u128 = 0;
    while i < bytes.len() {
        let start = i;
        while i < bytes.len() && bytes[i].is_ascii_digit() {
            i += 1;
        }
        if start == i {
            return Err(err("a unit is not preceded by a number"));
        }
        let n: u128 = input[start..i]
            .parse()
            .map_err(|_| err("a number is too large"))?;
        let unit_ms: u128 = if input[i..].starts_with("ms") {
            i += 2;
            1
        } else if input[i..].starts_with('s') {
            i += 1;
            1_000
        } else if input[i..].starts_with('m') {
            i += 1;
            60_000
        } else if input[i..].starts_with('h') {
            i += 1;
            3_600_000
        } else {
            return Err(err("a number is not followed by ms, s, m or h"));
        };
        total = total
            .checked_add(n.checked_mul(unit_ms).ok_or_else(|| err("it overflows"))?)
            .ok_or_else(|| err("it overflows"))?;
    }
    let millis = u64::try_from(total).map_err(|_| err("it overflows"))?;
    Ok(std::time::Duration::from_millis(millis))
}

/// A schemars transform that drops a type's own description, so that the documentation of the
/// field using the type (its `kubectl explain` text) is not replaced by the type's when kube's
/// `Option<enum>` rewriting hoists the type's schema into the field.
pub fn drop_type_description(schema: &mut Schema) {
    schema.remove("description");
}

/// The most `matchLabels` entries and `matchExpressions` a bounded label selector may hold.
pub const SELECTOR_MAX_REQUIREMENTS: u64 = 16;

/// The most values one `matchExpressions` requirement of a bounded label selector may list.
pub const SELECTOR_MAX_VALUES: u64 = 32;

/// Schema transform for a k8s-openapi `LabelSelector` field: bounds `matchLabels` and
/// `matchExpressions` to [`SELECTOR_MAX_REQUIREMENTS`] and each requirement's `values` to
/// [`SELECTOR_MAX_VALUES`], so a selector cannot grow without limit in the object or in the
/// operator's memory.
pub fn bounded_label_selector(schema: &mut Schema) {
    let props = schema
        .get_mut("properties")
        .and_then(serde_json::Value::as_object_mut)
        .expect("a LabelSelector schema has properties");
    props
        .get_mut("matchLabels")
        .and_then(serde_json::Value::as_object_mut)
        .expect("a LabelSelector schema has matchLabels")
        .insert("maxProperties".into(), SELECTOR_MAX_REQUIREMENTS.into());
    let expressions = props
        .get_mut("matchExpressions")
        .and_then(serde_json::Value::as_object_mut)
        .expect("a LabelSelector schema has matchExpressions");
    expressions.insert("maxItems".into(), SELECTOR_MAX_REQUIREMENTS.into());
    expressions
        .get_mut("items")
        .and_then(|i| i.pointer_mut("/properties/values"))
        .and_then(serde_json::Value::as_object_mut)
        .expect("a LabelSelectorRequirement schema has values")
        .insert("maxItems".into(), SELECTOR_MAX_VALUES.into());
}

/// A reference to an object by name in the same namespace as the referring object.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LocalObjectRef {
    /// Name of the referenced object (a DNS-1123 subdomain, at most 253 characters).
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
}

/// A reference to a Secret key in the same namespace as the referring object.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecretKeysRef {
    /// Name of the Secret (same namespace as the referring object).
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// Keys of the Secret to read (each a Secret data key: at most 253 characters of
    /// `-._a-zA-Z0-9`). At most 16. Absent: every key of the Secret is used.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(
        length(max = 16),
        inner(length(min = 1, max = 253), regex(pattern = r"^[-._a-zA-Z0-9]+$"))
    )]
    pub keys: Vec<String>,
}

/// A reference to a namespaced object, optionally in another namespace.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NamespacedObjectRef {
    /// Name of the referenced object.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// Namespace of the referenced object. Absent: the referring object's namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63))]
    pub namespace: Option<String>,
}

/// The pattern of an OCI manifest digest: `sha256:` and 64 lowercase hex digits (never a tag).
pub const DIGEST_PATTERN: &str = "^sha256:[a-f0-9]{64}$";

/// Whether `s` is an OCI manifest digest matching [`DIGEST_PATTERN`].
pub fn is_digest(s: &str) -> bool {
    s.len() == 71
        && s.starts_with("sha256:")
        && s[7..]
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// Schema of a gate's `variables` map: at most 16 entries, values at most 256 characters.
pub fn variables_schema(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "object",
        "maxProperties": 16,
        "additionalProperties": {"type": "string", "maxLength": 256},
    })
}

/// Schema of a status field kept verbatim as arbitrary JSON (`x-kubernetes-preserve-unknown-fields`).
pub fn preserved_json_schema(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "object",
        "nullable": true,
        "x-kubernetes-preserve-unknown-fields": true,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn parse_duration_table() {
        let cases: &[(&str, Option<Duration>)] = &[
            ("30s", Some(Duration::from_secs(30))),
            ("500ms", Some(Duration::from_millis(500))),
            ("1h30m", Some(Duration::from_secs(5400))),
            ("10m", Some(Duration::from_secs(600))),
            ("1m1s1ms", Some(Duration::from_millis(61_001))),
            ("0s", Some(Duration::ZERO)),
            ("", None),
            ("30", None),
            ("s", None),
            ("1d", None),
            ("1.5s", None),
            ("-1s", None),
            ("99999999999999999999999h", None),
        ];
        for (input, want) in cases {
            assert_eq!(parse_duration(input).ok(), *want, "input {input:?}");
        }
    }

    #[test]
    fn format_round_trips() {
        for secs in [0u64, 1, 59, 60, 61, 3600, 5400, 86_400] {
            let d = Duration::from_secs(secs);
            let s = DurationString::from_duration(d);
            assert_eq!(s.parse().unwrap(), d, "{s}");
        }
        assert_eq!(
            DurationString::from_duration(Duration::from_millis(1500)).as_str(),
            "1s500ms"
        );
    }

    #[test]
    fn digest_table() {
        let hex = "a".repeat(64);
        let cases = [
            (format!("sha256:{hex}"), true),
            (format!("sha256:{}", "A".repeat(64)), false),
            (format!("sha256:{}", "a".repeat(63)), false),
            ("latest".to_owned(), false),
            (format!("sha512:{hex}"), false),
        ];
        for (d, want) in cases {
            assert_eq!(is_digest(&d), want, "{d}");
        }
    }

    #[test]
    fn parse_error_names_input_and_fix() {
        let e = parse_duration("5 minutes").unwrap_err().to_string();
        assert!(e.contains("\"5 minutes\"") && e.contains("30s"), "{e}");
    }
}
