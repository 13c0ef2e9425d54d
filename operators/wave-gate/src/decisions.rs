//! The decision list Argo CD's clusterDecisionResource generator reads (`status.decisions`).
//!
//! Owns the one invariant that protects a site: once published, the list names every cluster of
//! `spec.waves` with an explicit revision (a manifest digest) and its wave, all values strings.
//! An absent or empty list makes Argo CD delete every generated Application of the site, so this
//! module never produces one, and [`publishable`] is the guard the reconcile checks before
//! every status write. Pure; never reads the cluster.

use std::collections::BTreeMap;

use sluice_api::v1alpha1::{ClusterDecision, WaveGateSpec};

/// Whether `s` is a manifest digest (`sha256:` + 64 lowercase hex).
pub fn is_digest(s: &str) -> bool {
    s.strip_prefix("sha256:").is_some_and(|hex| {
        hex.len() == 64
            && hex
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

/// The complete list for `spec`: every cluster in wave order, with the revision `current` gives
/// it, else `fallback` (a cluster added to a wave since the last write runs what the site ran
/// before the change in progress). Clusters no longer in the spec are dropped.
pub fn complete(
    spec: &WaveGateSpec,
    current: &[ClusterDecision],
    fallback: &str,
) -> Vec<ClusterDecision> {
    let known: BTreeMap<&str, &str> = current
        .iter()
        .map(|d| (d.cluster_name.as_str(), d.revision.as_str()))
        .collect();
    spec.waves
        .iter()
        .flat_map(|w| {
            w.clusters.iter().map(|c| ClusterDecision {
                cluster_name: c.clone(),
                revision: known
                    .get(c.as_str())
                    .copied()
                    .unwrap_or(fallback)
                    .to_owned(),
                wave: w.name.clone(),
            })
        })
        .collect()
}

/// Sets the revision of `clusters` in `decisions`.
pub fn set_revision<'a>(
    decisions: &mut [ClusterDecision],
    clusters: impl IntoIterator<Item = &'a String>,
    revision: &str,
) {
    for c in clusters {
        if let Some(d) = decisions.iter_mut().find(|d| &d.cluster_name == c) {
            d.revision = revision.to_owned();
        }
    }
}

/// Checks that `decisions` may be published for `spec`: when `required` (the list was
/// published before), it names every cluster of the spec exactly once with a digest revision
/// and the right wave. An empty list is allowed only before adoption (`required` false).
pub fn publishable(
    spec: &WaveGateSpec,
    decisions: &[ClusterDecision],
    required: bool,
) -> Result<(), String> {
    if decisions.is_empty() {
        return if required {
            Err("status.decisions would be empty after having been published; Argo CD would delete every Application of the site".into())
        } else {
            Ok(())
        };
    }
    let mut seen: BTreeMap<&str, usize> = BTreeMap::new();
    for d in decisions {
        *seen.entry(d.cluster_name.as_str()).or_default() += 1;
        if !is_digest(&d.revision) {
            return Err(format!(
                "status.decisions for cluster {:?} has revision {:?}, not a sha256 manifest digest",
                d.cluster_name, d.revision
            ));
        }
        match spec.wave_of_cluster(&d.cluster_name) {
            Some(i) if spec.waves[i].name == d.wave => {}
            _ => {
                return Err(format!(
                    "status.decisions names cluster {:?} in wave {:?}, which spec.waves does not",
                    d.cluster_name, d.wave
                ));
            }
        }
    }
    for c in spec.all_clusters() {
        match seen.get(c) {
            Some(1) => {}
            Some(n) => return Err(format!("status.decisions names cluster {c:?} {n} times")),
            None => {
                return Err(format!(
                    "status.decisions misses cluster {c:?} of spec.waves; Argo CD would delete its Applications"
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(c: char) -> String {
        format!("sha256:{}", c.to_string().repeat(64))
    }

    fn spec() -> WaveGateSpec {
        serde_json::from_value(serde_json::json!({
            "site": "a",
            "applicationSetRef": {"name": "mesh"},
            "repository": "oci://registry.local/mesh",
            "revision": d('b'),
            "waves": [{"name": "canary", "clusters": ["c1"]}, {"name": "rest", "clusters": ["c2", "c3"]}],
            "driftGate": {"exporter": "None"},
            "pin": {"publicKeysSecretRef": {"name": "keys"}},
        }))
        .unwrap()
    }

    fn dec(c: &str, rev: String, wave: &str) -> ClusterDecision {
        ClusterDecision {
            cluster_name: c.into(),
            revision: rev,
            wave: wave.into(),
        }
    }

    #[test]
    fn complete_keeps_known_revisions_and_fills_new_clusters() {
        let current = vec![dec("c1", d('b'), "canary"), dec("gone", d('b'), "rest")];
        let got = complete(&spec(), &current, &d('a'));
        assert_eq!(
            got,
            vec![
                dec("c1", d('b'), "canary"),
                dec("c2", d('a'), "rest"),
                dec("c3", d('a'), "rest"),
            ]
        );
        assert_eq!(publishable(&spec(), &got, true), Ok(()));
    }

    #[test]
    fn publishable_table() {
        let full = complete(&spec(), &[], &d('a'));
        let mut missing = full.clone();
        missing.pop();
        let mut empty_rev = full.clone();
        empty_rev[0].revision = String::new();
        let mut tag = full.clone();
        tag[1].revision = "v1.2.3".into();
        let mut wrong_wave = full.clone();
        wrong_wave[0].wave = "rest".into();
        let mut twice = full.clone();
        twice.push(full[2].clone());
        let cases: Vec<(&str, Vec<ClusterDecision>, bool, Option<&str>)> = vec![
            ("complete", full.clone(), true, None),
            ("empty before adoption", vec![], false, None),
            ("empty after publication", vec![], true, Some("empty")),
            (
                "a cluster missing",
                missing,
                true,
                Some("misses cluster \"c3\""),
            ),
            ("empty revision", empty_rev, true, Some("not a sha256")),
            ("a tag", tag, true, Some("not a sha256")),
            (
                "wrong wave",
                wrong_wave,
                true,
                Some("which spec.waves does not"),
            ),
            ("a cluster twice", twice, true, Some("2 times")),
        ];
        for (name, list, required, want) in cases {
            let got = publishable(&spec(), &list, required);
            match want {
                None => assert_eq!(got, Ok(()), "{name}"),
                Some(w) => {
                    let e = got.expect_err(name);
                    assert!(e.contains(w), "{name}: {e}");
                }
            }
        }
    }

    #[test]
    fn digest_shape() {
        assert!(is_digest(&d('a')));
        assert!(!is_digest("sha256:ABC"));
        assert!(!is_digest(&format!("sha256:{}", "A".repeat(64))));
        assert!(!is_digest(""));
    }
}
