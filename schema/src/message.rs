//! Messages: what a client posts (`NewMessage`), what the log stores (`Record`), and what
//! every face returns (`Message`, crosstalk-mcp's JSON shape).

use crate::{ChannelName, InvalidInput, Timestamp};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The `type` a message gets when the poster names none.
pub const DEFAULT_TYPE: &str = "message";

/// Size bounds on a posted message. The relay's configuration chooses them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest `body`, in bytes.
    pub max_body: usize,
    /// Largest `sender`, `type`, `recipient`, `session_id`, `status` or `side`, in bytes.
    pub max_field: usize,
}

/// Default of `--max-body-bytes`.
pub const DEFAULT_MAX_BODY_BYTES: usize = 256 * 1024;

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_body: DEFAULT_MAX_BODY_BYTES,
            max_field: 256,
        }
    }
}

/// A post as a client sends it (`POST /api/channels/{channel}/messages`, MCP `post_message`).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
pub struct NewMessage {
    /// Who posts (default: you, if registered).
    #[serde(default)]
    pub sender: String,
    /// message (default), request, response, status, handoff, done, QUESTION, PERMISSION, ANSWER (set reply_to).
    #[serde(rename = "type", default, deserialize_with = "optional_type")]
    pub kind: Option<MessageType>,
    pub body: String,
    /// The one participant it is for.
    #[serde(default)]
    pub recipient: Option<String>,
    /// Id of the message this answers.
    #[serde(default)]
    pub reply_to: Option<u64>,
    #[serde(default)]
    pub session_id: Option<String>,
    #[serde(default)]
    pub status: Option<String>,
    #[serde(default)]
    pub side: Option<String>,
    /// A retry with the same key returns the original.
    #[serde(default)]
    pub idempotency_key: Option<String>,
}

impl NewMessage {
    /// Checks the post against `limits` and turns it into the record the log stores.
    /// Empty optional fields are dropped; `type` defaults to `message`.
    pub fn into_record(self, limits: &Limits, now: Timestamp) -> Result<MessageRecord, InvalidInput> {
        let short = |field: &'static str, value: String| -> Result<String, InvalidInput> {
            if value.len() > limits.max_field {
                return Err(InvalidInput::TooLong {
                    field,
                    len: value.len(),
                    max: limits.max_field,
                });
            }
            if value.chars().any(char::is_control) {
                return Err(InvalidInput::ControlChars { field });
            }
            Ok(value)
        };
        let optional = |field, value: Option<String>| -> Result<Option<String>, InvalidInput> {
            match value.map(|v| v.trim().to_owned()) {
                Some(v) if !v.is_empty() => short(field, v).map(Some),
                _ => Ok(None),
            }
        };
        let sender = self.sender.trim().to_owned();
        if sender.is_empty() {
            return Err(InvalidInput::Missing { field: "sender" });
        }
        if self.body.is_empty() {
            return Err(InvalidInput::Missing { field: "body" });
        }
        if self.body.len() > limits.max_body {
            return Err(InvalidInput::TooLong {
                field: "body",
                len: self.body.len(),
                max: limits.max_body,
            });
        }
        if let Some(kind) = self.kind.as_ref().filter(|k| k.as_str().len() > limits.max_field) {
            return Err(InvalidInput::TooLong {
                field: "type",
                len: kind.as_str().len(),
                max: limits.max_field,
            });
        }
        let kind = self.kind.unwrap_or_default();
        let mut status = optional("status", self.status)?;
        if kind.asks() && status.is_none() {
            status = Some(STATUS_OPEN.to_owned());
        }
        Ok(MessageRecord {
            sender: short("sender", sender)?,
            kind,
            body: self.body,
            created_at: now,
            session_id: optional("session_id", self.session_id)?,
            recipient: optional("recipient", self.recipient)?,
            reply_to: self.reply_to,
            status,
            side: optional("side", self.side)?,
        })
    }

    /// The idempotency key, validated like the other short fields.
    pub fn idempotency_key(&self, limits: &Limits) -> Result<Option<String>, InvalidInput> {
        match self.idempotency_key.as_deref().map(str::trim) {
            None | Some("") => Ok(None),
            Some(k) if k.len() > limits.max_field => Err(InvalidInput::TooLong {
                field: "idempotency_key",
                len: k.len(),
                max: limits.max_field,
            }),
            Some(k) => Ok(Some(k.to_owned())),
        }
    }
}

