//! A real `nats-server` for tests: JetStream on, a random port on 127.0.0.1, its own
//! temporary directory (config, JetStream store, log), killed and reaped on drop.
//!
//! [`NatsServer::restart`] brings it back on the same port with the same store, so a test
//! can take the server away under a client and check that streams survive.
//!
//! The binary is `NATS_SERVER_BIN`, else `nats-server` on `PATH`, else
//! `/usr/sbin/nats-server` (the Debian package).

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use crate::procs::signal;
use crate::wait::try_wait_until_blocking;

/// The headers of a JSON request on the bus: `Content-Type`, and the request token
/// (`Relay-Token`) when given.
pub fn json_headers(token: Option<&str>) -> async_nats::HeaderMap {
    let mut h = async_nats::HeaderMap::new();
    h.insert("Content-Type", "application/json");
    if let Some(t) = token {
        h.insert("Relay-Token", t);
    }
    h
}

/// A JSON request on `subject` and its JSON answer (panics when none comes: a test's).
pub async fn json_request(
    client: &async_nats::Client,
    subject: &str,
    token: Option<&str>,
    body: serde_json::Value,
) -> serde_json::Value {
    let reply = client
        .request_with_headers(
            subject.to_string(),
            json_headers(token),
            body.to_string().into(),
        )
        .await
        .unwrap_or_else(|e| panic!("{subject}: no reply: {e}"));
    serde_json::from_slice(&reply.payload).unwrap_or_else(|e| panic!("{subject}: {e}"))
}

/// The JetStream storage a test server offers. Set, because a nats-server without
/// `max_file_store` offers 75% of the disk free when it starts, and a CI machine with
/// little disk left then refused the broker's 1 GiB flight stream in every NATS test.
/// Nothing a test writes comes near it.
pub const STORE_LIMIT: u64 = 8 << 30;

/// How long a start or restart may take before it is an error.
const READY_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a restart keeps retrying while the old socket still holds the port.
const REBIND_WINDOW: Duration = Duration::from_secs(5);
/// How long a SIGTERM may take before SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(5);

/// Client authentication the server requires.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Auth {
    UserPassword {
        user: String,
        password: String,
    },
    Token(String),
    /// The users of `ops/nats/relay-users.conf` (a broker, node n1, a client), with
    /// these passwords.
    RelayUsers {
        broker: String,
        node: String,
        client: String,
    },
}

/// A running `nats-server`; see the module docs.
pub struct NatsServer {
    child: Option<Child>,
    pid: u32,
    port: u16,
    conf: PathBuf,
    log: PathBuf,
    store_dir: PathBuf,
    /// The environment the config's `$VAR`s read.
    envs: Vec<(String, String)>,
    // Last field: removed only after `Drop::drop` has killed the process.
    dir: tempfile::TempDir,
}

impl NatsServer {
    /// A server without authentication.
    pub fn start() -> anyhow::Result<NatsServer> {
        Self::launch(None, STORE_LIMIT)
    }

    /// A server without authentication whose JetStream offers only `bytes` of storage.
    pub fn start_with_store_limit(bytes: u64) -> anyhow::Result<NatsServer> {
        Self::launch(None, bytes)
    }

    /// A server that requires `auth` from every client.
    pub fn start_with_auth(auth: Auth) -> anyhow::Result<NatsServer> {
        Self::launch(Some(auth), STORE_LIMIT)
    }

    fn launch(auth: Option<Auth>, store_limit: u64) -> anyhow::Result<NatsServer> {
        let dir = tempfile::Builder::new()
            .prefix("relay-nats-")
            .tempdir()
            .context("creating the nats-server directory")?;
        let port = free_port()?;
        let store_dir = dir.path().join("js");
        let conf = dir.path().join("nats.conf");
        let log = dir.path().join("nats.log");
        std::fs::write(
            &conf,
            config_text(port, &store_dir, store_limit, auth.as_ref()),
        )
        .with_context(|| format!("writing {}", conf.display()))?;
        let mut envs = Vec::new();
        if let Some(Auth::RelayUsers {
            broker,
            node,
            client,
        }) = &auth
        {
            let shipped =
                Path::new(env!("CARGO_MANIFEST_DIR")).join("../ops/nats/relay-users.conf");
            std::fs::copy(&shipped, dir.path().join("relay-users.conf"))
                .with_context(|| format!("copying {}", shipped.display()))?;
            for (var, value) in [
                ("RELAY_NATS_BROKER_PASSWORD", broker),
                ("RELAY_NATS_NODE_PASSWORD", node),
                ("RELAY_NATS_CLIENT_PASSWORD", client),
            ] {
                envs.push((var.to_string(), value.clone()));
            }
        }
        let mut server = NatsServer {
            child: None,
            pid: 0,
            port,
            conf,
            log,
            store_dir,
            envs,
            dir,
        };
        // A fresh random port can only be busy if something raced us for it: no retries.
        server.spawn_until_ready(Duration::ZERO)?;
        Ok(server)
    }

