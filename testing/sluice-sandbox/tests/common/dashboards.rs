//! The dashboards-and-alerts check the scenario tests run their scenario through
//! ([`run_checked`]): every Grafana dashboard query the chart ships
//! (charts/sluice/dashboards/*.json: panel targets and template-variable queries) and every alert
//! expression of its PrometheusRule (rendered by helm) runs against the sandbox's Prometheus
//! while the scenario runs and once more after it ended, in the same run whose figures the test
//! checks (one sandbox run per scenario, not one for the figures and one for the queries). A query that errors fails the test in any scenario; a query of the scenario's
//! own dashboards that never returns data fails it too; and each alert's scenario (the
//! [`ALERTS`] table) checks that the alert's expression returns series naming the object
//! (`object_name`); tests/dashboards_and_alerts.rs checks that every alert the chart renders is in
//! [`ALERTS`] with a scenario that exists.
//!
//! What a Grafana user gets is reproduced, not approximated: the operators' `/metrics` are
//! scraped every [`SCRAPE`] and written to the sandbox's Prometheus with the target labels a
//! per-cluster Prometheus adds (`job` = the chart's component name, `instance`, `namespace`,
//! `pod`, and `cluster` as the global view's external label); template variables are resolved
//! in order by running their own `label_values` queries, as Grafana does, and the scenario's
//! object must be among the values; `$__interval`, `$__rate_interval` and `$__range` are
//! substituted as Grafana computes them for the scrape interval and the time since the
//! scenario started; every query is a range query over the time since the previous round, as
//! a dashboard's panels are, so a state that lasted one scrape is seen. The sandbox runs without
//! `--until-done`: once it says the scenario ended, the last round reads the end state (a halt,
//! a release), then SIGTERM stops it and its result line must say `pass`.
//!
//! Alert `for:` durations (a minute to hours) are longer than any scenario: the scenario checks
//! that the expression names the object at every evaluation step for [`ALERT_FOR`] in a row (the
//! rule with its `for:` shortened to that would fire; a rule without `for:` fires on one step),
//! with series an operator removed ending at once (the scrape writes Prometheus' staleness
//! marker); charts/sluice/ci/alerts-test.yaml checks the rendered `for:` and annotations with
//! promtool. Thresholds are rendered at the schema's minimum and, where a scenario is shorter
//! still, compared at the sandbox's scale ([`SANDBOX_THRESHOLDS`]: a pin is "too old" after 2 s).

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;
use sluice_testkit::remote_write::{RemoteWriteClient, Series};

use super::ScenarioResult;

/// How often the operators' `/metrics` are scraped into Prometheus (a halt lasts about a second
/// before a scenario ends and stops the operators).
const SCRAPE: Duration = Duration::from_secs(1);
/// How often every query is evaluated, as a range query over the time since the last round
/// (with the step Grafana would use), so a state that lasted one scrape is seen; a last round
/// runs when the scenario prints its result, before the sandbox stops Prometheus.
const EVALUATE: Duration = Duration::from_secs(4);
/// The namespace the chart installs the operators in, as the scrape's target label.
const OPERATOR_NAMESPACE: &str = "sluice-system";

/// Alerts of the chart and the scenario that makes each fire (its expression returns the
/// object while the scenario runs); that scenario's test below checks it.
pub const ALERTS: &[(&str, &str)] = &[
    ("SluiceRolloutStuck", "canary-abort"),
    ("SluiceRolloutAborted", "canary-abort"),
    // canary-abort's starved gate holds the Rollout (policy Pause) before the fault.
    ("SluiceRolloutAnalysisInconclusive", "canary-abort"),
    // canary-promote's Git change comes after the Rollout's 2 s hand-back deadline.
    ("SluiceRolloutHandBackOverdue", "canary-promote"),
    ("SluiceBundlePinTooOld", "pin-release"),
    ("SluiceWaveHalted", "waves-breach"),
    // waves-clean's starved gate stays Inconclusive through every soak (policy Continue).
    ("SluiceWaveAnalysisInconclusive", "waves-clean"),
    // revision-upgrade creates its RevisionUpgrade with spec.paused and resumes it.
    ("SluiceUpgradePaused", "revision-upgrade"),
];

