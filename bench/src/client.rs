//! The load generator's HTTP clients: [`Conn`], one hyper HTTP/1.1 connection per task (no
//! pool, no redirects) for the workloads that read headers and streams; [`RawConn`], a
//! minimal HTTP/1.1 client for the closed request loops, which spend as little of the shared
//! box's CPU per request as they can (as `wrk` does); a Server-Sent Events reader.

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
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

/// Longest any single request may take before the workload counts it as failed.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// One keep-alive connection to the server under test.
pub struct Conn {
    sender: SendRequest<Full<Bytes>>,
    /// `Host` header value; hyper's connection-level API does not add one.
    host: String,
}

/// A response read to its end.
pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

/// A TCP connection to the server under test, with Nagle off (both clients write a request
/// whole and wait for its answer).
async fn dial(addr: SocketAddr) -> anyhow::Result<TcpStream> {
    let tcp = TcpStream::connect(addr)
        .await
        .with_context(|| format!("connect {addr}"))?;
    tcp.set_nodelay(true)?;
    Ok(tcp)
}

impl Conn {
    pub async fn connect(addr: SocketAddr) -> anyhow::Result<Conn> {
        let tcp = dial(addr).await?;
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp)).await?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        Ok(Conn {
            sender,
            host: addr.to_string(),
        })
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

/// One keep-alive HTTP/1.1 connection that sends a request prepared once, as bytes, and reads
/// the answer's status and body, nothing else: no header map, no second task per connection
/// (hyper drives each connection from a task of its own, so every request is two task wakes).
/// Answers with a `Content-Length` or `chunked` body; anything else is an error.
pub struct RawConn {
    stream: TcpStream,
    addr: SocketAddr,
    /// What has been read and not yet consumed.
    buf: BytesMut,
}

/// A request for [`RawConn`], in the bytes that go on the wire.
pub struct RawRequest(Bytes);

impl RawRequest {
    pub fn new(method: &Method, path: &str, addr: SocketAddr, body: &[u8]) -> RawRequest {
        let mut head = format!("{method} {path} HTTP/1.1\r\nhost: {addr}\r\n");
        if !body.is_empty() {
            head.push_str(&format!(
                "content-type: application/json\r\ncontent-length: {}\r\n",
                body.len()
            ));
        }
        head.push_str("\r\n");
        let mut wire = BytesMut::from(head.as_bytes());
        wire.extend_from_slice(body);
        RawRequest(wire.freeze())
    }
}

/// Longest response head [`RawConn`] accepts.
const MAX_HEAD: usize = 64 * 1024;

impl RawConn {
    pub async fn connect(addr: SocketAddr) -> anyhow::Result<RawConn> {
        Ok(RawConn {
            stream: dial(addr).await?,
            addr,
            buf: BytesMut::with_capacity(16 * 1024),
        })
    }

    /// Replaces a broken connection with a fresh one to the same server.
    pub async fn reconnect(&mut self) -> anyhow::Result<()> {
        *self = RawConn::connect(self.addr).await?;
        Ok(())
    }

    /// Sends `req` and reads the whole answer: its status and body.
    pub async fn request(&mut self, req: &RawRequest) -> anyhow::Result<(StatusCode, Bytes)> {
        tokio::time::timeout(REQUEST_TIMEOUT, async {
            self.stream.write_all(&req.0).await?;
            self.read_answer().await
        })
        .await
        .context("request timed out")?
    }

    async fn read_answer(&mut self) -> anyhow::Result<(StatusCode, Bytes)> {
        let (status, head_len, framing) = loop {
            let mut headers = [httparse::EMPTY_HEADER; 32];
            let mut res = httparse::Response::new(&mut headers);
            match res.parse(&self.buf)? {
                httparse::Status::Complete(n) => {
                    let status = StatusCode::from_u16(res.code.unwrap_or(0))?;
                    break (status, n, Framing::of(res.headers)?);
                }
                httparse::Status::Partial if self.buf.len() > MAX_HEAD => bail!("response head over {MAX_HEAD} bytes"),
                httparse::Status::Partial => self.fill().await?,
            }
        };
        let _ = self.buf.split_to(head_len);
        let body = match framing {
            Framing::Length(n) => {
                while self.buf.len() < n {
                    self.fill().await?;
                }
                self.buf.split_to(n).freeze()
            }
            Framing::Chunked => {
                let mut body = BytesMut::new();
                loop {
                    let (size_len, size) = loop {
                        match httparse::parse_chunk_size(&self.buf).map_err(|_| anyhow::anyhow!("bad chunk size"))? {
                            httparse::Status::Complete(found) => break found,
                            httparse::Status::Partial => self.fill().await?,
                        }
                    };
                    let size = usize::try_from(size)?;
                    // The chunk and its CRLF.
                    while self.buf.len() < size_len + size + 2 {
                        self.fill().await?;
                    }
                    let _ = self.buf.split_to(size_len);
                    body.extend_from_slice(&self.buf.split_to(size));
                    let _ = self.buf.split_to(2);
                    if size == 0 {
                        // No trailers are sent by either server: the last chunk's CRLF ends it.
                        break body.freeze();
                    }
                }
            }
        };
        Ok((status, body))
    }

