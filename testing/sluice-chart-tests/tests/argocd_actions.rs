//! The chart's Argo CD resource actions (`resource.customizations.actions.sluice.dev_<Kind>` of
//! the argocd-cm snippet), taken from the chart as helm renders it and run with Lua 5.1 (the
//! language of Argo CD's gopher-lua) inside Argo CD's library sandbox: only the base, table and
//! package libraries, no string methods, no string/math/io/os library. Each action's result is
//! read back the way Argo CD reads it (luajson: an empty table is an array, then
//! `cleanReturnedObj` restores empty maps) and turned into the JSON merge patch Argo CD's
//! `patchResource` sends; the test asserts that patch is exactly the spec control fields the
//! operator honours, that discovery enables exactly the actions that apply, that refusals say
//! why, that every control field is in the kind's ignoreDifferences (so self-heal keeps it),
//! and that the health checks also run in that sandbox.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{Map, Value, json};
use sluice_chart_tests::{SLUICE_KINDS, chart_dir, health_script};
use sluice_testkit::prereq;

/// The argocd-cm snippet's data as helm renders it with default values; `None` (a skip, or a
/// failure naming the install command in strict mode) without helm or lua5.1.
fn rendered_data() -> Option<BTreeMap<String, String>> {
    let helm = prereq::require_binary("helm")?;
    prereq::require_binary("lua5.1")?;
    let out = Command::new(helm)
        .args(["template", "t"])
        .arg(chart_dir())
        .args([
            "--namespace",
            "sluice-system",
            "--show-only",
            "templates/argocd/resource-customizations.yaml",
        ])
        .output()
        .expect("helm runs");
    assert!(
        out.status.success(),
        "helm template failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let docs: Vec<Value> = serde_saphyr::from_multiple(&text).unwrap();
    let cm = docs
        .into_iter()
        .find(|d| d["kind"] == "ConfigMap")
        .expect("the snippet is a ConfigMap");
    Some(
        cm["data"]
            .as_object()
            .unwrap()
            .iter()
            .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_string()))
            .collect(),
    )
}

/// One kind's actions as Argo CD reads `resource.customizations.actions.<group_kind>`.
struct Actions {
    discovery: String,
    definitions: BTreeMap<String, String>,
}

fn actions(data: &BTreeMap<String, String>, kind: &str) -> Actions {
    let key = format!("resource.customizations.actions.sluice.dev_{kind}");
    let text = data
        .get(&key)
        .unwrap_or_else(|| panic!("the snippet lacks {key}"));
    let v: Value = serde_saphyr::from_str(text).unwrap();
    Actions {
        discovery: v["discovery.lua"].as_str().unwrap().to_string(),
        definitions: v["definitions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| {
                (
                    d["name"].as_str().unwrap().to_string(),
                    d["action.lua"].as_str().unwrap().to_string(),
                )
            })
            .collect(),
    }
}

/// A Lua 5.1 expression for a JSON value (as Argo CD's decodeValue builds it: objects and
/// arrays are tables, null is nil).
fn lua_literal(v: &Value) -> String {
    match v {
        Value::Null => "nil".into(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::String(s) => lua_string(s),
        Value::Array(items) => {
            let inner: Vec<String> = items.iter().map(lua_literal).collect();
            format!("{{{}}}", inner.join(", "))
        }
        Value::Object(map) => {
            let inner: Vec<String> = map
                .iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| format!("[{}] = {}", lua_string(k), lua_literal(v)))
                .collect();
            format!("{{{}}}", inner.join(", "))
        }
    }
}

fn lua_string(s: &str) -> String {
    let mut out = String::from("\"");
    for b in s.bytes() {
        match b {
            b'"' => out.push_str("\\\""),
            b'\\' => out.push_str("\\\\"),
            0x20..=0x7e => out.push(b as char),
            _ => out.push_str(&format!("\\{b}")),
        }
    }
    out.push('"');
    out
}