/// An alert's `for:` as the scenarios evaluate it: the rendered ones (a minute to hours) are
/// longer than any scenario, so its expression must name the object at every evaluation, one
/// [`SCRAPE`] apart, for this long (as the rule would with `for:` shortened to it);
/// charts/sluice/ci/alerts-test.yaml checks the rendered `for:` with promtool.
pub const ALERT_FOR: Duration = Duration::from_secs(2);

/// Alert thresholds rendered at the smallest values the chart's schema accepts (helm `--set`).
const FAST_THRESHOLDS: &[&str] = &["monitoring.prometheusRule.alerts.pinMaxAgeSeconds=60"];

/// Thresholds the sandbox's clock needs below the schema's minimum: (alert, the comparison as
/// rendered, the comparison evaluated). A scenario's pin holds for seconds, not minutes.
const SANDBOX_THRESHOLDS: &[(&str, &str, &str)] = &[("SluiceBundlePinTooOld", "> 60", "> 2")];

/// One query to check, and where it comes from.
#[derive(Debug, Clone)]
pub struct Query {
    /// `rollouts.json: panel "Rollouts by phase" A`, `alert SluiceWaveHalted`, ...
    pub source: String,
    /// The dashboard it belongs to (file name), or `None` for an alert.
    pub dashboard: Option<String>,
    /// The alert's name.
    pub alert: Option<String>,
    /// The PromQL with Grafana's variables still in it.
    pub expr: String,
    /// For an alert: how long its expression must name the object at every evaluation in a
    /// row ([`ALERT_FOR`] for a rule with a `for:`, one evaluation without).
    pub hold: Duration,
}

/// A dashboard template variable.
#[derive(Debug, Clone)]
struct Variable {
    name: String,
    /// `label_values(<selector>, <label>)` or a textbox's default.
    query: Option<(String, String)>,
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn dashboards() -> Vec<(String, Value)> {
    let dir = repo().join("charts/sluice/dashboards");
    let mut out: Vec<(String, Value)> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "json"))
        .map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let text = std::fs::read_to_string(e.path()).unwrap();
            let v: Value = serde_json::from_str(&text)
                .unwrap_or_else(|err| panic!("dashboards/{name} is not JSON: {err}"));
            (name, v)
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

fn panel_queries(file: &str, panels: &Value, out: &mut Vec<Query>) {
    for p in panels.as_array().into_iter().flatten() {
        for t in p["targets"].as_array().into_iter().flatten() {
            if let Some(expr) = t["expr"].as_str() {
                out.push(Query {
                    source: format!(
                        "{file}: panel {:?} {}",
                        p["title"].as_str().unwrap_or_default(),
                        t["refId"].as_str().unwrap_or_default()
                    ),
                    dashboard: Some(file.to_owned()),
                    alert: None,
                    expr: expr.to_owned(),
                    hold: Duration::ZERO,
                });
            }
        }
        panel_queries(file, &p["panels"], out);
    }
}

/// `label_values(selector, label)` split, or `None` for another function.
pub fn label_values(q: &str) -> Option<(String, String)> {
    let inner = q.trim().strip_prefix("label_values(")?.strip_suffix(')')?;
    let (selector, label) = inner.rsplit_once(',')?;
    Some((selector.trim().to_owned(), label.trim().to_owned()))
}

fn variables(dash: &Value) -> Vec<Variable> {
    dash["templating"]["list"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|v| v["type"] == "query" || v["type"] == "textbox")
        .map(|v| {
            let q = v["query"]["query"].as_str().or(v["query"].as_str());
            Variable {
                name: v["name"].as_str().unwrap_or_default().to_owned(),
                query: if v["type"] == "query" {
                    Some(label_values(q.unwrap_or_default()).unwrap_or_else(|| {
                        panic!("variable {} is not label_values(...): {q:?}", v["name"])
                    }))
                } else {
                    None
                },
            }
        })
        .collect()
}

