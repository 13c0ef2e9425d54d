//! The one kubeconfig the sandbox hands to the user: a context per cluster (named like the
//! cluster) so `kubectl --context east-1 ...` and `kubectl get sluice -A` work from another
//! terminal. Owns the document's shape only; never talks to a cluster.

use serde_json::{Value, json};

/// One context of the kubeconfig.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Context, cluster and user name.
    pub name: String,
    /// API server URL (`http://127.0.0.1:<port>`).
    pub server: String,
    /// Bearer token of the user.
    pub token: String,
    /// A file holding the CA certificate (PEM) the server's TLS certificate is checked against;
    /// `None` for plain HTTP.
    pub certificate_authority: Option<String>,
}

/// Renders a kubeconfig with one context per entry; `current` becomes the current context.
pub fn render(entries: &[Entry], current: &str) -> String {
    let clusters: Vec<Value> = entries
        .iter()
        .map(|e| match &e.certificate_authority {
            None => json!({"name": e.name, "cluster": {"server": e.server}}),
            Some(ca) => json!({"name": e.name,
                "cluster": {"server": e.server, "certificate-authority": ca}}),
        })
        .collect();
    let users: Vec<Value> = entries
        .iter()
        .map(|e| json!({"name": e.name, "user": {"token": e.token}}))
        .collect();
    let contexts: Vec<Value> = entries
        .iter()
        .map(|e| {
            json!({"name": e.name, "context": {"cluster": e.name, "user": e.name, "namespace": "default"}})
        })
        .collect();
    let doc = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": clusters,
        "users": users,
        "contexts": contexts,
        "current-context": current,
        "preferences": {},
    });
    serde_yaml::to_string(&doc).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(name: &str, port: u16) -> Entry {
        Entry {
            name: name.into(),
            server: format!("http://127.0.0.1:{port}"),
            token: format!("token-{name}"),
            certificate_authority: None,
        }
    }

    #[test]
    fn every_entry_becomes_a_context_pointing_at_its_own_server_and_user() {
        let entries = [entry("east-mgmt", 17400), entry("east-1", 17401)];
        let text = render(&entries, "east-1");
        let doc: Value = serde_yaml::from_str(&text).unwrap();
        assert_eq!(doc["current-context"], "east-1");
        for (i, e) in entries.iter().enumerate() {
            let ctx = &doc["contexts"][i];
            assert_eq!(ctx["name"], e.name.as_str());
            assert_eq!(ctx["context"]["cluster"], e.name.as_str());
            assert_eq!(ctx["context"]["user"], e.name.as_str());
            let cluster = &doc["clusters"][i];
            assert_eq!(cluster["name"], e.name.as_str());
            assert_eq!(cluster["cluster"]["server"], e.server.as_str());
            assert_eq!(doc["users"][i]["user"]["token"], e.token.as_str());
        }
    }

    #[test]
    fn kube_rs_reads_the_document_and_picks_each_context() {
        let entries = [entry("west-1", 17404), entry("west-2", 17405)];
        let kc: kube::config::Kubeconfig =
            serde_yaml::from_str(&render(&entries, "west-1")).unwrap();
        let names: Vec<&str> = kc.contexts.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["west-1", "west-2"]);
        assert_eq!(kc.current_context.as_deref(), Some("west-1"));
        let server = kc.clusters[1]
            .cluster
            .as_ref()
            .and_then(|c| c.server.clone());
        assert_eq!(server.as_deref(), Some("http://127.0.0.1:17405"));
    }

    #[test]
    fn a_tls_server_carries_its_ca_file() {
        let mut tls = entry("east-1", 6443);
        tls.server = "https://127.0.0.1:6443".into();
        tls.certificate_authority = Some("/tmp/sandbox/east-1.ca.crt".into());
        let kc: kube::config::Kubeconfig =
            serde_yaml::from_str(&render(&[entry("east-mgmt", 17400), tls], "east-1")).unwrap();
        let ca = |i: usize| {
            kc.clusters[i]
                .cluster
                .as_ref()
                .and_then(|c| c.certificate_authority.clone())
        };
        assert_eq!(ca(0), None);
        assert_eq!(ca(1).as_deref(), Some("/tmp/sandbox/east-1.ca.crt"));
    }
}