/// Runs a script with `lua5.1` as Argo CD does: the object as the global `obj`, the action's
/// parameters as `actionParams` (strings), Argo CD's library sandbox; returns the script's
/// result encoded as luajson encodes it, or the error it raised.
const PRELUDE: &str = r#"
local sformat, sbyte, sgsub, tconcat, floor = string.format, string.byte, string.gsub, table.concat, math.floor
local write, exit, stderr = io.write, os.exit, io.stderr
local function esc(s)
  return '"' .. sgsub(s, '[%c"\\]', function(c)
    if c == '"' then return '\\"' elseif c == '\\' then return '\\\\' end
    return sformat('\\u%04x', sbyte(c))
  end) .. '"'
end
-- layeh.com/gopher-json's Encode: an empty table is [], a table with keys 1..n an array,
-- any other table an object whose keys must be strings.
local encode
encode = function(v)
  local t = type(v)
  if t == 'nil' then return 'null'
  elseif t == 'boolean' then return tostring(v)
  elseif t == 'number' then
    if v == floor(v) and v > -1e15 and v < 1e15 then return sformat('%d', v) end
    return sformat('%.17g', v)
  elseif t == 'string' then return esc(v)
  elseif t == 'table' then
    local n, count = 0, 0
    for k in pairs(v) do
      count = count + 1
      if type(k) == 'number' and k == floor(k) and k > n then n = k end
    end
    if count == 0 then return '[]' end
    local parts = {}
    if n == count then
      for i = 1, n do parts[i] = encode(v[i]) end
      return '[' .. tconcat(parts, ',') .. ']'
    end
    for k, x in pairs(v) do
      if type(k) ~= 'string' then error('cannot encode mixed or invalid key types') end
      parts[#parts + 1] = esc(k) .. ':' .. encode(x)
    end
    return '{' .. tconcat(parts, ',') .. '}'
  end
  error('cannot encode a ' .. t)
end
local chunk, err = loadfile(SCRIPT_PATH)
if chunk == nil then stderr:write('LOAD ' .. err) exit(2) end
-- Argo CD's sandbox (util/lua/lua.go: SkipOpenLibs, then only package, base, table and a
-- safe os are opened): no string library and so no string methods, no math, io or debug.
getmetatable('').__index = nil
string, math, io, debug, coroutine, os = nil, nil, nil, nil, nil, nil
local ok, result = pcall(chunk)
if not ok then stderr:write('ERROR ' .. tostring(result)) exit(3) end
write(encode(result))
"#;

fn run_lua(
    dir: &Path,
    script: &str,
    obj: &Value,
    params: &[(&str, &str)],
) -> Result<Value, String> {
    let lua = prereq::binary("lua5.1").unwrap_or_else(|missing| panic!("{missing}"));
    let path = dir.join("script.lua");
    std::fs::write(&path, script).unwrap();
    let params: Map<String, Value> = params
        .iter()
        .map(|(k, v)| (k.to_string(), json!(v)))
        .collect();
    let program = format!(
        "SCRIPT_PATH = {}\nobj = {}\nactionParams = {}\n{PRELUDE}",
        lua_string(path.to_str().unwrap()),
        lua_literal(obj),
        lua_literal(&Value::Object(params)),
    );
    let out = Command::new(lua)
        .arg("-")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut child| {
            use std::io::Write;
            child.stdin.take().unwrap().write_all(program.as_bytes())?;
            child.wait_with_output()
        })
        .expect("lua5.1 runs");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    match out.status.code() {
        Some(0) => Ok(serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)))),
        Some(3) => Err(stderr.trim_start_matches("ERROR ").to_string()),
        code => panic!("lua5.1 exited {code:?}: {stderr}"),
    }
}

/// Argo CD's cleanReturnedObj: where the object had a map and the script's result came back as
/// an empty array (an empty Lua table), it is a map again.
fn clean_returned(new: &mut Value, old: &Value) {
    match (new, old) {
        (Value::Object(n), Value::Object(o)) => {
            for (k, ov) in o {
                if let Some(nv) = n.get_mut(k) {
                    if ov.is_object() && nv.as_array().is_some_and(Vec::is_empty) {
                        *nv = json!({});
                    } else {
                        clean_returned(nv, ov);
                    }
                }
            }
        }
        (Value::Array(n), Value::Array(o)) => {
            for (nv, ov) in n.iter_mut().zip(o) {
                clean_returned(nv, ov);
            }
        }
        _ => {}
    }
}

