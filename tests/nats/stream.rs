//! The stream and a node's start: appends retried and batched, a stream an earlier release
//! wrote, credentials and TLS, the node's data directory, and a full disk.

use super::*;

/// Runs `crosstalk serve` on `dir` with `args`, expecting it to refuse to start: answers its
/// exit status, what it wrote to stderr, and how long it took.
pub(crate) fn refused_start(dir: &Path, args: &[&str]) -> (std::process::ExitStatus, String, Duration) {
    let started = Instant::now();
    let mut child = Command::new(env!("CARGO_BIN_EXE_crosstalk"))
        .arg("serve")
        .args(["--host", "127.0.0.1", "--port", "0", "--data-dir"])
        .arg(dir)
        .args(args)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn crosstalk");
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let mut err = String::new();
            use std::io::Read;
            child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
            return (status, err, started.elapsed());
        }
        if started.elapsed() > Duration::from_secs(45) {
            let _ = child.kill();
            panic!("crosstalk {args:?} did not stop by itself");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A node on `server` with `args` (credentials, TLS) answers a post.
pub(crate) async fn posts_through(server: &Single, args: &[&str]) {
    let url = server.url();
    let mut all = vec!["--store", url.as_str()];
    all.extend_from_slice(args);
    let node = Server::process(&all);
    let c = client();
    let m = post(&c, &node, "guarded", msg("a", "through")).await;
    assert_eq!(m["body"], "through");
}

/// The relay's stream as the server describes it now.
pub(crate) async fn stream_info(js: &async_nats::jetstream::Context) -> async_nats::jetstream::stream::Info {
    js.get_stream("CROSSTALK").await.unwrap().info().await.unwrap().clone()
}

/// The stream's newest sequence.
pub(crate) async fn last_sequence(js: &async_nats::jetstream::Context) -> u64 {
    stream_info(js).await.state.last_sequence
}

/// Takes the relay stream's subjects away, so that a node's appends reach no stream and wait
/// (it sends them again until one takes them); answers the configuration that gives them back.
pub(crate) async fn hold_the_stream(js: &async_nats::jetstream::Context) -> async_nats::jetstream::stream::Config {
    let config = stream_info(js).await.config;
    let elsewhere = async_nats::jetstream::stream::Config {
        subjects: vec!["elsewhere.>".into()],
        ..config.clone()
    };
    js.update_stream(&elsewhere).await.expect("take the subjects away");
    config
}

/// Waits until `node` (started logging) says again that an append of its found the stream
/// held back, so posts sent after this queue behind that append. A new line, not one logged
/// before the call: the node logs it at most once a second while appends wait, so one comes
/// within about a second while the append is held.
pub(crate) async fn until_an_append_is_held(node: &Server) {
    let held = || {
        node.stderr()
            .matches("no stream takes the channel's subject yet")
            .count()
    };
    let (before, deadline) = (held(), Instant::now() + T);
    while held() <= before {
        assert!(
            Instant::now() < deadline,
            "no append waited for the stream:\n{}",
            node.stderr()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Posts `body` to `channel` on `node` on a task of its own, which answers the stored message.
pub(crate) fn post_in_background(
    c: &reqwest::Client,
    node: &Server,
    channel: &str,
    body: Value,
) -> tokio::task::JoinHandle<Value> {
    let (c, url) = (c.clone(), node.url(&format!("/api/channels/{channel}/messages")));
    tokio::spawn(async move {
        let r = c.post(url).json(&body).send().await.expect("post");
        assert!(r.status().is_success(), "{}", r.status());
        r.json::<Value>().await.unwrap()
    })
}

/// A post whose event reaches no stream (NATS's "no responders": here the stream's subjects are
/// taken away for a moment, as on a new cluster before a new stream's subjects reach every
/// server) is sent again until the stream takes it: the post succeeds, and is stored once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_post_that_reaches_no_stream_is_sent_again_until_one_takes_it() {
    use async_nats::jetstream;
    let _one = ONE_CLUSTER.lock().await;
    let server = single("");
    let node = Server::process(&["--store", server.url().as_str()]);
    let c = client();
    post(&c, &node, "dev", msg("a", "first")).await;
    let js = jetstream::new(async_nats::connect(server.url()).await.unwrap());
    let config = hold_the_stream(&js).await;
    assert_eq!(config.subjects, vec!["crosstalk.ch.>".to_string()]);
    let back = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(400)).await;
        js.update_stream(&config).await.expect("give the subjects back");
    });
    let started = Instant::now();
    let second = post(&c, &node, "dev", msg("a", "second")).await;
    assert!(
        started.elapsed() >= Duration::from_millis(300),
        "posted while no stream listened"
    );
    back.await.unwrap();
    let all = until_count(&c, &node, "dev", 2).await;
    assert_eq!(
        all.iter().map(|m| m["body"].clone()).collect::<Vec<_>>(),
        ["first", "second"]
    );
    assert_eq!(all[1]["id"], second["id"]);
}

