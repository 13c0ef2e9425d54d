//! Adoption: the revision a site runs before the WaveGate published anything for it.

use std::collections::BTreeSet;

use sluice_api::external::argocd::SYNC_STATUS_SYNCED;
use sluice_api::v1alpha1::WaveGateSpec;

use crate::decisions;

use super::model::{AppView, Observations};

/// The revision a not-yet-adopted site runs: `spec.previousRevision`, else the one revision
/// every Application reports Synced at, else (a site without Applications) `spec.revision`.
pub fn adoption_revision(spec: &WaveGateSpec, obs: &Observations) -> Result<String, String> {
    if let Some(p) = &spec.previous_revision {
        return Ok(p.clone());
    }
    let clusters: BTreeSet<&str> = spec.all_clusters().collect();
    let apps: Vec<&AppView> = obs
        .applications
        .iter()
        .filter(|a| clusters.contains(a.cluster.as_str()))
        .collect();
    if apps.is_empty() {
        // Applications that exist but are not observed for the site's clusters (a destination
        // the WaveGate cannot match) are not "no Applications": publishing spec.revision for
        // every cluster would skip every wave.
        if !obs.unmatched_applications.is_empty() {
            return Err(format!(
                "no Application is observed for the site's clusters, but the ApplicationSet owns Applications whose destination matches none ({}); list their servers in spec.clusterServers or set spec.previousRevision to the revision the site runs",
                obs.unmatched_applications.join(", ")
            ));
        }
        // A site with no Applications at all is new: it starts at spec.revision.
        return Ok(spec.revision.clone());
    }
    let revisions: BTreeSet<Option<&str>> = apps
        .iter()
        .map(|a| {
            (a.sync_status.as_deref() == Some(SYNC_STATUS_SYNCED))
                .then_some(a.synced_revision.as_deref())
                .flatten()
        })
        .collect();
    match revisions.into_iter().collect::<Vec<_>>().as_slice() {
        [Some(r)] if decisions::is_digest(r) => Ok((*r).to_owned()),
        _ => Err(
            "the site's Applications are not all Synced at one digest revision; set spec.previousRevision to the revision the site runs"
                .into(),
        ),
    }
}
