//! The bridge's HTTP client for its relay session: reqwest, as rmcp uses it, plus a count of
//! the `initialize` requests sent. The first opens the session; any later one means rmcp
//! re-created a session the relay had lost (a relay restart), so the identity the agent
//! registered must be claimed again for the new session (see `proxy.rs`).

use futures_util::stream::BoxStream;
use http::{HeaderName, HeaderValue};
use rmcp::model::{ClientJsonRpcMessage, ClientRequest};
use rmcp::transport::streamable_http_client::{
    SseError, StreamableHttpClient, StreamableHttpError, StreamableHttpPostResponse, StreamableHttpResponseLimits,
};
use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

type Error = <reqwest::Client as StreamableHttpClient>::Error;

#[derive(Clone)]
pub struct Watched {
    inner: reqwest::Client,
    inits: Arc<AtomicU64>,
}

impl Watched {
    pub fn new(inner: reqwest::Client) -> (Watched, Arc<AtomicU64>) {
        let inits = Arc::new(AtomicU64::new(0));
        (
            Watched {
                inner,
                inits: inits.clone(),
            },
            inits,
        )
    }

    fn saw(&self, message: &ClientJsonRpcMessage) {
        if let ClientJsonRpcMessage::Request(r) = message {
            if matches!(r.request, ClientRequest::InitializeRequest(_)) {
                self.inits.fetch_add(1, Ordering::SeqCst);
            }
        }
    }
}

impl StreamableHttpClient for Watched {
    type Error = Error;

    fn post_message(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> impl Future<Output = Result<StreamableHttpPostResponse, StreamableHttpError<Error>>> + Send + '_ {
        self.saw(&message);
        self.inner
            .post_message(uri, message, session_id, auth_header, custom_headers)
    }

    fn post_message_with_response_limits(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        limits: StreamableHttpResponseLimits,
    ) -> impl Future<Output = Result<StreamableHttpPostResponse, StreamableHttpError<Error>>> + Send + '_ {
        // reqwest's own limits stay in force.
        self.saw(&message);
        self.inner
            .post_message_with_response_limits(uri, message, session_id, auth_header, custom_headers, limits)
    }

    fn delete_session(
        &self,
        uri: Arc<str>,
        session_id: Arc<str>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> impl Future<Output = Result<(), StreamableHttpError<Error>>> + Send + '_ {
        self.inner.delete_session(uri, session_id, auth_header, custom_headers)
    }

    fn get_stream(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> impl Future<Output = Result<BoxStream<'static, Result<sse_stream::Sse, SseError>>, StreamableHttpError<Error>>>
           + Send
           + '_ {
        self.inner
            .get_stream(uri, session_id, last_event_id, auth_header, custom_headers)
    }

    fn get_stream_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        max_sse_event_size: usize,
    ) -> impl Future<Output = Result<BoxStream<'static, Result<sse_stream::Sse, SseError>>, StreamableHttpError<Error>>>
           + Send
           + '_ {
        self.inner.get_stream_with_max_sse_event_size(
            uri,
            session_id,
            last_event_id,
            auth_header,
            custom_headers,
            max_sse_event_size,
        )
    }
}