/// The chart's alert rules, rendered by helm with monitoring on and [`FAST_THRESHOLDS`].
pub fn alert_queries() -> Option<Vec<Query>> {
    let helm = sluice_testkit::prereq::or_skip(sluice_testkit::prereq::binary("helm"))?;
    let mut args = vec![
        "template".to_string(),
        "sluice".into(),
        repo().join("charts/sluice").display().to_string(),
        "--namespace".into(),
        OPERATOR_NAMESPACE.into(),
        "--set".into(),
        "monitoring.prometheusRule.enabled=true".into(),
        "--show-only".into(),
        "templates/monitoring/prometheusrule.yaml".into(),
    ];
    for t in FAST_THRESHOLDS {
        args.extend(["--set".to_string(), (*t).to_owned()]);
    }
    let out = std::process::Command::new(helm)
        .args(&args)
        .output()
        .expect("helm runs");
    assert!(
        out.status.success(),
        "helm template failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rule: serde_yaml::Value = serde_yaml::from_slice(&out.stdout).expect("rendered YAML");
    let mut queries = Vec::new();
    for g in rule["spec"]["groups"].as_sequence().into_iter().flatten() {
        for r in g["rules"].as_sequence().into_iter().flatten() {
            let (Some(name), Some(expr)) = (r["alert"].as_str(), r["expr"].as_str()) else {
                continue;
            };
            let mut expr = expr.trim().to_owned();
            for (alert, rendered, sandbox) in SANDBOX_THRESHOLDS {
                if *alert == name {
                    assert!(
                        expr.contains(rendered),
                        "{name} no longer renders {rendered:?}: {expr}"
                    );
                    expr = expr.replace(rendered, sandbox);
                }
            }
            queries.push(Query {
                source: format!("alert {name}"),
                dashboard: None,
                alert: Some(name.to_owned()),
                expr,
                hold: if r["for"].as_str().is_some() {
                    ALERT_FOR
                } else {
                    Duration::ZERO
                },
            });
        }
    }
    Some(queries)
}

pub struct Vars {
    values: BTreeMap<String, String>,
}

impl Vars {
    /// `$__interval` is the evaluation step (the scrape interval at this resolution); `$__rate_interval` is
    /// max(`$__interval` + scrape interval, 4 × scrape interval), Grafana's formula, with the
    /// datasource's scrape interval set to [`SCRAPE`]; `$__range` is the time since the
    /// scenario started.
    pub fn new(range: Duration) -> Self {
        let interval = SCRAPE.as_secs();
        let rate = (interval + SCRAPE.as_secs()).max(4 * SCRAPE.as_secs());
        let mut values = BTreeMap::new();
        values.insert("__rate_interval".into(), format!("{rate}s"));
        values.insert("__range".into(), format!("{}s", range.as_secs().max(1)));
        values.insert("__interval".into(), format!("{interval}s"));
        Self { values }
    }

    pub fn set(&mut self, name: &str, value: &str) {
        self.values.insert(name.to_owned(), value.to_owned());
    }

    pub fn apply(&self, expr: &str) -> String {
        let mut out = expr.to_owned();
        // Longest names first, so `$object_name` is not cut by a shorter `$object`.
        let mut names: Vec<&String> = self.values.keys().collect();
        names.sort_by_key(|n| std::cmp::Reverse(n.len()));
        for n in names {
            let v = &self.values[n];
            out = out.replace(&format!("${{{n}}}"), v);
            out = out.replace(&format!("${n}"), v);
        }
        out
    }
}

// ---------------------------------------------------------------------------------------------
// Prometheus over plain HTTP/1.0 (the test only needs GET and the JSON answer).

fn encode(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn http_get(port: u16, path: &str) -> Result<String, String> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok();
    write!(s, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").map_err(|e| e.to_string())?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (_, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("no HTTP body: {text}"))?;
    Ok(body.to_owned())
}

/// Why a query gave no answer.
#[derive(Debug)]
enum Failed {
    /// Prometheus answered with an error: the query is wrong.
    Query(String),
    /// Prometheus could not be reached (the sandbox is stopping).
    Unreachable,
}

/// Range query from `start` to `end` (Unix seconds) at `step`: `Ok(series)` (a scalar counts
/// as one), or why not.
fn query_range(
    port: u16,
    promql: &str,
    start: f64,
    end: f64,
    step: Duration,
) -> Result<Vec<Value>, Failed> {
    let path = format!(
        "/api/v1/query_range?query={}&start={start:.3}&end={end:.3}&step={}",
        encode(promql),
        step.as_secs().max(1)
    );
    let body = http_get(port, &path).map_err(|_| Failed::Unreachable)?;
    let v: Value = serde_json::from_str(&body).map_err(|_| Failed::Unreachable)?;
    if v["status"] != "success" {
        return Err(Failed::Query(format!("{}: {}", v["errorType"], v["error"])));
    }
    match v["data"]["resultType"].as_str() {
        Some("vector") | Some("matrix") => {
            Ok(v["data"]["result"].as_array().cloned().unwrap_or_default())
        }
        Some("scalar") => Ok(vec![v["data"]["result"].clone()]),
        other => Err(Failed::Query(format!("unexpected result type {other:?}"))),
    }
}

fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

// ---------------------------------------------------------------------------------------------
// The scrape: what a per-cluster Prometheus with the chart's ServiceMonitor would store.

/// One operator's metrics endpoint in the sandbox.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Target {
    cluster: String,
    operator: String,
    port: u16,
}

/// `cluster: wave-gate started (pid N, metrics http://127.0.0.1:PORT/metrics)`.
fn target_of(line: &str) -> Option<Target> {
    let (cluster, rest) = line.split_once(": ")?;
    let (operator, rest) = rest.split_once(" started (pid ")?;
    let port = rest
        .split_once("metrics http://127.0.0.1:")?
        .1
        .split('/')
        .next()?
        .parse()
        .ok()?;
    Some(Target {
        cluster: cluster.to_owned(),
        operator: operator.trim_start_matches("sluice-").to_owned(),
        port,
    })
}

/// One sample of an exposition: metric name, labels, value.
type Sample = (String, Vec<(String, String)>, f64);

/// The samples of an exposition (Prometheus text or OpenMetrics): name, labels, value.
fn samples(text: &str) -> Vec<Sample> {
    let mut out = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let name_end = line.find(['{', ' ']).unwrap_or(line.len());
        let name = &line[..name_end];
        let mut rest = &line[name_end..];
        let mut labels = Vec::new();
        if let Some(body) = rest.strip_prefix('{') {
            let mut chars = body.char_indices().peekable();
            let mut key = String::new();
            let mut end = None;
            while let Some((i, c)) = chars.next() {
                match c {
                    '}' => {
                        end = Some(i + 1);
                        break;
                    }
                    ',' | ' ' => {}
                    '=' => {
                        let mut value = String::new();
                        chars.next(); // opening quote
                        while let Some((_, c)) = chars.next() {
                            match c {
                                '\\' => match chars.next() {
                                    Some((_, 'n')) => value.push('\n'),
                                    Some((_, c)) => value.push(c),
                                    None => {}
                                },
                                '"' => break,
                                c => value.push(c),
                            }
                        }
                        labels.push((std::mem::take(&mut key), value));
                    }
                    c => key.push(c),
                }
            }
            let Some(end) = end else { continue };
            rest = &body[end..];
        }
        let Some(value) = rest.split_whitespace().next().and_then(|v| v.parse().ok()) else {
            continue;
        };
        out.push((name.to_owned(), labels, value));
    }
    out
}

