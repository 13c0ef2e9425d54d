//! The HTTP layer: routes Kubernetes REST paths to `api`, streams watches (resume from a
//! resourceVersion, bookmarks, 410 as an ERROR event, timeouts), renders lists, tables and
//! discovery.
//!
//! Owns request parsing and response encoding only. Never changes objects itself; every write
//! goes through `api::State`.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, Method, StatusCode, Uri, header};
use axum::response::Response;
use serde_json::{Value, json};
use tokio::sync::{broadcast, mpsc, watch};

use crate::api::{Attributes, PatchKind, Req, State, selectors};
use crate::discovery;
use crate::error::ApiError;
use crate::resources::ResourceType;
use crate::store::{Event, EventType};

/// Everything a request handler needs.
#[derive(Clone, Debug)]
pub struct Ctx {
    /// The emulator state.
    pub state: Arc<State>,
    /// `127.0.0.1:<port>`.
    pub address: String,
    /// Flips to `true` on shutdown; watches end.
    pub shutdown: watch::Receiver<bool>,
    /// How often watches that asked for bookmarks get one.
    pub bookmark_interval: Duration,
}

fn json_response(code: u16, body: &Value) -> Response {
    bytes_response(code, serde_json::to_vec(body).unwrap_or_default())
}

fn bytes_response(code: u16, body: Vec<u8>) -> Response {
    Response::builder()
        .status(StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR))
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(body))
        .expect("valid response")
}

fn error_response(e: &ApiError) -> Response {
    json_response(e.code(), &e.status())
}

fn parse_query(uri: &Uri) -> HashMap<String, String> {
    let mut out = HashMap::new();
    for pair in uri
        .query()
        .unwrap_or_default()
        .split('&')
        .filter(|p| !p.is_empty())
    {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        out.insert(decode(k), decode(v));
    }
    out
}

