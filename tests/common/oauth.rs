//! The OAuth flow (`serve --oauth`) as a test walks it over HTTP, on any relay or node: the
//! admin mints an invite bound to an identity, one registered client consents with it and
//! exchanges the code; refreshes, revocations, and whether a token still works. Used by
//! `tests/it/oauth.rs` on a lone relay and `tests/nats/` across two nodes.

use super::{builder, client_with_token, request, Server};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::time::Duration;

/// Where the test client says codes go (nothing listens: the tests read the redirect).
pub const REDIRECT: &str = "http://127.0.0.1:9/cb";

/// A form body.
pub fn form(pairs: &[(&str, &str)]) -> String {
    let mut e = form_urlencoded::Serializer::new(String::new());
    for (k, v) in pairs {
        e.append_pair(k, v);
    }
    e.finish()
}

/// One registered client, and the admin who mints its invites.
pub struct Flow {
    pub admin: reqwest::Client,
    /// Follows no redirect: the consent's answer is read, not followed.
    pub plain: reqwest::Client,
    pub client_id: String,
    pub verifier: String,
}

/// An access and a refresh token.
#[derive(Debug, Clone)]
pub struct Tokens {
    pub access: String,
    pub refresh: String,
}

impl Tokens {
    pub fn of(v: &Value) -> Tokens {
        Tokens {
            access: v["access_token"].as_str().unwrap_or_else(|| panic!("{v}")).to_owned(),
            refresh: v["refresh_token"].as_str().unwrap_or_else(|| panic!("{v}")).to_owned(),
        }
    }
}

impl Flow {
    /// Registers a client on `s`.
    pub async fn new(s: &Server, admin_token: &str) -> Flow {
        let plain = builder()
            .redirect(reqwest::redirect::Policy::none())
            .timeout(Duration::from_secs(60))
            .pool_max_idle_per_host(256)
            .build()
            .unwrap();
        let (status, reg) = request(
            &plain,
            "POST",
            &s.url("/oauth/register"),
            Some(json!({"client_name": "Race Host", "redirect_uris": [REDIRECT]})),
            None,
        )
        .await;
        assert_eq!(status, 201, "{reg}");
        Flow {
            admin: client_with_token(admin_token),
            plain,
            client_id: reg["client_id"].as_str().unwrap().to_owned(),
            verifier: "r".repeat(43),
        }
    }

    /// A consent on `s` with a fresh invite for `identity`: the authorization code.
    pub async fn code(&self, s: &Server, identity: &str) -> String {
        self.code_for(s, json!({ "as": identity })).await
    }

    /// A whole consent on `s` with an invite that binds no identity (the connection may act as
    /// anyone, as the admin's token does): its first tokens.
    pub async fn connect_as_anyone(&self, s: &Server) -> Tokens {
        let code = self.code_for(s, json!({})).await;
        let (status, v) = self.exchange(s, &code).await;
        assert_eq!(status, 200, "{v}");
        Tokens::of(&v)
    }

