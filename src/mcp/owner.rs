//! An MCP session belongs to the principal that opened it. The transport only knows a session
//! by its id, so this middleware remembers who created each session (from the answer that
//! carries a new `Mcp-Session-Id`) and answers any request, stream, resumption or DELETE
//! naming that session on behalf of another principal as if the session did not exist (404).
//! A DELETE of a session nobody opened is 404 too, and a DELETE that ended one is 204.
//! With a shared token (or none) every caller is the same principal, as the token means.
//!
//! A session's event stream (its `GET`) is held open for as long as the client reads it, so
//! it counts against the principal's `--max-waits-per-principal`, like every other wait and
//! stream, and in `/healthz`'s `streams`, for exactly as long as its answer is being sent.
//!
//! Each session costs the relay memory until it ends, so a principal holds at most
//! `--max-sessions-per-principal` of them (both MCP faces together), and a token of one client
//! (a participant's, an OAuth connection's) at most `--max-sessions-per-participant`: an
//! `initialize` beyond that is refused (429 `too_many_sessions`) before rmcp makes the session. The session
//! manager ([`super::sessions::DisconnectAware`]) tells [`Owners`] of every session rmcp opens
//! and ends, and closes one that has not finished its handshake within [`INIT_GRACE`].

use crate::error::ApiError;
use crate::ops::{Ctx, Gauge, Held, Principal};
use actix_web::body::{BodySize, BoxBody, EitherBody, MessageBody};
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::{Method, StatusCode};
use actix_web::middleware::Next;
use actix_web::{web, HttpMessage, HttpResponse, ResponseError};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

/// Default of `--max-sessions-per-principal`: a large fleet behind one token, at about 50 KB
/// an idle session (docs/benchmarks.md).
pub const DEFAULT_MAX_SESSIONS: usize = 1024;
/// Default of `--max-sessions-per-participant`: one identity's agent, its reconnections and a
/// few hosts (rmcp closes a session idle for 5 minutes), at most about 3 MB idle.
pub const DEFAULT_MAX_SESSIONS_PER_PARTICIPANT: usize = 64;
/// The 429's code for an `initialize` beyond `--max-sessions-per-principal`.
pub const TOO_MANY_SESSIONS: &str = "too_many_sessions";
/// How long a new session may go without `notifications/initialized` (or any request) before
/// it is closed.
pub const INIT_GRACE: Duration = Duration::from_secs(10);

/// An event stream's answer, holding its principal's slot (and the streams gauge) until the
/// answer ends or the client goes.
pub struct Counted {
    body: BoxBody,
    _held: Held,
    _open: Gauge,
}

impl MessageBody for Counted {
    type Error = Box<dyn std::error::Error>;

    fn size(&self) -> BodySize {
        self.body.size()
    }

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<web::Bytes, Self::Error>>> {
        Pin::new(&mut self.get_mut().body).poll_next(cx)
    }
}

const SESSION_HEADER: &str = "mcp-session-id";

struct Session {
    principal: Principal,
    initialized: bool,
}

#[derive(Default)]
struct Table {
    sessions: HashMap<String, Session>,
    /// Per principal key: what it holds.
    counts: HashMap<String, Slots>,
}

/// A principal's slots: its live sessions, and its `initialize` requests in flight that have
/// no session yet. An `initialize` holds a slot while it is answered, and the session rmcp
/// opens for it takes that slot over ([`Owners::opened`]) rather than a second one: counted
/// twice, 1,000 agents behind one token initializing at once were refused at 1,024 while
/// they would hold 1,000 sessions (seen in the benchmark's row 11).
#[derive(Default, Debug, PartialEq)]
struct Slots {
    sessions: usize,
    initializing: usize,
    /// Slots of `initialize` requests still in flight that a session has taken over: their
    /// [`Reserved`] gives nothing back when it drops.
    handed_over: usize,
}

impl Slots {
    fn slots(&self) -> usize {
        self.sessions + self.initializing
    }
}

/// Changes `key`'s slots, and forgets the principal once it holds none.
fn change(counts: &mut HashMap<String, Slots>, key: &str, f: impl FnOnce(&mut Slots)) {
    let held = counts.entry(key.to_owned()).or_default();
    f(held);
    if *held == Slots::default() {
        counts.remove(key);
    }
}

/// Who opened each live MCP session (both faces), and how many each principal holds.
pub struct Owners {
    table: Mutex<Table>,
    /// Sessions the shared token (or, without tokens, everyone) may hold.
    max: usize,
    /// Sessions a token of one client may hold ([`Principal::is_one_client`]).
    max_one_client: usize,
    /// `/healthz`'s `sessions` and `sessions_initializing`.
    open: Arc<AtomicUsize>,
    initializing: Arc<AtomicUsize>,
}

impl Owners {
    pub fn new(max: usize, max_one_client: usize, cx: &Ctx) -> Owners {
        Owners {
            table: Default::default(),
            max: max.max(1),
            max_one_client: max_one_client.max(1),
            open: cx.mcp_sessions.clone(),
            initializing: cx.mcp_initializing.clone(),
        }
    }