/// A series' name and labels.
type SeriesKey = (String, Vec<(String, String)>);

/// Prometheus' staleness marker (a NaN with this bit pattern): the series ended.
const STALE: f64 = f64::from_bits(0x7ff0_0000_0000_0002);

/// A scraped series of `t` with the target labels a per-cluster Prometheus adds.
fn scraped(t: &Target, name: String, labels: Vec<(String, String)>) -> Series {
    let mut s = Series::new(name)
        .label("job", t.operator.as_str())
        .label("instance", format!("127.0.0.1:{}", t.port))
        .label("namespace", OPERATOR_NAMESPACE)
        .label("pod", format!("{}-0", t.operator))
        .label("cluster", t.cluster.as_str());
    for (k, v) in labels {
        s = s.label(k, v);
    }
    s
}

/// Scrapes every known target each [`SCRAPE`] until `stop`, writing to Prometheus.
fn scraper(
    prometheus: String,
    targets: Arc<Mutex<Vec<Target>>>,
    stop: Arc<AtomicBool>,
    written: Arc<AtomicU64>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let client = RemoteWriteClient::new(&prometheus);
        // What each target exposed at its last scrape: a series gone from the next one gets
        // Prometheus' staleness marker, as a scrape writes it, so a removed series (a deleted
        // object's, a phase left) stops answering at once instead of for the 5 min look-back.
        let mut exposed: BTreeMap<u16, BTreeSet<SeriesKey>> = BTreeMap::new();
        while !stop.load(Ordering::Relaxed) {
            let began = Instant::now();
            let now = sluice_testkit::prometheus::now_ms();
            let mut series = Vec::new();
            for t in targets.lock().unwrap().clone() {
                let Ok(text) = http_get(t.port, "/metrics") else {
                    continue;
                };
                let mut now_exposed = BTreeSet::new();
                for (name, labels, value) in samples(&text) {
                    // The scenario's own global view carries this one between sites already
                    // (wave-gate reads it back); a second copy would be a second source.
                    if name == "sluice_wavegate_wave_passed" {
                        continue;
                    }
                    now_exposed.insert((name.clone(), labels.clone()));
                    series.push(scraped(&t, name, labels).sample(now, value));
                }
                let before = exposed.insert(t.port, now_exposed.clone());
                for (name, labels) in before.unwrap_or_default().difference(&now_exposed) {
                    series.push(scraped(&t, name.clone(), labels.clone()).sample(now, STALE));
                }
            }
            if !series.is_empty() {
                match rt.block_on(client.write(&series)) {
                    Ok(()) => {
                        written.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => println!("note: writing scraped metrics failed: {e}"),
                }
            }
            std::thread::sleep(SCRAPE.saturating_sub(began.elapsed()));
        }
    })
}

