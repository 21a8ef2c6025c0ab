//! Identity: registering as an agent or a human, who is registered, and each identity's inbox.

use super::channels::NoArgs;
use super::messages::MessageList;
use super::{Caller, Ctx, Limit, OpError, Operation, Principal};
use crosstalk_actors::{InstanceView, Registered};
use crosstalk_schema::{InstanceId, InstanceKind};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

#[derive(Debug, Deserialize, JsonSchema)]
pub struct RegisterRequest {
    /// The name to act as.
    pub instance_id: InstanceId,
    /// What you do, for the others.
    pub description: Option<String>,
    /// agent (default) or human.
    #[serde(default)]
    pub kind: InstanceKind,
}

/// A registration, and what to send from now on (in the structured answer: hosts such as
/// Claude Code and Codex give their model only that).
#[derive(Debug, Serialize, JsonSchema)]
pub struct RegisterAnswer {
    #[serde(flatten)]
    pub registered: Registered,
    /// How later calls act as this identity.
    pub next: String,
}

pub struct Register;

impl Operation for Register {
    const NAME: &'static str = "register";
    const DESCRIPTION: &'static str = "Register as instance_id; nobody else can use it while you are active. \
        Later calls that name nobody act as it (pass sender/instance_id to be sure).";
    const READ_ONLY: bool = false;
    const IDEMPOTENT: bool = true;
    type Request = RegisterRequest;
    type Response = RegisterAnswer;

    async fn run(cx: &Ctx, caller: Caller, r: RegisterRequest) -> Result<RegisterAnswer, OpError> {
        // The token and the session's own registration bind as everywhere; the registry
        // refuses a name live in another session (409).
        let who = caller.claim(r.instance_id.as_str())?;
        // No session: a new token, bound (as every session is) as the caller's token's, and
        // answered as the client presents it.
        let name = match caller.session.as_deref() {
            Some(session) => Principal::session_name(session).to_owned(),
            None => format!("ct-{}", uuid::Uuid::new_v4().simple()),
        };
        // A token that proves who its client is (a participant's, an OAuth grant's) takes its
        // name back from a session of its own it left behind (a restarted host, which never
        // sent DELETE): at once, not once that session has been silent for the TTL.
        let take_over = caller.principal.is_one_client().then(|| caller.principal.session(""));
        let mut done = cx
            .relay
            .register(
                &who,
                r.description,
                r.kind,
                Some(caller.principal.session(&name)),
                take_over,
            )
            .await?;
        done.session = name;
        let id = done.instance.instance_id.clone();
        Ok(RegisterAnswer {
            next: format!(
                "Registered as {id}. Calls that name nobody act as {id}: from this MCP session, or from \
                 this token's calls without a session (2026-07-28 clients) while {id} is the only name \
                 they registered; REST sends X-Crosstalk-Session: {}. To be sure, pass sender={id} when \
                 posting and instance_id={id} when reading or waiting. Waits skip your own messages.",
                done.session
            ),
            registered: done,
        })
    }
}

/// Messages counted per channel for [`Unread`]: past it, the count reads as this many.
pub const UNREAD_CAP: usize = 1000;

#[derive(Debug, Deserialize, JsonSchema)]
pub struct UnreadRequest {
    /// The identity (default: your own).
    pub instance_id: Option<String>,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct UnreadCounts {
    pub instance_id: String,
    /// Channel → messages from others after the identity's read position (at most 1,000),
    /// for every channel it has read or joined.
    pub unread: std::collections::BTreeMap<String, usize>,
}

pub struct Unread;

impl Operation for Unread {
    const NAME: &'static str = "unread";
    const DESCRIPTION: &'static str = "How many messages from others each channel holds after your read position.";
    const READ_ONLY: bool = true;
    type Request = UnreadRequest;
    type Response = UnreadCounts;

    async fn run(cx: &Ctx, caller: Caller, r: UnreadRequest) -> Result<UnreadCounts, OpError> {
        let who = caller.identity(cx, r.instance_id.as_deref())?;
        let unread = cx
            .relay
            .unread(&who, UNREAD_CAP)
            .await?
            .into_iter()
            .map(|(c, n)| (c.to_string(), n))
            .collect();
        Ok(UnreadCounts {
            instance_id: who,
            unread,
        })
    }
}

/// Who the caller's token makes it.
#[derive(Debug, Serialize, JsonSchema)]
pub struct WhoAmI {
    /// `admin` (the relay's own token), `participant`, `connector` (an OAuth connection that
    /// acts as anyone) or `anyone` (a relay without tokens).
    pub principal: &'static str,
    /// The identity a participant token (or an OAuth connection bound with `--as`) acts as.
    pub identity: Option<String>,
    /// The token is a person's: the admin's, or a participant named in `--humans` (on a relay
    /// without tokens, whoever answers other than through MCP).
    pub human: bool,
    /// What else the token may manage on this relay: `webhooks`, and on a relay with
    /// `--oauth`, `connections` (invites and OAuth grants). The console shows those panels
    /// only, and so asks for nothing the relay would refuse.
    pub manages: Vec<&'static str>,
}

pub struct Whoami;

impl Operation for Whoami {
    const NAME: &'static str = "whoami";
    const DESCRIPTION: &'static str =
        "Who your token makes you: admin, a participant (and whether a person), or anyone.";
    const READ_ONLY: bool = true;
    type Request = NoArgs;
    type Response = WhoAmI;

    async fn run(cx: &Ctx, caller: Caller, _: NoArgs) -> Result<WhoAmI, OpError> {
        let p = &caller.principal;
        let manages = [
            ("webhooks", p.manages_webhooks()),
            ("connections", cx.oauth && p.manages_connections()),
        ]
        .into_iter()
        .filter_map(|(what, may)| may.then_some(what))
        .collect();
        let (principal, human, identity) = match caller.principal {
            Principal::Shared => ("admin", true, None),
            Principal::Participant(id) => ("participant", cx.humans.contains(&id), Some(id)),
            Principal::Connector(_) => ("connector", false, None),
            Principal::Anyone => ("anyone", !caller.policy.agents, None),
        };
        Ok(WhoAmI {
            principal,
            identity,
            human,
            manages,
        })
    }
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct Instances {
    pub instances: Vec<InstanceView>,
}

pub struct ListInstances;

impl Operation for ListInstances {
    const NAME: &'static str = "list_instances";
    const DESCRIPTION: &'static str = "Registered agents and humans with online/offline status.";
    const READ_ONLY: bool = true;
    type Request = NoArgs;
    type Response = Instances;

    async fn run(cx: &Ctx, _: Caller, _: NoArgs) -> Result<Instances, OpError> {
        Ok(Instances {
            instances: cx.relay.list_instances(),
        })
    }
}

#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct InboxRequest {
    /// Whose inbox (default: yours).
    pub instance_id: Option<String>,
    /// At most this many.
    pub limit: Option<Limit>,
}

pub struct Inbox;

impl Operation for Inbox {
    const NAME: &'static str = "check_messages";
    const DESCRIPTION: &'static str = "Your inbox: what is new for you on every channel you joined, once.";
    const READ_ONLY: bool = false;
    type Request = InboxRequest;
    type Response = MessageList;

    async fn run(cx: &Ctx, caller: Caller, r: InboxRequest) -> Result<MessageList, OpError> {
        let who = caller.identity(cx, r.instance_id.as_deref())?;
        let limit = caller.limit(r.limit);
        Ok(MessageList {
            messages: cx.relay.inbox(&who, limit).await?,
        })
    }
}
