//! Ordering and `since_id` under many concurrent posters on several channels.

use crate::common;
use common::*;
use std::collections::{HashMap, HashSet};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_posters_get_unique_increasing_ids_with_no_gaps_or_duplicates() {
    let s = Server::start();
    let c = client();
    let channels = ["alpha", "beta", "gamma"];
    let per_poster = 40;
    let posters = 8;
    let mut tasks = Vec::new();
    for ch in channels {
        for p in 0..posters {
            let c = c.clone();
            let url = s.url(&format!("/api/channels/{ch}/messages"));
            tasks.push(tokio::spawn(async move {
                let mut acked = Vec::new();
                for i in 0..per_poster {
                    let body = format!("{ch}/{p}/{i}");
                    let r = c
                        .post(&url)
                        .json(&msg(&format!("poster-{p}"), &body))
                        .send()
                        .await
                        .unwrap();
                    assert_eq!(r.status(), 200);
                    let v: serde_json::Value = r.json().await.unwrap();
                    assert_eq!(v["body"], body.as_str());
                    assert_eq!(v["channel"], ch);
                    acked.push((ch, v["id"].as_u64().unwrap(), body));
                }
                acked
            }));
        }
    }
    let mut acked = Vec::new();
    for t in tasks {
        acked.extend(t.await.unwrap());
    }
    // Ids are unique across the relay.
    let all_ids: HashSet<u64> = acked.iter().map(|a| a.1).collect();
    assert_eq!(all_ids.len(), acked.len());

    for ch in channels {
        let read = messages(&c, &s, ch, 0).await;
        let got = ids(&read);
        // Exactly the acknowledged messages of this channel: no gaps, no duplicates, nothing foreign.
        let mut want: Vec<u64> = acked.iter().filter(|a| a.0 == ch).map(|a| a.1).collect();
        want.sort_unstable();
        assert_eq!(
            got, want,
            "channel {ch} reads back exactly what was acknowledged, in id order"
        );
        let bodies: HashMap<u64, &str> = acked
            .iter()
            .filter(|a| a.0 == ch)
            .map(|a| (a.1, a.2.as_str()))
            .collect();
        for m in &read {
            assert_eq!(m["body"].as_str().unwrap(), bodies[&m["id"].as_u64().unwrap()]);
        }
        // Each poster's own messages appear in the order it sent them.
        for p in 0..posters {
            let mine: Vec<u64> = read
                .iter()
                .filter(|m| m["sender"] == format!("poster-{p}").as_str())
                .map(|m| m["body"].as_str().unwrap().rsplit('/').next().unwrap().parse().unwrap())
                .collect();
            assert_eq!(mine, (0..per_poster).collect::<Vec<u64>>());
        }
        // since_id is exclusive, and paging with limit walks the same sequence.
        let mid = got[got.len() / 2];
        let after_mid = ids(&messages(&c, &s, ch, mid).await);
        assert_eq!(after_mid, got.iter().copied().filter(|&i| i > mid).collect::<Vec<_>>());
        let (_, page) = get_json(&c, &s.url(&format!("/api/channels/{ch}/messages?since_id=0&limit=5"))).await;
        assert_eq!(ids(page.as_array().unwrap()), got[..5].to_vec());
    }

    // The channel list agrees with the log.
    let (status, list) = get_json(&c, &s.url("/api/channels")).await;
    assert_eq!(status, 200);
    let list = list.as_array().unwrap();
    assert_eq!(list.len(), 3);
    for row in list {
        let ch = row["channel"].as_str().unwrap();
        let n = acked.iter().filter(|a| a.0 == ch).count() as u64;
        assert_eq!(row["count"].as_u64(), Some(n));
        let last = acked.iter().filter(|a| a.0 == ch).map(|a| a.1).max().unwrap();
        assert_eq!(row["last_id"].as_u64(), Some(last));
        assert!(row["last_at"].as_str().unwrap().ends_with('Z'));
    }
}

#[tokio::test]
async fn channel_names_are_normalised_and_unknown_channels_read_empty() {
    let s = Server::start();
    let c = client();
    let m = post(&c, &s, "Team.Dev", msg("a", "x")).await;
    assert_eq!(m["channel"], "team.dev");
    assert_eq!(ids(&messages(&c, &s, "team.dev", 0).await), [m["id"].as_u64().unwrap()]);
    let (status, v) = get_json(&c, &s.url("/api/channels/never-written/messages")).await;
    assert_eq!((status, v), (200, serde_json::json!([])));
    // Reading a channel does not create it.
    let (_, list) = get_json(&c, &s.url("/api/channels")).await;
    assert_eq!(list.as_array().unwrap().len(), 1);
}

#[tokio::test]
async fn stored_message_has_crosstalk_mcp_shape() {
    let s = Server::start();
    let c = client();
    let sent = serde_json::json!({
        "sender": "alice", "type": "QUESTION", "body": "line one\nline two \"quoted\"",
        "recipient": "bob", "session_id": "s1", "status": "open", "side": "X"
    });
    let m = post(&c, &s, "dev", sent.clone()).await;
    for k in ["sender", "type", "body", "recipient", "session_id", "status", "side"] {
        assert_eq!(m[k], sent[k], "{k}");
    }
    assert_eq!(m["reply_to"], serde_json::Value::Null);
    let r = post(
        &c,
        &s,
        "dev",
        serde_json::json!({"sender": "bob", "body": "yes", "reply_to": m["id"]}),
    )
    .await;
    assert_eq!(r["reply_to"], m["id"]);
    assert_eq!(r["type"], "message", "type defaults to message");
    let created = m["created_at"].as_str().unwrap();
    assert!(created.ends_with('Z') && created.contains('T'), "{created}");
    let read = messages(&c, &s, "dev", 0).await;
    assert_eq!(read[1], r, "what is read back equals what the post returned");
    let mut with_reply = m.clone();
    with_reply["reply_count"] = serde_json::json!(1);
    assert_eq!(read[0], with_reply, "the question now counts its reply");
}