// ---------------------------------------------------------------------------------------------
// The check.

/// One scenario to run, and the budget of the whole run (start, scenario, stop).
pub struct Expect {
    /// The scenario's name.
    pub scenario: &'static str,
    /// The run's whole budget (start, scenario, stop).
    pub budget: Duration,
}

/// What was seen of one query over the runs.
#[derive(Default, Debug)]
struct Seen {
    /// The scenarios in which it returned data.
    data_in: BTreeSet<&'static str>,
    error: Option<String>,
    /// For an alert: the `object_name` values its series carried, per scenario.
    objects: BTreeMap<&'static str, BTreeSet<String>>,
    /// For an alert: per scenario and object, how long its series answered at every step.
    held: BTreeMap<&'static str, BTreeMap<String, Held>>,
    last: String,
}

/// How long an alert's expression named an object at every evaluation step in a row.
#[derive(Default, Debug, Clone, Copy)]
pub struct Held {
    /// The current run's first and last step (Unix seconds).
    since: f64,
    last: f64,
    /// The longest run so far, in seconds.
    pub longest: f64,
}

impl Held {
    /// One more step at which the expression named the object: it extends the run when it
    /// follows the last step by at most one step and a half (rounds overlap by one step).
    pub fn step(&mut self, at: f64, step: f64) {
        if at <= self.last + 1e-3 {
            return;
        }
        if self.last == 0.0 || at - self.last > 1.5 * step {
            self.since = at;
        }
        self.last = at;
        self.longest = self.longest.max(self.last - self.since);
    }
}

/// Everything one evaluation round needs.
struct Round<'a> {
    port: u16,
    scenario: &'static str,
    start: f64,
    end: f64,
    range: Duration,
    dashboards: &'a [(String, Value)],
    queries: &'a [Query],
    objects: &'a [(&'a str, &'a str, &'a str, &'a str)],
}

