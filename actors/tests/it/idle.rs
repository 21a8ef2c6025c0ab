//! Idle channels cost nothing: a channel actor nobody uses stops after the quiet period and
//! reopens from the store on the next use, with nothing lost or changed. In-process, on a
//! temporary sled store, with a short quiet period.

use crosstalk_actors::search::Query;
use crosstalk_actors::sled_store::SledStore;
use crosstalk_actors::{Relay, RelayConfig, WaitOptions, WaitOutcome};
use crosstalk_schema::{ChannelName, NewMessage};
use std::sync::Arc;
use std::time::{Duration, Instant};

const QUIET: Duration = Duration::from_millis(200);

fn ch(name: &str) -> ChannelName {
    ChannelName::parse(name).unwrap()
}

fn msg(sender: &str, kind: Option<&str>, body: &str) -> NewMessage {
    NewMessage {
        sender: sender.into(),
        kind: kind.and_then(|k| crosstalk_schema::MessageType::parse(k).unwrap()),
        body: body.into(),
        ..Default::default()
    }
}

fn start(dir: &std::path::Path, max_channels: usize) -> Relay {
    start_with(
        dir,
        RelayConfig {
            idle_after: Some(QUIET),
            presence_ttl: Duration::from_millis(300),
            max_channels,
            ..RelayConfig::default()
        },
    )
}

fn start_with(dir: &std::path::Path, config: RelayConfig) -> Relay {
    let store = Arc::new(SledStore::open(dir).unwrap());
    Relay::start(store, config).unwrap().0
}

/// Waits (bounded) until at most `n` channel actors are open; returns how many are.
async fn settle(relay: &Relay, n: usize) -> usize {
    let deadline = Instant::now() + Duration::from_secs(10);
    while relay.open_channels() > n && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    relay.open_channels()
}

#[actix_rt::test]
async fn idle_channels_close_and_reopen_with_nothing_lost() {
    let dir = tempfile::tempdir().unwrap();
    let relay = start(dir.path(), 1000);
    // All at once, so they are answered within the quiet period of each other even on a
    // loaded machine (one after another, 50 commits took longer than it under CI's load, and
    // the first channels had closed before the last opened).
    let posts = (0..50).map(|i| {
        let relay = relay.clone();
        async move {
            let c = ch(&format!("c{i}"));
            relay.post(&c, msg("a", None, &format!("needle{i} body"))).await
        }
    });
    let ids: Vec<u64> = futures_util::future::join_all(posts)
        .await
        .into_iter()
        .map(|p| p.unwrap().id())
        .collect();
    assert_eq!(relay.open_channels(), 50);
    assert_eq!(settle(&relay, 0).await, 0, "idle channels stayed open");

    // Reading reopens from the store: everything is there, with its reply count.
    let reply = relay
        .post(
            &ch("c7"),
            NewMessage {
                reply_to: Some(ids[7]),
                ..msg("b", None, "a reply")
            },
        )
        .await
        .unwrap();
    assert!(
        reply.id() > *ids.iter().max().unwrap(),
        "ids went backwards after a reopen"
    );
    assert_eq!(settle(&relay, 0).await, 0);
    let got = relay.read(&ch("c7"), 0, 100, None).await.unwrap();
    assert_eq!(got.len(), 2);
    assert_eq!(got[0].message.body, "needle7 body");
    assert_eq!(got[0].message.reply_count, 1);

    // Search finds messages of closed channels without opening them.
    assert_eq!(settle(&relay, 0).await, 0);
    let found = relay
        .search(Query {
            text: "needle42".into(),
            limit: 10,
            ..Query::default()
        })
        .await
        .unwrap();
    // The exact word first; one-edit neighbours (needle4, needle41, …) follow it.
    assert!(!found.is_empty(), "a closed channel's message is missing from search");
    assert_eq!(found[0].message.message.channel, "c42");
    assert_eq!(found[0].message.message.body, "needle42 body");
    assert_eq!(relay.open_channels(), 0, "search opened channels");
    assert_eq!(relay.list_channels().unwrap().len(), 50);
}

