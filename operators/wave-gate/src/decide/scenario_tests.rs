use super::*;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use sluice_analysis::GateAction;
use sluice_api::v1alpha1::wave_gate::{WaveState, conditions as types};
use sluice_api::v1alpha1::{
    GateVerdict, Verdict, VerdictReason, WaveGatePhase, WaveGateSpec, WaveGateStatus,
};
use sluice_runtime::conditions::{self as cond};

mod supersede_after_block {
    use super::*;

    #[test]
    fn blocked_then_superseded() {
        let rev = |c: char| format!("sha256:{}", c.to_string().repeat(64));
        let s: WaveGateSpec = serde_json::from_value(serde_json::json!({
            "site": "eu", "applicationSetRef": {"name": "mesh"}, "repository": "oci://r.local/m",
            "revision": rev('c'), "sourceCommit": "abc1234",
            "waves": [{"name": "canary", "clusters": ["c1"]}, {"name": "rest", "clusters": ["c2"]}],
            "driftGate": {"exporter": "None"}, "pin": {"publicKeysSecretRef": {"name": "k"}},
        }))
        .unwrap();
        let status: WaveGateStatus = serde_json::from_value(serde_json::json!({
            "phase": "Halted", "currentRevision": rev('b'), "previousRevision": rev('a'),
            "decisions": [{"clusterName": "c1", "revision": rev('a'), "wave": "canary"}, {"clusterName": "c2", "revision": rev('a'), "wave": "rest"}],
            "waves": [{"name": "canary", "state": "Failed"}, {"name": "rest", "state": "Pending"}],
            "halt": {"reason": "GateFailed", "wave": "canary", "haltedAt": "2027-01-01T00:00:00Z", "pinnedAt": "2027-01-01T00:00:01Z", "revertedClusters": ["c1"], "pins": ["p"]},
        })).unwrap();
        let t = Timestamp::from_second(1_800_000_000).unwrap();
        let o = Observations {
            applications: vec![],
            ..Observations::default()
        };
        let blocked = decide(&s, Some(&status), &o, t);
        assert_eq!(blocked.status.phase, WaveGatePhase::Halted);
        let mut s2 = s.clone();
        s2.supersede_halted = true;
        let d = decide(&s2, Some(&blocked.status), &o, t);
        assert_eq!(d.status.current_revision, Some(rev('c')), "{:#?}", d.status);
    }
}

mod soak_precision {
    use super::*;

    #[test]
    fn the_soak_starts_at_the_next_whole_second() {
        let at = |ms: i64| Timestamp::from_millisecond(1_800_000_000_000 + ms).unwrap();
        for (ms, want) in [(0, 0), (1, 1000), (280, 1000), (999, 1000), (1000, 1000)] {
            assert_eq!(ceil_second(at(ms)), at(want), "{ms} ms");
        }
        // Round trip through the wire format keeps the value exactly.
        let t = Time(ceil_second(at(280)));
        let back: Time = serde_json::from_value(serde_json::to_value(&t).unwrap()).unwrap();
        assert_eq!(back, t);
    }
}

mod held_after_soak {
    use super::*;

    #[test]
    fn a_wave_held_past_its_soak_says_why() {
        let rev = |c: char| format!("sha256:{}", c.to_string().repeat(64));
        let s: WaveGateSpec = serde_json::from_value(serde_json::json!({
            "site": "eu", "applicationSetRef": {"name": "mesh"}, "repository": "oci://r.local/m",
            "revision": rev('b'), "previousRevision": rev('a'),
            "waves": [{"name": "canary", "clusters": ["c1"], "soak": "10s"}],
            "driftGate": {"exporter": "None"}, "pin": {"publicKeysSecretRef": {"name": "k"}},
        }))
        .unwrap();
        let status: WaveGateStatus = serde_json::from_value(serde_json::json!({
            "currentRevision": rev('b'), "previousRevision": rev('a'),
            "decisions": [{"clusterName": "c1", "revision": rev('b'), "wave": "canary"}],
            "waves": [{"name": "canary", "state": "Soaking", "admittedAt": "2027-01-15T08:00:00Z", "convergedAt": "2027-01-15T08:00:00Z"}],
        }))
        .unwrap();
        let now: Timestamp = "2027-01-15T08:00:20Z".parse().unwrap();
        let verdict = GateVerdict {
            inconclusive_since: Some(Time(now)),
            ..GateVerdict::new(
                "mesh-error-ratio",
                Verdict::Inconclusive,
                VerdictReason::NoData,
                Time(now),
            )
        };
        let o = Observations {
            applications: vec![AppView {
                name: "mesh-c1".into(),
                namespace: "argocd".into(),
                cluster: "c1".into(),
                sync_status: Some("Synced".into()),
                synced_revision: Some(rev('b')),
                healthy: true,
            }],
            gates: Some(vec![EvaluatedGate {
                verdict,
                action: GateAction::Pause,
            }]),
            ..Observations::default()
        };
        let d = decide(&s, Some(&status), &o, now);
        assert_eq!(d.status.waves[0].state, WaveState::Soaking);
        let c = cond::find(&d.status.conditions, types::PROGRESSING).unwrap();
        assert!(
            c.message
                .contains("mesh-error-ratio Inconclusive (NoData, paused by policy)"),
            "{}",
            c.message
        );
    }
}