/// The JSON merge patch from `old` to `new` (jsonpatch.CreateMergePatch in Argo CD's
/// patchResource): changed and added fields, removed ones as null.
fn merge_patch(old: &Value, new: &Value) -> Value {
    match (old, new) {
        (Value::Object(o), Value::Object(n)) => {
            let mut patch = Map::new();
            for (k, nv) in n {
                match o.get(k) {
                    Some(ov) if ov == nv => {}
                    Some(ov) if ov.is_object() && nv.is_object() => {
                        patch.insert(k.clone(), merge_patch(ov, nv));
                    }
                    _ => {
                        patch.insert(k.clone(), nv.clone());
                    }
                }
            }
            for k in o.keys() {
                if !n.contains_key(k) {
                    patch.insert(k.clone(), Value::Null);
                }
            }
            Value::Object(patch)
        }
        _ => new.clone(),
    }
}

/// Runs an action on `obj` and returns the patch Argo CD would send, or the refusal.
fn patch_of(
    dir: &Path,
    script: &str,
    obj: &Value,
    params: &[(&str, &str)],
) -> Result<Value, String> {
    let mut result = run_lua(dir, script, obj, params)?;
    assert!(
        result.is_object(),
        "an action returns the object (Argo CD's old-style result): {result}"
    );
    clean_returned(&mut result, obj);
    Ok(merge_patch(obj, &result))
}

fn rev(c: char) -> String {
    format!("sha256:{}", c.to_string().repeat(64))
}

fn object(kind: &str, spec: Value, status: Value) -> Value {
    let mut obj = json!({
        "apiVersion": "sluice.dev/v1alpha1",
        "kind": kind,
        "metadata": {"name": "x", "namespace": "ns", "generation": 3, "labels": {},
                     "annotations": {"argocd.argoproj.io/tracking-id": "app:sluice.dev/Rollout:ns/x"}},
        "spec": spec,
    });
    if !status.is_null() {
        obj["status"] = status;
    }
    obj
}

fn rollout(spec_extra: Value, status: Value) -> Value {
    let mut spec = json!({
        "routeRef": {"name": "checkout"},
        "stableService": {"name": "checkout-v1"},
        "canaryService": {"name": "checkout-v2"},
        "canaryWorkload": {"name": "checkout-v2"},
        "steps": [{"setWeight": {"weight": 5}}, {"pause": {"untilPromoted": true}}, {"setWeight": {"weight": 50}}],
        "gates": [],
        "abort": false, "paused": false, "promoteFull": false, "retry": 0,
    });
    for (k, v) in spec_extra.as_object().unwrap() {
        spec[k] = v.clone();
    }
    object("Rollout", spec, status)
}

fn wave_gate(spec_extra: Value, status: Value) -> Value {
    let mut spec = json!({
        "site": "eu-west",
        "applicationSetRef": {"name": "mesh-config"},
        "repository": "oci://registry.local:5000/mesh/config",
        "revision": rev('b'),
        "waves": [
            {"name": "canary", "clusters": ["eu-1"]},
            {"name": "rest", "clusters": ["eu-2"], "waitFor": [{"site": "us-east", "wave": "canary"},
                                                            {"site": "ap-south", "wave": "canary"}]}
        ],
        "driftGate": {"exporter": "None"},
        "pin": {"publicKeysSecretRef": {"name": "cosign"}},
    });
    for (k, v) in spec_extra.as_object().unwrap() {
        spec[k] = v.clone();
    }
    object("WaveGate", spec, status)
}

type Expect = Result<Value, &'static str>;

struct Case {
    what: &'static str,
    kind: &'static str,
    action: &'static str,
    obj: Value,
    params: &'static [(&'static str, &'static str)],
    /// The merge patch's `spec`, or a fragment of the refusal.
    expect: Expect,
}

