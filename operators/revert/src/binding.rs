//! What ties a pin to the Application it pins: the bundle comes from the Application's own OCI
//! repository, and the objects land only where the Application may write (its destination
//! namespace, the namespaces of what Argo CD already tracks for it, within its AppProject's
//! destinations).
//!
//! The AppProject match ports Argo CD's `AppProject.isDestinationMatched` and `globMatch`
//! (`pkg/apis/application/v1alpha1/app_project_types.go`): a destination matches when its name
//! or server and its namespace match an entry's globs; a `!` pattern denies. Globs here know
//! `*` and `?` (Argo CD's gobwas globs know more; a pattern with `[` or `{` never matches, so it
//! refuses rather than allows). Pure.

/// An AppProject `spec.destinations[]` entry.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProjectDestination {
    /// `server` glob.
    pub server: String,
    /// `name` glob.
    pub name: String,
    /// `namespace` glob.
    pub namespace: String,
}

/// An OCI repository URL compared by host and path: without `oci://`, a trailing `/`, and
/// with the host in lower case.
pub fn normalise_repository(url: &str) -> String {
    let s = url
        .trim()
        .trim_start_matches("oci://")
        .trim_end_matches('/');
    match s.split_once('/') {
        Some((host, path)) => format!("{}/{path}", host.to_ascii_lowercase()),
        None => s.to_ascii_lowercase(),
    }
}

/// `*` (any run) and `?` (one character); anything else literal.
pub fn glob(pattern: &str, value: &str) -> bool {
    if pattern.contains(['[', '{']) {
        return false;
    }
    let p: Vec<char> = pattern.chars().collect();
    let v: Vec<char> = value.chars().collect();
    let (mut i, mut j, mut star, mut mark) = (0, 0, None, 0);
    while j < v.len() {
        if i < p.len() && (p[i] == '?' || p[i] == v[j]) {
            i += 1;
            j += 1;
        } else if i < p.len() && p[i] == '*' {
            star = Some(i);
            mark = j;
            i += 1;
        } else if let Some(s) = star {
            i = s + 1;
            mark += 1;
            j = mark;
        } else {
            return false;
        }
    }
    p[i..].iter().all(|c| *c == '*')
}

fn is_deny(pattern: &str) -> bool {
    pattern.starts_with('!')
}

/// Argo CD's `globMatch` with negation.
fn glob_match(pattern: &str, value: &str) -> bool {
    if is_deny(pattern) {
        return !glob(&pattern[1..], value);
    }
    pattern == "*" || glob(pattern, value)
}

/// Whether the AppProject's destinations permit `namespace` on the cluster `name` / `server`.
pub fn destination_matched(
    destinations: &[ProjectDestination],
    name: &str,
    server: &str,
    namespace: &str,
) -> bool {
    let mut any = false;
    for item in destinations {
        let name_matched = !name.is_empty() && glob_match(&item.name, name);
        let server_matched = !server.is_empty() && glob_match(&item.server, server);
        let ns_matched = glob_match(&item.namespace, namespace);
        let matched = (server_matched || name_matched) && ns_matched;
        if matched {
            any = true;
        } else if (!name_matched && is_deny(&item.name))
            || (!server_matched && is_deny(&item.server) && ns_matched)
            || (!ns_matched && is_deny(&item.namespace) && server_matched)
        {
            return false;
        }
    }
    any
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repositories_compare_by_host_and_path() {
        let table = [
            (
                "oci://Registry.Local:5000/mesh/config",
                "registry.local:5000/mesh/config",
                true,
            ),
            (
                "oci://registry.local:5000/mesh/config/",
                "registry.local:5000/mesh/config",
                true,
            ),
            (
                "oci://registry.local:5000/mesh/routes",
                "registry.local:5000/mesh/config",
                false,
            ),
        ];
        for (a, b, same) in table {
            assert_eq!(
                normalise_repository(a) == normalise_repository(b),
                same,
                "{a} {b}"
            );
        }
    }

    #[test]
    fn globs() {
        let table = [
            ("*", "anything", true),
            ("shop-*", "shop-east", true),
            ("shop-?", "shop-1", true),
            ("shop-?", "shop-12", false),
            ("shop", "shopping", false),
            ("[a-z]", "a", false),
        ];
        for (p, v, want) in table {
            assert_eq!(glob(p, v), want, "{p} {v}");
        }
    }

    #[test]
    fn project_destinations_as_argo_cd_matches_them() {
        let d = |server: &str, name: &str, namespace: &str| ProjectDestination {
            server: server.into(),
            name: name.into(),
            namespace: namespace.into(),
        };
        let shop_only = [d("", "east-1", "shop")];
        assert!(destination_matched(&shop_only, "east-1", "", "shop"));
        assert!(!destination_matched(
            &shop_only,
            "east-1",
            "",
            "istio-system"
        ));
        assert!(!destination_matched(&shop_only, "east-2", "", "shop"));
        let all_but_root = [d("*", "*", "*"), d("*", "*", "!istio-system")];
        assert!(destination_matched(
            &all_but_root,
            "east-1",
            "https://c1",
            "shop"
        ));
        assert!(!destination_matched(
            &all_but_root,
            "east-1",
            "https://c1",
            "istio-system"
        ));
        assert!(!destination_matched(&[], "east-1", "", "shop"));
    }
}