/// Runs every query over `round`'s window; `false` when Prometheus could not be reached.
fn evaluate(
    round: &Round<'_>,
    seen: &mut BTreeMap<String, Seen>,
    offered: &mut BTreeMap<(String, String), BTreeSet<String>>,
) -> bool {
    let step = SCRAPE;
    let run = |promql: &str, s: &mut Seen| -> Option<Vec<Value>> {
        match query_range(round.port, promql, round.start, round.end, step) {
            Ok(rows) => {
                if rows
                    .iter()
                    .any(|r| r["values"].as_array().is_none_or(|v| !v.is_empty()))
                {
                    s.data_in.insert(round.scenario);
                }
                s.last = promql.to_owned();
                Some(rows)
            }
            Err(Failed::Query(e)) => {
                s.error.get_or_insert(format!("{e} in {promql}"));
                s.last = promql.to_owned();
                Some(Vec::new())
            }
            Err(Failed::Unreachable) => None,
        }
    };
    for (file, d) in round.dashboards {
        let mut vars = Vars::new(round.range);
        vars.set("stable", sluice_sandbox::baseline::STABLE);
        vars.set("canary", sluice_sandbox::baseline::CANARY);
        // Variables in order, each from its own query with the earlier ones applied; the
        // scenario's object when offered, else the first value (Grafana's default).
        for v in variables(d) {
            let Some((selector, label)) = &v.query else {
                continue;
            };
            let promql = vars.apply(&format!("count by ({label}) ({selector})"));
            let s = seen
                .entry(format!("{file}: variable {}", v.name))
                .or_default();
            let Some(rows) = run(&promql, s) else {
                return false;
            };
            let values: BTreeSet<String> = rows
                .iter()
                .filter_map(|r| r["metric"][label.as_str()].as_str())
                .map(str::to_owned)
                .collect();
            let want = round
                .objects
                .iter()
                .find(|o| o.0 == file)
                .map(|o| match v.name.as_str() {
                    "cluster" => o.1,
                    "object_namespace" => o.2,
                    _ => o.3,
                });
            let pick = match want {
                Some(w) if values.contains(w) => w.to_owned(),
                _ => values.iter().next().cloned().unwrap_or_default(),
            };
            offered
                .entry((file.clone(), v.name.clone()))
                .or_default()
                .extend(values);
            vars.set(&v.name, &pick);
        }
        for q in round
            .queries
            .iter()
            .filter(|q| q.dashboard.as_deref() == Some(file))
        {
            let s = seen.entry(q.source.clone()).or_default();
            if run(&vars.apply(&q.expr), s).is_none() {
                return false;
            }
        }
    }
    for q in round.queries.iter().filter(|q| q.alert.is_some()) {
        let s = seen.entry(q.source.clone()).or_default();
        let Some(rows) = run(&q.expr, s) else {
            return false;
        };
        s.objects.entry(round.scenario).or_default().extend(
            rows.iter()
                .filter_map(|r| r["metric"]["object_name"].as_str())
                .map(str::to_owned),
        );
        let held = s.held.entry(round.scenario).or_default();
        for r in &rows {
            let Some(object) = r["metric"]["object_name"].as_str() else {
                continue;
            };
            let h = held.entry(object.to_owned()).or_default();
            for v in r["values"].as_array().into_iter().flatten() {
                if let Some(at) = v[0].as_f64() {
                    h.step(at, step.as_secs_f64());
                }
            }
        }
    }
    true
}