fn cases() -> Vec<Case> {
    let case = |what, kind, action, obj, params, expect| Case {
        what,
        kind,
        action,
        obj,
        params,
        expect,
    };
    let progressing = json!({"phase": "Progressing", "currentStepIndex": 1, "retriesHandled": 2});
    let aborted = json!({"phase": "Aborted", "currentStepIndex": 1, "retriesHandled": 2});
    let upgrade = |spec: Value, phase: &str| {
        let mut s = json!({"fromTag": "stable", "fromRevision": "1-27", "toTag": "canary",
                           "toRevision": "1-28", "abort": false, "paused": false, "resume": 0});
        for (k, v) in spec.as_object().unwrap() {
            s[k] = v.clone();
        }
        object(
            "RevisionUpgrade",
            s,
            json!({"phase": phase, "resumesHandled": 4}),
        )
    };
    let pin = |spec: Value, phase: &str| {
        let mut s = json!({"targets": [{"name": "mesh-eu-1"}],
                           "bundle": {"repository": "oci://r/m", "digest": rev('a')},
                           "publicKeysSecretRef": {"name": "cosign"}, "reason": "5xx",
                           "release": false});
        for (k, v) in spec.as_object().unwrap() {
            s[k] = v.clone();
        }
        object("BundlePin", s, json!({"phase": phase}))
    };
    let soaking = json!({"phase": "WaitingForSite", "currentWave": "rest"});
    vec![
        // Rollout
        case(
            "promote the current step",
            "Rollout",
            "promote",
            rollout(json!({}), progressing.clone()),
            &[],
            Ok(json!({"promoteThroughStep": 1})),
        ),
        case(
            "promote again",
            "Rollout",
            "promote",
            rollout(json!({"promoteThroughStep": 1}), progressing.clone()),
            &[],
            Err("already promoted through step 1"),
        ),
        case(
            "promote before any step",
            "Rollout",
            "promote",
            rollout(json!({}), json!({"phase": "WaitingForCanary"})),
            &[],
            Err("has not started a step yet"),
        ),
        case(
            "promote an aborted one",
            "Rollout",
            "promote",
            rollout(json!({}), aborted.clone()),
            &[],
            Err("is aborted: retry it"),
        ),
        case(
            "promote fully",
            "Rollout",
            "promote-full",
            rollout(json!({}), progressing.clone()),
            &[],
            Ok(json!({"promoteFull": true})),
        ),
        case(
            "promote fully twice",
            "Rollout",
            "promote-full",
            rollout(json!({"promoteFull": true}), progressing.clone()),
            &[],
            Err("already asks for full promotion"),
        ),
        case(
            "abort",
            "Rollout",
            "abort",
            rollout(json!({}), progressing.clone()),
            &[],
            Ok(json!({"abort": true})),
        ),
        case(
            "abort twice",
            "Rollout",
            "abort",
            rollout(json!({}), aborted.clone()),
            &[],
            Err("already aborted"),
        ),
        case(
            "pause",
            "Rollout",
            "pause",
            rollout(json!({}), progressing.clone()),
            &[],
            Ok(json!({"paused": true})),
        ),
        case(
            "pause a promoted one",
            "Rollout",
            "pause",
            rollout(json!({}), json!({"phase": "Promoted"})),
            &[],
            Err("is Promoted: there is nothing left to pause"),
        ),
        case(
            "resume",
            "Rollout",
            "resume",
            rollout(json!({"paused": true}), json!({"phase": "Paused"})),
            &[],
            Ok(json!({"paused": false})),
        ),
        case(
            "resume one not paused",
            "Rollout",
            "resume",
            rollout(json!({}), progressing.clone()),
            &[],
            Err("is not paused"),
        ),
        case(
            "retry after abort: past retriesHandled, manual promotion dropped",
            "Rollout",
            "retry",
            rollout(
                json!({"abort": true, "retry": 1, "promoteThroughStep": 1, "promoteFull": true}),
                aborted.clone(),
            ),
            &[],
            Ok(
                json!({"abort": false, "retry": 3, "promoteFull": false, "promoteThroughStep": null}),
            ),
        ),
        case(
            "retry one not aborted",
            "Rollout",
            "retry",
            rollout(json!({}), progressing.clone()),
            &[],
            Err("is Progressing, not aborted"),
        ),
        // RevisionUpgrade
        case(
            "abort an upgrade",
            "RevisionUpgrade",
            "abort",
            upgrade(json!({}), "Progressing"),
            &[],
            Ok(json!({"abort": true})),
        ),
        case(
            "abort a complete upgrade",
            "RevisionUpgrade",
            "abort",
            upgrade(json!({}), "Complete"),
            &[],
            Err("is complete: nothing to abort"),
        ),
        case(
            "resume a paused upgrade",
            "RevisionUpgrade",
            "resume",
            upgrade(json!({"paused": true}), "Paused"),
            &[],
            Ok(json!({"paused": false})),
        ),
        case(
            "resume an aborted upgrade: past resumesHandled",
            "RevisionUpgrade",
            "resume",
            upgrade(json!({"abort": true, "resume": 1}), "Aborted"),
            &[],
            Ok(json!({"abort": false, "resume": 5})),
        ),
        case(
            "resume a running upgrade",
            "RevisionUpgrade",
            "resume",
            upgrade(json!({}), "Progressing"),
            &[],
            Err("neither paused nor aborted"),
        ),
        // BundlePin
        case(
            "release a pin",
            "BundlePin",
            "release",
            pin(json!({}), "Pinned"),
            &[("reason", "forward fix merged")],
            Ok(json!({"release": true, "releaseReason": "forward fix merged"})),
        ),
        case(
            "release without a reason",
            "BundlePin",
            "release",
            pin(json!({}), "Pinned"),
            &[("reason", "")],
            Err("release needs a reason"),
        ),
        case(
            "release a released pin",
            "BundlePin",
            "release",
            pin(json!({}), "Released"),
            &[("reason", "x")],
            Err("already released"),
        ),
        // WaveGate
        case(
            "release a site; a release of an older revision is dropped",
            "WaveGate",
            "release-site",
            wave_gate(
                json!({"waitReleases": [{"site": "us-east", "revision": rev('a'), "reason": "old"}]}),
                soaking.clone(),
            ),
            &[("site", "us-east"), ("reason", "us-east is cut off")],
            Ok(
                json!({"waitReleases": [{"site": "us-east", "revision": rev('b'), "reason": "us-east is cut off"}]}),
            ),
        ),
        case(
            "release a second site",
            "WaveGate",
            "release-site",
            wave_gate(
                json!({"waitReleases": [{"site": "us-east", "revision": rev('b'), "reason": "cut off"}]}),
                soaking.clone(),
            ),
            &[("site", "ap-south"), ("reason", "ap-south too")],
            Ok(
                json!({"waitReleases": [{"site": "us-east", "revision": rev('b'), "reason": "cut off"},
                                        {"site": "ap-south", "revision": rev('b'), "reason": "ap-south too"}]}),
            ),
        ),
        case(
            "release a site nobody waits for",
            "WaveGate",
            "release-site",
            wave_gate(json!({}), soaking.clone()),
            &[("site", "mars"), ("reason", "x")],
            Err("no wave of this WaveGate waits for site mars: it waits for us-east, ap-south"),
        ),
        case(
            "release a site twice",
            "WaveGate",
            "release-site",
            wave_gate(
                json!({"waitReleases": [{"site": "us-east", "revision": rev('b'), "reason": "cut off"}]}),
                soaking.clone(),
            ),
            &[("site", "us-east"), ("reason", "again")],
            Err("site us-east is already released"),
        ),
        case(
            "release without a reason",
            "WaveGate",
            "release-site",
            wave_gate(json!({}), soaking.clone()),
            &[("site", "us-east")],
            Err("release-site needs a reason"),
        ),
        case(
            "emergency",
            "WaveGate",
            "emergency",
            wave_gate(json!({}), soaking.clone()),
            &[("reason", "CVE fix")],
            Ok(json!({"emergency": {"revision": rev('b'), "reason": "CVE fix"}})),
        ),
        case(
            "emergency of a halted change",
            "WaveGate",
            "emergency",
            wave_gate(json!({}), json!({"phase": "Halted"})),
            &[("reason", "x")],
            Err("the WaveGate is Halted"),
        ),
        case(
            "emergency twice",
            "WaveGate",
            "emergency",
            wave_gate(
                json!({"emergency": {"revision": rev('b'), "reason": "y"}}),
                soaking.clone(),
            ),
            &[("reason", "x")],
            Err("already declared"),
        ),
        case(
            "emergency without a reason",
            "WaveGate",
            "emergency",
            wave_gate(json!({}), soaking.clone()),
            &[],
            Err("emergency needs a reason"),
        ),
    ]
}