fn decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                match std::str::from_utf8(&bytes[i + 1..i + 3])
                    .ok()
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
                {
                    Some(b) => {
                        out.push(b);
                        i += 2;
                    }
                    None => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn bearer(headers: &HeaderMap) -> Option<String> {
    let h = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    h.strip_prefix("Bearer ").map(|t| t.trim().to_string())
}

fn wants_table(headers: &HeaderMap) -> bool {
    headers
        .get(header::ACCEPT)
        .and_then(|a| a.to_str().ok())
        .is_some_and(|a| a.contains("as=Table"))
}

fn parse_body(headers: &HeaderMap, body: &Bytes, yaml: bool) -> Result<Value, ApiError> {
    if body.is_empty() {
        return Ok(Value::Null);
    }
    let ct = headers
        .get(header::CONTENT_TYPE)
        .and_then(|c| c.to_str().ok())
        .unwrap_or_default();
    if ct.contains("protobuf") {
        return crate::protobuf::decode(body)
            .map_err(|e| ApiError::UnsupportedMediaType(e.to_string()));
    }
    if ct.contains("cbor") {
        return Err(ApiError::UnsupportedMediaType(format!(
            "the emulator accepts JSON and YAML request bodies, not {ct:?}; kubectl's imperative create commands send protobuf: use kubectl apply -f or kubectl create -f with a manifest"
        )));
    }
    if yaml || ct.contains("yaml") {
        serde_yaml::from_slice(body)
            .map_err(|e| ApiError::BadRequest(format!("error decoding YAML request body: {e}")))
    } else {
        serde_json::from_slice(body).map_err(|e| {
            ApiError::BadRequest(format!(
                "the request body is not valid JSON: {e}; send application/json"
            ))
        })
    }
}

/// The single entry point for every request.
pub async fn handle(
    ctx: Ctx,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    match route(&ctx, &method, &uri, &headers, &body).await {
        Ok(r) => r,
        Err(e) => error_response(&e),
    }
}

async fn route(
    ctx: &Ctx,
    method: &Method,
    uri: &Uri,
    headers: &HeaderMap,
    body: &Bytes,
) -> Result<Response, ApiError> {
    let user = ctx.state.authenticate(bearer(headers).as_deref())?;
    let path = uri.path().trim_matches('/');
    let segs: Vec<&str> = if path.is_empty() {
        Vec::new()
    } else {
        path.split('/').collect()
    };
    let types: Vec<Arc<ResourceType>> = ctx
        .state
        .registry
        .read()
        .unwrap_or_else(|p| p.into_inner())
        .all()
        .cloned()
        .collect();
    let not_found = || ApiError::NotFound {
        message: "the server could not find the requested resource".into(),
        details: json!({}),
    };
    let is_resource = matches!(segs.as_slice(), ["api", _, _, ..] | ["apis", _, _, _, ..]);
    if !is_resource {
        ctx.state.authorize(
            &user,
            &Attributes {
                verb: method.as_str().to_ascii_lowercase(),
                path: uri.path().to_string(),
                ..Default::default()
            },
            None,
        )?;
    }
    let (group, version, rest): (&str, &str, &[&str]) = match segs.as_slice() {
        ["version"] => return Ok(json_response(200, &discovery::version())),
        ["healthz" | "readyz" | "livez"] => return Ok(bytes_response(200, b"ok".to_vec())),
        ["api"] => return Ok(json_response(200, &discovery::core_versions(&ctx.address))),
        ["apis"] => return Ok(json_response(200, &discovery::group_list(&types))),
        ["openapi", "v2"] => return Ok(json_response(200, &discovery::openapi_v2(&types))),
        ["openapi", "v3"] => {
            let hash = ctx.state.store.read().rv();
            return Ok(json_response(
                200,
                &discovery::openapi_v3_index(&types, hash),
            ));
        }
        ["openapi", "v3", "api", v] => {
            return discovery::openapi_v3_doc(&types, "", v)
                .map(|d| json_response(200, &d))
                .ok_or_else(not_found);
        }
        ["openapi", "v3", "apis", g, v] => {
            return discovery::openapi_v3_doc(&types, g, v)
                .map(|d| json_response(200, &d))
                .ok_or_else(not_found);
        }
        ["apis", g] => {
            return discovery::group(&types, g)
                .map(|d| json_response(200, &d))
                .ok_or_else(not_found);
        }
        ["api", v, rest @ ..] => ("", *v, rest),
        ["apis", g, v, rest @ ..] => (*g, *v, rest),
        _ => return Err(not_found()),
    };
    if rest.is_empty() {
        return discovery::resource_list(&types, group, version)
            .map(|d| json_response(200, &d))
            .ok_or_else(not_found);
    }
    let (namespace, rest) = if rest[0] == "namespaces"
        && rest.len() >= 3
        && !matches!(rest[2], "status" | "finalize")
    {
        (rest[1].to_string(), &rest[2..])
    } else {
        (String::new(), rest)
    };
    let plural = rest[0];
    let rt = ctx
        .state
        .resource(group, version, plural)
        .ok_or_else(not_found)?;
    if !rt.namespaced && !namespace.is_empty() {
        return Err(not_found());
    }
    let req = Req {
        rt: rt.clone(),
        namespace,
        name: rest.get(1).map(|s| s.to_string()),
        subresource: rest.get(2).map(|s| s.to_string()),
        query: parse_query(uri),
        user,
        user_agent: headers
            .get(header::USER_AGENT)
            .and_then(|u| u.to_str().ok())
            .unwrap_or_default()
            .to_string(),
    };
    if rest.len() > 3 {
        return Err(not_found());
    }
    match req.subresource.as_deref() {
        None | Some("status") => {}
        Some("eviction") if rt.group.is_empty() && rt.plural == "pods" => {}
        Some(_) => return Err(not_found()),
    }
    if req.subresource.as_deref() == Some("status") && !rt.has_status {
        return Err(not_found());
    }
    let state = &ctx.state;
    let table = wants_table(headers);
    match (
        method.clone(),
        req.name.is_some(),
        req.subresource.as_deref(),
    ) {
        (Method::GET, true, _) => {
            let obj = state.get(&req)?;
            if table {
                return Ok(json_response(
                    200,
                    &discovery::table(&rt, &[obj], None, jiff::Timestamp::now()),
                ));
            }
            Ok(json_response(200, &obj))
        }
        (Method::GET, false, _) => {
            if matches!(
                req.query.get("watch").map(String::as_str),
                Some("true" | "1")
            ) {
                return watch_response(ctx, req, table);
            }
            let l = state.list(&req)?;
            if table {
                let mut t = discovery::table(
                    &rt,
                    &l.items,
                    Some(l.resource_version.to_string()),
                    jiff::Timestamp::now(),
                );
                if let Some(c) = &l.continue_token {
                    t["metadata"]["continue"] = json!(c);
                }
                return Ok(json_response(200, &t));
            }
            Ok(bytes_response(
                200,
                render_list(
                    &rt,
                    &l.items,
                    l.resource_version,
                    l.continue_token.as_deref(),
                    l.remaining,
                ),
            ))
        }
        (Method::POST, false, None) => {
            let b = parse_body(headers, body, false)?;
            Ok(json_response(201, &*state.create(&req, b)?))
        }
        (Method::POST, true, Some("eviction")) => Ok(json_response(201, &state.evict(&req)?)),
        (Method::PUT, true, _) => {
            let b = parse_body(headers, body, false)?;
            Ok(json_response(200, &*state.update(&req, b)?))
        }
        (Method::PATCH, true, _) => {
            let ct = headers
                .get(header::CONTENT_TYPE)
                .and_then(|c| c.to_str().ok())
                .unwrap_or_default();
            let kind = PatchKind::from_content_type(ct).ok_or_else(|| {
                ApiError::UnsupportedMediaType(format!(
                    "the body of the request was in an unknown format ({ct:?}) - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml, application/strategic-merge-patch+json"
                ))
            })?;
            let b = parse_body(headers, body, kind == PatchKind::Apply)?;
            let (created, obj) = state.patch(&req, kind, b)?;
            Ok(json_response(if created { 201 } else { 200 }, &obj))
        }
        (Method::DELETE, true, None) => {
            let b = parse_body(headers, body, false).unwrap_or(Value::Null);
            Ok(json_response(200, &*state.delete(&req, &b)?))
        }
        (Method::DELETE, false, None) => {
            let items = state.delete_collection(&req)?;
            let rv = state.store.read().rv();
            Ok(bytes_response(200, render_list(&rt, &items, rv, None, 0)))
        }
        _ => Err(ApiError::MethodNotAllowed(format!(
            "the server does not allow this method on the requested resource ({method} {})",
            uri.path()
        ))),
    }
}

/// Serializes a list without copying the objects.
pub fn render_list(
    rt: &ResourceType,
    items: &[Arc<Value>],
    rv: u64,
    cont: Option<&str>,
    remaining: usize,
) -> Vec<u8> {
    let mut meta = json!({"resourceVersion": rv.to_string()});
    if let Some(c) = cont {
        meta["continue"] = json!(c);
        meta["remainingItemCount"] = json!(remaining);
    }
    let mut out = Vec::with_capacity(64 + items.len() * 512);
    out.extend_from_slice(
        format!(
            "{{\"kind\":\"{}List\",\"apiVersion\":\"{}\",\"metadata\":{},\"items\":[",
            rt.kind,
            rt.api_version(),
            meta
        )
        .as_bytes(),
    );
    for (i, it) in items.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        let _ = serde_json::to_writer(&mut out, it.as_ref());
    }
    out.extend_from_slice(b"]}");
    out
}

