//! The operator's Prometheus metrics: reconciles, reconcile durations, errors by bounded
//! category, and whether this replica leads.
//!
//! Owns metric names, help texts and label sets. Must never label a series with an object's
//! name, a message or anything else unbounded: `kind` and `category` come from fixed sets.

use std::time::Duration;

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{
        counter::Counter,
        family::Family,
        gauge::Gauge,
        histogram::{Histogram, exponential_buckets},
    },
    registry::Registry,
};

use crate::error::Category;

/// Labels of reconcile series: the kind reconciled.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct KindLabels {
    /// The reconciled kind, e.g. `Rollout`.
    pub kind: String,
}

/// Labels of the error series.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct ErrorLabels {
    /// The reconciled kind.
    pub kind: String,
    /// The bounded error category ([`Category::label`]).
    pub category: String,
}

/// Handles to the shared metrics; cheap to clone.
#[derive(Debug, Clone)]
pub struct Metrics {
    reconciles: Family<KindLabels, Counter>,
    durations: Family<KindLabels, Histogram>,
    errors: Family<ErrorLabels, Counter>,
    leader: Gauge,
}

fn duration_histogram() -> Histogram {
    // 1 ms .. ~33 s: a reconcile is API round trips, a slow one waits on a metrics query.
    Histogram::new(exponential_buckets(0.001, 2.0, 16))
}

impl Metrics {
    /// Registers the metrics under the `sluice_` prefix in `registry`.
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self {
            reconciles: Family::default(),
            durations: Family::new_with_constructor(duration_histogram as fn() -> Histogram),
            errors: Family::default(),
            leader: Gauge::default(),
        };
        let sub = registry.sub_registry_with_prefix("sluice");
        sub.register(
            "reconciles",
            "Reconciles run, by kind",
            m.reconciles.clone(),
        );
        sub.register(
            "reconcile_duration_seconds",
            "Duration of one reconcile in seconds, by kind",
            m.durations.clone(),
        );
        sub.register(
            "reconcile_errors",
            "Reconciles that failed, by kind and bounded error category",
            m.errors.clone(),
        );
        sub.register(
            "leader",
            "1 while this replica holds the leader-election Lease and reconciles, else 0",
            m.leader.clone(),
        );
        m
    }

    /// Records one reconcile of `kind` that took `took` and failed with `error` if any.
    pub fn observe(&self, kind: &str, took: Duration, error: Option<Category>) {
        let labels = KindLabels {
            kind: kind.to_owned(),
        };
        self.reconciles.get_or_create(&labels).inc();
        self.durations
            .get_or_create(&labels)
            .observe(took.as_secs_f64());
        if let Some(category) = error {
            self.errors
                .get_or_create(&ErrorLabels {
                    kind: kind.to_owned(),
                    category: category.label().to_owned(),
                })
                .inc();
        }
    }

    /// Sets the leader gauge.
    pub fn set_leader(&self, leader: bool) {
        self.leader.set(i64::from(leader));
    }
}

/// Encodes `registry` in the OpenMetrics text format.
pub fn encode(registry: &Registry) -> String {
    let mut out = String::new();
    // Writing into a String cannot fail.
    let _ = prometheus_client::encoding::text::encode(&mut out, registry);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn observations_show_up_with_bounded_labels() {
        let mut registry = Registry::default();
        let m = Metrics::register(&mut registry);
        m.observe("Rollout", Duration::from_millis(3), None);
        m.observe(
            "Rollout",
            Duration::from_millis(5),
            Some(Category::Conflict),
        );
        m.set_leader(true);
        let text = encode(&registry);
        let table = [
            "sluice_reconciles_total{kind=\"Rollout\"} 2",
            "sluice_reconcile_errors_total{kind=\"Rollout\",category=\"conflict\"} 1",
            "sluice_reconcile_duration_seconds_count{kind=\"Rollout\"} 2",
            "sluice_leader 1",
            "# EOF",
        ];
        for want in table {
            assert!(text.contains(want), "missing {want:?} in\n{text}");
        }
        m.set_leader(false);
        assert!(encode(&registry).contains("sluice_leader 0"));
    }
}