    /// `nats://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The pid of the running server (of the last one after [`NatsServer::stop`]).
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The JetStream store directory; it outlives restarts.
    pub fn store_dir(&self) -> &Path {
        &self.store_dir
    }

    /// The file of [`NatsServer::log_text`].
    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// Everything every incarnation of the server wrote to stdout and stderr.
    pub fn log_text(&self) -> String {
        read_lossy(&self.log, 0)
    }

    /// Stops the server (SIGTERM, SIGKILL after a grace period) and starts it again on the
    /// same port with the same config and JetStream store; returns once it accepts
    /// connections. Also starts a stopped server.
    pub fn restart(&mut self) -> anyhow::Result<()> {
        self.stop();
        self.spawn_until_ready(REBIND_WINDOW)
    }

    /// Kills the server with SIGKILL (no chance to flush or say goodbye) and reaps it;
    /// [`NatsServer::restart`] starts it again. Idempotent.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Stops the server and reaps it. Idempotent.
    pub fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        if matches!(child.try_wait(), Ok(None)) {
            signal(child.id(), crate::Signal::TERM);
            let _ =
                try_wait_until_blocking("nats-server to exit after SIGTERM", STOP_GRACE, || {
                    child.try_wait().transpose()
                });
            // Harmless if it already exited; `wait` below reaps it either way.
            let _ = child.kill();
        }
        let _ = child.wait();
    }

    /// Spawns the server and waits until its port accepts connections. While
    /// `rebind_window` has not passed, a server that exits because the port is still
    /// held is spawned again.
    fn spawn_until_ready(&mut self, rebind_window: Duration) -> anyhow::Result<()> {
        let started = Instant::now();
        let port = self.port;
        let ready = try_wait_until_blocking(
            format_args!("port {port} to be free for nats-server"),
            rebind_window,
            || {
                let log_start = std::fs::metadata(&self.log).map(|m| m.len()).unwrap_or(0);
                if let Err(e) = self.spawn() {
                    return Ok(Err(e));
                }
                match self.wait_ready(READY_TIMEOUT.saturating_sub(started.elapsed())) {
                    Ok(()) => Ok(Ok(())),
                    // Held by a socket of the last server: try again, within the window.
                    Err(Exit::Exited(_)) if port_in_use(&read_lossy(&self.log, log_start)) => {
                        Err("address already in use")
                    }
                    Err(exit) => Ok(Err(self.not_ready(exit))),
                }
            },
        );
        match ready {
            Ok(done) => done,
            Err(_) => bail!(
                "nats-server on port {port} exited: the address was still in use after \
                 {rebind_window:?}; log:\n{}",
                self.log_text()
            ),
        }
    }

    /// The error of a start that failed, stopping what is left of it.
    fn not_ready(&mut self, exit: Exit) -> anyhow::Error {
        match exit {
            Exit::Exited(status) => anyhow::anyhow!(
                "nats-server on port {} exited with {status} before accepting \
                 connections; log:\n{}",
                self.port,
                self.log_text()
            ),
            Exit::Timeout => {
                self.stop();
                anyhow::anyhow!(
                    "nats-server did not accept connections on port {} within {:?}; log:\n{}",
                    self.port,
                    READY_TIMEOUT,
                    self.log_text()
                )
            }
        }
    }

    fn spawn(&mut self) -> anyhow::Result<()> {
        let out = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .with_context(|| format!("opening {}", self.log.display()))?;
        let err = out.try_clone()?;
        let bin = nats_server_bin();
        let child = Command::new(&bin)
            .arg("-c")
            .arg(&self.conf)
            .current_dir(self.dir.path())
            .envs(self.envs.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        self.pid = child.id();
        self.child = Some(child);
        Ok(())
    }

    /// Waits until the server greets on its port, for at most `within`.
    fn wait_ready(&mut self, within: Duration) -> Result<(), Exit> {
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, self.port));
        let ready = try_wait_until_blocking("nats-server to greet", within, || {
            let Some(child) = self.child.as_mut() else {
                return Some(Err(Exit::Exited("no process".to_string())));
            };
            if let Ok(Some(status)) = child.try_wait() {
                self.child = None;
                return Some(Err(Exit::Exited(status.to_string())));
            }
            // A listener that greets with `INFO` is a NATS server, not a socket that still
            // holds the port (whose backlog would accept the connect and stay silent).
            greets_with_info(&addr).then_some(Ok(()))
        });
        ready.unwrap_or(Err(Exit::Timeout))
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        self.stop();
    }
}