/// One nats-server, node A (logging, to tell when an append is held) and node B on it, a
/// first post to `dev` through A, and a JetStream context on the server.
async fn two_nodes_after_a_first_post() -> (Single, Server, Server, reqwest::Client, async_nats::jetstream::Context) {
    let server = single("");
    let a = Server::start_logging(&["--store", server.url().as_str()]);
    let b = Server::process(&["--store", server.url().as_str()]);
    let c = client();
    post(&c, &a, "dev", msg("a", "first")).await;
    let js = async_nats::jetstream::new(async_nats::connect(server.url()).await.unwrap());
    (server, a, b, c, js)
}

/// Posts to one channel that arrive at a node while its previous append to the log is on its
/// way go to the log together, as one message. Here the stream is kept from taking the first
/// post (its subjects taken away, as above) until the node says nine posts wait behind it
/// (`crosstalk_cluster_appends_waiting`); those nine, one of them a retry, become the next
/// message. Their ids count within that message, the retry gets its original's id, and both
/// nodes hold the same ten messages. The node's `/metrics` account for it: three messages of
/// eleven events, each event's wait for the message before its own and each message's time to
/// its acknowledgement at least as long as the test held them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn posts_waiting_for_an_append_go_to_the_log_as_one_message() {
    let _one = ONE_CLUSTER.lock().await;
    let (_server, a, b, c, js) = two_nodes_after_a_first_post().await;
    let config = stream_info(&js).await.config;
    assert_eq!(
        config.metadata.get("crosstalk_ids").map(String::as_str),
        Some("entries-v2"),
        "the stream says how its messages hold events"
    );
    let before = last_sequence(&js).await;
    hold_the_stream(&js).await;
    let send = |body: Value| post_in_background(&c, &a, "dev", body);
    let held = send(msg("a", "held"));
    until_an_append_is_held(&a).await;
    let held_from = Instant::now();
    let mut meanwhile: Vec<_> = (0..8)
        .map(|n| send(json!({"sender": "a", "body": format!("meanwhile {n}"), "idempotency_key": format!("k-{n}")})))
        .collect();
    meanwhile.push(send(
        json!({"sender": "a", "body": "meanwhile 3", "idempotency_key": "k-3"}),
    ));
    until_metric(&c, &a, "crosstalk_cluster_appends_waiting", 9.0).await;
    let all_waiting = Instant::now();
    // Long enough for the node's measured waits to be told from none.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let released = Instant::now();
    js.update_stream(&config).await.expect("give the subjects back");
    let held = held.await.unwrap();
    let mut answers = Vec::new();
    for m in meanwhile {
        answers.push(m.await.unwrap());
    }
    assert_eq!(
        last_sequence(&js).await,
        before + 2,
        "the held post's message, then one for the rest"
    );
    assert_eq!(held["id"].as_u64().unwrap(), (before + 1) << 10);
    // Nine events in the message, numbered 0 to 8 within it; the retry, whichever of the two
    // came second, was stored as no message and answered with its original.
    assert_eq!(answers[3]["id"], answers[8]["id"]);
    let together: std::collections::BTreeSet<u64> = answers.iter().map(|m| m["id"].as_u64().unwrap()).collect();
    assert_eq!(together.len(), 8, "{together:?}");
    assert!(
        together.iter().all(|id| id >> 10 == before + 2 && id & 1023 < 9),
        "{together:?}"
    );
    let on_a = until_count(&c, &a, "dev", 10).await;
    assert_eq!(on_a.len(), 10, "{on_a:?}");
    assert_eq!(until_count(&c, &b, "dev", 10).await, on_a, "both nodes hold the same");

    // What the node measured of it.
    let scrape = metrics_of(&c, &a).await;
    let value = |name: &str| common::sample(&scrape, name).unwrap_or_else(|| panic!("no {name} in\n{scrape}"));
    assert_eq!(value("crosstalk_cluster_appends_waiting"), 0.0);
    assert_eq!(value("crosstalk_cluster_append_events_count"), 3.0, "three messages");
    assert_eq!(value("crosstalk_cluster_append_events_sum"), 11.0, "of eleven events");
    assert_eq!(value("crosstalk_cluster_append_gather_seconds_count"), 11.0);
    // The nine waited for the held message at least from when all of them were waiting to
    // when its stream was given back; the held message's append, from before the first of
    // them was sent.
    let gathered = value("crosstalk_cluster_append_gather_seconds_sum");
    assert!(
        gathered >= 9.0 * (released - all_waiting).as_secs_f64(),
        "{gathered} s waited"
    );
    let appending = value("crosstalk_cluster_append_seconds_sum");
    assert!(
        appending >= (released - held_from).as_secs_f64(),
        "{appending} s appending"
    );
    // Every proposal waited for the fold once acknowledged (the retry too); every post
    // stored anew waited for the node's store.
    assert_eq!(value("crosstalk_cluster_fold_wait_seconds_count"), 11.0);
    assert_eq!(value("crosstalk_cluster_commit_wait_seconds_count"), 10.0);
    // B appended nothing, and answered no proposal.
    let on_b = metrics_of(&c, &b).await;
    for name in [
        "crosstalk_cluster_append_events_count",
        "crosstalk_cluster_fold_wait_seconds_count",
    ] {
        assert!(
            common::sample(&on_b, name).is_none_or(|v| v == 0.0),
            "{name} on B:\n{on_b}"
        );
    }
}

