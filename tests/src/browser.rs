//! A headless Chromium for the browser tests, driven over WebDriver (`fantoccini`), and
//! gone when its guard drops, whatever happened to the test.
//!
//! [`Browser::start`] runs Debian's `chromedriver` (`/usr/bin/chromedriver`, installed
//! with `chromium` by `ops/setup.sh`) on a free port, in a process group of its own, and
//! opens one headless Chromium session through it. chromedriver accepts local
//! connections only: it listens on the loopback addresses (`127.0.0.1` and `::1`) and
//! nowhere else. Under a loaded suite both steps are slow rather than broken: the driver
//! gets [`DRIVER_READY`] to answer on its port (a port someone took in between is picked
//! again), the session [`SESSION_READY`] to open.
//!
//! Everything of one browser lives in one temporary directory: Chromium's profile
//! (`--user-data-dir`), its home and temporary files (`HOME`, `XDG_*`, `TMPDIR`, so nothing
//! lands in the user's home or `/tmp`), and the database of the crash handler that
//! Debian's Chromium always starts. That handler (`chrome_crashpad_handler`) leaves the
//! process group for a session of its own; like every Chromium process, it names the
//! directory on its command line, which is how the guard finds it.
//!
//! Cleanup, on drop (also while a failing test unwinds): the WebDriver session is ended
//! (Chromium quits), chromedriver's process group is killed with SIGKILL (Chromium and its
//! children are in it), then every process left in the group or naming the directory is
//! killed until none is left; only then is the directory removed. A browser process that
//! is still there after [`GONE`] fails the test. What no guard can handle: the test
//! process itself killed with SIGKILL (a nextest timeout) leaves the group running.
//!
//! The helpers are thin over [`fantoccini::Client`] (see [`Browser::client`] for the
//! rest) and panic with what they were doing, as a test's own step would. The waits
//! ([`Browser::wait_for`], [`Browser::wait_text`], [`Browser::wait_js`]) ask the page
//! again and again through [`crate::wait`] until the condition holds, and fail after
//! [`WAIT`] naming the condition and what the page showed last. No fixed sleeps.
//!
//! Screenshots are artifacts for a reviewer: [`Browser::screenshot`] writes
//! `<artifacts_dir()>/<test>/<name>.png`; [`artifacts_dir`] is `$RELAY_TEST_ARTIFACTS`,
//! else `target/test-artifacts/` of the workspace (`ops/test.sh` prints it at the end).
//!
//! Over 600 lines: the browser and its chromedriver: one start, retry and teardown story.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{bail, Context};
use fantoccini::actions::{InputSource, KeyAction, KeyActions};
use fantoccini::elements::Element;
use fantoccini::{Client, ClientBuilder, Locator};
use hyper_util::client::legacy::connect::HttpConnector;
use serde_json::{json, Value};

use crate::procs::{self, Signal};
use crate::wait::{try_wait_until, try_wait_until_blocking, wait_until};

/// The browser (a launcher script of Debian's `chromium` package).
pub const CHROMIUM: &str = "/usr/bin/chromium";
/// Its WebDriver server (Debian's `chromium-driver` package).
pub const CHROMEDRIVER: &str = "/usr/bin/chromedriver";
/// How long chromedriver may take to answer on its port.
pub const DRIVER_READY: Duration = Duration::from_secs(30);
/// How long Chromium may take to start and open the session.
pub const SESSION_READY: Duration = Duration::from_secs(30);
/// How long a wait helper waits by default ([`Browser::set_wait`]).
pub const WAIT: Duration = Duration::from_secs(30);
/// How long the browser's processes may take to go once killed.
pub const GONE: Duration = Duration::from_secs(30);
/// How long ending the session on drop may take before the kill goes on without it.
const QUIT: Duration = Duration::from_secs(10);
/// How many free ports are tried when chromedriver finds the picked one taken.
const PORT_ATTEMPTS: u32 = 5;