/// A directory of this test's own (the tests run in parallel).
fn tempdir(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "sluice-argocd-actions-{}-{test}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn every_action_writes_only_the_control_fields_its_operator_honours() {
    let Some(data) = rendered_data() else { return };
    let dir = tempdir("actions");
    let mut ran: BTreeSet<(String, String)> = BTreeSet::new();
    for c in cases() {
        let actions = actions(&data, c.kind);
        let script = actions
            .definitions
            .get(c.action)
            .unwrap_or_else(|| panic!("{} has no action {}", c.kind, c.action));
        let got = patch_of(&dir, script, &c.obj, c.params);
        match (&got, &c.expect) {
            (Ok(patch), Ok(spec)) => {
                assert_eq!(
                    patch,
                    &json!({"spec": spec}),
                    "{} {}: {}",
                    c.kind,
                    c.action,
                    c.what
                );
            }
            (Err(message), Err(fragment)) => assert!(
                message.contains(fragment),
                "{} {}: {}: refusal {message:?} lacks {fragment:?}",
                c.kind,
                c.action,
                c.what
            ),
            _ => panic!(
                "{} {}: {}: got {got:?}, want {:?}",
                c.kind, c.action, c.what, c.expect
            ),
        }
        ran.insert((c.kind.to_string(), c.action.to_string()));
    }
    // Every action the chart ships is exercised.
    for kind in ["Rollout", "RevisionUpgrade", "BundlePin", "WaveGate"] {
        for name in actions(&data, kind).definitions.keys() {
            assert!(
                ran.contains(&(kind.to_string(), name.clone())),
                "{kind} action {name} has no case"
            );
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// (kind, object, the actions discovery enables).
fn discovery_cases() -> Vec<(&'static str, Value, &'static [&'static str])> {
    vec![
        (
            "Rollout",
            rollout(
                json!({}),
                json!({"phase": "Progressing", "currentStepIndex": 0}),
            ),
            &["abort", "pause", "promote", "promote-full"],
        ),
        (
            "Rollout",
            rollout(
                json!({"paused": true}),
                json!({"phase": "Paused", "currentStepIndex": 1}),
            ),
            &["abort", "promote", "promote-full", "resume"],
        ),
        (
            "Rollout",
            rollout(
                json!({"abort": true}),
                json!({"phase": "Aborted", "currentStepIndex": 1}),
            ),
            &["retry"],
        ),
        (
            "Rollout",
            rollout(json!({}), json!({"phase": "Promoted"})),
            &["abort"],
        ),
        (
            "Rollout",
            rollout(json!({}), Value::Null),
            &["abort", "pause", "promote-full"],
        ),
        (
            "RevisionUpgrade",
            object(
                "RevisionUpgrade",
                json!({"abort": false, "paused": false}),
                json!({"phase": "Progressing"}),
            ),
            &["abort"],
        ),
        (
            "RevisionUpgrade",
            object(
                "RevisionUpgrade",
                json!({"abort": true}),
                json!({"phase": "RollingBack"}),
            ),
            &["resume"],
        ),
        (
            "RevisionUpgrade",
            object("RevisionUpgrade", json!({}), json!({"phase": "Complete"})),
            &[],
        ),
        (
            "BundlePin",
            object(
                "BundlePin",
                json!({"release": false}),
                json!({"phase": "Pinned"}),
            ),
            &["release"],
        ),
        (
            "BundlePin",
            object(
                "BundlePin",
                json!({"release": true}),
                json!({"phase": "Releasing"}),
            ),
            &[],
        ),
        (
            "WaveGate",
            wave_gate(json!({}), json!({"phase": "WaitingForSite"})),
            &["emergency", "release-site"],
        ),
        (
            "WaveGate",
            wave_gate(
                json!({"waitReleases": [
            {"site": "us-east", "revision": rev('b'), "reason": "r"},
            {"site": "ap-south", "revision": rev('b'), "reason": "r"}]}),
                json!({"phase": "Soaking"}),
            ),
            &["emergency"],
        ),
        (
            "WaveGate",
            wave_gate(json!({}), json!({"phase": "Complete"})),
            &[],
        ),
    ]
}

#[test]
fn discovery_offers_exactly_the_actions_that_apply() {
    let Some(data) = rendered_data() else { return };
    let dir = tempdir("discovery");
    for (kind, obj, want) in discovery_cases() {
        let actions = actions(&data, kind);
        let found = run_lua(&dir, &actions.discovery, &obj, &[])
            .unwrap_or_else(|e| panic!("{kind} discovery failed: {e}"));
        let found = found
            .as_object()
            .expect("discovery returns a table of actions");
        let names: BTreeSet<&String> = found.keys().collect();
        let defined: BTreeSet<&String> = actions.definitions.keys().collect();
        assert_eq!(
            names, defined,
            "{kind}: discovery and definitions name the same actions"
        );
        let enabled: Vec<&str> = found
            .iter()
            .filter(|(_, a)| a["disabled"] != json!(true))
            .map(|(n, _)| n.as_str())
            .collect();
        assert_eq!(enabled, want, "{kind} {}: enabled actions", obj["status"]);
    }
    // Parameters: the reason is asked for, and release-site proposes the first waited site.
    let wg = actions(&data, "WaveGate");
    let found = run_lua(
        &dir,
        &wg.discovery,
        &wave_gate(
            json!({"waitReleases": [{"site": "us-east", "revision": rev('b'), "reason": "r"}]}),
            json!({"phase": "WaitingForSite"}),
        ),
        &[],
    )
    .unwrap();
    assert_eq!(
        found["release-site"]["params"],
        json!([{"name": "site", "default": "ap-south"}, {"name": "reason"}])
    );
    assert_eq!(found["emergency"]["params"], json!([{"name": "reason"}]));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn every_control_field_an_action_writes_is_ignored_in_diff() {
    let Some(data) = rendered_data() else { return };
    let mut written: BTreeMap<&str, BTreeSet<String>> = BTreeMap::new();
    let dir = tempdir("fields");
    for c in cases() {
        let script = actions(&data, c.kind).definitions[c.action].clone();
        if let Ok(patch) = patch_of(&dir, &script, &c.obj, c.params) {
            for field in patch["spec"].as_object().unwrap().keys() {
                written
                    .entry(c.kind)
                    .or_default()
                    .insert(format!("/spec/{field}"));
            }
            assert_eq!(
                patch.as_object().unwrap().keys().collect::<Vec<_>>(),
                vec!["spec"],
                "{} {}: an action writes spec control fields only",
                c.kind,
                c.action
            );
        }
    }
    for (kind, fields) in written {
        let key = format!("resource.customizations.ignoreDifferences.sluice.dev_{kind}");
        let text = data
            .get(&key)
            .unwrap_or_else(|| panic!("the snippet lacks {key}"));
        let ignore: Value = serde_saphyr::from_str(text).unwrap();
        let pointers: BTreeSet<String> = ignore["jsonPointers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p.as_str().unwrap().to_string())
            .collect();
        assert!(
            fields.is_subset(&pointers),
            "{kind}: the actions write {fields:?}, ignoreDifferences has {pointers:?}: self-heal would undo them"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn health_checks_run_without_the_libraries_argo_cd_leaves_out() {
    if prereq::require_binary("lua5.1").is_none() {
        return;
    }
    let dir = tempdir("health");
    let ready_false = json!([{"type": "Ready", "status": "False", "reason": "X", "message": "bad spec",
                              "lastTransitionTime": "2026-11-30T04:00:00Z"}]);
    // Statuses that reach every formatting branch of the scripts.
    let objects = [
        (
            "Rollout",
            json!({"phase": "Progressing", "currentStepIndex": 3, "desiredWeight": 25,
                           "appliedShare": 0.2431, "observedGeneration": 3}),
            "applied share 24.3%",
        ),
        (
            "BundlePin",
            json!({"phase": "Refused", "conditions": ready_false.clone()}),
            "refused: bad spec",
        ),
        (
            "RevisionUpgrade",
            json!({"phase": "Invalid", "conditions": ready_false.clone()}),
            "invalid: bad spec",
        ),
        (
            "WaveGate",
            json!({"phase": "Halted", "halt": {"reason": "GateFailed", "wave": "canary",
                            "haltedAt": "2026-11-30T04:00:00Z"}}),
            "",
        ),
        ("GateTemplate", Value::Null, ""),
    ];
    for kind in SLUICE_KINDS {
        let (_, status, message) = objects.iter().find(|(k, _, _)| k == kind).unwrap();
        let script = health_script(kind).unwrap();
        let obj = object(kind, json!({}), status.clone());
        let health = run_lua(&dir, &script, &obj, &[])
            .unwrap_or_else(|e| panic!("{kind} health check fails in Argo CD's sandbox: {e}"));
        assert!(
            health["message"].as_str().unwrap_or("").contains(message),
            "{kind}: {health}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Argo CD's flow against an API server with the sluice CRDs (the Kubernetes API emulator:
/// schema, defaults and CEL rules): each action runs on the live object, its merge patch is
/// sent as Argo CD's patchResource sends it, the server accepts it, and the stored spec has the
/// fields the case expects.
#[tokio::test]
async fn the_api_server_accepts_every_actions_patch() {
    use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
    use kube::core::{ApiResource, GroupVersionKind};

    let Some(data) = rendered_data() else { return };
    let crds: Vec<PathBuf> = ["rollouts", "wavegates", "bundlepins", "revisionupgrades"]
        .iter()
        .map(|p| chart_dir().join(format!("../../crds/{p}.sluice.dev.yaml")))
        .collect();
    let emu = kube_emulator::Emulator::start_with(kube_emulator::Options {
        manifests: crds,
        ..kube_emulator::Options::default()
    })
    .await
    .expect("emulator starts with the sluice CRDs");
    emu.load_yaml("apiVersion: v1\nkind: Namespace\nmetadata: {name: ns}\n")
        .unwrap();
    let dir = tempdir("api");
    for (i, c) in cases().into_iter().enumerate() {
        let Ok(want) = &c.expect else { continue };
        let plural = format!("{}s", c.kind.to_ascii_lowercase());
        let ar = ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("sluice.dev", "v1alpha1", c.kind),
            &plural,
        );
        let api: Api<DynamicObject> = if c.kind == "RevisionUpgrade" {
            Api::all_with(emu.client(), &ar)
        } else {
            Api::namespaced_with(emu.client(), "ns", &ar)
        };
        let name = format!("case-{i}");
        let mut create = json!({"apiVersion": "sluice.dev/v1alpha1", "kind": c.kind,
                                "metadata": {"name": name}, "spec": c.obj["spec"]});
        if c.kind != "RevisionUpgrade" {
            create["metadata"]["namespace"] = json!("ns");
        }
        let create: DynamicObject = serde_json::from_value(create).unwrap();
        api.create(&PostParams::default(), &create)
            .await
            .unwrap_or_else(|e| panic!("{} {}: create: {e}", c.kind, c.what));
        if let Some(status) = c.obj.get("status") {
            api.patch_status(
                &name,
                &PatchParams::default(),
                &Patch::Merge(json!({"status": status})),
            )
            .await
            .unwrap_or_else(|e| panic!("{} {}: status: {e}", c.kind, c.what));
        }
        let live = serde_json::to_value(api.get(&name).await.unwrap()).unwrap();
        let script = &actions(&data, c.kind).definitions[c.action];
        let patch = patch_of(&dir, script, &live, c.params).unwrap_or_else(|e| {
            panic!(
                "{} {}: {}: refused on the live object: {e}",
                c.kind, c.action, c.what
            )
        });
        api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap_or_else(|e| {
                panic!(
                    "{} {}: {}: the API server refused {patch}: {e}",
                    c.kind, c.action, c.what
                )
            });
        let stored = serde_json::to_value(api.get(&name).await.unwrap()).unwrap();
        for (field, value) in want.as_object().unwrap() {
            let got = stored["spec"].get(field).cloned().unwrap_or(Value::Null);
            assert_eq!(
                &got, value,
                "{} {}: {}: spec.{field}",
                c.kind, c.action, c.what
            );
        }
    }
    emu.shutdown().await;
}
