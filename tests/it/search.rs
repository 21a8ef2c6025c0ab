//! Full-text search as people type it: prefixes, phrases, OR and -, a typo in a longer word,
//! ranking, filters (channel, sender, type, time), snippets with the match marked, on every
//! face; and retention: a removed message is never found.

use crate::common;
use common::mcp::Mcp;
use common::*;
use serde_json::{json, Value};

async fn hits(c: &reqwest::Client, s: &Server, query: &[(&str, &str)]) -> Value {
    let mut url = reqwest::Url::parse(&s.url("/api/search/hits")).unwrap();
    for (k, v) in query {
        url.query_pairs_mut().append_pair(k, v);
    }
    let (status, v) = get_json(c, url.as_str()).await;
    assert_eq!(status, 200, "{query:?}: {v}");
    v
}

fn found_ids(v: &Value) -> Vec<u64> {
    v["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_u64().unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn search_finds_what_people_type() {
    let s = Server::start();
    let c = client();
    let id = |m: Value| m["id"].as_u64().unwrap();
    let migration = id(post(&c, &s, "db", msg("alice", "The migration to Postgres 17 is done")).await);
    let plan = id(post(
        &c,
        &s,
        "db",
        json!({"sender": "bob", "type": "PLAN", "body": "plan: migrate the users table first"}),
    )
    .await);
    let refresh = id(post(&c, &s, "auth", msg("carol", "the token refresh path is fixed")).await);
    let page = id(post(&c, &s, "auth", msg("carol", "refresh the page, then log in")).await);
    let tokens = id(post(&c, &s, "auth", msg("dave", "token, token, token: tokens everywhere")).await);

    // A prefix: "migrat" finds migration and migrate.
    let mut got = found_ids(&hits(&c, &s, &[("q", "migrat")]).await);
    got.sort_unstable();
    assert_eq!(got, [migration, plan]);
    // A phrase, in order; the same words apart do not match it.
    assert_eq!(found_ids(&hits(&c, &s, &[("q", "\"refresh path\"")]).await), [refresh]);
    assert!(found_ids(&hits(&c, &s, &[("q", "\"path refresh\"")]).await).is_empty());
    // OR, and -.
    let mut got = found_ids(&hits(&c, &s, &[("q", "postgres OR page")]).await);
    got.sort_unstable();
    assert_eq!(got, [migration, page]);
    assert_eq!(found_ids(&hits(&c, &s, &[("q", "refresh -page")]).await), [refresh]);
    // One typo in a longer word (a transposition here); a short word must be right.
    assert_eq!(
        found_ids(&hits(&c, &s, &[("q", "migratoin postgres")]).await),
        [migration]
    );
    assert!(found_ids(&hits(&c, &s, &[("q", "tokn")]).await).is_empty());
    // Ranked: the message that says token most often first.
    let ranked = hits(&c, &s, &[("q", "token")]).await;
    assert_eq!(found_ids(&ranked), [tokens, refresh], "{ranked}");
    let scores: Vec<f64> = ranked["hits"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["score"].as_f64().unwrap())
        .collect();
    assert!(scores[0] > scores[1], "{scores:?}");
    // Snippets mark what matched.
    assert_eq!(ranked["hits"][1]["snippet"], "the **token** refresh path is fixed");
    let typo = hits(&c, &s, &[("q", "migratoin")]).await;
    assert_eq!(typo["hits"][0]["snippet"], "The **migration** to Postgres 17 is done");
    // Filters: channel, sender and type (any case), time.
    assert_eq!(
        found_ids(&hits(&c, &s, &[("q", "refresh"), ("channel", "auth"), ("sender", "CAROL")]).await).len(),
        2
    );
    assert_eq!(
        found_ids(&hits(&c, &s, &[("q", "migrat"), ("type", "plan")]).await),
        [plan]
    );
    assert!(found_ids(&hits(&c, &s, &[("q", "migrat"), ("channel", "auth")]).await).is_empty());
    assert!(found_ids(&hits(&c, &s, &[("q", "token"), ("since", "2999-01-01T00:00:00Z")]).await).is_empty());
    assert_eq!(
        found_ids(&hits(&c, &s, &[("q", "token"), ("until", "2999-01-01T00:00:00Z")]).await).len(),
        2
    );
    let (status, e) = get_json(&c, &s.url("/api/search/hits?q=token&since=yesterday")).await;
    assert_eq!(status, 400, "{e}");
    assert!(e["error"].as_str().unwrap().contains("since"), "{e}");
    // More than 32 words and phrases: a clear 400.
    let long: Vec<String> = (0..33).map(|i| format!("w{i}")).collect();
    let (status, e) = get_json(&c, &s.url(&format!("/api/search?q={}", long.join("+")))).await;
    assert_eq!(status, 400, "{e}");
    assert!(e["error"].as_str().unwrap().contains("32"), "{e}");
    // Only excluded words, or no word at all: a clear 400.
    for q in ["-token", "!!", "\"\""] {
        let (status, e) = get_json(&c, &s.url(&format!("/api/search?q={}", urlencoding(q)))).await;
        assert_eq!(status, 400, "{q}: {e}");
    }

    // /api/search keeps its bare list; MCP gets the hits and a text with the passages.
    let (_, bare) = get_json(&c, &s.url("/api/search?q=migratoin")).await;
    assert_eq!(bare[0]["id"], migration);
    let m = Mcp::connect(&s).await;
    let r = m.call("search_messages", json!({"query": "refresh -page"})).await;
    assert_eq!(r["structuredContent"]["hits"][0]["id"], refresh, "{r}");
    assert!(
        r["content"][0]["text"]
            .as_str()
            .unwrap()
            .contains("the token **refresh** path"),
        "{r}"
    );
}

fn urlencoding(s: &str) -> String {
    reqwest::Url::parse_with_params("http://x/", [("q", s)])
        .unwrap()
        .query()
        .unwrap()[2..]
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_retention_removed_is_never_found() {
    // Retention's first round comes 5 s after start: long enough, even on a loaded machine,
    // for the five posts to be indexed and found first (at 1 s, CI's load once let it run
    // before the first search).
    let s = Server::start_with(&["--retention-channels", "logs=2/", "--retention-interval-secs", "5"]);
    let c = client();
    for i in 0..5 {
        post(&c, &s, "logs", msg("a", &format!("deploy number {i}"))).await;
    }
    // Indexed before retention runs.
    assert_eq!(found_ids(&hits(&c, &s, &[("q", "deploy")]).await).len(), 5);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let found = hits(&c, &s, &[("q", "deploy")]).await;
        let bodies: Vec<&str> = found["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["body"].as_str().unwrap())
            .collect();
        if bodies.len() == 2 {
            let mut b = bodies.clone();
            b.sort_unstable();
            assert_eq!(b, ["deploy number 3", "deploy number 4"]);
            break;
        }
        assert!(std::time::Instant::now() < deadline, "still found: {bodies:?}");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn equal_scores_come_newest_first_and_a_word_as_typed_is_not_a_typo() {
    let s = Server::start();
    let c = client();
    // The same words on two channels, searched between posts so the index holds them in
    // several segments: of twelve equal hits, the three newest, newest first.
    let mut posted = Vec::new();
    for i in 0..12 {
        let channel = if i % 2 == 0 { "ops" } else { "dev" };
        let m = post(&c, &s, channel, msg("bot", "status green")).await;
        posted.push((channel.to_owned(), m["id"].as_u64().unwrap()));
        if i % 4 == 3 {
            hits(&c, &s, &[("q", "green")]).await;
        }
    }
    let top = hits(&c, &s, &[("q", "green"), ("limit", "3")]).await;
    let got: Vec<(String, u64)> = top["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| (m["channel"].as_str().unwrap().to_owned(), m["id"].as_u64().unwrap()))
        .collect();
    let newest: Vec<(String, u64)> = posted.iter().rev().take(3).cloned().collect();
    assert_eq!(got, newest, "{top}");

    // "guild" is a word of its own, not a typo of "build": neither is far more common.
    let build = post(&c, &s, "ci", msg("bot", "the build is red")).await["id"]
        .as_u64()
        .unwrap();
    let guild = post(&c, &s, "ci", msg("bot", "guild meeting at noon")).await["id"]
        .as_u64()
        .unwrap();
    assert_eq!(found_ids(&hits(&c, &s, &[("q", "guild")]).await), [guild]);
    // A word no message has is taken for a typo of one that some have.
    let typo = hits(&c, &s, &[("q", "biuld")]).await;
    assert_eq!(found_ids(&typo), [build]);
    assert_eq!(typo["hits"][0]["snippet"], "the **build** is red");

    // A phrase of three words needs them adjacent and in order, not only its pairs.
    let both_pairs = post(&c, &s, "auth", msg("carol", "token refresh, then refresh path")).await["id"]
        .as_u64()
        .unwrap();
    let whole = post(&c, &s, "auth", msg("carol", "the token refresh path is fixed")).await["id"]
        .as_u64()
        .unwrap();
    assert_eq!(
        found_ids(&hits(&c, &s, &[("q", "\"token refresh path\"")]).await),
        [whole]
    );
    let mut got = found_ids(&hits(&c, &s, &[("q", "\"token refresh\"")]).await);
    got.sort_unstable();
    assert_eq!(got, [both_pairs, whole]);
    assert!(found_ids(&hits(&c, &s, &[("q", "\"path token refresh\"")]).await).is_empty());
}