/// Chromium's switches: headless, as root in a container (`--no-sandbox`), no GPU, and
/// nothing that reaches for the network on its own (the machine's network is closed: its
/// refused connections only slow the start down).
const CHROME_ARGS: &[&str] = &[
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-default-apps",
    "--no-proxy-server",
    "--window-size=1280,900",
];

/// One headless Chromium session and its chromedriver; see the module docs.
pub struct Browser {
    client: Client,
    session: String,
    test: String,
    wait: Duration,
    // After `client`: dropped once `Drop::drop` has ended the session.
    driver: Driver,
}

/// A one-time login link to `relay`'s dashboard, for `name` (`relay open --as NAME`).
pub fn login_link(relay: &crate::RelayProcess, name: &str) -> String {
    let link = relay.cli_json(&["open", "--as", name, "--json"]);
    match link["url"].as_str() {
        Some(url) => url.to_string(),
        None => panic!("relay open --json gave no url: {link}"),
    }
}

/// An HTTP client that follows no redirect, so a spent login link's `303` and the
/// cookie it sets are seen as they are.
pub fn login_client() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap_or_else(|e| panic!("an HTTP client: {e}"))
}

/// A one-time login link for `name` asked over HTTP (`POST /v1/login` at `api_url` with
/// the operator's `token`), as many clients at once can: its URL.
pub async fn ask_login_link(
    client: &reqwest::Client,
    api_url: &str,
    token: &str,
    name: &str,
) -> String {
    let resp = client
        .post(format!("{api_url}/v1/login"))
        .bearer_auth(token)
        .json(&json!({ "name": name }))
        .send()
        .await
        .unwrap_or_else(|e| panic!("POST /v1/login: {e}"));
    let link: Value = resp
        .json()
        .await
        .unwrap_or_else(|e| panic!("POST /v1/login: {e}"));
    match link["url"].as_str() {
        Some(url) => url.to_string(),
        None => panic!("POST /v1/login gave no url: {link}"),
    }
}