/// Status of a QUESTION until an ANSWER replies to it, and after.
pub const STATUS_OPEN: &str = "open";
pub const STATUS_ANSWERED: &str = "answered";
/// A recipient that means "every human".
pub const ANY_HUMAN: &str = "any-human";

/// A PERMISSION's verdicts.
pub const VERDICTS: [&str; 2] = ["allow", "deny"];

/// What a message's `type` means to the relay. Every rule about types (who may answer a
/// PERMISSION, what closes a question, what ends a session, what a directive is) reads this,
/// never the text a client sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Meaning {
    /// `message`, the default.
    Message,
    /// Waits for an ANSWER.
    Question,
    /// A host asking a human whether its agent may use a tool (Claude Code's relayed
    /// permission prompt): a QUESTION whose ANSWER is `allow` or `deny`, decided by a human only.
    Permission,
    /// Closes the QUESTION or PERMISSION its `reply_to` names.
    Answer,
    Interrupt,
    Directive,
    /// One side of a session is finished.
    Done,
    /// Any other type: free text that no rule reads.
    Free,
}

impl Meaning {
    /// The types that carry meaning, each as the relay itself writes it (a poster's own
    /// spelling, in any ASCII case, is kept as written).
    const SPELLED: [(Meaning, &'static str); 7] = [
        (Meaning::Message, "message"),
        (Meaning::Question, "QUESTION"),
        (Meaning::Permission, "PERMISSION"),
        (Meaning::Answer, "ANSWER"),
        (Meaning::Interrupt, "INTERRUPT"),
        (Meaning::Directive, "DIRECTIVE"),
        (Meaning::Done, "done"),
    ];

    /// How the relay writes a meaningful type (`None` for [`Meaning::Free`]).
    pub fn spelling(self) -> Option<&'static str> {
        Self::SPELLED.iter().find(|(m, _)| *m == self).map(|(_, s)| *s)
    }

    /// The meaning of a type as the relay stored or sent it: the whole text, ASCII case
    /// ignored (what [`MessageType::stored`] reads, without making one).
    pub fn of_word(word: &str) -> Meaning {
        Self::SPELLED
            .iter()
            .find(|(_, s)| s.eq_ignore_ascii_case(word))
            .map_or(Meaning::Free, |(m, _)| *m)
    }
}

/// A message's `type`, parsed once where it enters the relay (deserialisation of a post, on
/// every face) into its normal form, which is what every check reads and what the log stores:
///
/// - whitespace of every kind around it is gone;
/// - a type is refused if it holds a control character, an invisible (default-ignorable)
///   character such as a zero-width space or a bidi override, or whitespace other than a plain
///   space;
/// - a type that is one of the meaningful words in any ASCII case means that word, and is kept
///   as written, as crosstalk-mcp keeps it (`DONE` stays `DONE`, `done` stays `done`): what it
///   means is decided here, once, and carried with it;
/// - a type that only looks like a meaningful word — Unicode look-alikes (Cyrillic `А`,
///   fullwidth `ＡＮＳＷＥＲ`, …, by the Unicode TR39 confusable skeleton) — is refused, so no
///   type can read as a meaningful one to a person while meaning nothing to the relay, or the
///   other way round.
///
/// Types stored before this parse existed are read back with [`MessageType::stored`], which
/// classifies exactly as the relay always has (the whole text, ASCII case ignored), so a
/// replayed log folds to the same state.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct MessageType {
    text: String,
    meaning: Meaning,
}

impl Default for MessageType {
    fn default() -> Self {
        Meaning::Message.into()
    }
}