    /// Who opened session `session`, while it is open.
    pub fn owner(&self, session: &str) -> Option<Principal> {
        self.table.lock().sessions.get(session).map(|s| s.principal.clone())
    }

    /// The most sessions `p` may hold, and the setting that says so: a token of one client
    /// is held to the lower of the two.
    fn limit(&self, p: &Principal) -> (usize, &'static str) {
        if p.is_one_client() && self.max_one_client <= self.max {
            (self.max_one_client, "--max-sessions-per-participant")
        } else {
            (self.max, "--max-sessions-per-principal")
        }
    }

    /// Takes one of `p`'s slots for an `initialize` in flight, or refuses.
    fn reserve(this: &Arc<Owners>, p: &Principal) -> Result<Reserved, ApiError> {
        let key = p.key().to_owned();
        let (max, setting) = this.limit(p);
        let mut t = this.table.lock();
        let held = t.counts.get(&key).map_or(0, Slots::slots);
        if held >= max {
            let mut e = ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                TOO_MANY_SESSIONS,
                format!(
                    "{} holds {max} MCP sessions open, the most it may ({setting}): \
                     reuse one, or end one (DELETE with its Mcp-Session-Id)",
                    p.name(),
                ),
            );
            e.retry_after = Some(INIT_GRACE.as_secs() as u32);
            return Err(e);
        }
        change(&mut t.counts, &key, |h| h.initializing += 1);
        Ok(Reserved {
            owners: this.clone(),
            key,
        })
    }

    /// rmcp opened session `id` for `p`.
    pub fn opened(&self, id: &str, p: Principal) {
        let mut t = self.table.lock();
        if t.sessions.contains_key(id) {
            return;
        }
        change(&mut t.counts, p.key(), |h| {
            h.sessions += 1;
            if h.initializing > 0 {
                h.initializing -= 1;
                h.handed_over += 1;
            }
        });
        t.sessions.insert(
            id.to_owned(),
            Session {
                principal: p,
                initialized: false,
            },
        );
        self.open.fetch_add(1, Relaxed);
        self.initializing.fetch_add(1, Relaxed);
    }

    /// Session `id` finished its handshake (or is plainly in use).
    pub fn initialized(&self, id: &str) {
        if let Some(s) = self.table.lock().sessions.get_mut(id) {
            if !s.initialized {
                s.initialized = true;
                self.initializing.fetch_sub(1, Relaxed);
            }
        }
    }

    /// Whether session `id` is open and has not finished its handshake.
    pub fn initializing(&self, id: &str) -> bool {
        self.table.lock().sessions.get(id).is_some_and(|s| !s.initialized)
    }

    /// Session `id` ended, however it did; calling it again does nothing.
    pub fn closed(&self, id: &str) {
        let mut t = self.table.lock();
        let Some(s) = t.sessions.remove(id) else { return };
        change(&mut t.counts, s.principal.key(), |h| {
            h.sessions = h.sessions.saturating_sub(1)
        });
        self.open.fetch_sub(1, Relaxed);
        if !s.initialized {
            self.initializing.fetch_sub(1, Relaxed);
        }
    }
}

/// An `initialize` in flight, holding one of its principal's slots until it is answered or
/// the session rmcp opens for it takes the slot over.
struct Reserved {
    owners: Arc<Owners>,
    key: String,
}

impl Drop for Reserved {
    fn drop(&mut self) {
        change(&mut self.owners.table.lock().counts, &self.key, |h| {
            if h.handed_over > 0 {
                h.handed_over -= 1;
            } else {
                h.initializing = h.initializing.saturating_sub(1);
            }
        });
    }
}

/// Whether a POST is, or may be, an `initialize` request. A request that names its method in
/// `Mcp-Method` (every 2026-07-28 request) is taken at its word, since rmcp refuses an
/// `initialize` whose header says otherwise: a stateless client's every request is not
/// parsed twice. Otherwise the body is read: one that does not parse (a batch, duplicate
/// keys) counts, so nothing slips past.
fn may_initialize(req: &ServiceRequest) -> bool {
    let mut named = req.headers().get_all("mcp-method").peekable();
    if named.peek().is_some() {
        return named.any(|v| v.to_str().is_ok_and(|m| m.trim().eq_ignore_ascii_case("initialize")));
    }
    #[derive(serde::Deserialize)]
    struct Probe {
        method: Option<String>,
        id: Option<serde::de::IgnoredAny>,
    }
    let ext = req.extensions();
    let Some(body) = ext.get::<crate::http::Body>() else {
        return true;
    };
    serde_json::from_slice::<Probe>(&body.0)
        .map_or(true, |p| p.id.is_some() && p.method.as_deref() == Some("initialize"))
}