/// Opens a login link like a browser: the login cookie (`relay_login_PORT=VALUE`) when
/// it worked, `None` when it was refused (`401`). A login answers `303` to `/` with an
/// `HttpOnly`, `SameSite=Strict` cookie; any other answer fails the test.
pub async fn spend_login_link(client: &reqwest::Client, link: &str) -> Option<String> {
    let resp = client
        .get(link)
        .send()
        .await
        .unwrap_or_else(|e| panic!("{link}: {e}"));
    match resp.status().as_u16() {
        303 => {}
        401 => return None,
        other => panic!("the login link answered {other}: {resp:?}"),
    }
    assert_eq!(resp.headers()["location"], "/", "{resp:?}");
    let set = resp
        .headers()
        .get_all(reqwest::header::SET_COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find(|v| v.starts_with("relay_login_"))
        .unwrap_or_else(|| panic!("no login cookie: {resp:?}"));
    assert!(
        set.contains("HttpOnly") && set.contains("SameSite=Strict"),
        "{set}"
    );
    set.split(';').next().map(str::to_string)
}

/// A dashboard login of `relay`'s broker for `name`, without a browser: its login
/// link spent over HTTP, the cookie it set (`relay_login_PORT=VALUE`).
pub async fn login_cookie(relay: &crate::RelayProcess, name: &str) -> String {
    let link = login_link(relay, name);
    match spend_login_link(&login_client(), &link).await {
        Some(cookie) => cookie,
        None => panic!("the login link was refused: {link}"),
    }
}

impl Browser {
    /// A browser (named `test`, for its artifacts) logged in to `relay`'s dashboard as
    /// `name`, its page live.
    pub async fn logged_in(relay: &crate::RelayProcess, test: &str, name: &str) -> Browser {
        let b = match Browser::start(test).await {
            Ok(b) => b,
            Err(e) => panic!("starting the browser: {e:#}"),
        };
        b.goto(&login_link(relay, name)).await;
        b.wait_js("document.body.dataset.live", |v| v == "true")
            .await;
        b
    }

    /// Starts chromedriver and a Chromium session for the test named `test` (the folder of
    /// its screenshots). Fails, saying to run `ops/setup.sh`, when Chromium or chromedriver
    /// is not installed.
    pub async fn start(test: &str) -> anyhow::Result<Browser> {
        if let Some(e) = missing(&[Path::new(CHROMIUM), Path::new(CHROMEDRIVER)]) {
            return Err(e);
        }
        plain_name(test).context("the test name")?;
        let dir = tempfile::Builder::new()
            .prefix("relay-browser-")
            .tempdir()
            .context("creating the browser's directory")?;
        let driver = Driver::start(dir).await?;
        let client = driver.session().await?;
        let session = client
            .session_id()
            .await
            .ok()
            .flatten()
            .context("the new session has no id")?;
        Ok(Browser {
            client,
            session,
            test: test.to_string(),
            wait: WAIT,
            driver,
        })
    }

    /// The WebDriver client, for anything the helpers do not offer.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// How long the waits wait from now on ([`WAIT`] by default).
    pub fn set_wait(&mut self, within: Duration) {
        self.wait = within;
    }

    /// Makes the window `width` x `height` CSS pixels (a phone: 375 x 812). Headless
    /// Chromium has no frame, so the page's viewport (`innerWidth`) is that size.
    pub async fn set_window_size(&self, width: u32, height: u32) {
        self.client
            .set_window_size(width, height)
            .await
            .unwrap_or_else(|e| panic!("browser: sizing the window {width}x{height}: {e}"));
    }

    /// Opens `url` and returns once it has loaded.
    pub async fn goto(&self, url: &str) {
        self.client
            .goto(url)
            .await
            .unwrap_or_else(|e| panic!("browser: opening {url}: {e}"));
    }

    /// The page's title now.
    pub async fn title(&self) -> String {
        self.client
            .title()
            .await
            .unwrap_or_else(|e| panic!("browser: reading the title: {e}"))
    }

    /// The rendered text of the first element matching `css` now, as a user sees it
    /// (`innerText`: a hidden element gives ""; for the exact `textContent`, use
    /// [`Browser::js`]). Fails if nothing matches.
    pub async fn text(&self, css: &str) -> String {
        self.read_text(css)
            .await
            .unwrap_or_else(|e| panic!("browser: the text of {css}: {e}"))
    }

    /// Waits until an element matches `css`; returns the first.
    pub async fn wait_for(&self, css: &str) -> Element {
        wait_until(
            format_args!("an element matching {css} on {}", self.url().await),
            self.wait,
            || async {
                self.client
                    .find(Locator::Css(css))
                    .await
                    .map_err(|e| e.to_string())
            },
        )
        .await
    }

    /// Waits until the first element matching `css` has a text `pred` accepts (the text of
    /// [`Browser::text`]); returns that text.
    pub async fn wait_text(&self, css: &str, pred: impl Fn(&str) -> bool) -> String {
        self.wait_accepted(
            format_args!("the text of {css} to be as expected"),
            || self.read_text(css),
            |text: &String| pred(text),
            |text| format!("{text:?}"),
        )
        .await
    }

    /// Waits until the JavaScript expression `expr` has a value `pred` accepts; returns it.
    pub async fn wait_js(&self, expr: &str, pred: impl Fn(&Value) -> bool) -> Value {
        self.wait_accepted(
            format_args!("{expr} to be as expected"),
            || self.eval(expr),
            pred,
            Value::to_string,
        )
        .await
    }

    /// Reads with `read` until `accept` takes what it read; `shown` says what it was
    /// instead, for the failure message.
    async fn wait_accepted<T, Fut>(
        &self,
        what: impl std::fmt::Display,
        read: impl Fn() -> Fut,
        accept: impl Fn(&T) -> bool,
        shown: impl Fn(&T) -> String,
    ) -> T
    where
        Fut: std::future::Future<Output = Result<T, String>>,
    {
        wait_until(what, self.wait, || async {
            let value = read().await?;
            if accept(&value) {
                Ok(value)
            } else {
                Err(shown(&value))
            }
        })
        .await
    }

    /// The value of the JavaScript expression `expr` (run as `return (EXPR);` in the page;
    /// several statements go in an arrow function called at once).
    pub async fn js(&self, expr: &str) -> Value {
        self.eval(expr)
            .await
            .unwrap_or_else(|e| panic!("browser: {e}"))
    }

    /// The HTTP status the page's origin gets for `path`, fetched by the page itself
    /// (with whatever login cookie it has, as the dashboard's own requests are).
    pub async fn fetch_status(&self, path: &str) -> u64 {
        let expr = format!(
            "fetch({}, {{credentials: 'same-origin', headers: {{'X-Relay-Dashboard': '1'}}}}).then(r => r.status)",
            Value::String(path.to_string())
        );
        match self.js(&expr).await.as_u64() {
            Some(status) => status,
            None => panic!("fetching {path} from the page gave no status"),
        }
    }

    /// Waits until an element matches `css`, then clicks it like a user.
    pub async fn click(&self, css: &str) {
        self.wait_for(css)
            .await
            .click()
            .await
            .unwrap_or_else(|e| panic!("browser: clicking {css}: {e}"));
    }

    /// Types `keys` (each character pressed and released, in order) into whatever has the
    /// focus, like a user. Special keys are [`fantoccini::key::Key`]s: `&Key::Down`.
    pub async fn key(&self, keys: &str) {
        let typed = keys
            .chars()
            .fold(KeyActions::new("keyboard".into()), |seq, c| {
                seq.then(KeyAction::Down { value: c })
                    .then(KeyAction::Up { value: c })
            });
        self.client
            .perform_actions(typed)
            .await
            .unwrap_or_else(|e| panic!("browser: typing {keys:?}: {e}"));
    }

    /// Saves what the window shows as `<artifacts_dir()>/<test>/<name>.png`; returns the
    /// path.
    pub async fn screenshot(&self, name: &str) -> PathBuf {
        if let Err(e) = plain_name(name) {
            panic!("browser: the screenshot's name: {e}");
        }
        let png = self
            .client
            .screenshot()
            .await
            .unwrap_or_else(|e| panic!("browser: taking the screenshot {name}: {e}"));
        let dir = artifacts_dir().join(&self.test);
        let path = dir.join(format!("{name}.png"));
        let saved = async {
            tokio::fs::create_dir_all(&dir).await?;
            tokio::fs::write(&path, png).await
        };
        if let Err(e) = saved.await {
            panic!("browser: saving {}: {e}", path.display());
        }
        path
    }

    /// The live processes of this browser: chromedriver's process group (chromedriver,
    /// Chromium and its children) and any process naming the browser's directory.
    pub fn processes(&self) -> Vec<u32> {
        self.driver.processes()
    }

    /// chromedriver's pid, the id of its process group.
    pub fn driver_pid(&self) -> u32 {
        self.driver.pgid.unwrap_or_default()
    }

    /// The browser's directory (profile, home, temporary files); removed on drop.
    pub fn dir(&self) -> &Path {
        self.driver.dir.path()
    }

    async fn read_text(&self, css: &str) -> Result<String, String> {
        let element = self
            .client
            .find(Locator::Css(css))
            .await
            .map_err(|e| format!("no element matches: {e}"))?;
        element.text().await.map_err(|e| e.to_string())
    }

    async fn eval(&self, expr: &str) -> Result<Value, String> {
        self.client
            .execute(&format!("return ({expr});"), Vec::new())
            .await
            .map_err(|e| format!("evaluating {expr}: {e}"))
    }

    /// Where the page is, for a failure message.
    async fn url(&self) -> String {
        match self.client.current_url().await {
            Ok(url) => url.to_string(),
            Err(e) => format!("(no URL: {e})"),
        }
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        // Chromium quits with its session: files closed, children ended. The driver's own
        // drop then kills whatever did not. The test's runtime may be the thread running
        // this very drop, so the request goes from a thread and runtime of its own.
        let url = format!(
            "http://127.0.0.1:{}/session/{}",
            self.driver.port, self.session
        );
        let ended = std::thread::spawn(move || end_session(&url)).join();
        if let Ok(Err(e)) = ended {
            eprintln!("browser: ending the WebDriver session: {e:#} (killing it instead)");
        }
    }
}

/// `DELETE /session/ID`, within [`QUIT`].
fn end_session(url: &str) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        loopback_http(QUIT)?
            .delete(url)
            .send()
            .await?
            .error_for_status()?;
        Ok(())
    })
}