    /// Reads more of the answer into the buffer; an error if the server closed the connection.
    async fn fill(&mut self) -> anyhow::Result<()> {
        if self.buf.capacity() - self.buf.len() < 4096 {
            self.buf.reserve(16 * 1024);
        }
        if self.stream.read_buf(&mut self.buf).await? == 0 {
            bail!("the server closed the connection mid-answer");
        }
        Ok(())
    }
}

/// How an answer's body ends.
enum Framing {
    Length(usize),
    Chunked,
}

impl Framing {
    fn of(headers: &[httparse::Header<'_>]) -> anyhow::Result<Framing> {
        for h in headers {
            if h.name.eq_ignore_ascii_case("content-length") {
                return Ok(Framing::Length(std::str::from_utf8(h.value)?.trim().parse()?));
            }
            if h.name.eq_ignore_ascii_case("transfer-encoding") {
                if h.value.eq_ignore_ascii_case(b"chunked") {
                    return Ok(Framing::Chunked);
                }
                bail!("unsupported transfer-encoding {:?}", String::from_utf8_lossy(h.value));
            }
        }
        bail!("an answer with neither content-length nor chunked encoding")
    }
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

    /// A server that reads one request per answer in `answers` and writes each in two parts
    /// (split mid-way, so the client must read more than once), then closes.
    async fn scripted(answers: Vec<&'static [u8]>) -> SocketAddr {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut seen = Vec::new();
            for answer in answers {
                // Read until the request's head and its 2-byte body are in.
                while !seen.windows(6).any(|w| w == b"\r\n\r\n{}") {
                    let mut b = [0u8; 1024];
                    let n = s.read(&mut b).await.unwrap();
                    assert!(n > 0, "the client closed early");
                    seen.extend_from_slice(&b[..n]);
                }
                seen.clear();
                let (a, b) = answer.split_at(answer.len() / 2);
                s.write_all(a).await.unwrap();
                s.flush().await.unwrap();
                tokio::time::sleep(Duration::from_millis(5)).await;
                s.write_all(b).await.unwrap();
            }
        });
        addr
    }

    #[tokio::test]
    async fn raw_conn_reads_length_and_chunked_answers_on_one_connection() {
        let addr = scripted(vec![
            b"HTTP/1.1 200 OK\r\ncontent-length: 9\r\nx-a: b\r\n\r\n{\"id\":12}",
            b"HTTP/1.1 201 Created\r\ntransfer-encoding: chunked\r\n\r\n4\r\n[{\"i\r\na\r\nd\":7}, {}]\r\n0\r\n\r\n",
            b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n",
        ])
        .await;
        let mut conn = RawConn::connect(addr).await.unwrap();
        let req = RawRequest::new(&Method::POST, "/x", addr, b"{}");
        let (status, body) = conn.request(&req).await.unwrap();
        assert_eq!((status, &body[..]), (StatusCode::OK, &br#"{"id":12}"#[..]));
        let (status, body) = conn.request(&req).await.unwrap();
        assert_eq!((status, &body[..]), (StatusCode::CREATED, &br#"[{"id":7}, {}]"#[..]));
        let (status, body) = conn.request(&req).await.unwrap();
        assert_eq!((status, body.len()), (StatusCode::SERVICE_UNAVAILABLE, 0));
        // The server has closed: the next request fails instead of hanging.
        assert!(conn.request(&req).await.is_err());
    }

    #[test]
    fn raw_request_is_the_wire_form() {
        let addr: SocketAddr = "127.0.0.1:9".parse().unwrap();
        let req = RawRequest::new(&Method::POST, "/api/x", addr, b"{}");
        assert_eq!(
            &req.0[..],
            &b"POST /api/x HTTP/1.1\r\nhost: 127.0.0.1:9\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"[..]
        );
        let get = RawRequest::new(&Method::GET, "/y", addr, b"");
        assert_eq!(&get.0[..], &b"GET /y HTTP/1.1\r\nhost: 127.0.0.1:9\r\n\r\n"[..]);
    }
}