/// Posts to several channels that arrive at a node while its previous append is on its way
/// go to the log together, as one message of several channels (`crosstalk.ch.+several`), in
/// the order the node took them. Their ids count within that message whatever their channel,
/// so each channel's ids still increase, and both nodes hold the same on every channel. The
/// node's `/metrics` count the message's channels.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn posts_to_several_channels_waiting_for_an_append_go_as_one_message() {
    let _one = ONE_CLUSTER.lock().await;
    let (_server, a, b, c, js) = two_nodes_after_a_first_post().await;
    let before = last_sequence(&js).await;
    let config = hold_the_stream(&js).await;
    let held = post_in_background(&c, &a, "dev", msg("a", "held"));
    until_an_append_is_held(&a).await;
    // One at a time, so the node takes them in this order.
    let mut meanwhile = Vec::new();
    for (n, channel) in ["ops", "dev", "team.x", "ops"].into_iter().enumerate() {
        meanwhile.push((
            channel,
            post_in_background(&c, &a, channel, msg("a", &format!("meanwhile {n}"))),
        ));
        until_metric(&c, &a, "crosstalk_cluster_appends_waiting", (n + 1) as f64).await;
    }
    js.update_stream(&config).await.expect("give the subjects back");
    held.await.unwrap();
    let mut ids = Vec::new();
    for (channel, answer) in meanwhile {
        ids.push((channel, answer.await.unwrap()["id"].as_u64().unwrap()));
    }
    assert_eq!(
        last_sequence(&js).await,
        before + 2,
        "the held post's message, then one for the rest"
    );
    let message = before + 2;
    assert_eq!(
        ids,
        [
            ("ops", message << 10),
            ("dev", (message << 10) | 1),
            ("team.x", (message << 10) | 2),
            ("ops", (message << 10) | 3)
        ]
    );
    let stream = js.get_stream("CROSSTALK").await.unwrap();
    let raw = stream.get_raw_message(message).await.unwrap();
    assert_eq!(raw.subject.as_str(), "crosstalk.ch.+several");
    for (channel, n) in [("dev", 3), ("ops", 2), ("team.x", 1)] {
        let on_a = until_count(&c, &a, channel, n).await;
        assert_eq!(on_a.len(), n, "{channel}: {on_a:?}");
        assert_eq!(
            until_count(&c, &b, channel, n).await,
            on_a,
            "{channel}: both nodes hold the same"
        );
    }
    let scrape = metrics_of(&c, &a).await;
    let value = |name: &str| common::sample(&scrape, name).unwrap_or_else(|| panic!("no {name} in\n{scrape}"));
    assert_eq!(value("crosstalk_cluster_append_channels_count"), 3.0, "three messages");
    assert_eq!(
        value("crosstalk_cluster_append_channels_sum"),
        5.0,
        "of one, one and three channels"
    );
}

