//! Test support for the pieces the sluice Helm chart ships beside the operators.
//!
//! Owns: reading the chart's files (`charts/sluice/...`), running an Argo CD Lua health check
//! the way Argo CD does (the object as the global `obj`, a table `{status, message}` returned),
//! and collecting the metric names a dashboard or alert rule uses. It never renders the chart
//! (scripts/chart-check.sh does that with helm) and never talks to a cluster.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use mlua::{Lua, LuaSerdeExt, SerializeOptions, Value};

/// The health statuses Argo CD knows (`health.HealthStatusCode`).
pub const ARGOCD_HEALTH_STATUSES: &[&str] = &[
    "Healthy",
    "Progressing",
    "Degraded",
    "Suspended",
    "Missing",
    "Unknown",
];

/// Every sluice kind, each with a health check in `charts/sluice/argocd/health/<Kind>.lua`.
pub const SLUICE_KINDS: &[&str] = &[
    "Rollout",
    "WaveGate",
    "BundlePin",
    "RevisionUpgrade",
    "GateTemplate",
];

/// What went wrong reading a chart file or running a health check.
#[derive(Debug, thiserror::Error, strum::IntoStaticStr)]
pub enum ChartTestError {
    /// A chart file could not be read.
    #[error("cannot read {path}: {source}; run the tests from the sluice repository")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The Lua script failed to load or run.
    #[error("health check {script} failed to run: {source}")]
    Lua {
        /// The script's name.
        script: String,
        /// The Lua error.
        source: mlua::Error,
    },
    /// The script returned something Argo CD would not accept.
    #[error(
        "health check {script} returned {what}; Argo CD needs a table with a status among {ARGOCD_HEALTH_STATUSES:?} and a message"
    )]
    BadResult {
        /// The script's name.
        script: String,
        /// What it returned instead.
        what: String,
    },
}

impl ChartTestError {
    /// A bounded name of the error's kind.
    pub fn category(&self) -> &'static str {
        self.into()
    }
}

/// The chart directory, `charts/sluice` at the repository root.
pub fn chart_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../charts/sluice")
}

/// Reads a file of the chart, relative to [`chart_dir`].
pub fn read_chart_file(relative: &str) -> Result<String, ChartTestError> {
    let path = chart_dir().join(relative);
    std::fs::read_to_string(&path).map_err(|source| ChartTestError::Read { path, source })
}

/// The Lua health check of a sluice kind, as the chart ships it.
pub fn health_script(kind: &str) -> Result<String, ChartTestError> {
    read_chart_file(&format!("argocd/health/{kind}.lua"))
}

/// What a health check returned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Health {
    /// One of [`ARGOCD_HEALTH_STATUSES`].
    pub status: String,
    /// The message Argo CD shows beside the status.
    pub message: String,
}

/// Runs a health check on an object (its JSON form) as Argo CD does: a fresh Lua state, the
/// object as the global `obj` with absent fields as nil, the returned table read as
/// `{status, message}`.
pub fn run_health(
    name: &str,
    script: &str,
    object: &serde_json::Value,
) -> Result<Health, ChartTestError> {
    let lua_err = |source| ChartTestError::Lua {
        script: name.to_string(),
        source,
    };
    let lua = Lua::new();
    let options = SerializeOptions::new()
        .serialize_none_to_null(false)
        .serialize_unit_to_null(false);
    let obj = lua.to_value_with(object, options).map_err(lua_err)?;
    lua.globals().set("obj", obj).map_err(lua_err)?;
    let result: Value = lua.load(script).set_name(name).eval().map_err(lua_err)?;
    let bad = |what: String| ChartTestError::BadResult {
        script: name.to_string(),
        what,
    };
    let Value::Table(table) = result else {
        return Err(bad(format!("a {}", result.type_name())));
    };
    let status: Option<String> = table.get("status").map_err(lua_err)?;
    let message: Option<String> = table.get("message").map_err(lua_err)?;
    match (status, message) {
        (Some(status), Some(message)) if ARGOCD_HEALTH_STATUSES.contains(&status.as_str()) => {
            Ok(Health { status, message })
        }
        (status, message) => Err(bad(format!("status {status:?}, message {message:?}"))),
    }
}

/// Every `sluice_*` metric name in a PromQL expression or dashboard text, with histogram and
/// counter suffixes (`_bucket`, `_sum`, `_count`, `_total`, `_created`) kept as written.
pub fn sluice_metric_names(text: &str) -> BTreeSet<String> {
    let bytes = text.as_bytes();
    let mut names = BTreeSet::new();
    let mut i = 0;
    while let Some(offset) = text[i..].find("sluice_") {
        let start = i + offset;
        let boundary = start == 0 || {
            let c = bytes[start - 1];
            !(c.is_ascii_alphanumeric() || c == b'_' || c == b':' || c == b'-' || c == b'.')
        };
        let mut end = start;
        while end < bytes.len() && (bytes[end].is_ascii_alphanumeric() || bytes[end] == b'_') {
            end += 1;
        }
        if boundary {
            names.insert(text[start..end].to_string());
        }
        i = end.max(start + 1);
    }
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metric_names_are_found_in_promql() {
        let cases: &[(&str, &[&str])] = &[
            (
                "max by (name) (sluice_rollout_phase{phase=\"Promoted\"}) == 1",
                &["sluice_rollout_phase"],
            ),
            (
                "histogram_quantile(0.9, sum by (le) (rate(sluice_abort_seconds_bucket[5m]))) / sluice_x_total",
                &["sluice_abort_seconds_bucket", "sluice_x_total"],
            ),
            // Label values and words that merely contain the prefix are not metric names.
            ("up{job=\"t-sluice_a\"} and my_sluice_b", &[]),
            ("no metric here", &[]),
        ];
        for (text, want) in cases {
            let got: Vec<String> = sluice_metric_names(text).into_iter().collect();
            assert_eq!(got, *want, "in {text}");
        }
    }

    #[test]
    fn a_script_returning_a_bad_status_is_refused() {
        let obj = serde_json::json!({"metadata": {"name": "x"}});
        let cases: &[(&str, &str)] = &[
            ("return {status = 'Fine', message = 'x'}", "BadResult"),
            ("return 'Healthy'", "BadResult"),
            ("return {status = 'Healthy'}", "BadResult"),
            ("return obj.status.phase", "Lua"),
        ];
        for (script, category) in cases {
            let err = run_health("case", script, &obj).unwrap_err();
            assert_eq!(err.category(), *category, "{script}: {err}");
        }
        let ok = run_health(
            "ok",
            "return {status='Healthy', message=obj.metadata.name}",
            &obj,
        );
        assert_eq!(ok.unwrap().message, "x");
    }
}
