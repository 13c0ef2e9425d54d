//! Every `sluice_*` metric name a dashboard, an alert rule or an alert-rule test uses is one an
//! operator actually exports: each operator's `metrics::register` and the shared runtime's
//! metrics are registered into one Registry and encoded, and the sample names that encoding
//! produces (counters with `_total`, histograms with `_bucket`/`_sum`/`_count`) are the only
//! ones allowed, besides the drift exporter's contract (which the platform, not sluice, exports).

use std::collections::BTreeSet;

use prometheus_client::encoding::text::encode;
use prometheus_client::registry::Registry;
use sluice_chart_tests::{read_chart_file, sluice_metric_names};
use sluice_runtime::metrics::{Metrics, ObjectSignals};

/// Every operator's metrics and the shared runtime's, in one registry.
fn registry() -> Registry {
    let mut registry = Registry::default();
    sluice_rollout_weights::metrics::register(&mut registry);
    sluice_wave_gate::metrics::register(&mut registry);
    sluice_revert::metrics::register(&mut registry);
    sluice_upgrade_revisions::metrics::register(&mut registry);
    // Each operator's runtime metrics, with the fleet gauges it reads at scrape time.
    let reads: [fn(&ObjectSignals); 4] = [
        sluice_rollout_weights::metrics::read_at_scrape,
        sluice_wave_gate::metrics::read_at_scrape,
        sluice_revert::metrics::read_at_scrape,
        sluice_upgrade_revisions::metrics::read_at_scrape,
    ];
    for read in reads {
        read(&Metrics::register(&mut registry).objects());
    }
    registry
}

/// The sample names the operators export. The exposition gives each metric's type and so its
/// exact sample names (counters `_total`, histograms `_bucket`/`_sum`/`_count`); a labelled
/// family with no series yet is left out of the exposition, so its registered name (read from
/// the registry's descriptors) is allowed with any of those suffixes.
fn exported() -> BTreeSet<String> {
    let registry = registry();
    let mut text = String::new();
    encode(&mut text, &registry).expect("the registries encode");
    let mut names = BTreeSet::new();
    let mut typed = BTreeSet::new();
    for line in text.lines() {
        let mut parts = line.split_whitespace();
        if let (Some("#"), Some("TYPE"), Some(name), Some(kind)) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        {
            let suffixes: &[&str] = match kind {
                "counter" => &["_total", "_created"],
                "histogram" => &["_bucket", "_sum", "_count", "_created"],
                "info" => &["_info"],
                _ => &[""],
            };
            typed.insert(name.to_string());
            names.extend(suffixes.iter().map(|s| format!("{name}{s}")));
        }
    }
    for name in registered(&registry) {
        if !typed.contains(&name) {
            for suffix in ["", "_total", "_created", "_bucket", "_sum", "_count"] {
                names.insert(format!("{name}{suffix}"));
            }
        }
    }
    names
}

/// Every metric name registered, prefixes applied: read from the registry's Debug form, where a
/// registry's (fully qualified) prefix precedes its own descriptors and its sub-registries.
fn registered(registry: &Registry) -> BTreeSet<String> {
    let debug = format!("{registry:?}");
    let token = regex::Regex::new(
        r#"Registry \{ prefix: (?:Some\(Prefix\("([a-z0-9_]+)"\)\)|None)|Descriptor \{ name: "([a-zA-Z0-9_:]+)", help: "(?:[^"\\]|\\.)*", unit: (?:None|Some\(([A-Za-z]+)\))"#,
    )
    .unwrap();
    let mut prefix: Option<String> = None;
    let mut names = BTreeSet::new();
    for c in token.captures_iter(&debug) {
        if c.get(0).unwrap().as_str().starts_with("Registry") {
            prefix = c.get(1).map(|p| p.as_str().to_string());
        } else {
            let mut name = match &prefix {
                Some(p) => format!("{p}_{}", &c[2]),
                None => c[2].to_string(),
            };
            if let Some(unit) = c.get(3) {
                name = format!("{name}_{}", unit.as_str().to_ascii_lowercase());
            }
            names.insert(name);
        }
    }
    names
}

/// Metric names sluice reads but does not export: the platform drift exporter's contract.
fn contract() -> BTreeSet<String> {
    [
        sluice_analysis::builtin::DRIFT_BEHIND_METRIC,
        sluice_analysis::builtin::DRIFT_PROXIES_METRIC,
    ]
    .into_iter()
    .map(str::to_string)
    .collect()
}

#[test]
fn every_dashboard_and_alert_metric_is_exported() {
    let exported = exported();
    assert!(
        exported.contains("sluice_leader") && exported.len() > 20,
        "the registries encode too few names to check against: {exported:?}"
    );
    let contract = contract();
    let files = [
        "templates/monitoring/prometheusrule.yaml",
        "ci/alerts-test.yaml",
        "dashboards/rollouts.json",
        "dashboards/waves.json",
        "dashboards/upgrades.json",
        "dashboards/pins.json",
    ];
    let mut unknown = Vec::new();
    let mut used_total = 0;
    for file in files {
        let text = read_chart_file(file).unwrap();
        let used = sluice_metric_names(&text);
        assert!(!used.is_empty(), "{file} names no sluice metric");
        used_total += used.len();
        for name in used {
            if !exported.contains(&name) && !contract.contains(&name) {
                unknown.push(format!("{file}: {name}"));
            }
        }
    }
    assert!(
        unknown.is_empty(),
        "metric names no operator registers (rename them to what the operators' metrics modules register):\n  {}\nexported:\n  {}",
        unknown.join("\n  "),
        exported.iter().cloned().collect::<Vec<_>>().join("\n  ")
    );
    assert!(used_total > 30, "only {used_total} names checked");
}

#[test]
fn registered_names_are_read_with_their_prefixes() {
    let names = registered(&registry());
    for name in [
        "sluice_rollout_gate_verdicts",
        "sluice_wavegate_phase",
        "sluice_revert_pin_duration_seconds",
        "sluice_upgrade_proxies",
        "sluice_leader",
    ] {
        assert!(names.contains(name), "{name} not among {names:?}");
    }
}

#[test]
fn the_fleet_gauges_read_at_scrape_time_are_exported() {
    let exported = exported();
    for name in [
        "sluice_rollouts",
        "sluice_revert_pins",
        "sluice_revert_oldest_pin_age_seconds",
    ] {
        assert!(exported.contains(name), "{name} not among {exported:?}");
    }
}

#[test]
fn a_name_no_operator_registers_is_caught() {
    let exported = exported();
    for name in sluice_metric_names("rate(sluice_rollout_made_up_total[5m]) + sluice_rollouts") {
        let known = exported.contains(&name);
        assert_eq!(known, name == "sluice_rollouts", "{name}");
    }
}
