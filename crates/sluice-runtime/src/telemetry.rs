//! Installs the process-wide tracing subscriber.
//!
//! Owns log format (JSON in the cluster, text locally) and the level filter. Must never be
//! called twice with effect, and never logs secrets: span fields are kind/namespace/name only.

use tracing_subscriber::{EnvFilter, fmt, layer::SubscriberExt, util::SubscriberInitExt};

use crate::config::LogFormat;

/// The log filter could not be parsed.
#[derive(Debug, thiserror::Error)]
#[error(
    "invalid --log-level / SLUICE_LOG_LEVEL {filter:?}: {source}; use e.g. `info` or `info,kube=warn`"
)]
pub struct TelemetryError {
    /// The filter text given.
    pub filter: String,
    /// Parser error.
    #[source]
    pub source: tracing_subscriber::filter::ParseError,
}

impl crate::error::Categorized for TelemetryError {
    fn category(&self) -> crate::error::Category {
        crate::error::Category::Config
    }
}

/// Parses a filter in `EnvFilter` syntax.
pub fn filter(level: &str) -> Result<EnvFilter, TelemetryError> {
    EnvFilter::try_new(level).map_err(|source| TelemetryError {
        filter: level.to_owned(),
        source,
    })
}

/// Installs the global subscriber. A second call keeps the first subscriber (tests call this
/// freely) and returns `Ok`.
pub fn init(format: LogFormat, level: &str) -> Result<(), TelemetryError> {
    let filter = filter(level)?;
    let registry = tracing_subscriber::registry().with(filter);
    let _ = match format {
        LogFormat::Json => registry
            .with(
                fmt::layer()
                    .json()
                    .flatten_event(true)
                    .with_current_span(true),
            )
            .try_init(),
        LogFormat::Text => registry.with(fmt::layer().with_target(false)).try_init(),
    };
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_parse_or_name_the_bad_value() {
        assert!(filter("info").is_ok());
        assert!(filter("info,kube=warn").is_ok());
        let err = filter("info,kube=loud").unwrap_err();
        assert!(err.to_string().contains("kube=loud"), "{err}");
    }
}