/// A client for chromedriver's port: no proxy from the environment.
fn loopback_http(timeout: Duration) -> reqwest::Result<reqwest::Client> {
    reqwest::Client::builder()
        .no_proxy()
        .timeout(timeout)
        .build()
}

/// chromedriver in a process group of its own, and the directory of everything the
/// browser writes.
struct Driver {
    child: Option<Child>,
    /// chromedriver's pid and process group, once started.
    pgid: Option<u32>,
    port: u16,
    log: PathBuf,
    // Last field: removed only after `Drop::drop` has killed every process using it.
    dir: tempfile::TempDir,
}

/// Why chromedriver did not come up.
enum NotReady {
    /// It exited because another process had taken its port.
    PortTaken,
    Failed(anyhow::Error),
}

impl Driver {
    /// Not started yet.
    fn new(dir: tempfile::TempDir) -> Driver {
        Driver {
            child: None,
            pgid: None,
            port: 0,
            log: dir.path().join("chromedriver.log"),
            dir,
        }
    }

    /// Starts chromedriver on a free port; another port if the picked one was taken.
    async fn start(dir: tempfile::TempDir) -> anyhow::Result<Driver> {
        let mut driver = Driver::new(dir);
        let mut attempt = 1;
        loop {
            match driver.spawn_until_ready(free_port()?).await {
                Ok(()) => return Ok(driver),
                Err(NotReady::PortTaken) if attempt < PORT_ATTEMPTS => attempt += 1,
                Err(NotReady::PortTaken) => bail!(
                    "chromedriver found each of {PORT_ATTEMPTS} free ports taken; log:\n{}",
                    driver.log_text()
                ),
                Err(NotReady::Failed(e)) => return Err(e),
            }
        }
    }

