//! `crosstalk serve --oauth`: the whole flow a hosted MCP client walks — the 401 that points
//! at the metadata, the metadata, registration, the consent page with an invite from
//! `crosstalk invite`, the code exchange with PKCE, MCP and REST with the token, refresh with
//! rotation and reuse detection, revocation — each refusal on the way, and what survives a
//! restart. The SDK clients that walk it on their own are in `oauth_clients.rs`.

use crate::common;

use common::{builder, client, client_with_token, Server};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::time::Duration;

const ADMIN: &str = "admin-s3cret";
const REDIRECT: &str = "http://127.0.0.1:9/callback";

fn no_redirects() -> reqwest::Client {
    builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap()
}

fn encoded<K: AsRef<str>, V: AsRef<str>>(pairs: &[(K, V)]) -> String {
    let mut e = form_urlencoded::Serializer::new(String::new());
    for (k, v) in pairs {
        e.append_pair(k.as_ref(), v.as_ref());
    }
    e.finish()
}

/// `path?pairs` on the relay.
fn with_query(s: &Server, path: &str, pairs: &[(String, String)]) -> String {
    format!("{}?{}", s.url(path), encoded(pairs))
}

fn s256(verifier: &str) -> String {
    crosstalk::ops::oauth::s256(verifier)
}

/// `crosstalk invite` against the relay: the code on the last line of stdout.
pub fn invite(s: &Server, args: &[&str]) -> String {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_crosstalk"))
        .args(["invite", "--relay", &s.url(""), "--token", ADMIN])
        .args(args)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8(out.stdout).unwrap();
    stdout.lines().last().unwrap().trim().to_owned()
}

