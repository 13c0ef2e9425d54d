//! Helpers of the sandbox binary tests: prerequisites (`sluice_testkit::prereq`: a missing one
//! fails under CI and is skipped and counted otherwise), running the binary
//! with its stdout read line by line, the processes it started (from /proc) and the ports it
//! printed, so a test can prove nothing is left once it exits.
#![allow(dead_code)]

pub mod dashboards;

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, MutexGuard, mpsc};
use std::time::{Duration, Instant};

/// Whether the sandbox's prerequisites are here: the released CRDs, prometheus, docker-registry
/// and git. When one is missing the test fails under CI and is skipped and counted otherwise.
pub fn prerequisites() -> bool {
    use sluice_testkit::prereq::{self, INSTALL_TOOLS, Missing};
    let missing = |what: &str| Missing::new(format!("the `{what}` binary"), INSTALL_TOOLS);
    let check = prereq::upstream_crds()
        .map(|_| ())
        .and_then(|()| {
            sluice_testkit::prometheus::binary()
                .map(|_| ())
                .map_err(|_| missing("prometheus"))
        })
        .and_then(|()| {
            sluice_testkit::registry::binary()
                .map(|_| ())
                .map_err(|_| missing("docker-registry"))
        })
        .and_then(|()| prereq::binary("git").map(|_| ()));
    prereq::or_skip(check).is_some()
}

/// The sandbox binary running, with its stdout lines arriving on a channel.
pub struct Running {
    pub child: Child,
    pub lines: mpsc::Receiver<String>,
    pub seen: Vec<String>,
    /// (pid, start time) of every process seen with the sandbox as parent (or grandparent).
    pub descendants: BTreeSet<(u32, u64)>,
}

