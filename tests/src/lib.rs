//! Helpers shared by the integration tests: the `relay` binary as a real process
//! ([`RelayProcess`]), the CLI ([`relay_cmd`]), and raw HTTP access to its API; waiting
//! for something to happen ([`wait_until`], the one polling loop) and reading processes
//! ([`procs`], the one reader of `/proc`); a headless Chromium ([`browser::Browser`]); a git
//! repository for worktree tests ([`git`]); the fuzz runner and its input generators ([`fuzz`]);
//! the v1 data dir of the migration test and the checker of its outputs ([`fixture`]).
//!
//! Every process started here is killed when its handle drops, so a failing test leaves
//! nothing behind.
//!
//! Depends on: relay-broker, relay-client, relay-harnesses, relay-infra, relay-mock-model,
//! relay-protocol, relay-runtime.
//!
//! Every other crate of the workspace, and none on it (but the harnesses' tests).
//!
//! Layering (a module uses only the modules after its arrow; the process handles live in
//! the crate root; `tests/tests/module_graph/` checks it):
//! - `bench`, `codex_turns`, `fixture`, `fuzz`, `git`, `load`, `tmux`, `v1store`, `wait` -> none
//! - `procs` -> `wait`
//! - `environ` -> `load`
//! - `harness_events` -> `procs`
//! - `browser`, `nats` -> `procs`, `wait`
//! - `agents` -> `tmux`
//! - `chaos` -> `load`, `nats`

pub mod agents;
pub mod bench;
pub mod browser;
pub mod chaos;
pub mod codex_turns;
pub mod environ;
pub mod fixture;
pub mod fuzz;
pub mod git;
pub mod harness_events;
pub mod load;
pub mod nats;
pub mod procs;
pub mod tmux;
pub mod v1store;
pub mod wait;

pub use wait::{try_wait_until, wait_until, wait_until_blocking, TimedOut};

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use anyhow::{bail, Context};
pub use procs::Signal;
use relay_protocol::api::{ApiInfo, API_FILE};

/// The `relay` binary: `RELAY_BIN`, else next to the test binary's target dir.
pub fn relay_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("RELAY_BIN") {
        return PathBuf::from(p);
    }
    let exe = std::env::current_exe().unwrap_or_default();
    // target/<profile>/deps/<test> -> target/<profile>/relay
    let dir = exe
        .parent()
        .and_then(Path::parent)
        .map(Path::to_path_buf)
        .unwrap_or_default();
    let bin = dir.join("relay");
    assert!(
        bin.exists(),
        "{} is missing: build it first (cargo build --bins) or set RELAY_BIN",
        bin.display()
    );
    bin
}

/// The log filter of the brokers and nodes that tests and `ops/bench` start:
/// `RELAY_TEST_LOG` when set (to trace a run, e.g. `info,relay_runtime=debug`), else
/// `default`.
pub fn test_log_filter(default: &str) -> String {
    std::env::var("RELAY_TEST_LOG").unwrap_or_else(|_| default.into())
}

/// A `relay up` process on a data dir, listening on a free loopback port.
pub struct RelayProcess {
    /// The `relay` binary this process runs (and its CLI uses).
    pub bin: PathBuf,
    pub data_dir: PathBuf,
    child: Option<Child>,
    pub api: ApiInfo,
    extra: Vec<String>,
    envs: Vec<(String, String)>,
    pub log: PathBuf,
    /// `--listen`: a free port at first; the same one after [`RelayProcess::restart_same_port`].
    listen: String,
}

impl RelayProcess {
    pub fn start(data_dir: &Path) -> anyhow::Result<RelayProcess> {
        Self::start_with(data_dir, &[], &[])
    }

    /// Starts `relay up` with extra arguments and environment.
    pub fn start_with(
        data_dir: &Path,
        extra: &[&str],
        envs: &[(&str, &str)],
    ) -> anyhow::Result<RelayProcess> {
        Self::start_bin(&relay_bin(), data_dir, extra, envs)
    }

