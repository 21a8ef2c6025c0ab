//! The load generator's HTTP client: one hyper HTTP/1.1 connection per task, no pool, no
//! redirects, so a request costs the client as little CPU as possible on a box it shares with
//! the server under test. Also a Server-Sent Events reader for the stream workloads.

use anyhow::{bail, Context as _};
use bytes::{Bytes, BytesMut};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper::header::{HeaderMap, CONTENT_TYPE, HOST};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::net::TcpStream;

/// Longest any single request may take before the workload counts it as failed.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// One keep-alive connection to the server under test.
pub struct Conn {
    sender: SendRequest<Full<Bytes>>,
    addr: SocketAddr,
    /// `Host` header value; hyper's connection-level API does not add one.
    host: String,
}

/// A response read to its end.
pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Conn {
    pub async fn connect(addr: SocketAddr) -> anyhow::Result<Conn> {
        let tcp = TcpStream::connect(addr)
            .await
            .with_context(|| format!("connect {addr}"))?;
        tcp.set_nodelay(true)?;
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp)).await?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        Ok(Conn {
            sender,
            addr,
            host: addr.to_string(),
        })
    }

    /// Replaces a broken connection with a fresh one to the same server.
    pub async fn reconnect(&mut self) -> anyhow::Result<()> {
        *self = Conn::connect(self.addr).await?;
        Ok(())
    }

    /// Sends a request and returns the response head; the body is left to the caller.
    pub async fn send(
        &mut self,
        method: Method,
        path: &str,
        headers: &[(&str, &str)],
        body: Bytes,
    ) -> anyhow::Result<Response<Incoming>> {
        self.sender.ready().await?;
        let mut req = Request::builder().method(method).uri(path).header(HOST, &self.host);
        if !body.is_empty() {
            req = req.header(CONTENT_TYPE, "application/json");
        }
        for (name, value) in headers {
            req = req.header(*name, *value);
        }
        let res = tokio::time::timeout(REQUEST_TIMEOUT, self.sender.send_request(req.body(Full::new(body))?))
            .await
            .context("request timed out")??;
        Ok(res)
    }

    pub async fn request(
        &mut self,
        method: Method,
        path: &str,
        headers: &[(&str, &str)],
        body: Bytes,
    ) -> anyhow::Result<Reply> {
        let (parts, body) = self.send(method, path, headers, body).await?.into_parts();
        let body = tokio::time::timeout(REQUEST_TIMEOUT, body.collect())
            .await
            .context("response body timed out")??
            .to_bytes();
        Ok(Reply {
            status: parts.status,
            headers: parts.headers,
            body,
        })
    }

    pub async fn get(&mut self, path: &str) -> anyhow::Result<Reply> {
        self.request(Method::GET, path, &[], Bytes::new()).await
    }

    pub async fn post_json(&mut self, path: &str, body: Bytes) -> anyhow::Result<Reply> {
        self.request(Method::POST, path, &[], body).await
    }
}

/// One GET on a fresh connection: for probes that must not reuse a connection.
pub async fn get_once(addr: SocketAddr, path: &str) -> anyhow::Result<Reply> {
    Conn::connect(addr).await?.get(path).await
}

/// The `"id"` of the first JSON object in `body` (`{"id":12,…}` or `{"id": 12,…}`), without
/// parsing the whole document: the POST loops read one per response.
pub fn first_id(body: &[u8]) -> Option<u64> {
    let at = find(body, b"\"id\"")? + 4;
    let rest = &body[at..];
    let start = rest.iter().position(|b| !matches!(b, b' ' | b':'))?;
    let digits = rest[start..].iter().take_while(|b| b.is_ascii_digit()).count();
    std::str::from_utf8(&rest[start..start + digits]).ok()?.parse().ok()
}

pub fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// One Server-Sent Event. `event` is `message` when the server names none.
#[derive(Debug)]
pub struct SseEvent {
    pub event: String,
    pub data: String,
}

/// Reads events from a `text/event-stream` body.
pub struct SseReader {
    body: Incoming,
    buf: BytesMut,
}

impl SseReader {
    pub fn new(res: Response<Incoming>) -> anyhow::Result<SseReader> {
        if res.status() != StatusCode::OK {
            bail!("stream answered {}", res.status());
        }
        Ok(SseReader {
            body: res.into_body(),
            buf: BytesMut::new(),
        })
    }

    /// The next event, or `None` when the server closed the stream. Comments are skipped.
    pub async fn next(&mut self) -> anyhow::Result<Option<SseEvent>> {
        loop {
            if let Some(end) = find(&self.buf, b"\n\n") {
                let raw = self.buf.split_to(end + 2);
                let text = std::str::from_utf8(&raw).context("SSE event is not UTF-8")?;
                let mut event = String::from("message");
                let mut data = String::new();
                let mut any = false;
                for line in text.lines() {
                    if let Some(v) = line.strip_prefix("event:") {
                        event = v.trim_start().to_owned();
                        any = true;
                    } else if let Some(v) = line.strip_prefix("data:") {
                        if !data.is_empty() {
                            data.push('\n');
                        }
                        data.push_str(v.strip_prefix(' ').unwrap_or(v));
                        any = true;
                    }
                }
                if any {
                    return Ok(Some(SseEvent { event, data }));
                }
                continue;
            }
            match self.body.frame().await {
                None => return Ok(None),
                Some(frame) => {
                    if let Ok(chunk) = frame?.into_data() {
                        self.buf.extend_from_slice(&chunk);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_id_reads_compact_and_spaced_json() {
        assert_eq!(first_id(br#"{"id":42,"channel":"c"}"#), Some(42));
        assert_eq!(first_id(br#"[{"id": 7, "x": 1}]"#), Some(7));
        assert_eq!(first_id(br#"{"sender":"a"}"#), None);
    }
}
