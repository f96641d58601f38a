//! A TCP gate between `relay acp` and the broker that holds requests until opened.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use tokio::io::AsyncWriteExt;

/// A TCP proxy to the broker whose client-to-broker direction can be held shut: what
/// `relay acp` sends meanwhile waits in it, and goes on once it is open again. The
/// proxy's address in what is sent (the Host header) becomes the broker's, which
/// refuses other hosts.
pub struct Gate {
    pub url: String,
    pub open: tokio::sync::watch::Sender<bool>,
    pub task: tokio::task::JoinHandle<()>,
}

impl Gate {
    pub async fn start(broker_url: &str) -> Gate {
        let upstream = broker_url
            .trim_start_matches("http://")
            .trim_end_matches('/')
            .to_string();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let here = listener.local_addr().unwrap().to_string();
        let url = format!("http://{here}");
        let (open, rx) = tokio::sync::watch::channel(true);
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let (upstream, here) = (upstream.clone(), here.clone());
                let rx = rx.clone();
                tokio::spawn(async move {
                    let Ok(broker) = tokio::net::TcpStream::connect(&upstream).await else {
                        return;
                    };
                    let (mut cr, cw) = client.into_split();
                    let (br, mut bw) = broker.into_split();
                    let back = tokio::spawn(async move {
                        let (mut br, mut cw) = (br, cw);
                        let _ = tokio::io::copy(&mut br, &mut cw).await;
                    });
                    let mut rx = rx;
                    let mut buf = vec![0u8; 16 << 10];
                    loop {
                        let n = match tokio::io::AsyncReadExt::read(&mut cr, &mut buf).await {
                            Ok(0) | Err(_) => break,
                            Ok(n) => n,
                        };
                        let sent = replace(&buf[..n], here.as_bytes(), upstream.as_bytes());
                        if rx.wait_for(|open| *open).await.is_err()
                            || bw.write_all(&sent).await.is_err()
                        {
                            break;
                        }
                    }
                    let _ = bw.shutdown().await;
                    let _ = back.await;
                });
            }
        });
        Gate { url, open, task }
    }

    pub fn shut(&self) {
        self.open.send_replace(false);
    }

    pub fn open(&self) {
        self.open.send_replace(true);
    }
}

/// `bytes` with each `from` replaced by `to`.
pub fn replace(bytes: &[u8], from: &[u8], to: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i..].starts_with(from) {
            out.extend_from_slice(to);
            i += from.len();
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    out
}

impl Drop for Gate {
    fn drop(&mut self) {
        self.task.abort();
    }
}