impl Drop for Running {
    fn drop(&mut self) {
        // A failing test must not leave the sandbox running, nor what it started: SIGTERM lets
        // it stop its children and remove its files; SIGKILL only if it does not exit.
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = Command::new("kill")
                .args(["-TERM", &self.child.id().to_string()])
                .status();
            let deadline = Instant::now() + Duration::from_secs(30);
            while Instant::now() < deadline && matches!(self.child.try_wait(), Ok(None)) {
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The flag that runs the operator binaries when they were built next to the sandbox (as
/// `cargo test --workspace` or `cargo build --bins` leaves them), else leaves them out (said).
pub fn operators_flag() -> &'static str {
    let dir = Path::new(env!("CARGO_BIN_EXE_sluice-sandbox"))
        .parent()
        .unwrap();
    let all = [
        "wave-gate",
        "revert",
        "rollout-weights",
        "upgrade-revisions",
    ]
    .iter()
    .all(|op| dir.join(format!("sluice-{op}")).is_file());
    if all {
        "--operators=on"
    } else {
        println!(
            "note: operator binaries are not built in {}; running without them (cargo build --bins to include them)",
            dir.display()
        );
        "--operators=off"
    }
}

/// Starts the sandbox binary. `$CARGO` is removed so it never runs a nested cargo build.
pub fn start(args: &[&str]) -> Running {
    let mut child = Command::new(env!("CARGO_BIN_EXE_sluice-sandbox"))
        .args(args)
        .arg(operators_flag())
        .env_remove("CARGO")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("the sandbox binary starts");
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            println!("sandbox> {line}");
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    Running {
        child,
        lines: rx,
        seen: Vec::new(),
        descendants: BTreeSet::new(),
    }
}

/// `(ppid, start time)` of a live, non-zombie process.
fn stat(pid: u32) -> Option<(u32, u64)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command may contain spaces; fields after the last ')' are fixed.
    let rest = &text[text.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    if fields.first() == Some(&"Z") {
        return None;
    }
    let ppid = fields.get(1)?.parse().ok()?;
    let start = fields.get(19)?.parse().ok()?;
    Some((ppid, start))
}

impl Running {
    /// Records the sandbox's current children and grandchildren.
    pub fn record_descendants(&mut self) {
        let root = self.child.id();
        let mut parents = BTreeSet::from([root]);
        for _ in 0..2 {
            let Ok(dir) = std::fs::read_dir("/proc") else {
                return;
            };
            for entry in dir.flatten() {
                let Some(pid) = entry
                    .file_name()
                    .to_str()
                    .and_then(|s| s.parse::<u32>().ok())
                else {
                    continue;
                };
                if let Some((ppid, start)) = stat(pid)
                    && parents.contains(&ppid)
                {
                    parents.insert(pid);
                    self.descendants.insert((pid, start));
                }
            }
        }
    }

    /// Waits for a line matching `pred` (recording descendants meanwhile); panics after `within`.
    pub fn wait_line(&mut self, within: Duration, pred: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + within;
        loop {
            self.record_descendants();
            match self.lines.recv_timeout(Duration::from_millis(200)) {
                Ok(line) => {
                    self.seen.push(line.clone());
                    if pred(&line) {
                        return line;
                    }
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    panic!(
                        "the sandbox closed stdout before the expected line; saw:\n{}",
                        self.seen.join("\n")
                    )
                }
            }
            assert!(
                Instant::now() < deadline,
                "no expected line within {within:?}; saw:\n{}",
                self.seen.join("\n")
            );
        }
    }

    /// Reads stdout for `period` (recording descendants meanwhile).
    pub fn read_for(&mut self, period: Duration) {
        let until = Instant::now() + period;
        while Instant::now() < until {
            self.record_descendants();
            if let Ok(line) = self.lines.recv_timeout(Duration::from_millis(200)) {
                self.seen.push(line);
            }
        }
    }

    /// Waits for exit (recording descendants and reading stdout meanwhile); panics after `within`.
    pub fn wait_exit(&mut self, within: Duration) -> std::process::ExitStatus {
        let deadline = Instant::now() + within;
        loop {
            self.record_descendants();
            while let Ok(line) = self.lines.try_recv() {
                self.seen.push(line);
            }
            if let Some(status) = self.child.try_wait().unwrap() {
                // Drain what is left of stdout.
                while let Ok(line) = self.lines.recv_timeout(Duration::from_secs(2)) {
                    self.seen.push(line);
                }
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "the sandbox did not exit within {within:?}; saw:\n{}",
                self.seen.join("\n")
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Processes it started that are still alive.
    pub fn leftovers(&self) -> Vec<String> {
        self.descendants
            .iter()
            .filter(|(pid, start)| stat(*pid).is_some_and(|(_, s)| s == *start))
            .map(|(pid, _)| {
                let cmd =
                    std::fs::read_to_string(format!("/proc/{pid}/cmdline")).unwrap_or_default();
                format!("{pid} {}", cmd.replace('\0', " "))
            })
            .collect()
    }

    /// Every loopback port the sandbox printed.
    pub fn printed_ports(&self) -> BTreeSet<u16> {
        let mut out = BTreeSet::new();
        for line in &self.seen {
            let mut rest = line.as_str();
            while let Some(i) = rest.find("127.0.0.1:") {
                rest = &rest[i + "127.0.0.1:".len()..];
                let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
                if let Ok(p) = digits.parse() {
                    out.insert(p);
                }
            }
        }
        out
    }

    /// The work directory the sandbox announced.
    pub fn work_dir(&self) -> Option<PathBuf> {
        self.seen.iter().find_map(|l| {
            l.split("work directory ")
                .nth(1)
                .map(|p| PathBuf::from(p.trim()))
        })
    }
}

/// Inodes of the sockets listening on `port` (IPv4 and IPv6), from /proc/net/tcp{,6}.
fn listening_inodes(port: u16) -> Vec<String> {
    let hex = format!(":{port:04X}");
    ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .filter_map(|f| std::fs::read_to_string(f).ok())
        .flat_map(|text| {
            text.lines()
                .skip(1)
                .filter_map(|l| {
                    let f: Vec<&str> = l.split_whitespace().collect();
                    (f.get(1)?.ends_with(&hex) && f.get(3) == Some(&"0A"))
                        .then(|| f.get(9).map(|i| i.to_string()))?
                })
                .collect::<Vec<_>>()
        })
        .collect()
}

/// The process holding a socket inode, if it can be seen.
fn socket_owner(inode: &str) -> Option<u32> {
    let target = format!("socket:[{inode}]");
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
            continue;
        };
        for fd in fds.flatten() {
            if std::fs::read_link(fd.path()).is_ok_and(|l| l.to_string_lossy() == target) {
                return Some(pid);
            }
        }
    }
    None
}

impl Running {
    /// Ports among `ports` a process this sandbox started (or the sandbox itself) still listens
    /// on. Ports are ephemeral and the machine is shared, so a port another program took after
    /// the sandbox released it is printed, not counted.
    pub fn open_ports(&self, ports: &BTreeSet<u16>) -> Vec<u16> {
        let ours: BTreeSet<u32> = self
            .descendants
            .iter()
            .map(|(pid, _)| *pid)
            .chain([self.child.id()])
            .collect();
        let mut out = Vec::new();
        for port in ports {
            if TcpStream::connect_timeout(
                &([127, 0, 0, 1], *port).into(),
                Duration::from_millis(300),
            )
            .is_err()
            {
                continue;
            }
            let owners: Vec<Option<u32>> = listening_inodes(*port)
                .iter()
                .map(|i| socket_owner(i))
                .collect();
            if owners
                .iter()
                .any(|o| o.is_none_or(|pid| ours.contains(&pid)))
            {
                out.push(*port);
            } else {
                println!(
                    "note: port {port} is now used by another program ({owners:?}), not by the sandbox"
                );
            }
        }
        out
    }
}

/// A finished scenario run whose result was checked: exit 0, the JSON last line names the
/// scenario and says `pass`, and nothing it started is left running.
pub struct ScenarioResult {
    /// The JSON result line.
    pub result: serde_json::Value,
    /// The result line as printed, for messages.
    pub last: String,
}

impl ScenarioResult {
    /// A figure in milliseconds; panics naming it when it is missing or not a number.
    pub fn ms(&self, name: &str) -> u64 {
        self.result[name]
            .as_u64()
            .unwrap_or_else(|| panic!("{name} is not a number of ms: {}", self.last))
    }

    /// Checks what every abort scenario promises: the Rollout aborted on `gate` within `within`
    /// of the fault; the controller's own delay (`detect_to_revert_ms`) is part of that, to the
    /// second the timestamps carry; the revert was verified within a minute; and the mesh
    /// reports at most 0.1% on the canary afterwards.
    pub fn aborted_on(&self, gate: &str, within: Duration) {
        let last = &self.last;
        assert_eq!(self.result["failed_gate"], gate, "{last}");
        let abort_latency = self.ms("abort_latency_ms");
        assert!(
            abort_latency > 0 && u128::from(abort_latency) < within.as_millis(),
            "abort_latency_ms {abort_latency} (within {within:?}): {last}"
        );
        let detect_to_revert = self.ms("detect_to_revert_ms");
        assert!(
            detect_to_revert <= abort_latency + 1000,
            "detect_to_revert_ms {detect_to_revert} exceeds abort_latency_ms {abort_latency} (+1 s timestamp precision): {last}"
        );
        let revert_verified = self.ms("revert_verified_ms");
        assert!(
            revert_verified < 60_000,
            "revert_verified_ms {revert_verified}: {last}"
        );
        let share = self.result["canary_share_after"]
            .as_f64()
            .expect("canary_share_after is a number");
        assert!(
            share <= 0.001,
            "canary share after the revert {share}: {last}"
        );
    }
}

/// Runs `sluice-sandbox --scenario <name> --until-done` on free ports within `budget` and checks
/// what every scenario promises (see [`ScenarioResult`]). `None`, with the reason printed, when
/// the sandbox's prerequisites or the operator binaries are missing here.
pub fn run_scenario(name: &str, budget: Duration) -> Option<ScenarioResult> {
    run_scenario_with(name, &[], budget)
}

/// Scenarios run one at a time: each starts a whole sandbox, and two at once on a small machine
/// double each other's start.
static ONE_SANDBOX: Mutex<()> = Mutex::new(());

/// Holds the machine for one sandbox run until dropped.
pub fn one_sandbox() -> MutexGuard<'static, ()> {
    ONE_SANDBOX.lock().unwrap_or_else(|e| e.into_inner())
}

/// The environment variable that chooses what serves a scenario's clusters, as for the
/// end-to-end suite: `real` runs each cluster on a real kube-apiserver (`--control-plane real`;
/// scripts/test.sh sets it for this crate), anything else or unset on the API emulator.
pub const CONTROL_PLANE_ENV: &str = "SLUICE_E2E_CONTROL_PLANE";

/// What the real control plane adds to a run's start: six API servers and four controller
/// managers start in about 50 s on two cores, twice that on a loaded machine.
pub const REAL_START: Duration = Duration::from_secs(120);

/// The sandbox flags that put a run on the control plane [`CONTROL_PLANE_ENV`] names (none
/// where `flags` already name one) and the time its start adds to the run's budget. `None`,
/// said why, when the real control plane is asked for and its binaries are missing.
pub fn on_control_plane<'a>(
    flags: &[&'a str],
    budget: Duration,
) -> Option<(Vec<&'a str>, Duration)> {
    let mut args = flags.to_vec();
    let real = std::env::var(CONTROL_PLANE_ENV).is_ok_and(|v| v == "real");
    if !real || flags.contains(&"--control-plane") {
        return Some((args, budget));
    }
    sluice_testkit::control_plane::require()?;
    args.extend(["--control-plane", "real"]);
    Some((args, budget + REAL_START))
}

/// [`run_scenario`] with more flags (e.g. `--metrics thanos`).
pub fn run_scenario_with(name: &str, flags: &[&str], budget: Duration) -> Option<ScenarioResult> {
    let _one = one_sandbox();
    if !prerequisites() {
        return None;
    }
    let (flags, budget) = on_control_plane(flags, budget)?;
    if operators_flag() != "--operators=on" {
        sluice_testkit::prereq::Missing::new(
            format!("the operator binaries (scenario {name} runs them)"),
            "cargo build --bins",
        )
        .skip();
        return None;
    }
    let mut args = vec!["--scenario", name, "--until-done", "--base-port", "0"];
    args.extend_from_slice(&flags);
    let mut run = start(&args);
    let status = run.wait_exit(budget);
    let last = run.seen.last().cloned().unwrap_or_default();
    assert!(status.success(), "exit {status:?}; last line: {last}");
    let result: serde_json::Value = serde_json::from_str(&last)
        .unwrap_or_else(|e| panic!("last line is not JSON ({e}): {last}"));
    assert_eq!(result["scenario"], name, "{last}");
    assert_eq!(result["outcome"], "pass", "{last}");
    let left = run.leftovers();
    assert!(left.is_empty(), "processes left behind: {left:?}");
    Some(ScenarioResult { result, last })
}
