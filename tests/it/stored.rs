//! The stored formats, against bytes committed under `tests/fixtures/stored/`: for every type a
//! store keeps ([`Stored`]), a file of its samples in the layout this build writes, and one
//! for each older layout it still reads. This fails when
//! - a stored type's layout changes without its version being raised (the samples no longer
//!   encode to the committed bytes);
//! - a version is raised without a migration from the one before, or a migration reads the old
//!   bytes as something else than what they held;
//! - a type becomes stored without a fixture (every `stored!` and `impl Stored` in the sources
//!   must have its case here).
//!
//! A new layout's file is written once with `CROSSTALK_BLESS=1` (which never overwrites a file)
//! and committed; the files already there are never rewritten.
//!
//! A position (a read cursor, a node's fold watermark) was eight bytes big-endian before
//! positions carried a version: `cursor.bin` holds one such, which must still read.

use crosstalk_actors::cluster::Registration;
use crosstalk_actors::presence::PresenceRecord;
use crosstalk_schema::codec::{self, Stored};
use crosstalk_schema::oauth::{AuthCode, Grant, Invite, OAuthClient, TokenRef};
use crosstalk_schema::reservation::ReservationSet;
use crosstalk_schema::task::TaskRecord;
use crosstalk_schema::wake::WakeState;
use crosstalk_schema::webhook::{Delivery, Lease, Webhook};
use crosstalk_schema::{
    ChannelMeta, ChannelState, CutState, HeldMessage, IdFloor, Instance, Overlay, Position, Record, SharedData,
    StreamEntry, Timestamp,
};
use serde::Serialize;
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/stored")
}

fn slug(kind: &str) -> String {
    kind.to_ascii_lowercase().replace(' ', "-")
}

fn file(kind: &str, version: u8) -> PathBuf {
    dir().join(format!("{}.v{version}.bin", slug(kind)))
}

/// A fixture file: each value as a 4-byte little-endian length and its stored bytes.
fn pack(values: &[Vec<u8>]) -> Vec<u8> {
    let mut out = Vec::new();
    for v in values {
        out.extend_from_slice(&u32::try_from(v.len()).unwrap().to_le_bytes());
        out.extend_from_slice(v);
    }
    out
}

fn unpack(mut bytes: &[u8]) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    while !bytes.is_empty() {
        let (len, rest) = bytes.split_first_chunk::<4>().expect("a length");
        let len = u32::from_le_bytes(*len) as usize;
        out.push(rest[..len].to_vec());
        bytes = &rest[len..];
    }
    out
}

/// The committed file, or (with `CROSSTALK_BLESS=1`, only where there is none) `fresh`,
/// written.
fn committed(path: &Path, fresh: &[Vec<u8>], problems: &mut Vec<String>) -> Option<Vec<Vec<u8>>> {
    match std::fs::read(path) {
        Ok(bytes) => Some(unpack(&bytes)),
        Err(_) if std::env::var_os("CROSSTALK_BLESS").is_some() => {
            std::fs::create_dir_all(dir()).unwrap();
            std::fs::write(path, pack(fresh)).unwrap();
            Some(fresh.to_vec())
        }
        Err(_) => {
            problems.push(format!(
                "{} is missing: a new stored type or layout needs its bytes committed \
                 (run this test once with CROSSTALK_BLESS=1, then commit the file)",
                path.display()
            ));
            None
        }
    }
}

fn from_json<T: serde::de::DeserializeOwned>(v: Value) -> T {
    serde_json::from_value(v).expect("a sample of the type")
}

/// An older layout of `T`: the bytes it held (used only to write its file the first time) and
/// what each must read as today.
struct Older<T> {
    version: u8,
    bytes: Vec<Vec<u8>>,
    reads_as: Vec<T>,
}

/// `value` (a view of `T` in an older layout) framed as version `version` of `T`.
fn old_layout<T: Stored, V: Serialize>(version: u8, value: &V) -> Vec<u8> {
    let mut bytes = codec::encode_as::<T, V>(value);
    // The checksum covers the payload only.
    bytes[0] = version;
    bytes
}

#[derive(Default)]
struct Check {
    problems: Vec<String>,
    kinds: BTreeSet<&'static str>,
}