/// A stream that an earlier release marked `entries-v1` (no message of several channels) is
/// read as it was and marked as this release writes it, so that earlier release refuses it
/// from then on; one a later release marked otherwise is refused and left alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_of_the_release_before_is_marked_anew_and_a_later_ones_refused() {
    use async_nats::jetstream;
    let _one = ONE_CLUSTER.lock().await;
    let server = single("");
    let js = jetstream::new(async_nats::connect(server.url()).await.unwrap());
    let dir = tempfile::tempdir().unwrap();
    let mark = |value: &'static str| {
        let js = js.clone();
        async move {
            let mut config = stream_info(&js).await.config;
            config.metadata.insert("crosstalk_ids".into(), value.into());
            js.update_stream(&config).await.expect("mark the stream");
        }
    };
    let c = client();
    let first = {
        let node = Server::start_in(dir.path(), &["--store", server.url().as_str()]);
        post(&c, &node, "dev", msg("a", "before the upgrade")).await
    };
    mark("entries-v1").await;
    {
        let node = Server::start_in(dir.path(), &["--store", server.url().as_str()]);
        assert_eq!(messages(&c, &node, "dev", 0).await[0]["id"], first["id"]);
        post(&c, &node, "dev", msg("a", "after")).await;
        assert_eq!(until_count(&c, &node, "dev", 2).await.len(), 2);
    }
    assert_eq!(
        stream_info(&js)
            .await
            .config
            .metadata
            .get("crosstalk_ids")
            .map(String::as_str),
        Some("entries-v2")
    );
    mark("entries-v9").await;
    let messages_before = stream_info(&js).await.state.messages;
    let (status, err, _) = refused_start(dir.path(), &["--store", &server.url()]);
    assert!(!status.success(), "started on a later release's stream");
    assert!(err.contains("crosstalk_ids=entries-v9"), "{err}");
    let info = stream_info(&js).await;
    assert_eq!(info.state.messages, messages_before);
    assert_eq!(
        info.config.metadata.get("crosstalk_ids").map(String::as_str),
        Some("entries-v9")
    );
}

/// A node's `/metrics`.
pub(crate) async fn metrics_of(c: &reqwest::Client, node: &Server) -> String {
    c.get(node.url("/metrics")).send().await.unwrap().text().await.unwrap()
}

