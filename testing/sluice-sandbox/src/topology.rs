//! The sandbox's clusters: which sites exist, which clusters each site has, what each cluster is
//! for, and the fixed ports they listen on. Pure data; never starts anything.

use std::fmt;

/// The sites the sandbox starts, each with its own Argo CD on a management cluster.
pub const SITES: [&str; 2] = ["east", "west"];
/// Workload clusters per site (`<site>-1`, `<site>-2`, ...).
pub const WORKLOADS_PER_SITE: usize = 2;
/// First fixed port: cluster APIs take `base + ordinal`, operator metrics `base + 20 + n`.
pub const DEFAULT_BASE_PORT: u16 = 17400;
/// Offset of the first operator metrics port from the base port.
pub const OPERATOR_PORT_OFFSET: u16 = 20;

/// What a cluster is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Runs the site's Argo CD, its WaveGate and BundlePins (wave-gate, revert).
    Management,
    /// Runs mesh workloads and routes (rollout-weights, upgrade-revisions).
    Workload,
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Role::Management => "management",
            Role::Workload => "workload",
        })
    }
}

/// One cluster of the sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterSpec {
    /// Cluster and kubeconfig context name (`east-mgmt`, `east-1`, ...); also the `cluster`
    /// label of its telemetry.
    pub name: String,
    /// Site the cluster belongs to.
    pub site: String,
    /// What it is for.
    pub role: Role,
    /// Position in start order (0-based), which fixes its port.
    pub ordinal: u16,
}

/// All clusters, in start order: per site the management cluster, then its workload clusters.
pub fn clusters(sites: &[&str], workloads_per_site: usize) -> Vec<ClusterSpec> {
    let mut out = Vec::new();
    for site in sites {
        let mut push = |name: String, role| {
            let ordinal = u16::try_from(out.len()).unwrap_or(u16::MAX);
            out.push(ClusterSpec {
                name,
                site: (*site).to_string(),
                role,
                ordinal,
            });
        };
        push(format!("{site}-mgmt"), Role::Management);
        for i in 1..=workloads_per_site {
            push(format!("{site}-{i}"), Role::Workload);
        }
    }
    out
}

/// The fixed port of a cluster's API, or 0 (any free port) when `base` is 0.
pub fn api_port(base: u16, cluster: &ClusterSpec) -> u16 {
    if base == 0 {
        0
    } else {
        base.saturating_add(cluster.ordinal)
    }
}

/// The fixed metrics port of the `n`-th operator process (0-based, start order), or 0.
pub fn operator_port(base: u16, n: usize) -> u16 {
    if base == 0 {
        0
    } else {
        let n = u16::try_from(n).unwrap_or(u16::MAX);
        base.saturating_add(OPERATOR_PORT_OFFSET).saturating_add(n)
    }
}

/// Whether a TCP port on 127.0.0.1 can be bound now (0 always can).
pub fn port_is_free(port: u16) -> bool {
    std::net::TcpListener::bind(("127.0.0.1", port)).is_ok()
}

/// A free port on 127.0.0.1 chosen by the kernel.
pub fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind(("127.0.0.1", 0))?
        .local_addr()?
        .port())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_sites_give_a_management_and_two_workload_clusters_each_in_start_order() {
        let got: Vec<(String, Role, u16)> = clusters(&SITES, WORKLOADS_PER_SITE)
            .into_iter()
            .map(|c| (c.name, c.role, c.ordinal))
            .collect();
        let want = [
            ("east-mgmt", Role::Management, 0),
            ("east-1", Role::Workload, 1),
            ("east-2", Role::Workload, 2),
            ("west-mgmt", Role::Management, 3),
            ("west-1", Role::Workload, 4),
            ("west-2", Role::Workload, 5),
        ];
        assert_eq!(got.len(), want.len());
        for ((name, role, ordinal), (wn, wr, wo)) in got.iter().zip(want) {
            assert_eq!((name.as_str(), *role, *ordinal), (wn, wr, wo));
        }
    }

    #[test]
    fn ports_are_fixed_from_the_base_or_all_free_with_base_zero() {
        let all = clusters(&SITES, WORKLOADS_PER_SITE);
        let cases: [(u16, usize, u16, u16); 4] = [
            (DEFAULT_BASE_PORT, 0, 17400, 17420),
            (DEFAULT_BASE_PORT, 5, 17405, 17425),
            (20000, 3, 20003, 20023),
            (0, 5, 0, 0),
        ];
        for (base, i, api, op) in cases {
            assert_eq!(
                api_port(base, &all[i]),
                api,
                "api port base {base} cluster {i}"
            );
            assert_eq!(
                operator_port(base, i),
                op,
                "operator port base {base} n {i}"
            );
        }
    }

    #[test]
    fn site_and_role_are_recorded() {
        let all = clusters(&["north"], 3);
        assert_eq!(all.len(), 4);
        assert!(all.iter().all(|c| c.site == "north"));
        assert_eq!(all[3].name, "north-3");
        assert_eq!(all[0].role.to_string(), "management");
    }
}
