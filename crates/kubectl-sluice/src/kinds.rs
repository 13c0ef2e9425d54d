//! The sluice kinds the plugin knows, their names on the command line (kind, plural, the CRDs'
//! short names `srol`/`srollout`, `swg`, `spin`, `sru`, `sgt`, and the plugin's own `ro`, `wg`,
//! `pin`, `ru`, `gt`) and the `[KIND/]NAME` argument form.
//!
//! Owns naming only; never talks to a cluster.

use std::fmt;

use kube::core::ApiResource;
use sluice_api::v1alpha1;

use crate::error::CliError;

/// A sluice kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `Rollout` (namespaced).
    Rollout,
    /// `WaveGate` (namespaced).
    WaveGate,
    /// `BundlePin` (namespaced).
    BundlePin,
    /// `RevisionUpgrade` (cluster-scoped).
    RevisionUpgrade,
    /// `GateTemplate` (cluster-scoped).
    GateTemplate,
}

impl Kind {
    /// Every kind, in the order `get all` lists them.
    pub const ALL: [Kind; 5] = [
        Kind::Rollout,
        Kind::WaveGate,
        Kind::BundlePin,
        Kind::RevisionUpgrade,
        Kind::GateTemplate,
    ];

    /// The kind's name as the API spells it.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Rollout => "Rollout",
            Kind::WaveGate => "WaveGate",
            Kind::BundlePin => "BundlePin",
            Kind::RevisionUpgrade => "RevisionUpgrade",
            Kind::GateTemplate => "GateTemplate",
        }
    }

    /// The plural resource name.
    pub fn plural(self) -> &'static str {
        match self {
            Kind::Rollout => "rollouts",
            Kind::WaveGate => "wavegates",
            Kind::BundlePin => "bundlepins",
            Kind::RevisionUpgrade => "revisionupgrades",
            Kind::GateTemplate => "gatetemplates",
        }
    }

    /// Whether objects of this kind live in a namespace.
    pub fn namespaced(self) -> bool {
        !matches!(self, Kind::RevisionUpgrade | Kind::GateTemplate)
    }

    /// The kube-rs resource description of the kind, from sluice-api's type (group, version,
    /// kind and plural as the CRD declares them).
    pub fn api_resource(self) -> ApiResource {
        match self {
            Kind::Rollout => ApiResource::erase::<v1alpha1::Rollout>(&()),
            Kind::WaveGate => ApiResource::erase::<v1alpha1::WaveGate>(&()),
            Kind::BundlePin => ApiResource::erase::<v1alpha1::BundlePin>(&()),
            Kind::RevisionUpgrade => ApiResource::erase::<v1alpha1::RevisionUpgrade>(&()),
            Kind::GateTemplate => ApiResource::erase::<v1alpha1::GateTemplate>(&()),
        }
    }

    /// The CRD's short names (`kubectl get swg` works with them too).
    pub fn short_names(self) -> &'static [&'static str] {
        match self {
            Kind::Rollout => &["srol", "srollout"],
            Kind::WaveGate => &["swg"],
            Kind::BundlePin => &["spin"],
            Kind::RevisionUpgrade => &["sru"],
            Kind::GateTemplate => &["sgt"],
        }
    }

    /// The plugin's own shorter names (the CRDs' carry an `s` so they cannot collide with
    /// other projects' kinds in `kubectl get`; the plugin only ever means sluice's).
    pub fn aliases(self) -> &'static [&'static str] {
        match self {
            Kind::Rollout => &["ro"],
            Kind::WaveGate => &["wg"],
            Kind::BundlePin => &["pin", "pins", "bp"],
            Kind::RevisionUpgrade => &["ru", "upgrade", "upgrades"],
            Kind::GateTemplate => &["gt"],
        }
    }

    /// Parses a kind as typed on the command line: kind, plural, the CRD's short names, the
    /// plugin's aliases, any case, with or without `.sluice.dev`.
    pub fn parse(text: &str) -> Result<Kind, CliError> {
        let t = text.to_ascii_lowercase();
        let t = t.strip_suffix(".sluice.dev").unwrap_or(&t);
        Kind::ALL
            .into_iter()
            .find(|k| {
                t == k.name().to_ascii_lowercase()
                    || t == k.plural()
                    || k.short_names().contains(&t)
                    || k.aliases().contains(&t)
            })
            .ok_or_else(|| CliError::UnknownKind {
                kind: text.to_string(),
            })
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An object named on the command line: `NAME` (the command's kind) or `KIND/NAME`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    /// The kind.
    pub kind: Kind,
    /// The object's name.
    pub name: String,
}

impl Target {
    /// Parses `[KIND/]NAME` for a command that acts on `allowed` kinds (the first is the
    /// default); a kind outside `allowed` is refused, naming the command.
    pub fn parse(text: &str, command: &str, allowed: &[Kind]) -> Result<Target, CliError> {
        let (kind, name) = match text.split_once('/') {
            Some((kind, name)) => (Kind::parse(kind)?, name),
            None => (allowed[0], text),
        };
        if name.is_empty() {
            return Err(CliError::Usage {
                message: format!("'{text}' names no object: give NAME or KIND/NAME"),
            });
        }
        if !allowed.contains(&kind) {
            return Err(CliError::WrongKind {
                command: command.to_string(),
                kind,
                name: name.to_string(),
                allowed: allowed.to_vec(),
            });
        }
        Ok(Target {
            kind,
            name: name.to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_parse_from_every_spelling() {
        let cases = [
            ("rollout", Kind::Rollout),
            ("Rollouts", Kind::Rollout),
            ("ro", Kind::Rollout),
            ("rollouts.sluice.dev", Kind::Rollout),
            ("wg", Kind::WaveGate),
            ("WaveGate", Kind::WaveGate),
            ("pin", Kind::BundlePin),
            ("bundlepins", Kind::BundlePin),
            ("ru", Kind::RevisionUpgrade),
            ("upgrade", Kind::RevisionUpgrade),
            ("gatetemplate", Kind::GateTemplate),
            ("swg", Kind::WaveGate),
            ("spin", Kind::BundlePin),
            ("sru", Kind::RevisionUpgrade),
            ("sgt", Kind::GateTemplate),
            ("srol", Kind::Rollout),
        ];
        for (text, kind) in cases {
            assert_eq!(Kind::parse(text).unwrap(), kind, "{text}");
        }
        assert_eq!(
            Kind::parse("deployment").unwrap_err().category(),
            "UnknownKind"
        );
    }

    /// Every name the CRDs give a kind (kind, plural, singular, shortNames) parses to it, and
    /// the plugin addresses it with the CRD's scope.
    #[test]
    fn every_crd_name_and_scope_is_the_plugins() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../crds");
        let mut seen = Vec::new();
        for kind in Kind::ALL {
            let path = dir.join(format!("{}.sluice.dev.yaml", kind.plural()));
            let text = std::fs::read_to_string(&path)
                .unwrap_or_else(|e| panic!("{}: {e}: run crdgen", path.display()));
            let crd: serde_json::Value = serde_saphyr::from_str(&text).unwrap();
            let names = &crd["spec"]["names"];
            let mut spellings = vec![
                names["kind"].as_str().unwrap().to_string(),
                names["plural"].as_str().unwrap().to_string(),
                names["singular"].as_str().unwrap().to_string(),
            ];
            let short: Vec<String> = names["shortNames"]
                .as_array()
                .unwrap()
                .iter()
                .map(|n| n.as_str().unwrap().to_string())
                .collect();
            assert_eq!(short, kind.short_names(), "{kind}: short names");
            spellings.extend(short);
            for text in spellings {
                assert_eq!(Kind::parse(&text).unwrap(), kind, "{text}");
                assert_eq!(
                    Kind::parse(&text.to_uppercase()).unwrap(),
                    kind,
                    "{text} in capitals"
                );
            }
            assert_eq!(
                crd["spec"]["scope"] == "Namespaced",
                kind.namespaced(),
                "{kind}: scope"
            );
            assert_eq!(kind.api_resource().plural, kind.plural());
            seen.push(kind);
        }
        assert_eq!(seen, Kind::ALL);
    }

    #[test]
    fn targets_default_to_the_commands_first_kind_and_refuse_others() {
        let allowed = [Kind::Rollout, Kind::RevisionUpgrade];
        // (argument, Ok((kind, name)) | Err(error category))
        type Case = (&'static str, Result<(Kind, &'static str), &'static str>);
        let cases: [Case; 6] = [
            ("checkout", Ok((Kind::Rollout, "checkout"))),
            ("rollout/checkout", Ok((Kind::Rollout, "checkout"))),
            ("ru/to-1-28", Ok((Kind::RevisionUpgrade, "to-1-28"))),
            ("wavegate/eu", Err("WrongKind")),
            ("deploy/x", Err("UnknownKind")),
            ("rollout/", Err("Usage")),
        ];
        for (text, want) in cases {
            let got = Target::parse(text, "pause", &allowed);
            match (got, want) {
                (Ok(t), Ok((kind, name))) => assert_eq!((t.kind, t.name.as_str()), (kind, name)),
                (Err(e), Err(category)) => assert_eq!(e.category(), category, "{text}: {e}"),
                (got, want) => panic!("{text}: got {got:?}, want {want:?}"),
            }
        }
    }
}