impl std::fmt::Debug for NatsServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NatsServer")
            .field("url", &self.url())
            .field("pid", &self.pid)
            .field("running", &self.child.is_some())
            .field("dir", &self.dir.path())
            .finish()
    }
}

enum Exit {
    Exited(String),
    Timeout,
}

/// `NATS_SERVER_BIN`, else `nats-server` on `PATH`, else the Debian location.
pub fn nats_server_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("NATS_SERVER_BIN") {
        return PathBuf::from(p);
    }
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|d| d.join("nats-server"))
        .find(|p| p.is_file())
        .unwrap_or_else(|| PathBuf::from("/usr/sbin/nats-server"))
}

fn greets_with_info(addr: &SocketAddr) -> bool {
    let Ok(mut stream) = TcpStream::connect_timeout(addr, Duration::from_millis(200)) else {
        return false;
    };
    if stream
        .set_read_timeout(Some(Duration::from_millis(500)))
        .is_err()
    {
        return false;
    }
    let mut head = [0u8; 5];
    stream.read_exact(&mut head).is_ok() && &head == b"INFO "
}

fn free_port() -> anyhow::Result<u16> {
    let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).context("binding 127.0.0.1:0")?;
    Ok(l.local_addr()?.port())
}

fn config_text(port: u16, store_dir: &Path, store_limit: u64, auth: Option<&Auth>) -> String {
    let store = quote(&store_dir.to_string_lossy());
    // No `http`/`http_port`: the monitoring endpoint stays off.
    let mut conf = format!(
        "listen: 127.0.0.1:{port}\n\
         jetstream {{\n  store_dir: {store}\n  max_file_store: {store_limit}\n}}\n"
    );
    match auth {
        None => {}
        Some(Auth::UserPassword { user, password }) => conf.push_str(&format!(
            "authorization {{\n  user: {}\n  password: {}\n}}\n",
            quote(user),
            quote(password)
        )),
        Some(Auth::Token(token)) => conf.push_str(&format!(
            "authorization {{\n  token: {}\n}}\n",
            quote(token)
        )),
        Some(Auth::RelayUsers { .. }) => conf.push_str("include \"relay-users.conf\"\n"),
    }
    conf
}

/// A double-quoted config string; quoting also stops `$name` being read as a variable.
fn quote(s: &str) -> String {
    format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""))
}

fn port_in_use(log: &str) -> bool {
    log.contains("address already in use")
}

fn read_lossy(path: &Path, from: u64) -> String {
    let mut bytes = Vec::new();
    if let Ok(mut f) = File::open(path) {
        let _ = f.seek(SeekFrom::Start(from));
        let _ = f.read_to_end(&mut bytes);
    }
    String::from_utf8_lossy(&bytes).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_quotes_secrets() {
        let conf = config_text(
            4222,
            Path::new("/tmp/x/js"),
            1 << 20,
            Some(&Auth::UserPassword {
                user: "u".into(),
                password: "p$\"\\".into(),
            }),
        );
        assert_eq!(
            conf,
            "listen: 127.0.0.1:4222\njetstream {\n  store_dir: \"/tmp/x/js\"\n  max_file_store: 1048576\n}\n\
             authorization {\n  user: \"u\"\n  password: \"p$\\\"\\\\\"\n}\n"
        );
    }
}