/// Runs `runs` one after the other with every query evaluated during each, and returns each
/// run's checked result (as [`super::run_scenario`] does: exit 0, `pass`, nothing left
/// running); then every query of `dashboards_checked` must have returned data in at least one
/// run, every alert [`ALERTS`] gives one of these scenarios must have returned series naming an
/// object in it, the per-object variables must have offered `objects`, and no query may have
/// errored. `None`, said why, when helm, the sandbox's prerequisites or the operator binaries
/// are missing here.
pub fn run_checked(
    runs: &[Expect],
    dashboards_checked: &[&str],
    objects: &[(&str, &str, &str, &str)],
) -> Option<Vec<ScenarioResult>> {
    let _one = super::one_sandbox();
    let alerts = alert_queries()?;
    if !super::prerequisites() {
        return None;
    }
    if super::operators_flag() != "--operators=on" {
        sluice_testkit::prereq::Missing::new(
            "the operator binaries (the scenarios run them)",
            "cargo build --bins",
        )
        .skip();
        return None;
    }
    let (flags, start) = super::on_control_plane(&[], Duration::ZERO)?;
    let dashboards = dashboards();
    let mut queries: Vec<Query> = Vec::new();
    for (file, d) in &dashboards {
        panel_queries(file, &d["panels"], &mut queries);
    }
    queries.extend(alerts);
    let mut seen: BTreeMap<String, Seen> = BTreeMap::new();
    let mut offered: BTreeMap<(String, String), BTreeSet<String>> = BTreeMap::new();
    let mut results = Vec::new();
    for expect in runs {
        results.push(run_one(
            expect,
            (&flags, start),
            &dashboards,
            &queries,
            objects,
            &mut seen,
            &mut offered,
        ));
    }

    let scenarios: BTreeSet<&str> = runs.iter().map(|r| r.scenario).collect();
    let mine: BTreeSet<&str> = ALERTS
        .iter()
        .filter(|(_, s)| scenarios.contains(s))
        .map(|(a, _)| *a)
        .collect();
    let mut problems = Vec::new();
    for (source, s) in &seen {
        if let Some(e) = &s.error {
            problems.push(format!("{source} errors: {e}"));
        }
        let dashboard = dashboards_checked
            .iter()
            .any(|d| source.starts_with(&format!("{d}: ")));
        let alert = source.strip_prefix("alert ").filter(|a| mine.contains(a));
        if dashboard || alert.is_some() {
            let status = if s.data_in.is_empty() {
                "NO DATA".to_string()
            } else {
                format!("data in {:?}", s.data_in)
            };
            println!("checked [{status}] {source}: {}", s.last);
            if s.data_in.is_empty() {
                problems.push(format!("{source} never returned data: {}", s.last));
            }
        }
        if let Some(alert) = alert {
            let (_, scenario) = ALERTS.iter().find(|(a, _)| *a == alert).unwrap();
            let named = s.objects.get(scenario).cloned().unwrap_or_default();
            let held = s.held.get(scenario).cloned().unwrap_or_default();
            let longest = held.values().map(|h| h.longest).fold(0.0, f64::max);
            let hold = queries
                .iter()
                .find(|q| q.source == *source)
                .map_or(Duration::ZERO, |q| q.hold);
            println!(
                "alert {alert} fired in {scenario} naming {named:?}, held {longest:.0} s in a row (for: {hold:?} here)"
            );
            if named.is_empty() {
                problems.push(format!(
                    "{source} never fired naming an object (object_name) in {scenario}"
                ));
            } else if longest + 1e-3 < hold.as_secs_f64() {
                problems.push(format!(
                    "{source} named {named:?} in {scenario} but never for {hold:?} in a row (longest {longest:.0} s): it would stay pending"
                ));
            }
        }
    }
    for (file, cluster, ns, name) in objects {
        for (var, want) in [
            ("cluster", cluster),
            ("object_namespace", ns),
            ("object_name", name),
        ] {
            if let Some(values) = offered.get(&(file.to_string(), var.to_owned()))
                && !values.contains(*want)
            {
                problems.push(format!(
                    "{file}: variable {var} never offered {want:?} (offered {values:?})"
                ));
            }
        }
    }
    assert!(
        problems.is_empty(),
        "{} problems in {scenarios:?}:\n{}",
        problems.len(),
        problems.join("\n")
    );
    Some(results)
}

/// [`run_checked`] for one scenario whose run must show `dashboard`'s queries returning data
/// (none when `None`) and offer `object` (cluster, namespace, name) in its variables.
pub fn run_scenario_checked(
    scenario: &'static str,
    budget: Duration,
    dashboard: Option<&str>,
    object: (&str, &str, &str, &str),
) -> Option<ScenarioResult> {
    let checked: Vec<&str> = dashboard.into_iter().collect();
    run_checked(&[Expect { scenario, budget }], &checked, &[object]).map(|mut r| r.remove(0))
}

