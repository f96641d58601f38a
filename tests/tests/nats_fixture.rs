//! The `nats-server` fixture itself: it starts with JetStream on a random port, restarts
//! on the same port with its streams intact, enforces the auth it was given, and leaves
//! no process behind. Spoken to over plain TCP so the check depends on no client crate.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use relay_tests::nats::{Auth, NatsServer};
use relay_tests::{procs, wait_until_blocking};

/// A bare NATS protocol connection: enough to read `INFO`, authenticate and make
/// JetStream API requests.
struct Raw {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
    info: String,
}

impl Raw {
    fn connect(server: &NatsServer) -> Raw {
        let stream = TcpStream::connect(("127.0.0.1", server.port())).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let writer = stream.try_clone().unwrap();
        let mut raw = Raw {
            reader: BufReader::new(stream),
            writer,
            info: String::new(),
        };
        raw.info = raw.line();
        assert!(raw.info.starts_with("INFO {"), "{}", raw.info);
        raw
    }

    fn line(&mut self) -> String {
        let mut line = String::new();
        self.reader.read_line(&mut line).unwrap();
        line.trim_end().to_string()
    }

    fn send(&mut self, s: &str) {
        self.writer.write_all(s.as_bytes()).unwrap();
    }

    /// `CONNECT` with these options, then `PING`: the server's first answer, which is
    /// `PONG` when it accepted the connection and `-ERR ...` when it did not.
    fn handshake(&mut self, options: &str) -> String {
        self.send(&format!("CONNECT {options}\r\nPING\r\n"));
        self.line()
    }

    /// A request/reply through `_INBOX.fixture`; returns the reply payload.
    fn request(&mut self, subject: &str, payload: &str) -> String {
        self.send(&format!(
            "SUB _INBOX.fixture 1\r\nPUB {subject} _INBOX.fixture {}\r\n{payload}\r\n",
            payload.len()
        ));
        loop {
            let line = self.line();
            if line == "PING" {
                self.send("PONG\r\n");
            } else if line.starts_with("MSG ") {
                let size: usize = line.rsplit(' ').next().unwrap().parse().unwrap();
                let mut body = vec![0; size + 2];
                self.reader.read_exact(&mut body).unwrap();
                self.send("UNSUB 1\r\n");
                body.truncate(size);
                return String::from_utf8(body).unwrap();
            } else {
                assert!(!line.starts_with("-ERR"), "{line}");
            }
        }
    }
}