#[actix_rt::test]
async fn waits_and_holders_keep_a_channel_open() {
    let dir = tempfile::tempdir().unwrap();
    let relay = start(dir.path(), 1000);
    relay.post(&ch("held"), msg("a", None, "x")).await.unwrap();
    relay.post(&ch("waited"), msg("a", None, "x")).await.unwrap();
    relay.post(&ch("free"), msg("a", None, "x")).await.unwrap();
    // A stream holds the channel's handle (its view); a long-poll holds a wait.
    let handle = relay.channel(&ch("held")).await.unwrap();
    let waiter = {
        let relay = relay.clone();
        tokio::spawn(async move {
            relay
                .wait(
                    ch("waited"),
                    WaitOptions {
                        since_id: 1_000_000,
                        limit: 10,
                        timeout: Duration::from_secs(3),
                        instance: Some("w".into()),
                        ..WaitOptions::default()
                    },
                )
                .await
        })
    };
    assert_eq!(settle(&relay, 2).await, 2);
    tokio::time::sleep(QUIET * 4).await;
    assert_eq!(relay.open_channels(), 2, "a channel in use was closed");
    // A post wakes the wait through the same actor it registered with.
    let posted = relay.post(&ch("waited"), msg("b", None, "wake")).await.unwrap();
    drop(handle);
    let woke = waiter.await.unwrap().unwrap();
    assert_eq!(
        woke.outcome,
        WaitOutcome::Timeout,
        "since_id above every id: nothing to deliver"
    );
    assert!(posted.id() > 0);
    assert_eq!(settle(&relay, 0).await, 0, "channels stayed open once nobody used them");
}

#[actix_rt::test]
async fn a_wait_answers_the_same_after_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let relay = start(dir.path(), 1000);
    relay.post(&ch("pair"), msg("a", None, "working")).await.unwrap();
    relay
        .post(&ch("pair"), msg("a", Some("done"), "finished"))
        .await
        .unwrap();
    let pair = ch("pair");
    let wait = || {
        relay.wait(
            pair.clone(),
            WaitOptions {
                since_id: 0,
                limit: 10,
                timeout: Duration::from_secs(2),
                instance: Some("b".into()),
                exclude_self: true,
                ..WaitOptions::default()
            },
        )
    };
    let open = wait().await.unwrap();
    assert_eq!(open.outcome, WaitOutcome::Done);
    assert_eq!(settle(&relay, 0).await, 0);
    // The newest message decides what a wait answers: a reopened channel must know it.
    let reopened = wait().await.unwrap();
    assert_eq!(reopened.outcome, open.outcome);
    let ids = |r: &crosstalk_actors::WaitResult| r.messages.iter().map(|p| p.id()).collect::<Vec<_>>();
    assert_eq!(ids(&reopened), ids(&open));
    assert_eq!(reopened.next_since_id, open.next_since_id);
}

#[actix_rt::test]
async fn a_channel_opened_but_never_written_stops_counting_against_the_limit() {
    let dir = tempfile::tempdir().unwrap();
    let relay = start(dir.path(), 2);
    let short = |since| WaitOptions {
        since_id: since,
        limit: 10,
        timeout: Duration::from_millis(50),
        ..WaitOptions::default()
    };
    // Waiting on a channel opens it (to wait on it) without writing anything.
    for name in ["e1", "e2"] {
        assert_eq!(
            relay.wait(ch(name), short(0)).await.unwrap().outcome,
            WaitOutcome::Timeout
        );
    }
    // Held open while the limit is checked (otherwise, on a loaded machine, e1 may have gone
    // quiet and closed by the time e3 asks, and e3 rightly gets in).
    let held = [
        relay.channel(&ch("e1")).await.unwrap(),
        relay.channel(&ch("e2")).await.unwrap(),
    ];
    assert!(relay.wait(ch("e3"), short(0)).await.is_err(), "the limit did not hold");
    drop(held);
    assert_eq!(settle(&relay, 0).await, 0);
    for name in ["e3", "e4"] {
        assert_eq!(
            relay.wait(ch(name), short(0)).await.unwrap().outcome,
            WaitOutcome::Timeout
        );
    }
}

/// One opener brings at most `max_channels_per_opener` channels into being, whatever the
/// relay's room; another opener, and calls of nobody's, are not held up; a channel it opened
/// and never wrote gives its place back when it closes, one it wrote does not.
#[actix_rt::test]
async fn one_opener_brings_a_bounded_number_of_channels_into_being() {
    let dir = tempfile::tempdir().unwrap();
    let config = RelayConfig {
        idle_after: Some(QUIET),
        presence_ttl: Duration::from_millis(300),
        max_channels: 100,
        max_channels_per_opener: 2,
        ..RelayConfig::default()
    };
    let relay = start_with(dir.path(), config);
    let short = WaitOptions {
        limit: 10,
        timeout: Duration::from_millis(50),
        ..WaitOptions::default()
    };
    let alice = || Some(Arc::<str>::from("alice"));
    let post_as_alice = |name: &str, body: &str| {
        let (relay, name, body) = (relay.clone(), ch(name), msg("a", None, body));
        Relay::opening_as(alice(), async move { relay.post(&name, body).await })
    };
    post_as_alice("written", "x").await.unwrap();
    let waited = Relay::opening_as(alice(), relay.wait(ch("waited"), short.clone())).await;
    assert_eq!(waited.unwrap().outcome, WaitOutcome::Timeout);
    let e = post_as_alice("third", "x").await.map(|_| ()).unwrap_err().to_string();
    assert!(e.contains("--max-channels-per-participant"), "{e}");
    // Posting to its own, another opener's first post and an unattributed one go through.
    post_as_alice("written", "more").await.unwrap();
    Relay::opening_as(Some("bob".into()), relay.post(&ch("bobs"), msg("b", None, "x")))
        .await
        .unwrap();
    relay.post(&ch("nobodys"), msg("c", None, "x")).await.unwrap();
    // The channel alice only waited on closes unwritten: its place is hers again, once.
    assert_eq!(settle(&relay, 0).await, 0);
    post_as_alice("third", "x").await.unwrap();
    assert!(post_as_alice("fourth", "x").await.is_err());
}

