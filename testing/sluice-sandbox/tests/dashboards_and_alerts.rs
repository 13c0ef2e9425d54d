//! The chart's dashboards and alerts against the sandbox: every alert the chart renders names
//! the scenario that makes it fire ([`common::dashboards::ALERTS`]), and Grafana's variables are
//! substituted as Grafana does. The queries themselves run in the scenario tests
//! (canary_abort.rs, canary_promote.rs, pin_release.rs, revision_upgrade_scenario.rs, waves.rs),
//! each through [`common::dashboards::run_checked`] during the run whose figures it checks: every
//! dashboard and alert query against the sandbox's Prometheus, failing on a query that errors
//! or never returns data, and on an alert of that scenario that never names its object.

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::dashboards::{ALERTS, Held, Vars, alert_queries, label_values};

#[test]
fn every_alert_names_its_scenario() {
    let Some(alerts) = alert_queries() else {
        return;
    };
    let named: BTreeSet<&str> = ALERTS.iter().map(|(a, _)| *a).collect();
    let rendered: BTreeSet<&str> = alerts.iter().filter_map(|q| q.alert.as_deref()).collect();
    assert_eq!(
        rendered, named,
        "every alert the chart renders is in ALERTS with the scenario that makes it fire"
    );
    let scenarios: BTreeSet<&str> = sluice_sandbox::scenarios::REGISTRY
        .iter()
        .map(|s| s.name)
        .collect();
    for (alert, scenario) in ALERTS {
        assert!(
            scenarios.contains(scenario),
            "{alert} names scenario {scenario}, which does not exist"
        );
    }
}

#[test]
fn grafana_variables_are_substituted_as_grafana_does() {
    let v = Vars::new(Duration::from_secs(95));
    assert_eq!(
        v.apply("rate(x[$__rate_interval]) / rate(x[$__range]) [$__interval]"),
        "rate(x[4s]) / rate(x[95s]) [1s]"
    );
    let mut v = v;
    v.set("object_name", "checkout");
    v.set("object_namespace", "shop");
    assert_eq!(
        v.apply(r#"x{object_namespace=~"$object_namespace", object_name=~"${object_name}"}"#),
        r#"x{object_namespace=~"shop", object_name=~"checkout"}"#
    );
    assert_eq!(
        label_values(r#"label_values(sluice_object_state{kind="Rollout"}, object_name)"#),
        Some((
            r#"sluice_object_state{kind="Rollout"}"#.into(),
            "object_name".into()
        ))
    );
}

#[test]
fn an_alert_is_held_over_consecutive_steps_across_rounds() {
    let mut h = Held::default();
    // Round one: steps at 100..=102; round two starts one step back (101.4) and goes on.
    for at in [100.0, 101.0, 102.0, 101.4, 102.4, 103.4] {
        h.step(at, 1.0);
    }
    assert!((h.longest - 3.4).abs() < 1e-9, "{}", h.longest);
    // A gap of more than a step and a half starts a new run; the longest stays.
    for at in [106.0, 107.0] {
        h.step(at, 1.0);
    }
    assert!((h.longest - 3.4).abs() < 1e-9, "{}", h.longest);
    let mut once = Held::default();
    once.step(100.0, 1.0);
    assert_eq!(once.longest, 0.0, "one step is held for no time");
}