    /// Starts chromedriver on `port`; returns once it answers there.
    async fn spawn_until_ready(&mut self, port: u16) -> Result<(), NotReady> {
        self.port = port;
        self.spawn().map_err(NotReady::Failed)?;
        let pid = self.pgid.unwrap_or_default();
        let status = format!("http://127.0.0.1:{}/status", self.port);
        // Short: a port taken by a silent listener must not hold up seeing the exit.
        let http = loopback_http(Duration::from_secs(2)).map_err(|e| NotReady::Failed(e.into()))?;
        let ready = try_wait_until(
            format_args!("chromedriver to answer on port {}", self.port),
            DRIVER_READY,
            || async {
                if !procs::alive(pid) {
                    return Ok(false);
                }
                let answer: Value = http
                    .get(&status)
                    .send()
                    .await
                    .map_err(|e| e.to_string())?
                    .json()
                    .await
                    .map_err(|e| e.to_string())?;
                if answer["value"]["ready"] == true {
                    Ok(true)
                } else {
                    Err(answer.to_string())
                }
            },
        )
        .await;
        match ready {
            Ok(true) => Ok(()),
            // Exited. A taken port: "IPv4 port not available. Exiting...".
            Ok(false) => {
                self.stop();
                let log = self.log_text();
                if log.contains("port not available") || log.contains("Address already in use") {
                    Err(NotReady::PortTaken)
                } else {
                    Err(NotReady::Failed(anyhow::anyhow!(
                        "chromedriver exited before answering on port {}; log:\n{log}",
                        self.port
                    )))
                }
            }
            Err(e) => Err(NotReady::Failed(anyhow::anyhow!(
                "{e}; chromedriver's log:\n{}",
                self.log_text()
            ))),
        }
    }

