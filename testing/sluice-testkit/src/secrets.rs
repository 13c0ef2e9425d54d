//! Secrets as tests hand them to the API server. Builds objects only; never talks to a cluster.

use k8s_openapi::{ByteString, api::core::v1::Secret};

/// A Secret named `name` with `labels` and `data` (what the API server stores).
pub fn secret(name: &str, labels: &[(&str, &str)], data: &[(&str, &str)]) -> Secret {
    Secret {
        metadata: kube::api::ObjectMeta {
            name: Some(name.into()),
            labels: Some(
                labels
                    .iter()
                    .map(|(k, v)| ((*k).into(), (*v).into()))
                    .collect(),
            ),
            ..Default::default()
        },
        data: Some(
            data.iter()
                .map(|(k, v)| ((*k).into(), ByteString(v.as_bytes().to_vec())))
                .collect(),
        ),
        ..Default::default()
    }
}