fn event_line(kind: &str, object: &Value) -> Bytes {
    let mut out = Vec::with_capacity(256);
    out.extend_from_slice(b"{\"type\":\"");
    out.extend_from_slice(kind.as_bytes());
    out.extend_from_slice(b"\",\"object\":");
    let _ = serde_json::to_writer(&mut out, object);
    out.extend_from_slice(b"}\n");
    Bytes::from(out)
}

fn gone_line(rv: u64, oldest: u64) -> Bytes {
    let e = ApiError::Gone(format!("too old resource version: {rv} ({oldest})"));
    event_line("ERROR", &e.status())
}

/// How a watch with a selection sees an event: changes that leave the selection are DELETED,
/// changes that enter it are ADDED, others pass through when the object is selected.
fn selected(e: &Event, sel: &dyn Fn(&Value) -> bool) -> Option<(EventType, Arc<Value>)> {
    let now = sel(&e.object);
    let before = e.prev.as_deref().map(sel);
    match (e.kind, before, now) {
        (EventType::Modified, Some(true), false) => Some((EventType::Deleted, e.object.clone())),
        (EventType::Modified, Some(false), true) => Some((EventType::Added, e.object.clone())),
        (_, _, true) => Some((e.kind, e.object.clone())),
        _ => None,
    }
}