    /// A consent on `s` with a fresh invite made of `invite`: the authorization code.
    async fn code_for(&self, s: &Server, invite: Value) -> String {
        let (status, invite) = request(&self.admin, "POST", &s.url("/api/oauth/invites"), Some(invite), None).await;
        assert_eq!(status, 201, "{invite}");
        let challenge = crosstalk::ops::oauth::s256(&self.verifier);
        let pairs = [
            ("response_type", "code"),
            ("client_id", self.client_id.as_str()),
            ("redirect_uri", REDIRECT),
            ("code_challenge", challenge.as_str()),
            ("code_challenge_method", "S256"),
            ("invite_code", invite["code"].as_str().unwrap()),
        ];
        let r = self
            .plain
            .post(s.url("/oauth/authorize"))
            .header("origin", s.url("").trim_end_matches('/'))
            .header("content-type", "application/x-www-form-urlencoded")
            .body(form(&pairs))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 303, "{}", r.text().await.unwrap_or_default());
        let location = r.headers()["location"].to_str().unwrap().to_owned();
        let query: HashMap<String, String> = form_urlencoded::parse(location.split_once('?').unwrap().1.as_bytes())
            .into_owned()
            .collect();
        query["code"].clone()
    }

    /// Posts `pairs` to `s`'s token endpoint: the status and the JSON answer.
    pub async fn token(&self, s: &Server, pairs: &[(&str, &str)]) -> (u16, Value) {
        let r = self
            .plain
            .post(s.url("/oauth/token"))
            .header("content-type", "application/x-www-form-urlencoded")
            .body(form(pairs))
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(Value::Null))
    }

    /// Exchanges `code` on `s`.
    pub async fn exchange(&self, s: &Server, code: &str) -> (u16, Value) {
        let pairs = [
            ("grant_type", "authorization_code"),
            ("code", code),
            ("redirect_uri", REDIRECT),
            ("code_verifier", self.verifier.as_str()),
            ("client_id", self.client_id.as_str()),
        ];
        self.token(s, &pairs).await
    }

    /// Refreshes with `refresh` on `s`.
    pub async fn refresh(&self, s: &Server, refresh: &str) -> (u16, Value) {
        let pairs = [
            ("grant_type", "refresh_token"),
            ("refresh_token", refresh),
            ("client_id", self.client_id.as_str()),
        ];
        self.token(s, &pairs).await
    }

    /// A whole consent on `s` as `identity`: its first tokens.
    pub async fn connect(&self, s: &Server, identity: &str) -> Tokens {
        let code = self.code(s, identity).await;
        let (status, v) = self.exchange(s, &code).await;
        assert_eq!(status, 200, "{v}");
        Tokens::of(&v)
    }

    /// The grant ids by the identity each acts as (`crosstalk clients`).
    pub async fn grants(&self, s: &Server) -> HashMap<String, String> {
        let (status, list) = request(&self.admin, "GET", &s.url("/api/oauth/clients"), None, None).await;
        assert_eq!(status, 200, "{list}");
        list["clients"]
            .as_array()
            .unwrap()
            .iter()
            .map(|g| {
                (
                    g["as"].as_str().unwrap_or_default().to_owned(),
                    g["grant"].as_str().unwrap().to_owned(),
                )
            })
            .collect()
    }

    /// The admin's `DELETE /api/oauth/clients/{grant}` on `s`: its status.
    pub async fn revoke(&self, s: &Server, grant: &str) -> u16 {
        request(
            &self.admin,
            "DELETE",
            &s.url(&format!("/api/oauth/clients/{grant}")),
            None,
            None,
        )
        .await
        .0
    }
}

/// The status `GET /api/channels` answers `access` on `s`: 200 while it works, 401 once not.
pub async fn works(s: &Server, access: &str) -> u16 {
    request(&client_with_token(access), "GET", &s.url("/api/channels"), None, None)
        .await
        .0
}