#[test]
fn starts_with_jetstream_on_a_random_port() {
    let server = NatsServer::start().unwrap();
    assert_eq!(server.url(), format!("nats://127.0.0.1:{}", server.port()));
    assert!(procs::exists(server.pid()));

    let mut raw = Raw::connect(&server);
    assert!(raw.info.contains("\"jetstream\":true"), "{}", raw.info);
    assert!(!raw.info.contains("\"auth_required\":true"), "{}", raw.info);
    assert_eq!(raw.handshake(r#"{"verbose":false}"#), "PONG");
    assert!(
        server.log_text().contains("Server is ready"),
        "{}",
        server.log_text()
    );
}

#[test]
fn restart_keeps_the_port_and_the_streams() {
    let mut server = NatsServer::start().unwrap();
    let (port, pid) = (server.port(), server.pid());

    let mut raw = Raw::connect(&server);
    assert_eq!(raw.handshake(r#"{"verbose":false}"#), "PONG");
    let created = raw.request(
        "$JS.API.STREAM.CREATE.FIXTURE",
        r#"{"name":"FIXTURE","subjects":["fixture.>"],"storage":"file"}"#,
    );
    assert!(!created.contains("\"error\""), "{created}");
    let ack = raw.request("fixture.a", "hello");
    assert!(ack.contains("\"seq\":1"), "{ack}");
    drop(raw);

    server.restart().unwrap();
    assert_eq!(server.port(), port);
    assert_ne!(server.pid(), pid);
    assert!(!procs::exists(pid), "the old server {pid} is still there");
    assert!(procs::exists(server.pid()));

    let mut raw = Raw::connect(&server);
    assert_eq!(raw.handshake(r#"{"verbose":false}"#), "PONG");
    let info = raw.request("$JS.API.STREAM.INFO.FIXTURE", "");
    assert!(info.contains("\"messages\":1"), "{info}");

    // Twice in a row, straight after clients were connected: the port is reusable.
    server.restart().unwrap();
    assert_eq!(server.port(), port);
    let mut raw = Raw::connect(&server);
    assert_eq!(raw.handshake(r#"{"verbose":false}"#), "PONG");
}

#[test]
fn stop_then_restart_serves_again() {
    let mut server = NatsServer::start().unwrap();
    let pid = server.pid();
    server.stop();
    assert!(!procs::exists(pid));
    assert!(TcpStream::connect(("127.0.0.1", server.port())).is_err());
    server.stop(); // idempotent

    server.restart().unwrap();
    assert!(procs::exists(server.pid()));
    Raw::connect(&server);
}

#[test]
fn drop_kills_and_reaps_the_process() {
    let server = NatsServer::start().unwrap();
    let (pid, port) = (server.pid(), server.port());
    let store = server.store_dir().to_path_buf();
    assert!(store.exists());
    drop(server);
    // Reaped, not a zombie: /proc has no entry at all.
    assert!(!procs::exists(pid), "nats-server {pid} outlived its handle");
    assert!(TcpStream::connect(("127.0.0.1", port)).is_err());
    assert!(!store.exists(), "the temporary directory is removed");
}

#[test]
fn user_password_auth_is_enforced() {
    // `$` and `"` must reach the server literally, not as a variable or a string end.
    let password = r#"pa$s"w\rd"#;
    let server = NatsServer::start_with_auth(Auth::UserPassword {
        user: "relay".into(),
        password: password.into(),
    })
    .unwrap();

    let mut anon = Raw::connect(&server);
    assert!(
        anon.info.contains("\"auth_required\":true"),
        "{}",
        anon.info
    );
    assert!(anon.info.contains("\"jetstream\":true"), "{}", anon.info);
    let refused = anon.handshake(r#"{"verbose":false}"#);
    assert!(refused.starts_with("-ERR"), "{refused}");

    let mut wrong = Raw::connect(&server);
    let refused = wrong.handshake(r#"{"verbose":false,"user":"relay","pass":"nope"}"#);
    assert!(refused.starts_with("-ERR"), "{refused}");

    let mut user = Raw::connect(&server);
    let options = format!(
        r#"{{"verbose":false,"user":"relay","pass":{}}}"#,
        json_string(password)
    );
    assert_eq!(user.handshake(&options), "PONG");
}

#[test]
fn token_auth_is_enforced() {
    let server = NatsServer::start_with_auth(Auth::Token("s3cret".into())).unwrap();

    let mut anon = Raw::connect(&server);
    assert!(
        anon.info.contains("\"auth_required\":true"),
        "{}",
        anon.info
    );
    let refused = anon.handshake(r#"{"verbose":false}"#);
    assert!(refused.starts_with("-ERR"), "{refused}");

    let mut user = Raw::connect(&server);
    assert_eq!(
        user.handshake(r#"{"verbose":false,"auth_token":"s3cret"}"#),
        "PONG"
    );
}

fn json_string(s: &str) -> String {
    serde_json::to_string(s).unwrap()
}

#[test]
fn restart_waits_for_a_port_that_is_briefly_held() {
    let mut server = NatsServer::start().unwrap();
    let port = server.port();
    server.stop();
    // Something else holds the port for a moment, as a lingering socket would.
    let holder = std::net::TcpListener::bind(("127.0.0.1", port)).unwrap();
    // Released once the restarting server has found the port held (and will try again).
    let log = server.log_path().to_path_buf();
    let release = std::thread::spawn(move || {
        wait_until_blocking(
            "nats-server to find the port in use",
            Duration::from_secs(30),
            || {
                let text = std::fs::read_to_string(&log).unwrap_or_default();
                text.contains("address already in use").then_some(())
            },
        );
        drop(holder);
    });
    server.restart().unwrap();
    release.join().unwrap();
    assert_eq!(server.port(), port);
    assert!(
        server.log_text().contains("address already in use"),
        "{}",
        server.log_text()
    );
    let mut raw = Raw::connect(&server);
    assert_eq!(raw.handshake(r#"{"verbose":false}"#), "PONG");
}