impl From<Meaning> for MessageType {
    /// A meaningful type as the relay writes it; [`Meaning::Free`] has none and reads as `message`.
    fn from(meaning: Meaning) -> Self {
        let meaning = if meaning == Meaning::Free {
            Meaning::Message
        } else {
            meaning
        };
        MessageType {
            text: meaning.spelling().unwrap_or(DEFAULT_TYPE).to_owned(),
            meaning,
        }
    }
}

impl MessageType {
    /// Parses a client's `type`. `Ok(None)` for a type that is empty once trimmed (the post
    /// then takes the default, `message`).
    pub fn parse(raw: &str) -> Result<Option<MessageType>, InvalidInput> {
        let text = raw.trim();
        if text.is_empty() {
            return Ok(None);
        }
        let bad = |reason| Err(InvalidInput::Invalid { field: "type", reason });
        for c in text.chars() {
            if c.is_control() {
                return Err(InvalidInput::ControlChars { field: "type" });
            }
            if !c.is_ascii() && invisible(c) {
                return bad("it holds an invisible character (zero-width, joiner, bidi control or the like)");
            }
            if c.is_whitespace() && c != ' ' {
                return bad("the only whitespace a type may hold is a plain space");
            }
        }
        let meaning = Meaning::of_word(text);
        if meaning != Meaning::Free {
            return Ok(Some(MessageType {
                text: text.to_owned(),
                meaning,
            }));
        }
        if let Some(word) = looks_like(text) {
            return Err(InvalidInput::Other(format!(
                "field `type` is invalid: {:?} looks like {word} but is spelled with other characters; \
                 write {word} in plain letters, or choose a type that looks like no meaningful one",
                text.chars().take(40).collect::<String>()
            )));
        }
        Ok(Some(MessageType {
            text: text.to_owned(),
            meaning,
        }))
    }

    /// A type as the log stored it, classified as the relay always has: the whole text, ASCII
    /// case ignored. Never refuses: a stored record must always read back.
    pub fn stored(text: String) -> MessageType {
        let meaning = Meaning::of_word(&text);
        MessageType { text, meaning }
    }

    pub fn as_str(&self) -> &str {
        &self.text
    }

    pub fn meaning(&self) -> Meaning {
        self.meaning
    }

    pub fn is(&self, meaning: Meaning) -> bool {
        self.meaning == meaning
    }

    /// Whether a message of this type waits for an ANSWER (a QUESTION or a PERMISSION).
    pub fn asks(&self) -> bool {
        matches!(self.meaning, Meaning::Question | Meaning::Permission)
    }

    /// Reads a stored type without refusing it ([`MessageType::stored`]): for records in the
    /// log and messages a relay sent, which must always decode.
    pub fn deserialize_stored<'de, D: serde::Deserializer<'de>>(d: D) -> Result<MessageType, D::Error> {
        String::deserialize(d).map(MessageType::stored)
    }
}

impl std::fmt::Display for MessageType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

impl Serialize for MessageType {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.text)
    }
}

impl<'de> Deserialize<'de> for MessageType {
    /// A client's type: parsed, so a bad one is refused where it arrives ([`MessageType::parse`]).
    /// An empty one is `message`.
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<MessageType, D::Error> {
        let raw = String::deserialize(d)?;
        MessageType::parse(&raw)
            .map(Option::unwrap_or_default)
            .map_err(serde::de::Error::custom)
    }
}

impl JsonSchema for MessageType {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "MessageType".into()
    }

    fn json_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
        String::json_schema(generator)
    }

    fn inline_schema() -> bool {
        true
    }
}

/// Parses an optional client `type`, where an empty one means none.
fn optional_type<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<MessageType>, D::Error> {
    match Option::<String>::deserialize(d)? {
        None => Ok(None),
        Some(raw) => MessageType::parse(&raw).map_err(serde::de::Error::custom),
    }
}