/// Waits (at most 3 s: a node may read a replica a moment behind) until `access` is refused
/// on `s`; its last status.
pub async fn until_refused(c: &reqwest::Client, s: &Server, access: &str) -> u16 {
    let deadline = std::time::Instant::now() + Duration::from_secs(3);
    loop {
        let r = c.get(s.url("/api/channels")).bearer_auth(access).send().await.unwrap();
        let status = r.status().as_u16();
        if status == 401 || std::time::Instant::now() > deadline {
            return status;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The failures of `checks` (what it means, and an access token that must be refused), each
/// tried on `a` and `b` at once.
async fn still_working(a: &Server, b: &Server, checks: Vec<(String, String)>) -> Vec<String> {
    let c = super::client();
    let tried = checks.iter().flat_map(|(what, access)| {
        let c = &c;
        [a, b].map(|s| async move { (until_refused(c, s, access).await != 401).then(|| what.clone()) })
    });
    let mut failed: Vec<String> = futures_util::future::join_all(tried)
        .await
        .into_iter()
        .flatten()
        .collect();
    failed.dedup();
    failed
}

/// Fails with every race lost, if any was.
fn lost_races(mut lost: Vec<String>, races: usize) {
    lost.sort();
    lost.dedup();
    let mut which: Vec<&str> = lost.iter().filter_map(|l| l.split(':').next()).collect();
    which.dedup();
    assert!(
        lost.is_empty(),
        "{} of {races} races lost:\n{}",
        which.len(),
        lost.join("\n")
    );
}

/// Races run at once: enough to overlap on two cores, few enough that each race's own steps
/// still interleave as a client and an admin would.
pub const AT_ONCE: usize = 20;
/// Refreshes one client makes in a loop before a race gives up on the revocation winning.
const REFRESH_LOOP: usize = 40;

/// `races` times: a client refreshes in a loop on `a` while the admin revokes its grant on
/// `b`. The revocation must win every time: the admin is answered 204, the grant is never
/// listed again, and no token the client got works, on either relay.
pub async fn revocation_races(a: &Server, b: &Server, admin_token: &str, races: usize) {
    let flow = Flow::new(a, admin_token).await;
    let mut lost = Vec::new();
    for batch in (0..races).collect::<Vec<_>>().chunks(AT_ONCE) {
        let mut first = Vec::new();
        for i in batch {
            first.push(flow.connect(a, &format!("rev-{i}")).await);
        }
        let grants = flow.grants(b).await;
        let runs = batch.iter().zip(first).map(|(i, tokens)| {
            let (flow, grant) = (&flow, grants[&format!("rev-{i}")].clone());
            async move {
                let refresher = async {
                    let mut issued = vec![tokens.access.clone()];
                    let mut current = tokens.clone();
                    for _ in 0..REFRESH_LOOP {
                        let (status, v) = flow.refresh(a, &current.refresh).await;
                        if status != 200 {
                            break;
                        }
                        current = Tokens::of(&v);
                        issued.push(current.access.clone());
                    }
                    issued
                };
                let revoker = async {
                    // Into the loop, at a different point in each race.
                    tokio::time::sleep(Duration::from_millis((*i as u64 * 7) % 40)).await;
                    flow.revoke(b, &grant).await
                };
                let (issued, revoked) = tokio::join!(refresher, revoker);
                (*i, grant, issued, revoked)
            }
        });
        let mut checks = Vec::new();
        for (i, grant, issued, revoked) in futures_util::future::join_all(runs).await {
            assert_eq!(revoked, 204, "race {i}: the revocation was not answered 204");
            for access in issued {
                checks.push((
                    format!("race {i}: a token of revoked grant {grant} still works"),
                    access,
                ));
            }
        }
        lost.extend(still_working(a, b, checks).await);
        let left = flow.grants(b).await;
        for i in batch {
            if left.contains_key(&format!("rev-{i}")) {
                lost.push(format!("race {i}: the revoked grant is listed again"));
            }
        }
    }
    lost_races(lost, races);
}

/// `races` times: one refresh token used three times at once, on `a`, `b` and `a`. At most
/// one refresh is answered with tokens, the reuse ends the grant every time, and the tokens
/// the winner got do not work, on either relay.
pub async fn reuse_races(a: &Server, b: &Server, admin_token: &str, races: usize) {
    let flow = Flow::new(a, admin_token).await;
    let mut lost = Vec::new();
    for batch in (0..races).collect::<Vec<_>>().chunks(AT_ONCE) {
        let mut first = Vec::new();
        for i in batch {
            first.push(flow.connect(a, &format!("reuse-{i}")).await);
        }
        let runs = batch.iter().zip(first).map(|(i, tokens)| {
            let flow = &flow;
            async move {
                let (x, y, z) = tokio::join!(
                    flow.refresh(a, &tokens.refresh),
                    flow.refresh(b, &tokens.refresh),
                    flow.refresh(a, &tokens.refresh),
                );
                (*i, tokens, [x, y, z])
            }
        });
        let mut checks = Vec::new();
        for (i, tokens, answers) in futures_util::future::join_all(runs).await {
            let won: Vec<&Value> = answers.iter().filter(|(s, _)| *s == 200).map(|(_, v)| v).collect();
            if won.len() > 1 {
                lost.push(format!("race {i}: {} refreshes with one token got tokens", won.len()));
            }
            for (status, v) in &answers {
                if *status != 200 && v["error"] != "invalid_grant" {
                    lost.push(format!("race {i}: a refresh answered {status} {v}"));
                }
            }
            let issued = won.iter().map(|v| Tokens::of(v).access).chain([tokens.access.clone()]);
            for access in issued {
                checks.push((
                    format!("race {i}: a token still works after its refresh token was reused"),
                    access,
                ));
            }
        }
        lost.extend(still_working(a, b, checks).await);
        let left = flow.grants(b).await;
        for i in batch {
            if left.contains_key(&format!("reuse-{i}")) {
                lost.push(format!("race {i}: the reuse did not end the grant"));
            }
        }
    }
    lost_races(lost, races);
}

/// `races` times: one authorization code exchanged twice at once, on `a` and `b`. At most one
/// exchange is answered with tokens, and the second ends the grant the first made: no token
/// issued from the code works, on either relay.
pub async fn code_races(a: &Server, b: &Server, admin_token: &str, races: usize) {
    let flow = Flow::new(a, admin_token).await;
    let mut lost = Vec::new();
    for batch in (0..races).collect::<Vec<_>>().chunks(AT_ONCE) {
        let mut codes = Vec::new();
        for i in batch {
            codes.push(flow.code(a, &format!("code-{i}")).await);
        }
        let runs = batch.iter().zip(codes).map(|(i, code)| {
            let flow = &flow;
            async move {
                let (x, y) = tokio::join!(flow.exchange(a, &code), flow.exchange(b, &code));
                (*i, [x, y])
            }
        });
        let mut checks = Vec::new();
        for (i, answers) in futures_util::future::join_all(runs).await {
            let won: Vec<&Value> = answers.iter().filter(|(s, _)| *s == 200).map(|(_, v)| v).collect();
            if won.len() > 1 {
                lost.push(format!("race {i}: both exchanges of one code got tokens"));
            }
            for (status, v) in &answers {
                if *status != 200 && v["error"] != "invalid_grant" {
                    lost.push(format!("race {i}: an exchange answered {status} {v}"));
                }
            }
            for v in won {
                checks.push((
                    format!(
                        "race {i}: a token from a code used twice still works (answers: {:?})",
                        answers
                            .iter()
                            .map(|(s, v)| format!("{s} {}", v["error_description"]))
                            .collect::<Vec<_>>()
                    ),
                    Tokens::of(v).access,
                ));
            }
        }
        lost.extend(still_working(a, b, checks).await);
        let left = flow.grants(b).await;
        for i in batch {
            if left.contains_key(&format!("code-{i}")) {
                lost.push(format!("race {i}: the grant of a code used twice is listed"));
            }
        }
    }
    lost_races(lost, races);
}

/// Whether `r`'s body ends (as a stream ends) within `within`; what it sent meanwhile.
pub async fn ends_within(r: &mut reqwest::Response, within: Duration) -> (bool, String) {
    let mut seen = String::new();
    let read = async {
        while let Ok(Some(chunk)) = r.chunk().await {
            seen.push_str(&String::from_utf8_lossy(&chunk));
        }
    };
    let ended = tokio::time::timeout(within, read).await.is_ok();
    (ended, seen)
}

/// How long after a revocation a token's streams and waits may go on: the relay checks them
/// again every second.
pub const ENDS_WITHIN: Duration = Duration::from_secs(5);

/// Everything long-lived a token opened on `a` — an SSE stream, a long-poll, an MCP session's
/// event stream (`GET /mcp`) and a `wait_for_message` call in flight — ends within
/// [`ENDS_WITHIN`] of its grant being revoked on `b`: a stream as a stream ends, the long-poll
/// with 401. Before that, the stream delivers.
pub async fn revoked_streams_end(a: &Server, b: &Server, admin_token: &str) {
    use super::mcp::{Mcp, LEGACY};
    let flow = Flow::new(a, admin_token).await;
    let tokens = flow.connect(a, "streamer").await;
    let grant = flow.grants(b).await["streamer"].clone();
    let c = client_with_token(&tokens.access);
    let mut sse = c
        .get(a.url("/api/channels/live/stream"))
        .timeout(Duration::from_secs(60))
        .send()
        .await
        .unwrap();
    assert_eq!(sse.status(), 200);
    let posted = super::post(&c, a, "live", super::msg("streamer", "while good")).await;
    let mut delivered = String::new();
    while !delivered.contains("while good") {
        let chunk = tokio::time::timeout(Duration::from_secs(10), sse.chunk()).await;
        delivered.push_str(&String::from_utf8_lossy(&chunk.unwrap().unwrap().unwrap()));
    }
    let since = posted["id"].as_u64().unwrap();
    let long_poll = tokio::spawn({
        let (c, url) = (
            c.clone(),
            a.url(&format!("/api/channels/live/wait?since_id={since}&timeout_s=60")),
        );
        async move {
            let r = c.get(url).send().await.unwrap();
            let challenge = r
                .headers()
                .get("www-authenticate")
                .map(|v| v.to_str().unwrap().to_owned());
            (r.status().as_u16(), challenge, std::time::Instant::now())
        }
    });
    let m = Mcp::connect_with(a, c.clone()).await;
    let mut events = c
        .get(a.url("/mcp"))
        .header("accept", "text/event-stream")
        .header("mcp-session-id", m.session.clone().unwrap())
        .header("mcp-protocol-version", LEGACY)
        .timeout(Duration::from_secs(60))
        .send()
        .await
        .unwrap();
    assert_eq!(events.status(), 200);
    let id = m.next_id();
    let body = m.request_body(
        id,
        "tools/call",
        json!({"name": "wait_for_message", "arguments": {"channel": "quiet", "timeout_s": 60}}),
    );
    let mut call = m.post_raw(&body).timeout(Duration::from_secs(60)).send().await.unwrap();
    assert_eq!(call.status(), 200);
    // The long-poll and the tool call's wait are parked.
    super::until_waits(&super::client(), a.url("").trim_end_matches('/'), 2).await;

    assert_eq!(flow.revoke(b, &grant).await, 204);
    let revoked = std::time::Instant::now();
    let ((sse_ended, _), (events_ended, _), (call_ended, answer), polled) = tokio::join!(
        ends_within(&mut sse, ENDS_WITHIN),
        ends_within(&mut events, ENDS_WITHIN),
        ends_within(&mut call, ENDS_WITHIN),
        long_poll,
    );
    assert!(sse_ended, "the SSE stream outlived its revoked token");
    assert!(events_ended, "the MCP event stream outlived its revoked token");
    assert!(call_ended, "a wait_for_message call outlived its revoked token");
    assert!(
        !answer.contains("\"result\""),
        "the call answered after the revocation: {answer}"
    );
    let (status, challenge, at) = polled.unwrap();
    assert_eq!(status, 401, "the long-poll");
    assert!(challenge.unwrap_or_default().contains("invalid_token"));
    assert!(
        at.duration_since(revoked) < ENDS_WITHIN,
        "the long-poll outlived its token"
    );
    // And nothing is left parked behind them on the relay: the tool call's wait is cancelled
    // once its stream has been gone for the resume grace.
    super::until_waits(&super::client(), a.url("").trim_end_matches('/'), 0).await;
}