/// Waits until `node`'s metric `name` reads `want`.
pub(crate) async fn until_metric(c: &reqwest::Client, node: &Server, name: &str, want: f64) {
    let deadline = Instant::now() + T;
    loop {
        let seen = common::sample(&metrics_of(c, node).await, name);
        if seen == Some(want) {
            return;
        }
        assert!(Instant::now() < deadline, "{name} never read {want}: {seen:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A stream an earlier release wrote (one event a message, its id the stream sequence) is
/// refused at start-up, saying what to do, and is left as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_an_earlier_release_wrote_is_refused_and_left_alone() {
    use async_nats::jetstream;
    let _one = ONE_CLUSTER.lock().await;
    let server = single("");
    let js = jetstream::new(async_nats::connect(server.url()).await.unwrap());
    js.create_stream(jetstream::stream::Config {
        name: "CROSSTALK".into(),
        subjects: vec!["crosstalk.ch.>".into()],
        ..Default::default()
    })
    .await
    .unwrap();
    js.publish("crosstalk.ch.dev", "an event of the earlier layout".into())
        .await
        .unwrap()
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (status, err, _) = refused_start(dir.path(), &["--store", &server.url()]);
    assert!(!status.success(), "started on an earlier release's stream");
    assert!(err.contains("was written by a crosstalk release before"), "{err}");
    assert!(err.contains("--nats-stream"), "{err}");
    let info = stream_info(&js).await;
    assert_eq!(info.state.messages, 1);
    assert!(!info.config.metadata.contains_key("crosstalk_ids"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_signs_in_to_nats_and_stops_at_once_when_refused() {
    let _one = ONE_CLUSTER.lock().await;
    let users = single("authorization { user: relay, password: \"s3cret pass\" }");
    let url = users.url();
    for args in [
        vec!["--store", &url],
        vec!["--store", &url, "--nats-user", "relay", "--nats-password", "wrong"],
    ] {
        let dir = tempfile::tempdir().unwrap();
        let (status, err, took) = refused_start(dir.path(), &args);
        assert!(!status.success(), "{args:?} started");
        assert!(
            err.contains("NATS refused the connection: authorization violation"),
            "{args:?}: {err}"
        );
        assert!(took < Duration::from_secs(10), "{args:?}: refused only after {took:?}");
    }
    posts_through(&users, &["--nats-user", "relay", "--nats-password", "s3cret pass"]).await;

    let token = single("authorization { token: \"t0ken\" }");
    let dir = tempfile::tempdir().unwrap();
    let (status, err, _) = refused_start(dir.path(), &["--store", &token.url(), "--nats-token", "nope"]);
    assert!(!status.success() && err.contains("authorization violation"), "{err}");
    posts_through(&token, &["--nats-token", "t0ken"]).await;
}

/// `openssl` with `args` in `dir`.
pub(crate) fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .current_dir(dir)
        .args(args)
        .output()
        .expect("openssl");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_reaches_nats_over_tls_with_its_ca_and_client_certificate() {
    let _one = ONE_CLUSTER.lock().await;
    // A test CA, a server certificate for 127.0.0.1 and a client certificate, all from it.
    let pki = tempfile::tempdir().unwrap();
    let p = pki.path();
    let day = ["-days", "1"];
    openssl(
        p,
        &[
            &[
                "req",
                "-x509",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-keyout",
                "ca.key",
                "-out",
                "ca.pem",
                "-subj",
                "/CN=crosstalk test CA",
            ][..],
            &day,
        ]
        .concat(),
    );
    for (name, ext) in [
        (
            "server",
            "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n",
        ),
        ("client", "extendedKeyUsage=clientAuth\n"),
    ] {
        std::fs::write(
            p.join(format!("{name}.ext")),
            format!("basicConstraints=CA:FALSE\n{ext}"),
        )
        .unwrap();
        let (key, csr, pem, extfile) = (
            format!("{name}.key"),
            format!("{name}.csr"),
            format!("{name}.pem"),
            format!("{name}.ext"),
        );
        openssl(
            p,
            &[
                "req",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-keyout",
                &key,
                "-out",
                &csr,
                "-subj",
                &format!("/CN={name}"),
            ],
        );
        openssl(
            p,
            &[
                &[
                    "x509",
                    "-req",
                    "-in",
                    &csr,
                    "-CA",
                    "ca.pem",
                    "-CAkey",
                    "ca.key",
                    "-CAcreateserial",
                    "-out",
                    &pem,
                    "-extfile",
                    &extfile,
                ][..],
                &day,
            ]
            .concat(),
        );
    }
    let file = |n: &str| p.join(n).display().to_string();
    let server = single(&format!(
        "tls {{\n  cert_file: \"{}\"\n  key_file: \"{}\"\n  ca_file: \"{}\"\n  verify: true\n}}",
        file("server.pem"),
        file("server.key"),
        file("ca.pem")
    ));
    let url = server.url();
    let ca = file("ca.pem");
    let cert = format!("{},{}", file("client.pem"), file("client.key"));

    // Without the CA the server's certificate is not trusted: refused at once.
    let dir = tempfile::tempdir().unwrap();
    let (status, err, took) = refused_start(dir.path(), &["--store", &url, "--nats-tls-required"]);
    assert!(
        !status.success() && err.contains("NATS refused the connection"),
        "{err}"
    );
    assert!(err.contains("certificate"), "{err}");
    assert!(took < Duration::from_secs(10), "refused only after {took:?}");
    // With the CA but no client certificate, a server that verifies clients refuses it.
    let dir = tempfile::tempdir().unwrap();
    let (status, err, took) = refused_start(dir.path(), &["--store", &url, "--nats-tls-ca", &ca]);
    assert!(
        !status.success() && err.contains("NATS refused the connection"),
        "{err}"
    );
    assert!(took < Duration::from_secs(10), "refused only after {took:?}");
    // With both, the node works.
    posts_through(
        &server,
        &["--nats-tls-ca", &ca, "--nats-tls-cert", &cert, "--nats-tls-required"],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relays_own_store_and_a_nodes_copy_are_never_mixed() {
    let _one = ONE_CLUSTER.lock().await;
    let nats = single("");
    let c = client();
    // A relay's own (sled) data directory, with a channel in it.
    let mut own = Server::process(&[]);
    post(&c, &own, "mine", msg("a", "kept")).await;
    own.terminate();
    let own_dir = own.take_dir().unwrap();
    let (status, err, _) = refused_start(own_dir.path(), &["--store", &nats.url()]);
    assert!(
        !status.success() && err.contains("holds a relay's own channels"),
        "{err}"
    );
    // A node's copy of the stream.
    let mut n = Server::process(&["--store", &nats.url()]);
    post(&c, &n, "shared", msg("a", "in the log")).await;
    n.terminate();
    let node_dir = n.take_dir().unwrap();
    let (status, err, _) = refused_start(node_dir.path(), &[]);
    assert!(
        !status.success() && err.contains("a cluster node's copy of the NATS stream CROSSTALK"),
        "{err}"
    );
    let (status, err, _) = refused_start(node_dir.path(), &["--store", &nats.url(), "--nats-stream", "OTHER"]);
    assert!(!status.success() && err.contains("not OTHER"), "{err}");
    // Neither was touched: each still starts as what it is, with its message.
    let own = Server::start_in(own_dir.path(), &[]);
    assert_eq!(messages(&c, &own, "mine", 0).await.len(), 1);
    drop(own);
    let n = Server::start_in(node_dir.path(), &["--store", &nats.url()]);
    assert_eq!(messages(&c, &n, "shared", 0).await.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_disk_fills_stops_and_catches_up_from_the_log() {
    let _one = ONE_CLUSTER.lock().await;
    let nats = single("");
    let url = nats.url();
    let dir = tempfile::tempdir().unwrap();
    let c = client();
    let mut acknowledged = Vec::new();
    {
        let mut n = Server::start_file_limited(dir.path(), 2 * 1024 * 1024, &["--store", &url]);
        let target = n.url("/api/channels/full/messages");
        for i in 0..400 {
            let body = format!("{i:04} {}", "x".repeat(2048));
            let Ok(r) = c.post(&target).json(&json!({"sender": "w", "body": body})).send().await else {
                break;
            };
            if r.status() == 200 {
                acknowledged.push(body);
            }
        }
        // Its copy can no longer follow the log: the node stops rather than leave a hole.
        let deadline = Instant::now() + T;
        let status = loop {
            if let Some(s) = n.child().try_wait().unwrap() {
                break s;
            }
            assert!(
                Instant::now() < deadline,
                "the node kept running with a store that refuses writes ({} posts acknowledged):\n{}",
                acknowledged.len(),
                n.stderr()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        assert_eq!(status.code(), Some(75), "{}", n.stderr());
    }
    assert!(!acknowledged.is_empty());
    // Restarted without the limit, it folds the rest of the log: every acknowledged post.
    let n = Server::start_in(dir.path(), &["--store", &url]);
    let got = until_count(&c, &n, "full", acknowledged.len()).await;
    let bodies: std::collections::HashSet<&str> = got.iter().map(|m| m["body"].as_str().unwrap()).collect();
    for b in &acknowledged {
        assert!(bodies.contains(b.as_str()), "acknowledged post {} missing", &b[..4]);
    }
    assert_eq!(bodies.len(), got.len(), "a post is there twice");
}