pub async fn bind(
    req: ServiceRequest,
    next: Next<impl MessageBody + 'static>,
) -> Result<ServiceResponse<EitherBody<impl MessageBody>>, actix_web::Error> {
    let Some(owners) = req.app_data::<web::Data<Owners>>().cloned() else {
        let res = next.call(req).await?;
        return Ok(res.map_body(|_, body| EitherBody::left(EitherBody::right(body))));
    };
    let principal = req
        .extensions()
        .get::<Principal>()
        .cloned()
        .unwrap_or(Principal::Anyone);
    let session = req
        .headers()
        .get(SESSION_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    if let Some(s) = &session {
        if owners.owner(s).is_some_and(|owner| owner != principal) {
            let e = ApiError::new(StatusCode::NOT_FOUND, "not_found", "Session not found");
            return Ok(req.into_response(e.error_response()).map_into_right_body());
        }
    }
    let deleting = req.method() == Method::DELETE;
    if deleting && session.as_deref().is_some_and(|s| owners.owner(s).is_none()) {
        // rmcp answers 202 to any DELETE; a session nobody opened (or already ended) is 404.
        let e = ApiError::new(StatusCode::NOT_FOUND, "not_found", "Session not found");
        return Ok(req.into_response(e.error_response()).map_into_right_body());
    }
    // An `initialize` without a session makes rmcp open one: it takes a slot first.
    let _initializing = if session.is_none() && req.method() == Method::POST && may_initialize(&req) {
        match Owners::reserve(&owners.clone().into_inner(), &principal) {
            Ok(r) => Some(r),
            Err(e) => {
                crate::guard::rejected(TOO_MANY_SESSIONS);
                return Ok(req.into_response(e.error_response()).map_into_right_body());
            }
        }
    } else {
        None
    };
    // A GET opens the session's event stream: it takes one of the principal's slots.
    let stream = match (req.method() == Method::GET, req.app_data::<web::Data<Ctx>>()) {
        (true, Some(cx)) => match cx.hold(&principal) {
            Ok(held) => Some((held, Gauge::enter(&cx.streams))),
            Err(e) => {
                return Ok(req
                    .into_response(ApiError::from(e).error_response())
                    .map_into_right_body());
            }
        },
        _ => None,
    };
    let res = next.call(req).await?;
    if deleting && res.status() == StatusCode::ACCEPTED {
        // The session is gone when the DELETE returns: 204, which every SDK accepts (the
        // Python SDK warns on 202). A 204 has no body: rmcp's empty chunked one, kept, reached
        // the wire as a stray `0\r\n\r\n` that the client read as the next answer's start.
        let gone = HttpResponse::NoContent().finish();
        return Ok(res.into_response(gone).map_into_right_body());
    }
    Ok(match stream {
        Some((held, open)) => res.map_body(|_, body| {
            EitherBody::left(EitherBody::left(Counted {
                body: body.boxed(),
                _held: held,
                _open: open,
            }))
        }),
        None => res.map_body(|_, body| EitherBody::left(EitherBody::right(body))),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owners(max: usize) -> Arc<Owners> {
        Arc::new(Owners {
            table: Default::default(),
            max,
            max_one_client: max,
            open: Default::default(),
            initializing: Default::default(),
        })
    }

    fn slots(o: &Owners) -> usize {
        o.table
            .lock()
            .counts
            .get(Principal::Anyone.key())
            .map_or(0, Slots::slots)
    }

    /// Agents initializing at once each hold one slot, whether or not rmcp has opened their
    /// session yet: three sessions opened of a limit of four leave room for a fourth.
    #[test]
    fn a_session_takes_over_the_slot_of_its_initialize() {
        let o = owners(4);
        let p = Principal::Anyone;
        let inits: Vec<Reserved> = (0..3).map(|_| Owners::reserve(&o, &p).unwrap()).collect();
        for i in 0..3 {
            o.opened(&format!("s{i}"), p.clone());
        }
        assert_eq!(slots(&o), 3, "three sessions, their initializes still being answered");
        let fourth = Owners::reserve(&o, &p).expect("a fourth fits");
        assert!(Owners::reserve(&o, &p).is_err(), "a fifth does not");
        drop(inits);
        assert_eq!(slots(&o), 4);
        drop(fourth);
        assert_eq!(slots(&o), 3);
        for i in 0..3 {
            o.closed(&format!("s{i}"));
        }
        assert!(o.table.lock().counts.is_empty(), "{:?}", o.table.lock().counts.keys());
    }

    /// An `initialize` that opens no session gives its slot back, whichever of several in
    /// flight ends first; a session opened with no `initialize` in flight takes a slot of its own.
    #[test]
    fn slots_come_back_however_the_initializes_end() {
        let o = owners(2);
        let p = Principal::Anyone;
        let (failed, made) = (Owners::reserve(&o, &p).unwrap(), Owners::reserve(&o, &p).unwrap());
        assert!(Owners::reserve(&o, &p).is_err());
        o.opened("made", p.clone());
        drop(failed);
        assert_eq!(slots(&o), 2, "the session and the initialize still answering");
        drop(made);
        assert_eq!(slots(&o), 1);
        o.opened("resumed", p.clone());
        assert_eq!(slots(&o), 2);
        assert!(Owners::reserve(&o, &p).is_err());
        o.closed("made");
        o.closed("resumed");
        o.closed("resumed");
        assert!(o.table.lock().counts.is_empty());
    }
}
