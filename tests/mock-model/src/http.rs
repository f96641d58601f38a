//! Just enough HTTP/1.1 for a test mock: read one request (request line, headers, a
//! `Content-Length` or chunked body), then write one response and close. Every response
//! says `connection: close`, so there is no keep-alive state to get wrong; clients open a
//! new connection per request, which costs nothing on loopback.

use std::io;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

/// A client connection: reads are buffered, writes go straight through.
pub(crate) type Conn = BufReader<TcpStream>;

/// Largest request head (request line and headers) accepted.
const MAX_HEAD: usize = 64 * 1024;
/// Largest request body accepted. Agent CLIs send the whole conversation on every
/// request, with tool schemas and instructions: tens of KiB typically, more after long
/// tests.
const MAX_BODY: usize = 64 * 1024 * 1024;

/// One parsed request.
#[derive(Debug, Clone)]
pub(crate) struct Request {
    pub method: String,
    /// The request target as sent, query string included.
    pub target: String,
    /// Header names lower-cased, in the order received.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Request {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The path without the query string.
    pub fn path(&self) -> &str {
        self.target.split('?').next().unwrap_or_default()
    }
}

fn bad(msg: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.into())
}

/// Reads one request. `Ok(None)` when the peer closed before sending anything.
pub(crate) async fn read_request(reader: &mut Conn) -> io::Result<Option<Request>> {
    let mut head_len = 0usize;
    let mut line = Vec::new();
    let request_line = loop {
        line.clear();
        let n = reader.read_until(b'\n', &mut line).await?;
        if n == 0 {
            return Ok(None);
        }
        head_len += n;
        let text = trim_crlf(&line);
        // RFC 9112 §2.2: ignore empty lines before the request line.
        if !text.is_empty() {
            break String::from_utf8_lossy(text).into_owned();
        }
    };
    let mut parts = request_line.split_whitespace();
    let (Some(method), Some(target)) = (parts.next(), parts.next()) else {
        return Err(bad(format!("bad request line {request_line:?}")));
    };
    let (method, target) = (method.to_string(), target.to_string());

    let mut headers = Vec::new();
    loop {
        line.clear();
        let n = reader.read_until(b'\n', &mut line).await?;
        if n == 0 {
            return Err(bad("eof in headers"));
        }
        head_len += n;
        if head_len > MAX_HEAD {
            return Err(bad("request head too large"));
        }
        let text = trim_crlf(&line);
        if text.is_empty() {
            break;
        }
        let text = String::from_utf8_lossy(text);
        if let Some((k, v)) = text.split_once(':') {
            headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
        }
    }

    let mut req = Request {
        method,
        target,
        headers,
        body: Vec::new(),
    };
    let chunked = req
        .header("transfer-encoding")
        .is_some_and(|v| v.to_ascii_lowercase().contains("chunked"));
    if chunked {
        req.body = read_chunked(reader).await?;
    } else if let Some(len) = req.header("content-length") {
        let len: usize = len.parse().map_err(|_| bad("bad content-length"))?;
        if len > MAX_BODY {
            return Err(bad("body too large"));
        }
        let mut body = vec![0u8; len];
        reader.read_exact(&mut body).await?;
        req.body = body;
    }
    Ok(Some(req))
}

async fn read_chunked(reader: &mut Conn) -> io::Result<Vec<u8>> {
    let mut body = Vec::new();
    let mut line = Vec::new();
    loop {
        line.clear();
        reader.read_until(b'\n', &mut line).await?;
        let text = String::from_utf8_lossy(trim_crlf(&line)).into_owned();
        // Chunk extensions (`;name=value`) are legal and meaningless here.
        let size_hex = text.split(';').next().unwrap_or_default().trim();
        let size = usize::from_str_radix(size_hex, 16)
            .map_err(|_| bad(format!("bad chunk size {size_hex:?}")))?;
        if size == 0 {
            // Trailers, up to the empty line.
            loop {
                line.clear();
                let n = reader.read_until(b'\n', &mut line).await?;
                if n == 0 || trim_crlf(&line).is_empty() {
                    return Ok(body);
                }
            }
        }
        if body.len() + size > MAX_BODY {
            return Err(bad("body too large"));
        }
        let start = body.len();
        body.resize(start + size, 0);
        reader.read_exact(&mut body[start..]).await?;
        let mut crlf = [0u8; 2];
        reader.read_exact(&mut crlf).await?;
    }
}

fn trim_crlf(line: &[u8]) -> &[u8] {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    line.strip_suffix(b"\r").unwrap_or(line)
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        _ => "Status",
    }
}

/// Writes a complete response with a body and `connection: close`.
pub(crate) async fn write_response(
    stream: &mut Conn,
    status: u16,
    content_type: &str,
    body: &[u8],
) -> io::Result<()> {
    let head = format!(
        "HTTP/1.1 {status} {}\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        reason(status),
        body.len()
    );
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(body).await?;
    stream.flush().await
}

/// A `text/event-stream` response, written with chunked transfer encoding so each event
/// reaches the client as soon as it is written.
pub(crate) struct SseWriter<'a> {
    stream: &'a mut Conn,
}

impl<'a> SseWriter<'a> {
    pub async fn start(stream: &'a mut Conn) -> io::Result<Self> {
        stream
            .write_all(
                b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n",
            )
            .await?;
        stream.flush().await?;
        Ok(Self { stream })
    }

    /// Writes `event: <kind>\ndata: <json>\n\n` as one chunk.
    pub async fn event(&mut self, kind: &str, data: &serde_json::Value) -> io::Result<()> {
        let payload = format!("event: {kind}\ndata: {data}\n\n");
        self.write_chunk(&payload).await
    }

    /// Writes `data: <text>\n\n` as one chunk, with no `event:` line: the Gemini API and
    /// chat completions streams name no events (chat completions ends with `[DONE]`).
    pub async fn data(&mut self, data: &str) -> io::Result<()> {
        let payload = format!("data: {data}\n\n");
        self.write_chunk(&payload).await
    }

    /// Writes `text` as one chunk of its own, with no SSE framing (the Gemini API's
    /// mid-stream error).
    pub async fn raw(&mut self, text: &str) -> io::Result<()> {
        self.write_chunk(text).await
    }

    async fn write_chunk(&mut self, payload: &str) -> io::Result<()> {
        let chunk = format!("{:x}\r\n{payload}\r\n", payload.len());
        self.stream.write_all(chunk.as_bytes()).await?;
        self.stream.flush().await
    }

    pub async fn finish(self) -> io::Result<()> {
        self.stream.write_all(b"0\r\n\r\n").await?;
        self.stream.flush().await
    }

    /// The connection, to watch for the client going away.
    pub fn conn(&mut self) -> &mut Conn {
        self.stream
    }
}