/// Beyond `max_open_channels`, the longest-unused channels close before their quiet period is
/// over, down to seven eighths of the bound; a channel someone holds, and one used within the
/// last second, stay; every closed one reopens with its messages.
#[actix_rt::test]
async fn beyond_the_open_bound_the_longest_unused_close_early() {
    let dir = tempfile::tempdir().unwrap();
    let config = RelayConfig {
        // Far longer than the test: only the bound closes anything.
        idle_after: Some(Duration::from_secs(600)),
        max_open_channels: 8,
        ..RelayConfig::default()
    };
    let relay = start_with(dir.path(), config);
    let posts = (0..40).map(|i| {
        let relay = relay.clone();
        async move {
            relay
                .post(&ch(&format!("b{i}")), msg("a", None, &format!("body {i}")))
                .await
        }
    });
    for p in futures_util::future::join_all(posts).await {
        p.unwrap();
    }
    // Nothing has been unused for a second yet: all of them stay.
    assert_eq!(relay.open_channels(), 40);
    let held = relay.channel(&ch("b0")).await.unwrap();
    tokio::time::sleep(Duration::from_millis(1200)).await;
    // Opening one more looks again at once.
    relay.post(&ch("fresh"), msg("a", None, "new")).await.unwrap();
    assert_eq!(
        settle(&relay, 7).await,
        7,
        "the open bound did not close channels early"
    );
    let directory_has = |name: &str| relay.channel_is_open(&ch(name));
    assert!(directory_has("b0"), "a held channel was closed");
    assert!(directory_has("fresh"), "the channel just used was closed");
    drop(held);
    for i in [1, 17, 39] {
        let got = relay.read(&ch(&format!("b{i}")), 0, 10, None).await.unwrap();
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].message.body, format!("body {i}"));
    }
}

/// A channel closed early still knows who spoke on it within the presence TTL: two parties
/// waiting while a third spoke a moment ago are not told to speak first; once the third waits
/// too, the first of them is.
#[actix_rt::test]
async fn who_spoke_on_a_channel_still_counts_after_it_closes() {
    let dir = tempfile::tempdir().unwrap();
    let config = RelayConfig {
        idle_after: Some(QUIET),
        // Far longer than the test: every poster stays a party throughout.
        presence_ttl: Duration::from_secs(600),
        release_grace: Duration::from_millis(100),
        ..RelayConfig::default()
    };
    let relay = start_with(dir.path(), config);
    let trio = ch("trio");
    let mut last = 0;
    for who in ["a", "b", "c"] {
        last = relay.post(&trio, msg(who, None, "here")).await.unwrap().id();
    }
    // Recent parties no longer keep the actor open.
    assert_eq!(settle(&relay, 0).await, 0, "a channel with recent parties stayed open");
    let wait = |who: &'static str, secs: u64| {
        let (relay, trio) = (relay.clone(), trio.clone());
        tokio::spawn(async move {
            relay
                .wait(
                    trio,
                    WaitOptions {
                        since_id: last,
                        limit: 10,
                        timeout: Duration::from_secs(secs),
                        instance: Some(who.into()),
                        ..WaitOptions::default()
                    },
                )
                .await
                .unwrap()
                .outcome
        })
    };
    let (a, b) = (wait("a", 1), wait("b", 1));
    assert_eq!(
        a.await.unwrap(),
        WaitOutcome::Timeout,
        "c spoke lately, yet a was released"
    );
    assert_eq!(b.await.unwrap(), WaitOutcome::Timeout);
    let (a, b, c) = (wait("a", 5), wait("b", 5), wait("c", 5));
    assert_eq!(a.await.unwrap(), WaitOutcome::SpeakFirst);
    c.abort();
    b.abort();
}