impl Check {
    fn stored<T: Stored>(&mut self, samples: Vec<T>, older: Vec<Older<T>>) {
        let kind = T::KIND;
        self.kinds.insert(kind);
        let now: Vec<Vec<u8>> = samples.iter().map(codec::encode).collect();
        if let Some(held) = committed(&file(kind, T::VERSION), &now, &mut self.problems) {
            if held != now {
                self.problems.push(format!(
                    "a {kind} (version {}) no longer encodes as its committed bytes: its layout changed. \
                     Raise its VERSION, read the old layout in its upgrade(), and commit the new bytes",
                    T::VERSION
                ));
            }
            for (i, bytes) in held.iter().enumerate() {
                match codec::decode::<T>(bytes) {
                    Ok(v) if codec::encode(&v) == *bytes => {}
                    Ok(_) => self
                        .problems
                        .push(format!("{kind} sample {i} does not read back as written")),
                    Err(e) => self.problems.push(format!("{kind} sample {i} no longer decodes: {e}")),
                }
            }
        }
        let mut versions = vec![T::VERSION];
        for old in older {
            versions.push(old.version);
            let Some(held) = committed(&file(kind, old.version), &old.bytes, &mut self.problems) else {
                continue;
            };
            if held.len() != old.reads_as.len() {
                self.problems.push(format!(
                    "{kind} version {}: {} values held, {} expected",
                    old.version,
                    held.len(),
                    old.reads_as.len()
                ));
                continue;
            }
            for (i, (bytes, want)) in held.iter().zip(&old.reads_as).enumerate() {
                match codec::decode::<T>(bytes) {
                    Ok(v) if codec::encode(&v) == codec::encode(want) => {}
                    Ok(_) => self.problems.push(format!(
                        "{kind} version {} value {i} migrates to something else than it held",
                        old.version
                    )),
                    Err(e) => self.problems.push(format!(
                        "{kind} version {} value {i} no longer decodes (a migration is missing): {e}",
                        old.version
                    )),
                }
            }
        }
        // Every version below today's that a store may hold has its file.
        for v in 1..T::VERSION {
            if !versions.contains(&v) {
                self.problems
                    .push(format!("{kind}: version {v} has no fixture and no migration test"));
            }
        }
    }
}

/// The kinds the sources declare stored: every `stored!(Type => "kind", …)` and every
/// `const KIND: &'static str = "…"`, outside comments.
fn declared_kinds() -> BTreeSet<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut kinds = BTreeSet::new();
    let mut stack: Vec<PathBuf> = ["schema/src", "actors/src", "src"]
        .iter()
        .map(|d| root.join(d))
        .collect();
    while let Some(path) = stack.pop() {
        if path.is_dir() {
            stack.extend(std::fs::read_dir(&path).unwrap().map(|e| e.unwrap().path()));
            continue;
        }
        if path.extension().is_none_or(|e| e != "rs") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let code: String = text
            .lines()
            .filter(|l| !l.trim_start().starts_with("//"))
            .collect::<Vec<_>>()
            .join("\n");
        let mut rest = code.as_str();
        while let Some(at) = rest.find("stored!(") {
            let block = &rest[at..];
            let end = block.find(");").unwrap_or(block.len());
            for part in block[..end].split("=>").skip(1) {
                if let Some(kind) = part.trim_start().strip_prefix('"').and_then(|k| k.split('"').next()) {
                    kinds.insert(kind.to_owned());
                }
            }
            rest = &block[end..];
        }
        for line in code.lines() {
            if let Some(kind) = line
                .trim()
                .strip_prefix("const KIND: &'static str = \"")
                .and_then(|k| k.split('"').next())
            {
                kinds.insert(kind.to_owned());
            }
        }
    }
    kinds
}

fn ts(n: i64) -> Timestamp {
    Timestamp(1_765_000_000_000_000 + n)
}

fn message(n: i64) -> Value {
    json!({"Message": {
        "sender": "alice", "kind": "QUESTION", "body": "ready for review?", "created_at": ts(n).0,
        "session_id": "s-1", "recipient": "bob", "reply_to": 3, "status": "open", "side": "builder"
    }})
}