/// The events a watch starts with, or the oldest resourceVersion still available (410).
type Initial = Result<Vec<(EventType, Arc<Value>)>, u64>;

fn watch_response(ctx: &Ctx, req: Req, table: bool) -> Result<Response, ApiError> {
    let state = ctx.state.clone();
    state.authorize(
        &req.user,
        &Attributes {
            verb: "watch".into(),
            group: req.rt.group.clone(),
            resource: req.rt.plural.clone(),
            subresource: String::new(),
            namespace: req.namespace.clone(),
            name: String::new(),
            path: String::new(),
        },
        Some(&req.rt),
    )?;
    let matches = selectors(&req.query)?;
    let q = |k: &str| req.query.get(k).cloned().unwrap_or_default();
    let bookmarks = q("allowWatchBookmarks") == "true";
    let send_initial = q("sendInitialEvents") == "true";
    let timeout = q("timeoutSeconds")
        .parse::<u64>()
        .ok()
        .filter(|t| *t > 0)
        .unwrap_or(1800);
    let rv_param = q("resourceVersion");
    let rt = req.rt.clone();
    let key = rt.table();
    let ns_filter = req.namespace.clone();
    let in_ns = move |obj: &Value| {
        ns_filter.is_empty()
            || obj.pointer("/metadata/namespace").and_then(Value::as_str)
                == Some(ns_filter.as_str())
    };

    let sel = move |o: &Value| in_ns(o) && matches(o);
    let (tx, rx_body) = mpsc::channel::<Bytes>(256);
    // Subscribe and snapshot under one lock so no event falls between them.
    let (mut live, initial, start_rv): (broadcast::Receiver<_>, Initial, u64) = {
        let mut w = state.store.write();
        let cur = w.rv();
        if rv_param.is_empty() || rv_param == "0" || send_initial {
            let (rx, _) = w.watch_from(&key, cur);
            let objs: Vec<(EventType, Arc<Value>)> = w
                .table(&key)
                .map(|t| {
                    t.iter_ns(None)
                        .filter(|o| sel(o))
                        .map(|o| (EventType::Added, o.clone()))
                        .collect()
                })
                .unwrap_or_default();
            (rx, Ok(objs), cur)
        } else {
            let from: u64 = rv_param
                .parse()
                .map_err(|_| ApiError::BadRequest(format!("resourceVersion {rv_param:?} is not a valid resource version; use one returned by the server")))?;
            let (rx, evs) = w.watch_from(&key, from);
            match evs {
                Some(evs) => (
                    rx,
                    Ok(evs.iter().filter_map(|e| selected(e, &sel)).collect()),
                    from,
                ),
                None => {
                    let oldest = w.table(&key).map(|t| t.compacted()).unwrap_or(cur);
                    (rx, Err(oldest), from)
                }
            }
        }
    };
    let mut shutdown = ctx.shutdown.clone();
    let bookmark_every = ctx.bookmark_interval;
    tokio::spawn(async move {
        let render = |kind: EventType, obj: &Arc<Value>| -> Bytes {
            let obj = State::present(&rt, obj);
            if table {
                let t = discovery::table(&rt, &[obj], None, jiff::Timestamp::now());
                event_line(kind.as_str(), &t)
            } else {
                event_line(kind.as_str(), &obj)
            }
        };
        let api_version = rt.api_version();
        // Watchers sending an event as stored share one encoding of it.
        let render_event = |ev: &Event, kind: EventType, obj: &Arc<Value>| -> Bytes {
            let as_stored = !table
                && kind == ev.kind
                && obj.get("apiVersion").and_then(Value::as_str) == Some(api_version.as_str());
            if as_stored {
                ev.wire
                    .get_or_init(|| event_line(kind.as_str(), obj))
                    .clone()
            } else {
                render(kind, obj)
            }
        };
        let initial = match initial {
            Ok(i) => i,
            Err(oldest) => {
                let _ = tx.send(gone_line(start_rv, oldest)).await;
                return;
            }
        };
        let mut last_rv = start_rv;
        for (kind, obj) in &initial {
            if let Some(rv) = obj
                .pointer("/metadata/resourceVersion")
                .and_then(Value::as_str)
                .and_then(|r| r.parse().ok())
            {
                last_rv = last_rv.max(rv);
            }
            if tx.send(render(*kind, obj)).await.is_err() {
                return;
            }
        }
        let bookmark = |rv: u64, initial_end: bool| -> Bytes {
            let mut meta = json!({"resourceVersion": rv.to_string()});
            if initial_end {
                meta["annotations"] = json!({"k8s.io/initial-events-end": "true"});
            }
            event_line(
                "BOOKMARK",
                &json!({"kind": rt.kind, "apiVersion": rt.api_version(), "metadata": meta}),
            )
        };
        if send_initial && bookmarks && tx.send(bookmark(last_rv, true)).await.is_err() {
            return;
        }
        let deadline = tokio::time::sleep(Duration::from_secs(timeout));
        tokio::pin!(deadline);
        let mut tick = tokio::time::interval(bookmark_every);
        tick.tick().await;
        loop {
            tokio::select! {
                _ = &mut deadline => return,
                _ = shutdown.changed() => return,
                _ = tick.tick(), if bookmarks => {
                    // Everything committed up to `cur` is already queued on `live`: drain it first.
                    let cur = state.store.read().rv();
                    loop {
                        match live.try_recv() {
                            Ok(ev) => {
                                last_rv = last_rv.max(ev.rv);
                                if let Some((kind, obj)) = selected(&ev, &sel) && tx.send(render_event(&ev, kind, &obj)).await.is_err() {
                                    return;
                                }
                            }
                            Err(broadcast::error::TryRecvError::Empty) => break,
                            Err(broadcast::error::TryRecvError::Lagged(_)) => {
                                let _ = tx.send(gone_line(last_rv, last_rv)).await;
                                return;
                            }
                            Err(broadcast::error::TryRecvError::Closed) => return,
                        }
                    }
                    last_rv = last_rv.max(cur);
                    if tx.send(bookmark(last_rv, false)).await.is_err() {
                        return;
                    }
                }
                ev = live.recv() => match ev {
                    Ok(ev) => {
                        if ev.rv <= last_rv {
                            continue;
                        }
                        last_rv = last_rv.max(ev.rv);
                        if let Some((kind, obj)) = selected(&ev, &sel) && tx.send(render_event(&ev, kind, &obj)).await.is_err() {
                            return;
                        }
                    }
                    Err(broadcast::error::RecvError::Lagged(_)) => {
                        let _ = tx.send(gone_line(last_rv, last_rv)).await;
                        return;
                    }
                    Err(broadcast::error::RecvError::Closed) => return,
                },
            }
        }
    });
    let stream = futures::stream::unfold(rx_body, |mut rx| async move {
        rx.recv().await.map(|b| (Ok::<_, Infallible>(b), rx))
    });
    Ok(Response::builder()
        .status(200)
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::CACHE_CONTROL, "no-cache, private")
        .body(Body::from_stream(stream))
        .expect("valid response"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_decoding() {
        let cases = [
            (
                "labelSelector=app%3Dweb%2Ctier%20in%20(a)",
                "labelSelector",
                "app=web,tier in (a)",
            ),
            (
                "fieldSelector=metadata.name%3Dx",
                "fieldSelector",
                "metadata.name=x",
            ),
            ("watch=1&resourceVersion=10", "resourceVersion", "10"),
            ("a=b+c", "a", "b c"),
            ("a=100%", "a", "100%"),
        ];
        for (q, k, want) in cases {
            let uri: Uri = format!("/x?{q}").parse().unwrap();
            assert_eq!(
                parse_query(&uri).get(k).map(String::as_str),
                Some(want),
                "{q}"
            );
        }
    }

    #[test]
    fn lists_render_as_kubernetes_lists() {
        let r = crate::resources::Registry::with_builtins();
        let rt = r.get("", "v1", "configmaps").unwrap();
        let items = vec![Arc::new(json!({"metadata": {"name": "a"}}))];
        let v: Value =
            serde_json::from_slice(&render_list(&rt, &items, 7, Some("tok"), 3)).unwrap();
        assert_eq!(v["kind"], "ConfigMapList");
        assert_eq!(v["metadata"]["resourceVersion"], "7");
        assert_eq!(v["metadata"]["continue"], "tok");
        assert_eq!(v["items"][0]["metadata"]["name"], "a");
    }
}