    fn spawn(&mut self) -> anyhow::Result<()> {
        let home = self.dir.path().join("home");
        let tmp = self.dir.path().join("tmp");
        std::fs::create_dir_all(&home)?;
        std::fs::create_dir_all(&tmp)?;
        // This start's log only: a port taken last time is not taken again.
        let out = std::fs::File::create(&self.log)
            .with_context(|| format!("creating {}", self.log.display()))?;
        let err = out.try_clone()?;
        let child = Command::new(CHROMEDRIVER)
            .arg(format!("--port={}", self.port))
            // Chromium inherits this environment: its crash handler's database, caches
            // and temporary files go to the browser's directory.
            .env("HOME", &home)
            .env("XDG_CONFIG_HOME", home.join(".config"))
            .env("XDG_CACHE_HOME", home.join(".cache"))
            .env("XDG_DATA_HOME", home.join(".local/share"))
            .env("TMPDIR", &tmp)
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .with_context(|| format!("starting {CHROMEDRIVER}"))?;
        self.pgid = Some(child.id());
        self.child = Some(child);
        Ok(())
    }

    /// Opens the Chromium session, within [`SESSION_READY`].
    async fn session(&self) -> anyhow::Result<Client> {
        let options = json!({
            "binary": CHROMIUM,
            "args": CHROME_ARGS
                .iter()
                .map(|a| a.to_string())
                .chain([format!("--user-data-dir={}", self.dir.path().join("profile").display())])
                .collect::<Vec<_>>(),
            // Pages may show notifications without asking (the dashboard's alerts).
            "prefs": {"profile.default_content_setting_values.notifications": 1},
        });
        let mut capabilities = serde_json::Map::new();
        capabilities.insert("browserName".into(), json!("chrome"));
        capabilities.insert("goog:chromeOptions".into(), options);
        let url = format!("http://127.0.0.1:{}", self.port);
        let connect = async {
            ClientBuilder::new(HttpConnector::new())
                .capabilities(capabilities)
                .connect(&url)
                .await
        };
        match tokio::time::timeout(SESSION_READY, connect).await {
            Ok(Ok(client)) => Ok(client),
            Ok(Err(e)) => bail!(
                "opening a Chromium session: {e}; chromedriver's log:\n{}",
                self.log_text()
            ),
            Err(_) => bail!(
                "Chromium did not open a session within {SESSION_READY:?}; chromedriver's \
                 log:\n{}",
                self.log_text()
            ),
        }
    }

    /// chromedriver's process group, and the processes naming the browser's directory.
    fn processes(&self) -> Vec<u32> {
        let mut all = procs::mentioning(&self.dir.path().to_string_lossy());
        if let Some(pgid) = self.pgid {
            all.extend(procs::group_members(pgid));
        }
        all.sort_unstable();
        all.dedup();
        all
    }

    /// SIGKILL to chromedriver's process group, and chromedriver reaped.
    fn stop(&mut self) {
        if let Some(pgid) = self.pgid.and_then(|p| i32::try_from(p).ok()) {
            procs::signal(-pgid, Signal::KILL);
        }
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        self.stop();
        // Whatever left the group (the crash handler) or was started after the kill.
        let gone = try_wait_until_blocking(
            format_args!(
                "the browser's processes (group {:?}, or naming {}) to end",
                self.pgid,
                self.dir.path().display()
            ),
            GONE,
            || {
                let left = self.processes();
                for &pid in &left {
                    procs::signal(pid, Signal::KILL);
                }
                if left.is_empty() {
                    Ok(())
                } else {
                    Err(format!("{left:?} still running"))
                }
            },
        );
        if let Err(e) = gone {
            // A second panic while unwinding would abort the whole test binary.
            if std::thread::panicking() {
                eprintln!("browser: {e}");
            } else {
                panic!("browser: {e}");
            }
        }
    }
}