#[test]
fn every_stored_type_reads_its_committed_bytes_in_every_layout() {
    let mut c = Check::default();

    let records: Vec<Record> = vec![
        from_json(message(1)),
        from_json(json!({"SessionStarted": {"session_id": "s-1", "max_turns": 8, "at": ts(2).0}})),
        from_json(json!({"SessionEnded": {"session_id": "s-1", "reason": "done", "at": ts(3).0}})),
        from_json(json!({"Described": {"description": "the build channel", "at": ts(4).0}})),
        from_json(json!({"Trimmed": {"through": 2, "at": ts(5).0}})),
    ];
    c.stored(records.clone(), vec![]);
    c.stored(
        vec![Overlay {
            reply_count: 3,
            answered_by: Some(7),
        }],
        vec![],
    );
    c.stored(
        vec![StreamEntry {
            record: records[0].clone(),
            idempotency_key: Some("retry-1".into()),
        }],
        vec![],
    );
    c.stored(vec![IdFloor(42)], vec![]);
    c.stored(vec![Position(4242)], vec![]);
    c.stored(
        vec![HeldMessage {
            channels: vec![
                (crosstalk_schema::ChannelName::parse("dev").unwrap(), (7 << 10) | 2),
                (crosstalk_schema::ChannelName::parse("team.ops").unwrap(), (7 << 10) | 5),
            ],
        }],
        vec![],
    );

    // Channel summary: version 1 held either layout (release 0.1 wrote both).
    let meta = ChannelMeta {
        count: 5,
        last_id: 9,
        last_at: Some(ts(9)),
        created_at: Some(ts(1)),
        last_message_id: 8,
    };
    #[derive(Serialize)]
    struct MetaBefore {
        count: u64,
        last_id: u64,
        last_at: Option<Timestamp>,
        created_at: Option<Timestamp>,
    }
    let before = MetaBefore {
        count: 5,
        last_id: 9,
        last_at: Some(ts(9)),
        created_at: Some(ts(1)),
    };
    c.stored(
        vec![meta],
        vec![Older {
            version: 1,
            bytes: vec![
                old_layout::<ChannelMeta, _>(1, &meta),
                old_layout::<ChannelMeta, _>(1, &before),
            ],
            reads_as: vec![
                meta,
                ChannelMeta {
                    last_message_id: 9,
                    ..meta
                },
            ],
        }],
    );

    // Channel state: version 1 held either layout, with and without `trimmed`.
    let state: ChannelState = from_json(json!({
        "description": "the build channel",
        "session": {"session_id": "s-1", "started_at": ts(2).0, "max_turns": 8, "turns": 3,
                    "done_by": ["alice"], "ended_at": ts(3).0, "end_reason": "done"},
        "open_questions": {"4": "bob", "6": null},
        "trimmed": {"through": 2, "at": 5}
    }));
    #[derive(Serialize)]
    struct StateBefore<'a> {
        description: &'a Option<String>,
        session: &'a Option<crosstalk_schema::Session>,
        open_questions: &'a std::collections::BTreeMap<u64, Option<String>>,
    }
    let state_before = StateBefore {
        description: &state.description,
        session: &state.session,
        open_questions: &state.open_questions,
    };
    c.stored(
        vec![state.clone()],
        vec![Older {
            version: 1,
            bytes: vec![
                old_layout::<ChannelState, _>(1, &state),
                old_layout::<ChannelState, _>(1, &state_before),
            ],
            reads_as: vec![
                state.clone(),
                ChannelState {
                    trimmed: None,
                    ..state.clone()
                },
            ],
        }],
    );
    c.stored(
        vec![CutState {
            trim: crosstalk_schema::Trim { through: 2, at: 5 },
            state: state.clone(),
            created_at: Some(ts(1)),
            last_message_id: 8,
            last_at: Some(ts(9)),
        }],
        vec![],
    );

    let instance: Instance = from_json(json!({
        "instance_id": "coder", "description": "writes the code", "kind": "human", "registered_at": ts(1).0
    }));
    c.stored(vec![instance.clone()], vec![]);
    c.stored(
        vec![from_json::<SharedData>(json!({
            "key": "plan", "owner": "coder", "description": "the plan", "content": "step 1",
            "version": 2, "updated_at": ts(2).0, "deleted": true
        }))],
        vec![],
    );
    c.stored(
        vec![from_json::<ReservationSet>(json!({"items": [{
            "id": "r-1", "holder": "coder", "paths": ["src/**"], "exclusive": true, "reason": "refactor",
            "project": "crosstalk", "created_ms": 1, "expires_ms": 2, "release_when_offline": true
        }]}))],
        vec![],
    );
    c.stored(
        vec![from_json::<Webhook>(json!({
            "id": "w-1", "channel": "dev", "types": ["QUESTION"], "url": "http://127.0.0.1:9/hook",
            "format": "slack", "secret": "s3cret", "created_at": 1
        }))],
        vec![],
    );
    c.stored(
        vec![from_json::<Delivery>(json!({
            "last_id": 4, "delivered": 3, "attempts": 2, "failing_since": 5, "last_error": "503",
            "next_attempt_at": 6
        }))],
        vec![],
    );
    c.stored(
        vec![Lease {
            node: "node-a".into(),
            until: 7,
        }],
        vec![],
    );
    // Wake state: version 2 added `made_by`; version 1's states were made by nobody counted.
    let wake_states = || {
        vec![
            from_json::<WakeState>(json!({
                "identity": "reviewer",
                "lease": {"holder": "h-1", "host": "laptop", "pid": 42, "until_ms": 9},
                "handled": {"dev": 12, "ops": 3},
                "activity": {"Working": {"since_ms": 8, "channels": ["dev"]}},
                "turns": [{"started_ms": 1, "ended_ms": 2, "channels": ["dev"], "messages": 2,
                           "outcome": "exit 1", "attempt": 2}],
                "made_by": null
            })),
            from_json::<WakeState>(json!({
                "identity": "builder", "lease": null, "handled": {},
                "activity": {"Paused": {"channel": "dev", "why": "the loop guard", "question": 14}},
                "turns": [], "made_by": null
            })),
            from_json::<WakeState>(json!({
                "identity": "idle", "lease": null, "handled": {}, "activity": "Listening", "turns": [],
                "made_by": null
            })),
        ]
    };
    let mut now = wake_states();
    now[2].made_by = Some("\u{0}grant:g-1".into());
    #[derive(Serialize)]
    struct WakeBefore {
        identity: String,
        lease: Option<crosstalk_schema::wake::WakeLease>,
        handled: std::collections::BTreeMap<String, u64>,
        activity: crosstalk_schema::wake::Activity,
        turns: Vec<crosstalk_schema::wake::Turn>,
    }
    let before: Vec<Vec<u8>> = wake_states()
        .into_iter()
        .map(|w| {
            let v1 = WakeBefore {
                identity: w.identity,
                lease: w.lease,
                handled: w.handled,
                activity: w.activity,
                turns: w.turns,
            };
            old_layout::<WakeState, _>(1, &v1)
        })
        .collect();
    c.stored(
        now,
        vec![Older {
            version: 1,
            bytes: before,
            reads_as: wake_states(),
        }],
    );

    c.stored(
        vec![from_json::<Invite>(json!({
            "id": "i-1", "identity": "coder", "created_at": 1, "expires_at": 2, "note": "for the laptop"
        }))],
        vec![],
    );
    c.stored(
        vec![from_json::<OAuthClient>(json!({
            "client_id": "c-1", "client_name": "Claude", "redirect_uris": ["https://claude.ai/cb"], "created_at": 1
        }))],
        vec![],
    );
    c.stored(
        vec![from_json::<AuthCode>(json!({
            "client_id": "c-1", "client_name": "Claude", "redirect_uri": "https://claude.ai/cb",
            "challenge": "abc", "resource": "https://relay/mcp", "scope": "relay", "identity": "coder",
            "invite_id": "i-1", "expires_at": 2
        }))],
        vec![],
    );
    c.stored(
        vec![from_json::<Grant>(json!({
            "id": "g-1", "client_id": "c-1", "client_name": "Claude", "redirect_host": "claude.ai",
            "identity": "coder", "invite_id": "i-1", "scope": "relay", "resource": "https://relay/mcp",
            "created_at": 1, "access": "aa", "refresh": "rr", "retired": ["r0", "code"]
        }))],
        vec![],
    );
    c.stored(
        ["Access", "Refresh", "Retired", "Code"]
            .iter()
            .map(|k| from_json::<TokenRef>(json!({"grant": "g-1", "kind": k, "expires_at": 3})))
            .collect(),
        vec![],
    );

    // Task: version 1 held either layout, with and without `grant`.
    let task: TaskRecord = from_json(json!({
        "id": "t-1", "owner": "coder", "face": "mcp", "tool": "wait_for_message",
        "run": "{\"channel\":\"dev\"}", "bound": "coder", "state": "Completed", "message": "done",
        "result": "{}", "created_ms": 1, "updated_ms": 2, "deadline_ms": 3, "ttl_ms": 4,
        "node": "node-a", "grant": "g-1"
    }));
    #[derive(Serialize)]
    struct TaskBefore {
        id: String,
        owner: String,
        face: String,
        tool: String,
        run: String,
        bound: Option<String>,
        state: crosstalk_schema::task::TaskState,
        message: Option<String>,
        result: Option<String>,
        created_ms: i64,
        updated_ms: i64,
        deadline_ms: i64,
        ttl_ms: i64,
        node: String,
    }
    let t = task.clone();
    let before = TaskBefore {
        id: t.id,
        owner: t.owner,
        face: t.face,
        tool: t.tool,
        run: t.run,
        bound: t.bound,
        state: t.state,
        message: t.message,
        result: t.result,
        created_ms: t.created_ms,
        updated_ms: t.updated_ms,
        deadline_ms: t.deadline_ms,
        ttl_ms: t.ttl_ms,
        node: t.node,
    };
    c.stored(
        vec![task.clone()],
        vec![Older {
            version: 1,
            bytes: vec![
                old_layout::<TaskRecord, _>(1, &task),
                old_layout::<TaskRecord, _>(1, &before),
            ],
            reads_as: vec![
                task.clone(),
                TaskRecord {
                    grant: None,
                    ..task.clone()
                },
            ],
        }],
    );

    c.stored(
        vec![Registration {
            instance: instance.clone(),
            session: Some("sess-1".into()),
            seen: -5,
        }],
        vec![],
    );
    c.stored(
        vec![from_json::<PresenceRecord>(json!({
            "channel": "dev",
            "participant": {"id": "coder", "participant_id": "coder", "display_name": "Coder", "kind": "agent",
                            "side": "builder", "activity": "waiting", "last_seen": 1.5,
                            "last_seen_at": "2025-12-06T00:00:01Z"},
            "seen": 6
        }))],
        vec![],
    );

    // Every stored type declared in the sources has its case above, and every file its type.
    let declared = declared_kinds();
    let checked: BTreeSet<String> = c.kinds.iter().map(|k| (*k).to_owned()).collect();
    for kind in declared.difference(&checked) {
        c.problems.push(format!(
            "the stored type {kind:?} has no case in this test (and no committed bytes)"
        ));
    }
    for kind in checked.difference(&declared) {
        c.problems
            .push(format!("{kind:?} is checked here but no source declares it stored"));
    }
    let slugs: BTreeSet<String> = checked.iter().map(|k| slug(k)).collect();
    for entry in std::fs::read_dir(dir()).into_iter().flatten() {
        let name = entry.unwrap().file_name().into_string().unwrap();
        if name == "cursor.bin" {
            continue;
        }
        let kind = name.split(".v").next().unwrap_or_default();
        if !slugs.contains(kind) {
            c.problems
                .push(format!("tests/fixtures/stored/{name} belongs to no stored type"));
        }
    }

    // A read cursor as releases before versioned positions wrote it: eight bytes, big-endian.
    let cursor = std::fs::read(dir().join("cursor.bin"));
    match cursor {
        Ok(b) => assert_eq!(
            Position::decode(&b),
            Ok(Position(4242)),
            "a position as earlier releases wrote it no longer reads"
        ),
        Err(_) if std::env::var_os("CROSSTALK_BLESS").is_some() => {
            std::fs::write(dir().join("cursor.bin"), 4242u64.to_be_bytes()).unwrap()
        }
        Err(_) => c.problems.push("tests/fixtures/stored/cursor.bin is missing".into()),
    }

    assert!(c.problems.is_empty(), "stored formats:\n- {}", c.problems.join("\n- "));
}