    /// [`RelayProcess::start_with`] with another `relay` binary (a benchmark's baseline).
    pub fn start_bin(
        bin: &Path,
        data_dir: &Path,
        extra: &[&str],
        envs: &[(&str, &str)],
    ) -> anyhow::Result<RelayProcess> {
        let mut p = RelayProcess {
            bin: bin.to_path_buf(),
            data_dir: data_dir.to_path_buf(),
            child: None,
            api: ApiInfo {
                url: String::new(),
                token: String::new(),
                pid: 0,
            },
            extra: extra.iter().map(|s| s.to_string()).collect(),
            envs: envs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            log: data_dir.with_extension("log"),
            listen: "127.0.0.1:0".into(),
        };
        p.spawn()?;
        Ok(p)
    }

    fn spawn(&mut self) -> anyhow::Result<()> {
        std::fs::create_dir_all(&self.data_dir)?;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)?;
        let mut cmd = Command::new(&self.bin);
        cmd.arg("up")
            .arg("--data-dir")
            .arg(&self.data_dir)
            .arg("--listen")
            .arg(&self.listen)
            .args(&self.extra)
            .env("RUST_LOG", test_log_filter("info,relay=debug"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
        for (k, v) in &self.envs {
            cmd.env(k, v);
        }
        let child = cmd.spawn().context("spawning relay up")?;
        let child = self.child.insert(child);
        let text = wait_ready(child, &self.data_dir.join(API_FILE), "relay up", &self.log)?;
        self.api = serde_json::from_str(&text)?;
        Ok(())
    }

    pub fn pid(&self) -> u32 {
        self.api.pid
    }

    pub fn log_text(&self) -> String {
        read_log(&self.log)
    }

    /// `kill -9`, and wait until the process is gone.
    pub fn kill9(&mut self) {
        kill9(&mut self.child);
    }

    /// SIGTERM, and wait for a clean exit.
    pub fn terminate(&mut self) -> anyhow::Result<std::process::ExitStatus> {
        terminate(&mut self.child, "relay", Duration::from_secs(20))
    }

    /// Waits (up to `within`) for the process to exit on its own; its status.
    pub fn wait_exit(&mut self, within: Duration) -> anyhow::Result<std::process::ExitStatus> {
        let Some(c) = self.child.as_mut() else {
            bail!("not running")
        };
        let status =
            wait::try_wait_until_blocking("relay to exit", within, || c.try_wait().transpose())??;
        self.child = None;
        Ok(status)
    }

    /// Starts the process again on the same data dir.
    pub fn restart(&mut self) -> anyhow::Result<()> {
        self.kill9();
        self.spawn()
    }

    /// `kill -9`, then starts again on the same data dir AND the same port (as `relay up`
    /// on its default port would be): a page open on the old one can reconnect.
    pub fn restart_same_port(&mut self) -> anyhow::Result<()> {
        self.kill9();
        self.listen = self
            .api
            .url
            .trim_start_matches("http://")
            .trim_end_matches('/')
            .to_string();
        self.spawn()
    }

    /// Starts the CLI against this broker (found through its data dir's `api.json`, as
    /// a user's would be), stdin closed, stdout and stderr piped; the caller waits.
    pub fn spawn_cli(&self, args: &[&str]) -> std::io::Result<Child> {
        Command::new(&self.bin)
            .args(args)
            .env("RELAY_DATA_DIR", &self.data_dir)
            .env_remove("RELAY_URL")
            .env_remove("RELAY_TOKEN")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
    }

    /// Runs the CLI against this broker.
    pub fn cli(&self, args: &[&str]) -> Output {
        relay_cmd_with(&self.bin, &self.data_dir, args)
    }

    /// Runs the CLI, asserts success, returns stdout.
    pub fn cli_ok(&self, args: &[&str]) -> String {
        let out = self.cli(args);
        assert!(
            out.status.success(),
            "relay {args:?} failed: {}\nstdout: {}\nbroker log:\n{}",
            String::from_utf8_lossy(&out.stderr),
            String::from_utf8_lossy(&out.stdout),
            self.log_text()
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Runs the CLI with `--json` output parsed.
    pub fn cli_json(&self, args: &[&str]) -> serde_json::Value {
        let out = self.cli_ok(args);
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("relay {args:?}: bad JSON {e}: {out}"))
    }

    /// Raw HTTP access to the API, authenticated with this broker's token.
    pub fn http(&self) -> Http {
        Http {
            url: self.api.url.clone(),
            token: Some(self.api.token.clone()),
            client: reqwest::Client::new(),
        }
    }
}

/// A process log's text so far (empty if it cannot be read).
fn read_log(log: &Path) -> String {
    std::fs::read_to_string(log).unwrap_or_default()
}

/// `kill -9` of a child process this handle still owns, and wait until it is gone.
/// SIGTERM to `child` and wait up to `within` for its exit (then SIGKILL, and an error).
fn terminate(
    child: &mut Option<Child>,
    what: &str,
    within: Duration,
) -> anyhow::Result<std::process::ExitStatus> {
    let Some(mut c) = child.take() else {
        bail!("{what} is not running")
    };
    procs::signal(c.id(), Signal::TERM);
    let exited =
        wait::try_wait_until_blocking(format!("{what} to exit after SIGTERM"), within, || {
            c.try_wait().transpose()
        });
    match exited {
        Ok(status) => Ok(status?),
        Err(e) => {
            let _ = c.kill();
            let _ = c.wait();
            bail!("{e}")
        }
    }
}

fn kill9(child: &mut Option<Child>) {
    if let Some(mut c) = child.take() {
        let _ = c.kill();
        let _ = c.wait();
    }
}

impl Drop for RelayProcess {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// Waits until `child` writes `file` naming its own pid (api.json, node.json): that is
/// when it is ready. Returns the file's text. Fails, with the log, if it exits or takes
/// more than 30 s.
fn wait_ready(child: &mut Child, file: &Path, what: &str, log: &Path) -> anyhow::Result<String> {
    let pid = u64::from(child.id());
    let log_text = || std::fs::read_to_string(log).unwrap_or_default();
    let ready = wait::try_wait_until_blocking(
        format_args!("{what} to write {} with its pid", file.display()),
        Duration::from_secs(30),
        || match child.try_wait() {
            Ok(Some(status)) => Some(Err(anyhow::anyhow!("{what} exited with {status}"))),
            Err(e) => Some(Err(e.into())),
            Ok(None) => std::fs::read_to_string(file)
                .ok()
                .filter(|text| {
                    serde_json::from_str::<serde_json::Value>(text)
                        .is_ok_and(|v| v["pid"].as_u64() == Some(pid))
                })
                .map(Ok),
        },
    );
    match ready {
        Ok(Ok(text)) => Ok(text),
        Ok(Err(e)) => bail!("{e:#}; log:\n{}", log_text()),
        Err(e) => bail!("{e}; log:\n{}", log_text()),
    }
}

/// Runs `relay ARGS` with `RELAY_DATA_DIR` set.
pub fn relay_cmd(data_dir: &Path, args: &[&str]) -> Output {
    relay_cmd_with(&relay_bin(), data_dir, args)
}

/// [`relay_cmd`] with another `relay` binary.
pub fn relay_cmd_with(bin: &Path, data_dir: &Path, args: &[&str]) -> Output {
    Command::new(bin)
        .args(args)
        .env("RELAY_DATA_DIR", data_dir)
        .env_remove("RELAY_URL")
        .env_remove("RELAY_TOKEN")
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("running relay {args:?}: {e}"))
}

/// A raw HTTP client for the API: status code and JSON body, nothing interpreted.
#[derive(Clone)]
pub struct Http {
    pub url: String,
    pub token: Option<String>,
    client: reqwest::Client,
}

impl Http {
    pub fn with_token(mut self, token: Option<&str>) -> Http {
        self.token = token.map(str::to_string);
        self
    }

    pub async fn request(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> (u16, serde_json::Value) {
        self.try_request(method, path, body)
            .await
            .unwrap_or_else(|e| panic!("{path}: {e}"))
    }

    /// Like [`Http::request`], with a connection failure as an error.
    pub async fn try_request(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<(u16, serde_json::Value), reqwest::Error> {
        let mut req = self
            .client
            .request(method, format!("{}{path}", self.url))
            .header("content-type", "application/json");
        if let Some(t) = &self.token {
            req = req.bearer_auth(t);
        }
        if let Some(b) = body {
            req = req.body(b);
        }
        let resp = req.send().await?;
        let status = resp.status().as_u16();
        let bytes = resp.bytes().await?;
        let value = serde_json::from_slice(&bytes)
            .unwrap_or_else(|_| serde_json::Value::String(String::from_utf8_lossy(&bytes).into()));
        Ok((status, value))
    }

    pub async fn get(&self, path: &str) -> (u16, serde_json::Value) {
        self.request(reqwest::Method::GET, path, None).await
    }

    pub async fn post(&self, path: &str, body: &serde_json::Value) -> (u16, serde_json::Value) {
        self.request(
            reqwest::Method::POST,
            path,
            Some(body.to_string().into_bytes()),
        )
        .await
    }
}

/// A `relay node` process (the harness-session plane only), killed on drop.
pub struct NodeProcess {
    pub name: String,
    pub data_dir: PathBuf,
    nats_url: String,
    extra: Vec<String>,
    envs: Vec<(String, String)>,
    child: Option<Child>,
    pub log: PathBuf,
}

impl NodeProcess {
    /// Starts `relay node NAME` with the node key of `broker`'s data dir (written as
    /// an operator would, with `relay node-key NAME --out <data_dir>/node.key`).
    pub fn start(
        name: &str,
        data_dir: &Path,
        nats_url: &str,
        broker: &RelayProcess,
    ) -> anyhow::Result<NodeProcess> {
        Self::start_with(name, data_dir, nats_url, broker, &[])
    }

    /// With extra `relay node` arguments (`--nats-user`...).
    pub fn start_with(
        name: &str,
        data_dir: &Path,
        nats_url: &str,
        broker: &RelayProcess,
        extra: &[&str],
    ) -> anyhow::Result<NodeProcess> {
        Self::start_with_env(name, data_dir, nats_url, broker, extra, &[])
    }

    /// With extra `relay node` arguments and environment variables (`HOME` for its git).
    pub fn start_with_env(
        name: &str,
        data_dir: &Path,
        nats_url: &str,
        broker: &RelayProcess,
        extra: &[&str],
        envs: &[(&str, &str)],
    ) -> anyhow::Result<NodeProcess> {
        std::fs::create_dir_all(data_dir)?;
        let key = data_dir.join("node.key");
        let out = relay_cmd_with(
            &broker.bin,
            &broker.data_dir,
            &["node-key", name, "--out", &key.to_string_lossy()],
        );
        anyhow::ensure!(
            out.status.success(),
            "relay node-key: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let mut n = NodeProcess {
            name: name.to_string(),
            data_dir: data_dir.to_path_buf(),
            nats_url: nats_url.to_string(),
            extra: extra.iter().map(|s| s.to_string()).collect(),
            envs: envs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            child: None,
            log: data_dir.with_extension("log"),
        };
        n.spawn()?;
        Ok(n)
    }

    fn spawn(&mut self) -> anyhow::Result<()> {
        std::fs::create_dir_all(&self.data_dir)?;
        let _ = std::fs::remove_file(self.data_dir.join("node.json"));
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)?;
        let child = Command::new(relay_bin())
            .args([
                "node",
                "--name",
                &self.name,
                "--nats",
                &self.nats_url,
                "--data-dir",
            ])
            .arg(&self.data_dir)
            .args(&self.extra)
            .envs(self.envs.iter().map(|(k, v)| (k, v)))
            .env("RUST_LOG", test_log_filter("info,relay=debug"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .context("spawning relay node")?;
        let child = self.child.insert(child);
        wait_ready(
            child,
            &self.data_dir.join("node.json"),
            "relay node",
            &self.log,
        )?;
        Ok(())
    }

    pub fn log_text(&self) -> String {
        read_log(&self.log)
    }

    /// `kill -9`, and wait until the process is gone.
    pub fn kill9(&mut self) {
        kill9(&mut self.child);
    }

    pub fn restart(&mut self) -> anyhow::Result<()> {
        self.kill9();
        self.spawn()
    }

    /// SIGTERM (a clean stop, as a supervisor restarting it would), and wait for the
    /// exit; [`NodeProcess::restart`] brings it back.
    pub fn terminate(&mut self) -> anyhow::Result<std::process::ExitStatus> {
        terminate(&mut self.child, "relay node", Duration::from_secs(30))
    }
}

impl Drop for NodeProcess {
    fn drop(&mut self) {
        self.kill9();
    }
}
