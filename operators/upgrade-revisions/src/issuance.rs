//! Reading certificate issuance from the metrics source: what one query asks and what its
//! answer means. Issuance is the sum, over every certificate authority replica of every
//! revision (istiod runs several per revision, each with its own counter), of each counter's
//! increase over the window, counter resets (a replica restart) handled by `increase()`. The
//! series are configurable (`--issuance-series`): istiod's
//! `citadel_server_success_cert_issuance_count` by default; a platform issuing SVIDs with SPIRE
//! names SPIRE server's X.509-SVID signing counter instead.
//!
//! Pure: builds the query and interprets its answer; never talks to the metrics source. No
//! answer is never read as zero issuance.

use std::time::Duration;

/// The default issuance series: istiod's CA counter of this cluster. `{{cluster}}` is replaced
/// by the cluster's label value (escaped).
pub const DEFAULT_ISSUANCE_SERIES: &str =
    "citadel_server_success_cert_issuance_count{cluster=\"{{cluster}}\"}";

/// The series selector (a metric name with label matchers, never an expression: the query
/// takes its range and offset) for `cluster`: `template` with `{{cluster}}` replaced (escaped for a
/// PromQL string).
pub fn series(template: &str, cluster: &str) -> String {
    template.replace(
        "{{cluster}}",
        &sluice_analysis::template::escape_string(cluster),
    )
}

/// One instant query answering three parts, told apart by the label `part`: `value`, the sum
/// over every series of its increase over the window; `ts`, the newest sample's timestamp;
/// `early`, the oldest timestamp of the samples one window ago (absent until the source holds
/// a whole window).
pub fn query(series: &str, window: Duration) -> String {
    let w = window.as_secs().max(1);
    format!(
        "label_replace(sum(increase({series}[{w}s])), \"part\", \"value\", \"\", \"\") \
         or label_replace(max(timestamp({series})), \"part\", \"ts\", \"\", \"\") \
         or label_replace(min(timestamp({series} offset {w}s)), \"part\", \"early\", \"\", \"\")"
    )
}

/// What the answer says: SVIDs issued in the window, or why it cannot be used.
pub fn interpret(
    series: &str,
    value: Option<f64>,
    newest: Option<f64>,
    early: Option<f64>,
    window: Duration,
    now_seconds: f64,
) -> Result<f64, String> {
    let (Some(value), Some(newest)) = (value, newest) else {
        return Err(format!("no {series} series in the metrics source"));
    };
    if early.is_none() {
        return Err(format!(
            "{series} has no sample older than the window of {window:?} yet"
        ));
    }
    let stale = now_seconds - newest;
    if stale > window.as_secs_f64() {
        return Err(format!("the newest {series} sample is {stale:.0}s old"));
    }
    if !value.is_finite() {
        return Err(format!("the increase of {series} is not a number"));
    }
    Ok(value.max(0.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_query_sums_the_increase_of_every_replica() {
        let s = series(DEFAULT_ISSUANCE_SERIES, "east\"1");
        assert_eq!(
            s,
            "citadel_server_success_cert_issuance_count{cluster=\"east\\\"1\"}"
        );
        let q = query(&s, Duration::from_secs(60));
        assert!(q.contains(&format!("sum(increase({s}[60s]))")), "{q}");
        assert!(!q.contains("max(citadel"), "never the largest counter: {q}");
        assert!(q.contains(&format!("timestamp({s} offset 60s)")), "{q}");
    }

    #[test]
    fn no_answer_is_not_zero() {
        let w = Duration::from_secs(60);
        let s = "c";
        let table = [
            (Some(12.0), Some(1000.0), Some(940.0), Ok(12.0)),
            (Some(-1.0), Some(1000.0), Some(940.0), Ok(0.0)),
            (None, Some(1000.0), Some(940.0), Err("no c series")),
            (Some(1.0), None, Some(940.0), Err("no c series")),
            (Some(1.0), Some(1000.0), None, Err("no sample older")),
            (Some(1.0), Some(900.0), Some(840.0), Err("is 100s old")),
        ];
        for (value, newest, early, want) in table {
            let got = interpret(s, value, newest, early, w, 1000.0);
            match want {
                Ok(v) => assert_eq!(got, Ok(v)),
                Err(e) => assert!(got.as_ref().is_err_and(|m| m.contains(e)), "{got:?}"),
            }
        }
    }
}