async fn register(s: &Server, redirect: &str) -> String {
    let r = client()
        .post(s.url("/oauth/register"))
        .json(&json!({"client_name": "Test Host", "redirect_uris": [redirect]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["redirect_uris"], json!([redirect]), "{v}");
    assert_eq!(v["token_endpoint_auth_method"], "none", "{v}");
    assert!(v.get("client_secret").is_none(), "{v}");
    v["client_id"].as_str().unwrap().to_owned()
}

fn authorize_params(client_id: &str, verifier: &str, state: &str) -> Vec<(String, String)> {
    [
        ("response_type", "code"),
        ("client_id", client_id),
        ("redirect_uri", REDIRECT),
        ("state", state),
        ("code_challenge", &s256(verifier)),
        ("code_challenge_method", "S256"),
        ("scope", "crosstalk"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

/// Submits the consent form with `invite_code`: the status and the redirect's query.
async fn consent(s: &Server, params: &[(String, String)], invite_code: &str) -> (u16, HashMap<String, String>, String) {
    let mut form = params.to_vec();
    form.push(("invite_code".into(), invite_code.into()));
    let r = no_redirects()
        .post(s.url("/oauth/authorize"))
        .header("origin", s.url("").trim_end_matches('/'))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(encoded(&form))
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let location = r
        .headers()
        .get("location")
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    let query = location
        .split_once('?')
        .map(|(_, q)| form_urlencoded::parse(q.as_bytes()).into_owned().collect())
        .unwrap_or_default();
    (status, query, r.text().await.unwrap_or_default())
}

async fn token(s: &Server, form: &[(&str, &str)]) -> (u16, Value) {
    let r = client()
        .post(s.url("/oauth/token"))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(encoded(form))
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

/// A full consent: register, authorize with `invite_code`, exchange. The tokens.
pub async fn connect(s: &Server, invite_code: &str) -> (String, Value) {
    let client_id = register(s, REDIRECT).await;
    let verifier = "v".repeat(43) + "-verifier";
    let params = authorize_params(&client_id, &verifier, "st");
    let (status, q, page) = consent(s, &params, invite_code).await;
    assert_eq!(status, 303, "{page}");
    let (st, tokens) = token(
        s,
        &[
            ("grant_type", "authorization_code"),
            ("code", &q["code"]),
            ("redirect_uri", REDIRECT),
            ("code_verifier", &verifier),
            ("client_id", &client_id),
        ],
    )
    .await;
    assert_eq!(st, 200, "{tokens}");
    (client_id, tokens)
}

/// A GET's JSON answer.
async fn json_at(s: &Server, path: &str) -> Value {
    client().get(s.url(path)).send().await.unwrap().json().await.unwrap()
}

async fn post_as(token: &str, s: &Server, sender: &str) -> u16 {
    client_with_token(token)
        .post(s.url("/api/channels/ops/messages"))
        .json(&json!({"sender": sender, "body": "hello"}))
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

#[tokio::test]
async fn a_hosted_client_connects_with_an_invite() {
    let s = Server::start_with(&["--oauth", "--token", ADMIN]);
    let issuer = s.url("");
    let issuer = issuer.trim_end_matches('/');
    let http = client();

    // An MCP request without a token: 401, and where the metadata is.
    let r = http
        .post(s.url("/mcp"))
        .header("accept", "application/json, text/event-stream")
        .json(&json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    let challenge = r.headers()["www-authenticate"].to_str().unwrap().to_owned();
    assert_eq!(
        challenge,
        format!("Bearer resource_metadata=\"{issuer}/.well-known/oauth-protected-resource/mcp\", scope=\"crosstalk\"")
    );
    let r = http.get(s.url("/cc/api/channels")).send().await.unwrap();
    assert!(r.headers()["www-authenticate"]
        .to_str()
        .unwrap()
        .contains("/.well-known/oauth-protected-resource\""));

    // The metadata.
    let prm: Value = json_at(&s, "/.well-known/oauth-protected-resource/mcp").await;
    assert_eq!(prm["resource"], format!("{issuer}/mcp"));
    assert_eq!(prm["authorization_servers"], json!([issuer]));
    let cc: Value = json_at(&s, "/.well-known/oauth-protected-resource/cc/mcp").await;
    assert_eq!(cc["resource"], format!("{issuer}/cc/mcp"));
    let asm: Value = json_at(&s, "/.well-known/oauth-authorization-server").await;
    assert_eq!(asm["issuer"], issuer);
    assert_eq!(asm["code_challenge_methods_supported"], json!(["S256"]));
    assert_eq!(asm["token_endpoint"], format!("{issuer}/oauth/token"));
    assert_eq!(asm["authorization_response_iss_parameter_supported"], true);

    // Registration refuses a redirect URI the relay would not send codes to.
    let r = http
        .post(s.url("/oauth/register"))
        .json(&json!({"redirect_uris": ["http://evil.example/cb"]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    assert_eq!(r.json::<Value>().await.unwrap()["error"], "invalid_redirect_uri");
    let client_id = register(&s, REDIRECT).await;

    // The consent page: a plain form, one text field.
    let verifier = "x".repeat(50);
    let params = authorize_params(&client_id, &verifier, "state-1");
    let r = http
        .get(with_query(&s, "/oauth/authorize", &params))
        .header("sec-fetch-site", "cross-site")
        .header("sec-fetch-mode", "navigate")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let page = r.text().await.unwrap();
    assert_eq!(page.matches("type=\"text\"").count(), 1, "{page}");
    assert!(page.contains("Test Host") && page.contains("127.0.0.1"), "{page}");
    // A client not registered, or a redirect it did not register: the relay's own page.
    let mut wrong = params.clone();
    wrong[2].1 = "http://127.0.0.1:9/elsewhere".into();
    let r = http
        .get(with_query(&s, "/oauth/authorize", &wrong))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    // No PKCE: the relay's own page says so; nothing goes to the client before a consent.
    let mut plain = params.clone();
    plain.retain(|(k, _)| !k.starts_with("code_challenge"));
    let r = no_redirects()
        .get(with_query(&s, "/oauth/authorize", &plain))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    assert!(r.headers().get("location").is_none());
    assert!(r.text().await.unwrap().contains("PKCE is required"));

    // A wrong code is refused on the page; the invite `crosstalk invite` minted works once.
    let code = invite(&s, &["--as", "worker-7"]);
    assert_eq!(code.len(), 11, "{code}");
    let (st, _, page) = consent(&s, &params, "AAAAA-AAAAA").await;
    assert_eq!(st, 400);
    assert!(page.contains("not valid"), "{page}");
    let (st, q, page) = consent(&s, &params, &code.to_lowercase()).await;
    assert_eq!(st, 303, "{page}");
    assert_eq!(q["state"], "state-1");
    assert_eq!(q["iss"], issuer);
    let (st, _, _) = consent(&s, &params, &code).await;
    assert_eq!(st, 400, "an invite is good once");

    // The exchange: the verifier must match, the client must be known.
    let s = &s;
    let exchange = |verifier: String, client: String, code: String| async move {
        token(
            s,
            &[
                ("grant_type", "authorization_code"),
                ("code", &code),
                ("redirect_uri", REDIRECT),
                ("code_verifier", &verifier),
                ("client_id", &client),
            ],
        )
        .await
    };
    // Unknown, and ids no client could have (on a cluster a key is a subject: no wildcard
    // there may match another client's record, and no empty token may reach the servers).
    for nobody in ["ct_c_nobody", "ct_c_x.>", "ct_c_x.*", "ct_c_a..b", "ct_c_ a"] {
        let (st, e) = exchange(verifier.clone(), nobody.into(), q["code"].clone()).await;
        assert_eq!(
            (st, e["error"].as_str()),
            (401, Some("invalid_client")),
            "{nobody}: {e}"
        );
    }
    let (st, tokens) = exchange(verifier.clone(), client_id.clone(), q["code"].clone()).await;
    assert_eq!(st, 200, "{tokens}");
    assert_eq!(tokens["token_type"], "Bearer");
    assert_eq!(tokens["scope"], "crosstalk");
    let (st, e) = token(s, &[("grant_type", "password"), ("client_id", &client_id)]).await;
    assert_eq!((st, e["error"].as_str()), (400, Some("unsupported_grant_type")), "{e}");

    // The token works on MCP and REST, as the invite's identity only.
    let access = tokens["access_token"].as_str().unwrap().to_owned();
    let m = common::mcp::Mcp::connect_at(s, "/mcp", client_with_token(&access)).await;
    assert!(!m.ok("tools/list", json!({})).await["tools"]
        .as_array()
        .unwrap()
        .is_empty());
    assert_eq!(post_as(&access, s, "worker-7").await, 200);
    assert_eq!(post_as(&access, s, "worker-8").await, 403);
    // It is not the admin's.
    let r = client_with_token(&access)
        .post(s.url("/api/oauth/invites"))
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);

    // Refresh rotates both tokens; the old access token ends.
    let refresh = tokens["refresh_token"].as_str().unwrap().to_owned();
    let (st, next) = token(
        s,
        &[
            ("grant_type", "refresh_token"),
            ("refresh_token", &refresh),
            ("client_id", &client_id),
        ],
    )
    .await;
    assert_eq!(st, 200, "{next}");
    assert_ne!(next["refresh_token"], tokens["refresh_token"]);
    let r = client_with_token(&access)
        .get(s.url("/api/channels"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    assert!(r.headers()["www-authenticate"]
        .to_str()
        .unwrap()
        .contains("error=\"invalid_token\""));
    let access2 = next["access_token"].as_str().unwrap().to_owned();
    assert_eq!(post_as(&access2, s, "worker-7").await, 200);
    // The spent refresh token coming back: the whole connection ends.
    let (st, e) = token(
        s,
        &[
            ("grant_type", "refresh_token"),
            ("refresh_token", &refresh),
            ("client_id", &client_id),
        ],
    )
    .await;
    assert_eq!((st, e["error"].as_str()), (400, Some("invalid_grant")), "{e}");
    assert_eq!(post_as(&access2, s, "worker-7").await, 401);
}

#[tokio::test]
async fn connections_are_listed_revoked_and_survive_a_restart() {
    let mut s = Server::process(&["--oauth", "--token", ADMIN]);
    let (_, unbound) = connect(&s, &invite(&s, &[])).await;
    let (_, bound) = connect(&s, &invite(&s, &["--as", "reviewer", "--expires", "10m"])).await;
    let unbound_access = unbound["access_token"].as_str().unwrap().to_owned();
    // An invite without --as: anyone.
    assert_eq!(post_as(&unbound_access, &s, "someone").await, 200);
    assert_eq!(post_as(&unbound_access, &s, "someone-else").await, 200);

    let admin = client_with_token(ADMIN);
    let list: Value = admin
        .get(s.url("/api/oauth/clients"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let clients = list["clients"].as_array().unwrap().clone();
    assert_eq!(clients.len(), 2, "{list}");
    let of = |who: Value| {
        clients
            .iter()
            .find(|c| c["as"] == who)
            .unwrap_or_else(|| panic!("{list}"))
            .clone()
    };
    let (anyone, reviewer) = (of(Value::Null), of(json!("reviewer")));

    // The CLI lists them and revokes one: its token is refused at once.
    let cli = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_crosstalk"))
            .args(args)
            .args(["--relay", &s.url(""), "--token", ADMIN])
            .output()
            .unwrap()
    };
    let out = cli(&["clients"]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(text.contains("reviewer") && text.contains("Test Host"), "{text}");
    let grant = anyone["grant"].as_str().unwrap();
    let out = cli(&["clients", "--revoke", grant]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(post_as(&unbound_access, &s, "someone").await, 401);
    let out = cli(&["clients", "--revoke", grant]);
    assert_eq!(out.status.code(), Some(2), "revoking twice says there is none");

    // A restart keeps the other connection: its tokens, and the refresh.
    let dir = s.take_dir().unwrap();
    drop(s);
    let s2 = Server::start_in(dir.path(), &["--oauth", "--token", ADMIN]);
    let bound_access = bound["access_token"].as_str().unwrap();
    assert_eq!(post_as(bound_access, &s2, "reviewer").await, 200);
    let client_id = reviewer["client_id"].as_str().unwrap().to_owned();
    let (st, next) = token(
        &s2,
        &[
            ("grant_type", "refresh_token"),
            ("refresh_token", bound["refresh_token"].as_str().unwrap()),
            ("client_id", &client_id),
        ],
    )
    .await;
    assert_eq!(st, 200, "{next}");
    drop(dir);
}

#[tokio::test]
async fn without_oauth_nothing_changes_and_oauth_needs_the_admin_token() {
    let s = Server::start_with(&["--token", ADMIN]);
    for path in [
        "/.well-known/oauth-authorization-server",
        "/.well-known/oauth-protected-resource/mcp",
    ] {
        assert_eq!(client().get(s.url(path)).send().await.unwrap().status(), 404, "{path}");
    }
    let r = client().get(s.url("/api/channels")).send().await.unwrap();
    assert_eq!(r.headers()["www-authenticate"], "Bearer");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_crosstalk"))
        .args(["serve", "--oauth", "--port", "0"])
        .env("CROSSTALK_DATA_DIR", tempfile::tempdir().unwrap().path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--oauth needs --token"));
}

#[tokio::test]
async fn invite_guessing_is_limited() {
    let s = Server::start_with(&["--oauth", "--token", ADMIN]);
    let client_id = register(&s, REDIRECT).await;
    let params = authorize_params(&client_id, &"g".repeat(43), "s");
    let mut statuses = Vec::new();
    for _ in 0..7 {
        statuses.push(consent(&s, &params, "ZZZZZ-ZZZZZ").await.0);
    }
    assert_eq!(statuses[..5], [400; 5], "{statuses:?}");
    assert_eq!(statuses[5..], [429; 2], "{statuses:?}");
    // Even the right code waits until the window passes: guessing gains nothing.
    let code = invite(&s, &[]);
    assert_eq!(consent(&s, &params, &code).await.0, 429);
}

#[tokio::test]
async fn the_public_url_is_the_issuer_and_an_allowed_host() {
    let s = Server::start_with(&[
        "--oauth",
        "--token",
        ADMIN,
        "--public-url",
        "https://Relay.Example.com:443",
    ]);
    let r = client()
        .get(s.url("/.well-known/oauth-authorization-server"))
        .header("host", "relay.example.com")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let asm: Value = r.json().await.unwrap();
    assert_eq!(asm["issuer"], "https://relay.example.com");
    assert_eq!(
        asm["authorization_endpoint"],
        "https://relay.example.com/oauth/authorize"
    );
    let r = client()
        .post(s.url("/cc/mcp"))
        .header("host", "relay.example.com")
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    assert_eq!(
        r.headers()["www-authenticate"],
        "Bearer resource_metadata=\"https://relay.example.com/.well-known/oauth-protected-resource/cc/mcp\", scope=\"crosstalk\""
    );
}

#[tokio::test]
async fn a_metadata_document_on_a_private_address_is_not_fetched() {
    let s = Server::start_with(&["--oauth", "--token", ADMIN]);
    let asm: Value = json_at(&s, "/.well-known/oauth-authorization-server").await;
    assert_eq!(asm["client_id_metadata_document_supported"], true);
    // A listener that would answer, on loopback: the relay must not even connect.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let client_id = format!("https://127.0.0.1:{port}/client.json");
    let mut params = authorize_params(&client_id, &"p".repeat(43), "s");
    params[2].1 = "https://app.example/cb".into();
    let r = client()
        .get(with_query(&s, "/oauth/authorize", &params))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let page = r.text().await.unwrap();
    assert!(page.contains("not a public address"), "{page}");
    assert!(listener.accept().is_err(), "the relay connected to a private address");
    // Not https, or no path: not a metadata document, not a registered client either.
    params[1].1 = "https://app.example/".into();
    let r = client()
        .get(with_query(&s, "/oauth/authorize", &params))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
}

#[tokio::test]
async fn registration_is_limited_per_address() {
    let s = Server::start_with(&["--oauth", "--token", ADMIN]);
    let mut statuses = Vec::new();
    for _ in 0..12 {
        let r = client()
            .post(s.url("/oauth/register"))
            .json(&json!({"redirect_uris": [REDIRECT]}))
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        if status == 429 {
            assert!(r.headers().get("retry-after").is_some());
            assert_eq!(r.json::<Value>().await.unwrap()["error"], "temporarily_unavailable");
        }
        statuses.push(status);
    }
    assert_eq!(statuses[..10], [201; 10], "{statuses:?}");
    assert_eq!(statuses[10..], [429; 2], "{statuses:?}");
}

/// Races of each kind: enough that a window of a few milliseconds is hit many times over.
const RACES: usize = 100;
/// A relay for races: the checks that a token is refused are failed authentications, as many
/// as the races make, so they are not limited.
const RACING: [&str; 5] = ["--oauth", "--token", ADMIN, "--auth-failure-rate", "0"];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revocation_wins_over_refreshes_in_flight() {
    let s = Server::start_with(&RACING);
    common::oauth::revocation_races(&s, &s, ADMIN, RACES).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refresh_token_used_three_times_at_once_ends_the_grant_with_the_winners_tokens() {
    let s = Server::start_with(&RACING);
    common::oauth::reuse_races(&s, &s, ADMIN, RACES).await;
}

#[tokio::test]
async fn a_code_exchanged_twice_ends_the_grant_it_made() {
    let s = Server::start_with(&RACING);
    let flow = common::oauth::Flow::new(&s, ADMIN).await;
    let code = flow.code(&s, "twice").await;
    let (status, first) = flow.exchange(&s, &code).await;
    assert_eq!(status, 200, "{first}");
    let first = common::oauth::Tokens::of(&first);
    let (status, next) = flow.refresh(&s, &first.refresh).await;
    assert_eq!(status, 200, "{next}");
    let next = common::oauth::Tokens::of(&next);
    assert_eq!(common::oauth::works(&s, &next.access).await, 200);
    // The code again: refused, and everything issued from it, refreshed or not, ends.
    let (status, e) = flow.exchange(&s, &code).await;
    assert_eq!((status, e["error"].as_str()), (400, Some("invalid_grant")), "{e}");
    assert!(e["error_description"].as_str().unwrap().contains("revoked"), "{e}");
    assert_eq!(common::oauth::works(&s, &next.access).await, 401);
    assert_eq!(flow.refresh(&s, &next.refresh).await.0, 400);
    assert!(!flow.grants(&s).await.contains_key("twice"));
    // A code nobody issued ends nothing and says so.
    let (status, e) = flow.exchange(&s, "ct_ac_0000").await;
    assert_eq!((status, e["error"].as_str()), (400, Some("invalid_grant")), "{e}");
    assert!(e["error_description"].as_str().unwrap().contains("unknown"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_code_exchanged_twice_at_once_ends_the_grant_whichever_exchange_won() {
    let s = Server::start_with(&RACING);
    common::oauth::code_races(&s, &s, ADMIN, RACES).await;
}

#[tokio::test]
async fn an_authorization_request_in_error_is_answered_on_the_relays_own_page_never_redirected() {
    let s = Server::start_with(&["--oauth", "--token", ADMIN]);
    // Anyone may register a client that names an attacker's page (the relay never connects).
    const PHISH: &str = "https://evil.example/phish";
    let client_id = register(&s, PHISH).await;
    let verifier = "e".repeat(43);
    let mut params = authorize_params(&client_id, &verifier, "s");
    params[2].1 = PHISH.into();
    let bad = |k: &str, v: &str| {
        let mut p = params.clone();
        match p.iter_mut().find(|(name, _)| name == k) {
            Some(pair) => pair.1 = v.into(),
            None => p.push((k.into(), v.into())),
        }
        p
    };
    for (what, query) in [
        ("response_type", bad("response_type", "x")),
        ("code_challenge_method", bad("code_challenge_method", "plain")),
        ("scope", bad("scope", "admin")),
        ("resource", bad("resource", "https://elsewhere.example/")),
    ] {
        let r = no_redirects()
            .get(with_query(&s, "/oauth/authorize", &query))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 400, "{what}");
        assert!(r.headers().get("location").is_none(), "{what}: redirected");
        assert!(
            r.headers()["content-type"].to_str().unwrap().starts_with("text/html"),
            "{what}"
        );
        let page = r.text().await.unwrap();
        assert!(
            page.contains("Cannot connect") && !page.contains("evil.example"),
            "{what}: {page}"
        );
    }
    // The form is shown for a good request, and only a consent sends the client anywhere.
    let r = no_redirects()
        .get(with_query(&s, "/oauth/authorize", &params))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
}

#[tokio::test]
async fn a_registration_is_bounded_in_size_with_rfc_7591_errors() {
    let s = Server::start_with(&["--oauth", "--token", ADMIN]);
    let refused = |body: Value| {
        let url = s.url("/oauth/register");
        async move {
            let r = client().post(url).json(&body).send().await.unwrap();
            let status = r.status().as_u16();
            let v: Value = r.json().await.unwrap();
            (status, v["error"].as_str().unwrap_or_default().to_owned(), v)
        }
    };
    let long_uri = format!("https://app.example/{}", "c".repeat(600));
    for (body, want) in [
        (json!({"redirect_uris": [long_uri]}), "invalid_redirect_uri"),
        (json!({"redirect_uris": vec![REDIRECT; 11]}), "invalid_redirect_uri"),
        (
            json!({"redirect_uris": [REDIRECT], "client_name": "n".repeat(201)}),
            "invalid_client_metadata",
        ),
        (
            json!({"redirect_uris": [REDIRECT], "client_name": 7}),
            "invalid_client_metadata",
        ),
        (
            json!({"redirect_uris": [REDIRECT], "logo_uri": "l".repeat(2001)}),
            "invalid_client_metadata",
        ),
        // A string inside an array is bounded as any other.
        (
            json!({"redirect_uris": [REDIRECT], "contacts": ["x".repeat(3000)]}),
            "invalid_client_metadata",
        ),
        // Strings each within bounds, the whole over 8 KiB.
        (
            json!({"redirect_uris": [REDIRECT], "contacts": vec!["c".repeat(1900); 5]}),
            "invalid_client_metadata",
        ),
    ] {
        let (status, error, v) = refused(body).await;
        assert_eq!((status, error.as_str()), (400, want), "{v}");
        assert!(
            v["error_description"].as_str().unwrap().contains("at most")
                || v["error_description"].as_str().unwrap().contains("string")
                || v["error_description"].as_str().unwrap().contains("1 to 10"),
            "{v}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_tokens_streams_and_waits_end_within_seconds() {
    let s = Server::start_with(&RACING);
    common::oauth::revoked_streams_end(&s, &s, ADMIN).await;
}
