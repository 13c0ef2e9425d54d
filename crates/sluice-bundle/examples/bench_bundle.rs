//! Benchmark: time to render, push, sign and verify-and-pull a bundle of N mesh objects
//! (default 500, the design's pin target) against a real `docker-registry` on loopback.
//!
//!     cargo run --release -p sluice-bundle --example bench_bundle -- [objects] [rounds]
//!
//! Prints the median of each step over the rounds (default 7) and the bundle's sizes. Not run in
//! CI; no timing is asserted anywhere.

use std::time::{Duration, Instant};

use sluice_bundle::{
    BundleClient, Manifests, Metadata, ReadOptions, RegistryOptions, SigningKey, render,
};
use sluice_testkit::registry::Registry;

fn object(i: usize) -> String {
    match i % 3 {
        0 => format!(
            "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata:\n  name: svc-{i}\n  namespace: team-{ns}\n\
             spec:\n  parentRefs:\n  - name: mesh-gateway\n    namespace: istio-system\n  hostnames: [svc-{i}.example]\n  rules:\n\
             \x20 - matches:\n    - path: {{type: PathPrefix, value: /api}}\n    backendRefs:\n    - {{name: svc-{i}-v1, port: 8080, weight: 90}}\n\
             \x20   - {{name: svc-{i}-v2, port: 8080, weight: 10}}\n",
            ns = i % 40
        ),
        1 => format!(
            "apiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata:\n  name: svc-{i}\n  namespace: team-{ns}\n\
             spec:\n  host: svc-{i}.team-{ns}.svc.cluster.local\n  trafficPolicy:\n    connectionPool:\n      http: {{http2MaxRequests: 1000}}\n\
             \x20   outlierDetection: {{consecutive5xxErrors: 5, interval: 10s, baseEjectionTime: 30s}}\n",
            ns = i % 40
        ),
        _ => format!(
            "apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata:\n  name: svc-{i}\n  namespace: team-{ns}\n\
             spec:\n  selector: {{matchLabels: {{app: svc-{i}}}}}\n  action: ALLOW\n  rules:\n  - from:\n    - source:\n\
             \x20       principals: [cluster.local/ns/team-{ns}/sa/frontend]\n",
            ns = i % 40
        ),
    }
}

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let mut args = std::env::args().skip(1);
    let objects: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(500);
    let rounds: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(7).max(1);

    let registry = match Registry::start().await {
        Ok(registry) => registry,
        Err(err) => {
            eprintln!("bench_bundle needs the registry fixture: {err}");
            std::process::exit(1);
        }
    };
    let dir = tempfile::tempdir().expect("temp dir");
    // 50 objects per file, like a team's directory of mesh config.
    for (file, chunk) in (0..objects).collect::<Vec<_>>().chunks(50).enumerate() {
        let text: Vec<String> = chunk.iter().map(|&i| object(i)).collect();
        std::fs::write(
            dir.path().join(format!("mesh-{file:03}.yaml")),
            text.join("---\n"),
        )
        .expect("write manifests");
    }
    let key = SigningKey::generate().expect("key");
    let trusted = [key.public_key().clone()];
    let client = BundleClient::new(RegistryOptions::default());
    let repo = registry.repository("bench/mesh");

    let (mut t_render, mut t_push, mut t_sign, mut t_verify_pull) =
        (vec![], vec![], vec![], vec![]);
    let mut sizes = (0, 0, 0);
    for round in 0..rounds {
        let metadata = Metadata {
            source_commit: Some(format!("{round:07x}")),
            ..Metadata::default()
        };
        let start = Instant::now();
        let (manifests, _) =
            Manifests::read_dir(dir.path(), &ReadOptions::default()).expect("read");
        let artifact = render(&manifests, &metadata).expect("render");
        t_render.push(start.elapsed());

        let start = Instant::now();
        let pushed = client.push(&artifact, &repo).await.expect("push");
        t_push.push(start.elapsed());

        let start = Instant::now();
        client.sign(&pushed.reference, &key).await.expect("sign");
        t_sign.push(start.elapsed());

        let start = Instant::now();
        let bundle = client
            .verify_and_pull(&pushed.reference, &trusted)
            .await
            .expect("verify and pull");
        t_verify_pull.push(start.elapsed());
        assert_eq!(bundle.objects().len(), objects);
        sizes = (
            manifests
                .files()
                .iter()
                .map(|f| f.contents.len())
                .sum::<usize>(),
            artifact.layer.len(),
            artifact.manifest_bytes.len(),
        );
    }

    println!("bundle benchmark: {objects} objects, {rounds} rounds, registry on loopback");
    println!(
        "  manifests {} bytes, layer {} bytes (gzip), manifest {} bytes",
        sizes.0, sizes.1, sizes.2
    );
    println!(
        "  render (read dir, parse, content digest, tar+gzip)  median {}",
        ms(median(t_render))
    );
    println!(
        "  push (blobs + manifest)                            median {}",
        ms(median(t_push))
    );
    println!(
        "  sign (fetch, sign, push signature tag)             median {}",
        ms(median(t_sign))
    );
    println!(
        "  verify + pull (signature by digest, layer, digests) median {}",
        ms(median(t_verify_pull))
    );
}