/// A character that shows as nothing: Unicode's Default_Ignorable_Code_Point (zero-width
/// space and joiners, bidi controls, variation selectors, the soft hyphen, tags, …), which
/// the TR39 skeleton drops.
fn invisible(c: char) -> bool {
    let mut buf = [0u8; 4];
    let nothing = unicode_security::skeleton(c.encode_utf8(&mut buf)).next().is_none();
    nothing
}

/// Each meaningful word with its [`skeletons`], worked out once.
fn looks_alike() -> &'static [(&'static str, [String; 3])] {
    static WORDS: std::sync::LazyLock<Vec<(&'static str, [String; 3])>> =
        std::sync::LazyLock::new(|| Meaning::SPELLED.iter().map(|(_, w)| (*w, skeletons(w))).collect());
    &WORDS
}

/// The meaningful word `text` looks like without being it, if any. Working out a text's
/// skeletons costs more than the rest of a post's parse, and a relay sees the same few types
/// over and over, so each thread remembers its last [`LOOKS_REMEMBERED`] answers.
fn looks_like(text: &str) -> Option<&'static str> {
    thread_local! {
        static SEEN: std::cell::RefCell<std::collections::VecDeque<(Box<str>, Option<&'static str>)>> =
            const { std::cell::RefCell::new(std::collections::VecDeque::new()) };
    }
    if let Some(known) = SEEN.with_borrow(|seen| seen.iter().find(|(t, _)| &**t == text).map(|(_, w)| *w)) {
        return known;
    }
    let looks = skeletons(text);
    let word = looks_alike()
        .iter()
        .find(|(_, theirs)| theirs.iter().any(|s| looks.contains(s)))
        .map(|(word, _)| *word);
    // Long texts are rare as types and not worth keeping.
    if text.len() <= 64 {
        SEEN.with_borrow_mut(|seen| {
            if seen.len() == LOOKS_REMEMBERED {
                seen.pop_back();
            }
            seen.push_front((text.into(), word));
        });
    }
    word
}

/// How many types' look-alike answers a thread keeps ([`looks_like`]).
const LOOKS_REMEMBERED: usize = 16;

/// What a text can look like: its TR39 confusable skeleton as written, in lower case and in
/// upper case (so `Аnswer` with a Cyrillic `А`, and `PERMlSSION` with a small L, both look
/// like a meaningful word).
fn skeletons(text: &str) -> [String; 3] {
    let skeleton = |t: &str| unicode_security::skeleton(t).collect::<String>();
    [
        skeleton(text),
        skeleton(&text.to_lowercase()),
        skeleton(&text.to_uppercase()),
    ]
}

/// One event of a channel's log. New kinds are added at the end only: postcard encodes the
/// variant by index, so logs written today stay readable.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Record {
    Message(MessageRecord),
    /// A session began on the channel (crosstalk-mcp's `start_session`).
    SessionStarted {
        session_id: String,
        max_turns: Option<u32>,
        at: Timestamp,
    },
    /// The session ended: `reason` is `ended`, `max_turns` or `done`.
    SessionEnded {
        session_id: String,
        reason: String,
        at: Timestamp,
    },
    /// The channel's description was set.
    Described {
        description: String,
        at: Timestamp,
    },
    /// Retention, decided once for every node of a cluster: the channel's events up to and
    /// including id `through` leave every node's copy when the fold reaches this event (a
    /// relay on its own compacts directly and never logs one).
    Trimmed {
        through: u64,
        at: Timestamp,
    },
}

impl Record {
    /// The event's own time: a message's creation, or when the session, description or cut
    /// was recorded.
    pub fn at(&self) -> Timestamp {
        match self {
            Record::Message(m) => m.created_at,
            Record::SessionStarted { at, .. }
            | Record::SessionEnded { at, .. }
            | Record::Described { at, .. }
            | Record::Trimmed { at, .. } => *at,
        }
    }
}