/// `$RELAY_TEST_ARTIFACTS` (relative to the workspace if relative), else the workspace's
/// `target/test-artifacts`: where the tests leave what a reviewer looks at.
pub fn artifacts_dir() -> PathBuf {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap_or(Path::new("/"));
    artifacts_dir_in(workspace, std::env::var_os("RELAY_TEST_ARTIFACTS"))
}

fn artifacts_dir_in(workspace: &Path, var: Option<std::ffi::OsString>) -> PathBuf {
    match var {
        Some(dir) if !dir.is_empty() => workspace.join(dir),
        _ => workspace.join("target/test-artifacts"),
    }
}

/// The error naming the first of `paths` that is not installed.
fn missing(paths: &[&Path]) -> Option<anyhow::Error> {
    let absent = paths.iter().find(|p| !p.is_file())?;
    Some(anyhow::anyhow!(
        "{} is not installed: run ops/setup.sh (it installs Debian's chromium and \
         chromium-driver packages)",
        absent.display()
    ))
}

/// A name for a file or folder of the artifacts: one plain path component.
fn plain_name(name: &str) -> anyhow::Result<()> {
    let plain =
        !name.is_empty() && name != "." && name != ".." && !name.contains(['/', '\\', '\0']);
    if plain {
        Ok(())
    } else {
        bail!("{name:?} is not a plain file name")
    }
}

fn free_port() -> anyhow::Result<u16> {
    let l = std::net::TcpListener::bind(("127.0.0.1", 0)).context("binding 127.0.0.1:0")?;
    Ok(l.local_addr()?.port())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn a_missing_browser_says_to_run_setup() {
        let e = missing(&[Path::new("/bin/sh"), Path::new("/nonexistent/chromedriver")]);
        assert_eq!(
            e.unwrap().to_string(),
            "/nonexistent/chromedriver is not installed: run ops/setup.sh (it installs \
             Debian's chromium and chromium-driver packages)"
        );
        assert!(missing(&[Path::new("/bin/sh")]).is_none());
    }

    #[tokio::test]
    async fn a_port_taken_before_chromedriver_binds_it_is_told_apart() {
        let taken = std::net::TcpListener::bind(("127.0.0.1", 0)).unwrap();
        let port = taken.local_addr().unwrap().port();
        let dir = tempfile::Builder::new()
            .prefix("relay-browser-")
            .tempdir()
            .unwrap();
        let mut driver = Driver::new(dir);
        let taken_told = matches!(
            driver.spawn_until_ready(port).await,
            Err(NotReady::PortTaken)
        );
        assert!(taken_told, "log:\n{}", driver.log_text());
        // The next free port works.
        let next = free_port().unwrap();
        assert!(driver.spawn_until_ready(next).await.is_ok());
        assert!(procs::alive(driver.pgid.unwrap()));
    }

    #[test]
    fn artifact_names_are_one_plain_component() {
        assert!(plain_name("agents-view").is_ok());
        for bad in ["", ".", "..", "a/b", "../x", "a\\b"] {
            assert!(plain_name(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn artifacts_go_to_the_variable_or_the_workspace_target_dir() {
        let ws = Path::new("/w");
        let dir = |var: Option<&str>| artifacts_dir_in(ws, var.map(Into::into));
        assert_eq!(dir(None), Path::new("/w/target/test-artifacts"));
        assert_eq!(dir(Some("")), Path::new("/w/target/test-artifacts"));
        assert_eq!(dir(Some("shots")), Path::new("/w/shots"));
        assert_eq!(dir(Some("/ci/shots")), Path::new("/ci/shots"));
    }
}
