//! Path reservations: grants and conflicts (named, with holder, paths and expiry), shared
//! ones coexisting, renew and release, the identity rules of posting, announcements on the
//! channel, a holder that goes offline, the one MCP tool, `crosstalk guard` in a real git
//! checkout (and its hook), and a restart.

use crate::common;
use common::mcp::Mcp;
use common::*;
use serde_json::{json, Value};
use std::process::Command;

async fn reserve(c: &reqwest::Client, s: &Server, body: Value) -> (u16, Value) {
    request(c, "POST", &s.url("/api/reservations"), Some(body), None).await
}

async fn release(c: &reqwest::Client, s: &Server, id: &str, holder: &str) -> (u16, Value) {
    let url = s.url(&format!("/api/reservations/{id}?holder={holder}"));
    request(c, "DELETE", &url, None, None).await
}

async fn listed(c: &reqwest::Client, s: &Server, query: &str) -> Vec<Value> {
    let (status, v) = get_json(c, &s.url(&format!("/api/reservations{query}"))).await;
    assert_eq!(status, 200, "{v}");
    v["reservations"].as_array().unwrap().clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exclusive_reservations_conflict_shared_ones_coexist_and_each_change_is_announced() {
    let s = Server::start();
    let c = client();
    let (status, a) = reserve(
        &c,
        &s,
        json!({"holder": "alice", "paths": ["src/**"], "ttl_s": 600, "reason": "router refactor", "project": "crosstalk"}),
    )
    .await;
    assert_eq!(status, 200, "{a}");
    assert_eq!(a["granted"], true);
    let alice_id = a["id"].as_str().unwrap().to_owned();
    assert_eq!(a["reservation"]["paths"], json!(["src/**"]));

    // bob's overlapping exclusive one is refused, and told who, what and until when.
    let (_, b) = reserve(
        &c,
        &s,
        json!({"holder": "bob", "paths": ["docs/*.md", "src/main.rs"], "project": "crosstalk"}),
    )
    .await;
    assert_eq!(b["granted"], false, "{b}");
    let conflict = &b["conflicts"][0];
    assert_eq!(
        (
            conflict["holder"].as_str(),
            conflict["id"].as_str(),
            conflict["reason"].as_str()
        ),
        (Some("alice"), Some(&*alice_id), Some("router refactor"))
    );
    assert_eq!(conflict["paths"], json!(["src/**"]));
    assert!(conflict["expires_at"].as_str().unwrap().ends_with('Z'));
    // Disjoint paths, another project, and alice's own overlap are all fine.
    for body in [
        json!({"holder": "bob", "paths": ["docs/*.md"], "project": "crosstalk"}),
        json!({"holder": "bob", "paths": ["src/**"], "project": "another-repo"}),
        json!({"holder": "alice", "paths": ["src/lib.rs"], "project": "crosstalk"}),
    ] {
        let (_, r) = reserve(&c, &s, body.clone()).await;
        assert_eq!(r["granted"], true, "{body} -> {r}");
    }
    // Shared ones coexist with each other, not with an exclusive one.
    let (_, s1) = reserve(
        &c,
        &s,
        json!({"holder": "carol", "paths": ["bench/**"], "exclusive": false}),
    )
    .await;
    let (_, s2) = reserve(
        &c,
        &s,
        json!({"holder": "dave", "paths": ["bench/**/*.json"], "exclusive": false}),
    )
    .await;
    let (_, x) = reserve(&c, &s, json!({"holder": "erin", "paths": ["bench/out/**"]})).await;
    assert_eq!(
        (s1["granted"].as_bool(), s2["granted"].as_bool(), x["granted"].as_bool()),
        (Some(true), Some(true), Some(false))
    );
    assert_eq!(
        x["conflicts"].as_array().unwrap().len(),
        2,
        "both shared holders named: {x}"
    );

    // Listing, by project and holder.
    assert_eq!(listed(&c, &s, "?project=crosstalk").await.len(), 3);
    let bobs = listed(&c, &s, "?holder=bob").await;
    assert_eq!(bobs.len(), 2);
    assert_eq!(listed(&c, &s, "").await.len(), 6);

    // Renew (only its holder), release, and then bob's refused request goes through.
    let (status, e) = request(
        &c,
        "POST",
        &s.url(&format!("/api/reservations/{alice_id}/renew")),
        Some(json!({"holder": "bob"})),
        None,
    )
    .await;
    assert_eq!(status, 403, "{e}");
    let (status, renewed) = request(
        &c,
        "POST",
        &s.url(&format!("/api/reservations/{alice_id}/renew")),
        Some(json!({"holder": "alice", "ttl_s": 7200})),
        None,
    )
    .await;
    assert_eq!(status, 200, "{renewed}");
    assert!(renewed["expires_at"].as_str().unwrap() > a["reservation"]["expires_at"].as_str().unwrap());
    let (status, _) = release(&c, &s, &alice_id, "bob").await;
    assert_eq!(status, 403);
    let (status, gone) = release(&c, &s, &alice_id, "alice").await;
    assert_eq!((status, gone["released"].as_bool()), (200, Some(true)));
    let (status, _) = release(&c, &s, &alice_id, "alice").await;
    assert_eq!(status, 404);
    // An id that names a record no project has (a wildcard, on a cluster a filter) is unknown.
    for odd in ["*.x", ">.x", "%2A.%3E", "a..b", "%20.x"] {
        let (status, e) = release(&c, &s, odd, "alice").await;
        assert_eq!(status, 404, "{odd}: {e}");
    }
    let (_, b) = reserve(
        &c,
        &s,
        json!({"holder": "bob", "paths": ["src/main.rs"], "project": "crosstalk"}),
    )
    .await;
    assert_eq!(b["granted"], true, "{b}");

    // Every change was announced on the reservations channel, as its holder.
    let said = messages(&c, &s, "reservations", 0).await;
    let lines: Vec<(String, String)> = said
        .iter()
        .map(|m| {
            (
                m["sender"].as_str().unwrap().to_owned(),
                m["body"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert!(said.iter().all(|m| m["type"] == "RESERVATION"), "{said:?}");
    assert!(
        lines[0].0 == "alice" && lines[0].1.starts_with("reserved src/**"),
        "{lines:?}"
    );
    assert!(
        lines
            .iter()
            .any(|(who, l)| who == "alice" && l.starts_with("renewed src/**")),
        "{lines:?}"
    );
    assert!(
        lines
            .iter()
            .any(|(who, l)| who == "alice" && l.starts_with("released src/**")),
        "{lines:?}"
    );
    assert!(
        !lines.iter().any(|(who, _)| who == "erin"),
        "a refused request announces nothing"
    );

    // Bad input is a clear error, and nothing is stored.
    for (body, field) in [
        (json!({"holder": "z", "paths": []}), "paths"),
        (json!({"holder": "z", "paths": ["../etc/passwd"]}), "paths"),
        (json!({"holder": "z", "paths": ["a//b"]}), "paths"),
        (json!({"holder": "z", "paths": ["x"], "ttl_s": 0}), "ttl_s"),
        (json!({"holder": "z", "paths": ["x"], "ttl_s": 999999999}), "ttl_s"),
        (json!({"holder": "z", "paths": "src/**"}), "paths"),
    ] {
        let (status, e) = reserve(&c, &s, body.clone()).await;
        assert_eq!(status, 400, "{body} -> {e}");
        assert!(e["error"].as_str().unwrap().contains(field), "{body} -> {e}");
    }
    assert!(listed(&c, &s, "?holder=z").await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_participant_reserves_only_as_itself() {
    let s = Server::start_with(&["--participants", "alice:tok-alice,bob:tok-bob"]);
    let alice = client_with_token("tok-alice");
    let (status, e) = reserve(&alice, &s, json!({"holder": "bob", "paths": ["x"]})).await;
    assert_eq!(status, 403, "{e}");
    let (status, r) = reserve(&alice, &s, json!({"paths": ["x"]})).await;
    assert_eq!(
        (status, r["reservation"]["holder"].as_str()),
        (200, Some("alice")),
        "{r}"
    );
    let id = r["id"].as_str().unwrap();
    let bob = client_with_token("tok-bob");
    let (status, _) = request(&bob, "DELETE", &s.url(&format!("/api/reservations/{id}")), None, None).await;
    assert_eq!(status, 403, "bob cannot release alice's");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_mcp_tool_reserves_and_a_holder_going_offline_releases_if_asked() {
    let s = Server::start();
    let m = Mcp::connect(&s).await;
    m.call_ok("register", json!({"instance_id": "worker-1"})).await;
    let granted = m
        .call_ok(
            "reserve",
            json!({"paths": ["src/**"], "reason": "tasks", "release_when_offline": true, "project": "p"}),
        )
        .await;
    assert_eq!(granted["granted"], true, "{granted}");
    let text = m.call("reserve", json!({"action": "list", "project": "p"})).await;
    assert!(
        text["content"][0]["text"]
            .as_str()
            .unwrap()
            .contains("worker-1 holds src/**"),
        "{text}"
    );
    let other = Mcp::connect(&s).await;
    other.call_ok("register", json!({"instance_id": "worker-2"})).await;
    let refused = other
        .call_ok("reserve", json!({"paths": ["src/x.rs"], "project": "p"}))
        .await;
    assert_eq!(refused["granted"], false);
    let said = other
        .call("reserve", json!({"paths": ["src/x.rs"], "project": "p"}))
        .await;
    assert!(
        said["content"][0]["text"].as_str().unwrap().starts_with("Refused"),
        "{said}"
    );
    // worker-1's session ends: its reservation goes with it.
    let r = m
        .http
        .delete(&m.url)
        .header("Mcp-Session-Id", m.session.as_deref().unwrap())
        .header("MCP-Protocol-Version", m.version)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 204);
    let granted = other
        .call_ok("reserve", json!({"paths": ["src/x.rs"], "project": "p"}))
        .await;
    assert_eq!(granted["granted"], true, "{granted}");
    // Renew and release by id through the same tool; a missing id is a tool error.
    let id = granted["id"].as_str().unwrap();
    other
        .call_ok("reserve", json!({"action": "renew", "id": id, "ttl_s": 60}))
        .await;
    assert!(other
        .call_err("reserve", json!({"action": "release"}))
        .await
        .contains("id"));
    other.call_ok("reserve", json!({"action": "release", "id": id})).await;
    // Asking to be released when offline needs the holder online.
    let c = client();
    let (status, e) = reserve(
        &c,
        &s,
        json!({"holder": "nobody", "paths": ["x"], "release_when_offline": true}),
    )
    .await;
    assert_eq!(status, 400, "{e}");
}

fn git(dir: &std::path::Path, args: &[&str]) {
    let out = Command::new("git").current_dir(dir).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_guard_stops_a_commit_of_paths_another_agent_holds() {
    let s = Server::start();
    let c = client();
    let (_, r) = reserve(
        &c,
        &s,
        json!({"holder": "alice", "paths": ["src/**"], "reason": "router", "project": "demo"}),
    )
    .await;
    assert_eq!(r["granted"], true);
    reserve(
        &c,
        &s,
        json!({"holder": "carol", "paths": ["README.md"], "exclusive": false, "project": "demo"}),
    )
    .await;
    let repo = tempfile::tempdir().unwrap();
    let dir = repo.path();
    git(dir, &["init", "-q"]);
    git(dir, &["config", "user.email", "t@example.com"]);
    git(dir, &["config", "user.name", "t"]);
    std::fs::create_dir_all(dir.join("src")).unwrap();
    std::fs::write(dir.join("src/main.rs"), "fn main() {}\n").unwrap();
    std::fs::write(dir.join("README.md"), "hi\n").unwrap();
    git(dir, &["add", "."]);
    let guard = |who: &str| {
        Command::new(env!("CARGO_BIN_EXE_crosstalk"))
            .current_dir(dir)
            .args(["guard", "--as", who, "--project", "demo", "--relay", &s.url("")])
            .env_remove("CROSSTALK_TOKEN")
            .output()
            .unwrap()
    };
    let bob = guard("bob");
    let err = String::from_utf8_lossy(&bob.stderr);
    assert_eq!(bob.status.code(), Some(1), "{err}");
    assert!(err.contains("src/main.rs: held by alice (src/**, exclusive"), "{err}");
    assert!(
        !err.contains("README.md"),
        "a shared reservation does not stop a commit: {err}"
    );
    assert_eq!(guard("alice").status.code(), Some(0), "the holder itself may commit");

    // As the pre-commit hook: bob's commit is refused, and goes through once alice releases.
    let install = Command::new(env!("CARGO_BIN_EXE_crosstalk"))
        .current_dir(dir)
        .args([
            "guard",
            "--install",
            "--as",
            "bob",
            "--project",
            "demo",
            "--relay",
            &s.url(""),
        ])
        .output()
        .unwrap();
    assert!(install.status.success(), "{}", String::from_utf8_lossy(&install.stderr));
    let commit = Command::new("git")
        .current_dir(dir)
        .args(["commit", "-q", "-m", "x"])
        .output()
        .unwrap();
    assert!(!commit.status.success(), "the hook refused the commit");
    assert!(String::from_utf8_lossy(&commit.stderr).contains("held by alice"));
    let id = r["id"].as_str().unwrap();
    release(&c, &s, id, "alice").await;
    let commit = Command::new("git")
        .current_dir(dir)
        .args(["commit", "-q", "-m", "x"])
        .output()
        .unwrap();
    assert!(commit.status.success(), "{}", String::from_utf8_lossy(&commit.stderr));
    // A hook of someone else's is not overwritten.
    std::fs::write(dir.join(".git/hooks/pre-commit"), "#!/bin/sh\nexit 0\n").unwrap();
    let again = Command::new(env!("CARGO_BIN_EXE_crosstalk"))
        .current_dir(dir)
        .args(["guard", "--install", "--as", "bob"])
        .output()
        .unwrap();
    assert_eq!(again.status.code(), Some(2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reservations_survive_a_restart() {
    let mut s = Server::process(&[]);
    let c = client();
    let (_, r) = reserve(&c, &s, json!({"holder": "alice", "paths": ["src/**"], "project": "p"})).await;
    assert_eq!(r["granted"], true);
    let (_, clean) = s.terminate();
    assert!(clean);
    let dir = s.take_dir().unwrap();
    let s2 = Server::start_in(dir.path(), &[]);
    let held = listed(&c, &s2, "?project=p").await;
    assert_eq!(held.len(), 1);
    assert_eq!(held[0]["id"], r["id"]);
    let (_, b) = reserve(&c, &s2, json!({"holder": "bob", "paths": ["src/a.rs"], "project": "p"})).await;
    assert_eq!(b["granted"], false, "{b}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reservation_lapses_at_its_time() {
    let s = Server::start();
    let c = client();
    let (_, r) = reserve(&c, &s, json!({"holder": "alice", "paths": ["a/**"], "ttl_s": 1})).await;
    assert_eq!(r["granted"], true);
    let (_, b) = reserve(&c, &s, json!({"holder": "bob", "paths": ["a/x"]})).await;
    assert_eq!(b["granted"], false);
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    assert!(listed(&c, &s, "").await.is_empty(), "lapsed");
    let (_, b) = reserve(&c, &s, json!({"holder": "bob", "paths": ["a/x"]})).await;
    assert_eq!(b["granted"], true, "{b}");
    let id = r["id"].as_str().unwrap();
    let (status, _) = release(&c, &s, id, "alice").await;
    assert_eq!(status, 404, "a lapsed reservation is gone");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_and_a_reservation_are_bounded() {
    let s = Server::start();
    let c = client();
    // At most 64 patterns in one reservation.
    let many: Vec<String> = (0..65).map(|i| format!("f{i}.rs")).collect();
    let (status, e) = reserve(&c, &s, json!({"holder": "alice", "paths": many})).await;
    assert_eq!(status, 400, "{e}");
    // At most 100 live reservations per holder in a project; others may still reserve.
    for i in 0..100 {
        let (status, r) = reserve(
            &c,
            &s,
            json!({"holder": "alice", "paths": [format!("f{i}.rs")], "project": "p"}),
        )
        .await;
        assert_eq!((status, r["granted"].as_bool()), (200, Some(true)), "{r}");
    }
    let (status, e) = reserve(&c, &s, json!({"holder": "alice", "paths": ["g.rs"], "project": "p"})).await;
    assert_eq!(status, 429, "{e}");
    assert!(e["error"].as_str().unwrap().contains("100"), "{e}");
    let (_, r) = reserve(&c, &s, json!({"holder": "bob", "paths": ["g.rs"], "project": "p"})).await;
    assert_eq!(r["granted"], true, "{r}");
}

/// What one request may make the relay compute is bounded: patterns are refused beyond 8
/// wildcards or 32 segments, and a request whose comparison with its project would take more
/// than its budget of steps is refused (429) with nothing stored, instead of holding a core
/// for minutes. The heaviest patterns the rules allow, 64 against 64 held, are answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn comparing_patterns_is_bounded_and_a_request_beyond_the_budget_is_refused() {
    let s = Server::start();
    let c = client();
    for (paths, why) in [
        (json!(["*?*?*?*?*"]), "at most 8 wildcards"),
        (json!([vec!["a"; 33].join("/")]), "at most 32 segments"),
    ] {
        let (status, e) = reserve(&c, &s, json!({"holder": "z", "paths": paths})).await;
        assert_eq!(status, 400, "{e}");
        assert!(e["error"].as_str().unwrap().contains(why), "{e}");
    }
    // A long name against a long piece between two stars is the heaviest pair: 64 names
    // against 64 such pieces is about 19 million steps, inside the budget of 20 million.
    let names: Vec<String> = (0..64).map(|i| "a".repeat(510 - i)).collect();
    let pieces: Vec<String> = (0..64).map(|i| format!("*{}b*", "a".repeat(507 - i))).collect();
    let short = |v: &Value| {
        format!(
            "{} {}",
            v["code"],
            v["error"].as_str().unwrap_or("").get(..200).unwrap_or("")
        )
    };
    let (status, r) = reserve(&c, &s, json!({"holder": "b", "paths": pieces, "project": "q"})).await;
    assert_eq!((status, r["granted"].as_bool()), (200, Some(true)), "{}", short(&r));
    let (status, r) = reserve(&c, &s, json!({"holder": "a", "paths": names, "project": "q"})).await;
    assert_eq!((status, r["granted"].as_bool()), (200, Some(true)), "{}", short(&r));
    // Twenty holders of 64 such pieces (shared, so they coexist): the same request would need
    // twenty times that.
    for i in 0..20 {
        let body = json!({"holder": format!("b{i}"), "paths": pieces, "project": "p", "exclusive": false});
        let (status, r) = reserve(&c, &s, body).await;
        assert_eq!((status, r["granted"].as_bool()), (200, Some(true)), "{}", short(&r));
    }
    let (status, e) = reserve(&c, &s, json!({"holder": "a", "paths": names, "project": "p"})).await;
    assert_eq!(
        (status, e["code"].as_str()),
        (429, Some("limit_reached")),
        "{}",
        short(&e)
    );
    assert!(e["error"].as_str().unwrap().contains("steps"), "{}", short(&e));
    assert_eq!(listed(&c, &s, "?project=p&holder=a").await.len(), 0, "nothing stored");
    assert_eq!(listed(&c, &s, "?project=p").await.len(), 20, "and nothing lost");
}

/// `LIB/X.RS` and `lib/x.rs` are one file on macOS and Windows: patterns are compared without
/// regard to case, in every project, and each is kept and shown as it was written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paths_that_differ_only_in_case_are_one_path() {
    let s = Server::start();
    let c = client();
    let (_, a) = reserve(
        &c,
        &s,
        json!({"holder": "alice", "paths": ["lib/x.rs"], "project": "c"}),
    )
    .await;
    assert_eq!(a["granted"], true, "{a}");
    let (_, b) = reserve(&c, &s, json!({"holder": "bob", "paths": ["LIB/X.RS"], "project": "c"})).await;
    assert_eq!(b["granted"], false, "{b}");
    assert_eq!(b["conflicts"][0]["paths"], json!(["lib/x.rs"]), "{b}");
    let (_, b) = reserve(&c, &s, json!({"holder": "bob", "paths": ["Docs/**"], "project": "c"})).await;
    assert_eq!(b["granted"], true, "{b}");
    let (_, e) = reserve(
        &c,
        &s,
        json!({"holder": "erin", "paths": ["docs/README.md"], "project": "c"}),
    )
    .await;
    assert_eq!(e["granted"], false, "{e}");
    let held: Vec<Value> = listed(&c, &s, "?project=c")
        .await
        .iter()
        .map(|r| r["paths"][0].clone())
        .collect();
    assert_eq!(held, [json!("lib/x.rs"), json!("Docs/**")], "kept as written");
}

/// `crosstalk guard` checks every staged path as it is, case aside, and refuses one it cannot
/// check (a name no reservation pattern could spell: a tab or another control character in it,
/// or longer than a pattern may be), saying why, whoever holds what.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_guard_refuses_a_path_it_cannot_check() {
    let s = Server::start();
    let c = client();
    let (_, r) = reserve(
        &c,
        &s,
        json!({"holder": "alice", "paths": ["src/**"], "project": "demo"}),
    )
    .await;
    assert_eq!(r["granted"], true);
    let repo = tempfile::tempdir().unwrap();
    let dir = repo.path();
    git(dir, &["init", "-q"]);
    let long = format!("src/{}/{}/{}.rs", "d".repeat(251), "e".repeat(252), "f".repeat(250));
    assert_eq!(long.len(), 762);
    let unfit = ["src/a\tb.rs", "src/ctl\u{1}.rs", long.as_str()];
    for p in unfit.iter().chain(&["SRC/Main.rs", "docs/ok.md"]) {
        let file = dir.join(p);
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        std::fs::write(&file, "x\n").unwrap();
    }
    git(dir, &["add", "."]);
    let guard = |who: &str| {
        let out = Command::new(env!("CARGO_BIN_EXE_crosstalk"))
            .current_dir(dir)
            .args(["guard", "--as", who, "--project", "demo", "--relay", &s.url("")])
            .env_remove("CROSSTALK_TOKEN")
            .output()
            .unwrap();
        (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let (code, err) = guard("bob");
    assert_eq!(code, Some(1), "{err}");
    for why in [
        "\"src/a\\tb.rs\": cannot be checked against reservations: it has a control character ('\\t')",
        "\"src/ctl\\u{1}.rs\": cannot be checked against reservations: it has a control character ('\\u{1}')",
        "cannot be checked against reservations: it is 762 bytes long; reservation patterns are at most 512",
        "SRC/Main.rs: held by alice (src/**, exclusive",
        "1 staged path(s) are held by another agent and 3 cannot be checked",
    ] {
        assert!(err.contains(why), "{why:?} not in:\n{err}");
    }
    assert!(!err.contains("docs/ok.md"), "{err}");
    assert!(
        !err.contains('\u{1}'),
        "no control character reaches the terminal: {err:?}"
    );
    // The holder is not stopped by its own reservation, but the unfit paths still are.
    let (code, err) = guard("alice");
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("3 staged path(s) cannot be checked against reservations; rename them"),
        "{err}"
    );
    let mut unstage = vec!["rm", "-q", "--cached", "--"];
    unstage.extend(unfit);
    git(dir, &unstage);
    assert_eq!(guard("alice"), (Some(0), String::new()));
}