/// A message as the log stores it. The id and the channel are the record's key, not part of it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MessageRecord {
    pub sender: String,
    #[serde(deserialize_with = "MessageType::deserialize_stored")]
    pub kind: MessageType,
    pub body: String,
    pub created_at: Timestamp,
    pub session_id: Option<String>,
    pub recipient: Option<String>,
    pub reply_to: Option<u64>,
    pub status: Option<String>,
    pub side: Option<String>,
}

/// A stored message as every face shows it: crosstalk-mcp's field names.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Message {
    pub id: u64,
    pub channel: String,
    pub sender: String,
    #[serde(rename = "type", deserialize_with = "MessageType::deserialize_stored")]
    pub kind: MessageType,
    pub body: String,
    /// RFC 3339, UTC.
    pub created_at: String,
    pub session_id: Option<String>,
    pub recipient: Option<String>,
    pub reply_to: Option<u64>,
    pub status: Option<String>,
    pub side: Option<String>,
    /// Messages whose `reply_to` names this one.
    #[serde(default)]
    pub reply_count: u64,
}

impl Message {
    pub fn new(id: u64, channel: &ChannelName, record: MessageRecord) -> Self {
        Message {
            id,
            channel: channel.to_string(),
            sender: record.sender,
            kind: record.kind,
            body: record.body,
            created_at: record.created_at.to_rfc3339(),
            session_id: record.session_id,
            recipient: record.recipient,
            reply_to: record.reply_to,
            status: record.status,
            side: record.side,
            reply_count: 0,
        }
    }

    /// Applies what later events changed about this message.
    pub fn with_overlay(mut self, overlay: &Overlay) -> Self {
        self.reply_count = overlay.reply_count;
        if overlay.answered_by.is_some() {
            self.status = Some(STATUS_ANSWERED.to_owned());
        }
        self
    }
}

/// What later messages changed about an earlier one: how many replies it has, and (for a
/// QUESTION) which ANSWER closed it. Kept beside the log, updated in the replies' batches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Overlay {
    pub reply_count: u64,
    pub answered_by: Option<u64>,
}

/// One event as a message of a cluster's stream carries it: the record and the post's
/// idempotency key, so that the fold, on every node, recognises a retried post. It embeds
/// [`Record`]: a new layout of that is a new layout of this.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamEntry {
    pub record: Record,
    pub idempotency_key: Option<String>,
}

crate::stored!(Record => "log record", Overlay => "message overlay", StreamEntry => "stream entry");

#[cfg(test)]
mod tests {
    use super::*;

    fn post(sender: &str, body: &str) -> NewMessage {
        NewMessage {
            sender: sender.into(),
            body: body.into(),
            ..Default::default()
        }
    }

    #[test]
    fn defaults_and_trims() {
        let mut p = post(" alice ", "hi\nthere");
        p.recipient = Some("  ".into());
        let r = p.into_record(&Limits::default(), Timestamp(1)).unwrap();
        assert_eq!(r.sender, "alice");
        assert_eq!(r.kind.as_str(), "message");
        assert_eq!(r.recipient, None);
        assert_eq!(r.body, "hi\nthere");
    }

    #[test]
    fn rejects_bad_posts() {
        let limits = Limits {
            max_body: 8,
            max_field: 4,
        };
        let cases = [
            (post("", "x"), InvalidInput::Missing { field: "sender" }),
            (post("a", ""), InvalidInput::Missing { field: "body" }),
            (
                post("a", "123456789"),
                InvalidInput::TooLong {
                    field: "body",
                    len: 9,
                    max: 8,
                },
            ),
            (
                post("abcde", "x"),
                InvalidInput::TooLong {
                    field: "sender",
                    len: 5,
                    max: 4,
                },
            ),
            (post("a\nb", "x"), InvalidInput::ControlChars { field: "sender" }),
        ];
        for (p, want) in cases {
            assert_eq!(p.into_record(&limits, Timestamp(0)).unwrap_err(), want);
        }
    }