/// Runs one scenario with the sandbox `flags` of its control plane, whose start adds `start` to
/// its budget.
fn run_one(
    expect: &Expect,
    (flags, start): (&[&str], Duration),
    dashboards: &[(String, Value)],
    queries: &[Query],
    objects: &[(&str, &str, &str, &str)],
    seen: &mut BTreeMap<String, Seen>,
    offered: &mut BTreeMap<(String, String), BTreeSet<String>>,
) -> ScenarioResult {
    let started = Instant::now();
    let began = unix_now();
    // Without --until-done the sandbox keeps running once the scenario has ended (as a person
    // would look at Grafana afterwards): the last round reads the end state, then SIGTERM stops
    // it and it prints the scenario's result line.
    let budget = expect.budget + start;
    let mut args = vec!["--scenario", expect.scenario, "--base-port", "0"];
    args.extend_from_slice(flags);
    let mut run = super::start(&args);
    let ended = format!("scenario {}: ", expect.scenario);
    let targets: Arc<Mutex<Vec<Target>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let written = Arc::new(AtomicU64::new(0));
    let mut prometheus: Option<u16> = None;
    let mut scraping = None;
    let mut reachable = true;
    let mut evaluations = 0u32;
    let mut from = began;
    let mut next_eval = Instant::now() + EVALUATE;
    let status = loop {
        run.record_descendants();
        let mut scenario_ended = false;
        while let Ok(line) = run.lines.try_recv() {
            if let Some(url) = line.strip_prefix("prometheus: ") {
                prometheus = url
                    .trim()
                    .trim_end_matches('/')
                    .rsplit(':')
                    .next()
                    .and_then(|p| p.parse().ok());
                if scraping.is_none() {
                    scraping = Some(scraper(
                        url.trim().to_owned(),
                        targets.clone(),
                        stop.clone(),
                        written.clone(),
                    ));
                }
            }
            if let Some(t) = target_of(&line) {
                targets.lock().unwrap().push(t);
            }
            scenario_ended |= line.starts_with(&ended)
                && (line[ended.len()..].starts_with("pass: ")
                    || line[ended.len()..].starts_with("fail: "));
            run.seen.push(line);
        }
        if let Some(status) = run.child.try_wait().unwrap() {
            while let Ok(line) = run.lines.recv_timeout(Duration::from_secs(2)) {
                run.seen.push(line);
            }
            break status;
        }
        assert!(
            started.elapsed() < budget,
            "{} did not finish within {:?}; saw:\n{}",
            expect.scenario,
            budget,
            run.seen.join("\n")
        );
        if let Some(port) = prometheus
            && reachable
            && (scenario_ended || Instant::now() >= next_eval)
            && !targets.lock().unwrap().is_empty()
        {
            if scenario_ended {
                // The operators' end state: more scrapes land before the last round (a counter
                // created at the end needs two samples for increase(); an alert on the end
                // state, as SluiceWaveHalted, is held for ALERT_FOR, then one scrape more).
                let want =
                    written.load(Ordering::Relaxed) + ALERT_FOR.as_secs() / SCRAPE.as_secs() + 2;
                let wait = Instant::now() + 10 * SCRAPE;
                while written.load(Ordering::Relaxed) < want && Instant::now() < wait {
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
            next_eval = Instant::now() + EVALUATE;
            let end = unix_now();
            let round = Round {
                port,
                scenario: expect.scenario,
                start: from - SCRAPE.as_secs_f64(),
                end,
                range: started.elapsed(),
                dashboards,
                queries,
                objects,
            };
            let took = Instant::now();
            reachable = evaluate(&round, seen, offered);
            if reachable {
                evaluations += 1;
                from = end;
                println!(
                    "{}: evaluation round {evaluations} took {} ms",
                    expect.scenario,
                    took.elapsed().as_millis()
                );
            }
            if scenario_ended {
                assert!(reachable, "Prometheus went away before the last round");
                reachable = false;
                let _ = std::process::Command::new("kill")
                    .args(["-TERM", &run.child.id().to_string()])
                    .status();
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    stop.store(true, Ordering::Relaxed);
    if let Some(h) = scraping {
        let _ = h.join();
    }
    let last = run.seen.last().cloned().unwrap_or_default();
    assert!(status.success(), "exit {status:?}; last line: {last}");
    let result: Value = serde_json::from_str(&last)
        .unwrap_or_else(|e| panic!("last line is not JSON ({e}): {last}"));
    assert_eq!(result["scenario"], expect.scenario, "{last}");
    assert_eq!(result["outcome"], "pass", "{last}");
    println!(
        "{}: {evaluations} evaluation rounds of {} queries in {:?}",
        expect.scenario,
        seen.len(),
        started.elapsed()
    );
    assert!(
        evaluations > 0,
        "no evaluation round ran during {}",
        expect.scenario
    );
    let left = run.leftovers();
    assert!(left.is_empty(), "processes left behind: {left:?}");
    ScenarioResult { result, last }
}
