//! A tiny in-process fake of the Kubernetes API for unit tests of the write helpers: one
//! ConfigMap, GET / PUT / PATCH of its status, resourceVersion preconditions answered with 409
//! like the real API server. Test-only; never compiled into a binary.

use std::sync::{Arc, Mutex};

use http::{Request, Response, StatusCode};
use kube::client::Body;

#[derive(Debug)]
struct State {
    object: serde_json::Value,
    rv: u64,
    /// Reads after which another writer bumps the resourceVersion.
    races: u32,
    gets: u32,
    puts: u32,
    last_field_manager: Option<String>,
}

/// The fake API; clone it freely.
#[derive(Clone, Debug)]
pub struct FakeApi {
    state: Arc<Mutex<State>>,
    path: String,
}

fn json_response(code: StatusCode, body: &serde_json::Value) -> Response<Body> {
    Response::builder()
        .status(code)
        .header("content-type", "application/json")
        .body(Body::from(serde_json::to_vec(body).unwrap()))
        .unwrap()
}

fn status(code: u16, reason: &str, message: &str) -> serde_json::Value {
    serde_json::json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {},
        "status": "Failure", "message": message, "reason": reason, "code": code,
    })
}

impl FakeApi {
    /// A ConfigMap `ns/name` with `data`.
    pub fn with_configmap(ns: &str, name: &str, data: serde_json::Value) -> Self {
        let object = serde_json::json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": ns, "resourceVersion": "1"},
            "data": data,
        });
        Self {
            state: Arc::new(Mutex::new(State {
                object,
                rv: 1,
                races: 0,
                gets: 0,
                puts: 0,
                last_field_manager: None,
            })),
            path: format!("/api/v1/namespaces/{ns}/configmaps/{name}"),
        }
    }

    /// After each of the next `n` reads, another writer changes the object.
    pub fn race_next_reads(&self, n: u32) {
        self.state.lock().unwrap().races = n;
    }

    /// GET requests received.
    pub fn gets(&self) -> u32 {
        self.state.lock().unwrap().gets
    }

    /// PUT requests received.
    pub fn puts(&self) -> u32 {
        self.state.lock().unwrap().puts
    }

    /// The stored status.
    pub fn status(&self) -> serde_json::Value {
        self.state.lock().unwrap().object["status"].clone()
    }

    /// The `fieldManager` of the last write.
    pub fn last_field_manager(&self) -> Option<String> {
        self.state.lock().unwrap().last_field_manager.clone()
    }

    /// A client whose every request goes to this fake.
    pub fn client(&self) -> kube::Client {
        let this = self.clone();
        let svc = tower::service_fn(move |req: Request<Body>| {
            let this = this.clone();
            async move { Ok::<_, std::convert::Infallible>(this.handle(req).await) }
        });
        kube::Client::new(svc, "default")
    }

    fn bump(state: &mut State) {
        state.rv += 1;
        state.object["metadata"]["resourceVersion"] = state.rv.to_string().into();
    }

    async fn handle(&self, req: Request<Body>) -> Response<Body> {
        let method = req.method().clone();
        let path = req.uri().path().to_owned();
        let query = req.uri().query().unwrap_or_default().to_owned();
        let body = req.into_body().collect_bytes().await.unwrap_or_default();
        let mut st = self.state.lock().unwrap();
        let field_manager = query
            .split('&')
            .find_map(|kv| kv.strip_prefix("fieldManager="))
            .map(str::to_owned);
        let sent_rv = || -> Option<String> {
            let v: serde_json::Value = serde_json::from_slice(&body).ok()?;
            v["metadata"]["resourceVersion"].as_str().map(str::to_owned)
        };
        let stale = |st: &State| sent_rv().is_some_and(|rv| rv != st.rv.to_string());
        match (
            method.as_str(),
            path == self.path,
            path == format!("{}/status", self.path),
        ) {
            ("GET", true, _) => {
                st.gets += 1;
                let out = st.object.clone();
                if st.races > 0 {
                    st.races -= 1;
                    Self::bump(&mut st);
                }
                json_response(StatusCode::OK, &out)
            }
            ("PUT", true, _) => {
                st.puts += 1;
                if sent_rv().is_none() || stale(&st) {
                    return json_response(
                        StatusCode::CONFLICT,
                        &status(409, "Conflict", "the object has been modified"),
                    );
                }
                let mut next: serde_json::Value = serde_json::from_slice(&body).unwrap();
                next["status"] = st.object["status"].clone();
                st.object = next;
                st.last_field_manager = field_manager;
                Self::bump(&mut st);
                json_response(StatusCode::OK, &st.object)
            }
            ("PATCH", _, true) => {
                if stale(&st) {
                    return json_response(
                        StatusCode::CONFLICT,
                        &status(409, "Conflict", "the object has been modified"),
                    );
                }
                let patch: serde_json::Value = serde_json::from_slice(&body).unwrap();
                st.object["status"] = patch["status"].clone();
                st.last_field_manager = field_manager;
                Self::bump(&mut st);
                json_response(StatusCode::OK, &st.object)
            }
            _ => json_response(
                StatusCode::NOT_FOUND,
                &status(404, "NotFound", "no such path"),
            ),
        }
    }
}