    /// Every spelling an agent might try for ANSWER: each is either the ANSWER (trimmed, any
    /// case) or refused. None is stored as something that reads like one and means another.
    #[test]
    fn a_type_is_parsed_into_one_form() {
        let meaning = |raw: &str| MessageType::parse(raw).map(|t| t.map(|t| t.meaning()));
        let answer = |raw: &str| MessageType::parse(raw).map(|t| t.map(|t| (t.as_str().to_owned(), t.meaning())));
        for raw in [
            "ANSWER",
            "answer",
            "Answer",
            "aNsWeR",
            " ANSWER",
            "ANSWER ",
            "answer\n",
            "\tAnswer",
            "\r\nANSWER\r\n",
            "ANSWER\u{a0}",
            "\u{a0}ANSWER",
            "\u{2003}answer\u{3000}",
            "\u{2028}ANSWER\u{2029}",
            "\u{85}ANSWER",
            "\u{1680}answer",
            "\u{feff}ANSWER".trim_start_matches('\u{feff}'),
        ] {
            assert_eq!(meaning(raw), Ok(Some(Meaning::Answer)), "{raw:?}");
            assert_eq!(answer(raw).unwrap().unwrap().0, raw.trim(), "kept as written, trimmed");
        }
        // Invisible characters, anywhere.
        for raw in [
            "ANSWER\u{200b}",
            "\u{200b}ANSWER",
            "ANS\u{200b}WER",
            "ANS\u{200c}WER",
            "ANS\u{200d}WER",
            "ANSWER\u{2060}",
            "ANSWER\u{feff}",
            "\u{feff}ANSWER",
            "ANS\u{ad}WER",
            "\u{202e}REWSNA",
            "ANSWER\u{fe0f}",
            "ANSWER\u{e0041}",
            "ANS\u{34f}WER",
        ] {
            assert!(
                matches!(
                    MessageType::parse(raw),
                    Err(InvalidInput::Invalid { field: "type", .. })
                ),
                "{raw:?} was not refused: {:?}",
                MessageType::parse(raw)
            );
        }
        // Control characters and other whitespace inside.
        for raw in ["ANS\nWER", "ANS\tWER", "ANSWER\u{0}", "ANS\u{7f}WER", "ANS\u{9c}WER"] {
            assert_eq!(
                MessageType::parse(raw),
                Err(InvalidInput::ControlChars { field: "type" }),
                "{raw:?}"
            );
        }
        for raw in ["ANS\u{a0}WER", "ANS\u{2003}WER"] {
            assert!(
                matches!(MessageType::parse(raw), Err(InvalidInput::Invalid { .. })),
                "{raw:?}"
            );
        }
        // Look-alikes of every meaningful type: Cyrillic, Greek, fullwidth, mathematical letters,
        // digits for letters, combining marks.
        for raw in [
            "\u{410}NSWER",                                     // Cyrillic А
            "ANSW\u{415}R",                                     // Cyrillic Е
            "\u{ff21}\u{ff2e}\u{ff33}\u{ff37}\u{ff25}\u{ff32}", // fullwidth
            "\u{1d400}NSWER",                                   // mathematical bold A
            "PERM\u{399}SSION",                                 // Greek Ι
            "PERM1SSION",
            "QUEST\u{406}ON", // Cyrillic І
            "D\u{41e}NE",
            "d\u{3bf}ne", // Greek ο
            "DlRECTIVE",
            "\u{2160}NTERRUPT", // Roman numeral one
            "mess\u{430}ge",
        ] {
            // Twice, and after many other types: the thread's memory of answers
            // (`looks_like`) answers as the skeletons do, and forgets without harm.
            for round in 0..4 {
                let got = MessageType::parse(raw);
                assert!(
                    matches!(&got, Err(InvalidInput::Other(why)) if why.contains("looks like")),
                    "{raw:?} was not refused as a look-alike in round {round}: {got:?}"
                );
                if round % 2 == 0 {
                    continue;
                }
                for other in 0..LOOKS_REMEMBERED + 1 {
                    assert!(MessageType::parse(&format!("kind {other}")).is_ok());
                }
            }
        }
        // Free types stay as written; an empty one is none.
        assert_eq!(
            answer("  status update "),
            Ok(Some(("status update".to_owned(), Meaning::Free)))
        );
        assert_eq!(answer("Übergabe"), Ok(Some(("Übergabe".to_owned(), Meaning::Free))));
        assert_eq!(answer("REQUEST"), Ok(Some(("REQUEST".to_owned(), Meaning::Free))));
        assert_eq!(answer(" \u{a0}\t"), Ok(None));
        // Each meaningful word means itself in any case.
        for (raw, want) in [
            ("question", Meaning::Question),
            ("Permission", Meaning::Permission),
            ("directive", Meaning::Directive),
            ("Interrupt", Meaning::Interrupt),
            ("DONE", Meaning::Done),
            ("MESSAGE", Meaning::Message),
        ] {
            assert_eq!(meaning(raw), Ok(Some(want)), "{raw:?}");
        }
    }

    /// The parse happens where a post is read: a JSON body with a disguised type is refused by
    /// deserialisation, and a plain one arrives normalised.
    #[test]
    fn a_post_is_normalised_where_it_is_read() {
        let read =
            |kind: &str| serde_json::from_value::<NewMessage>(serde_json::json!({"body": "allow", "type": kind}));
        assert_eq!(read(" ANSWER").unwrap().kind.unwrap().meaning(), Meaning::Answer);
        assert_eq!(read("answer\n").unwrap().kind.unwrap().as_str(), "answer");
        assert!(read("ANSWER\u{200b}").unwrap_err().to_string().contains("invisible"));
        assert!(read("\u{410}NSWER")
            .unwrap_err()
            .to_string()
            .contains("looks like ANSWER"));
        assert_eq!(read("").unwrap().kind, None);
        let rec = read("\tAnswer\u{a0}")
            .unwrap()
            .into_record(&Limits::default(), Timestamp(0))
            .map(|mut r| {
                r.sender = "x".into();
                r
            });
        assert!(rec.is_err(), "no sender: refused");
    }

    /// What the log holds is read back as it is, classified as before the parse existed, so
    /// an old log replays to the same state; and the stored bytes did not change.
    #[test]
    fn stored_types_read_back_unchanged() {
        for (text, meaning) in [
            ("ANSWER", Meaning::Answer),
            ("answer", Meaning::Answer),
            ("ANSWER\u{200b}", Meaning::Free),
            ("RESERVATION", Meaning::Free),
        ] {
            let rec = MessageRecord {
                sender: "a".into(),
                kind: MessageType::stored(text.into()),
                body: "b".into(),
                created_at: Timestamp(0),
                session_id: None,
                recipient: None,
                reply_to: None,
                status: None,
                side: None,
            };
            let bytes = postcard::to_allocvec(&rec).unwrap();
            let as_string = postcard::to_allocvec(&("a", text)).unwrap();
            assert!(bytes.starts_with(&as_string), "a type is stored as the string it was");
            let back: MessageRecord = postcard::from_bytes(&bytes).unwrap();
            assert_eq!(back.kind.as_str(), text);
            assert_eq!(back.kind.meaning(), meaning, "{text:?}");
        }
    }

    #[test]
    fn wire_shape_is_crosstalk_mcps() {
        let ch = ChannelName::parse("dev").unwrap();
        let rec = post("a", "b").into_record(&Limits::default(), Timestamp(0)).unwrap();
        let json = serde_json::to_value(Message::new(7, &ch, rec)).unwrap();
        let keys: Vec<_> = json.as_object().unwrap().keys().cloned().collect();
        for k in [
            "id",
            "channel",
            "sender",
            "type",
            "body",
            "created_at",
            "session_id",
            "recipient",
            "reply_to",
            "status",
            "side",
        ] {
            assert!(keys.contains(&k.to_string()), "missing {k}");
        }
        assert_eq!(json["created_at"], "1970-01-01T00:00:00.000000Z");
    }
}
