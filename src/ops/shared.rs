//! Shared data: named, versioned content an identity publishes for the others.

use super::channels::NoArgs;
use super::{Caller, Ctx, OpError, Operation, Principal};
use crosstalk_actors::SharedSummary;
use crosstalk_schema::SharedData;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

#[derive(Debug, Deserialize, JsonSchema)]
pub struct ShareRequest {
    pub key: String,
    pub content: String,
    /// Kept from the previous version when omitted.
    pub description: Option<String>,
    /// The owner (default: you).
    #[serde(alias = "instance_id")]
    pub owner: Option<String>,
}

pub struct Share;

impl Operation for Share {
    const NAME: &'static str = "share_data";
    const DESCRIPTION: &'static str =
        "Publish content under key (up to {max_shared}); only its owner can change it; versions are kept.";
    const READ_ONLY: bool = false;
    type Request = ShareRequest;
    type Response = SharedSummary;

    async fn run(cx: &Ctx, caller: Caller, r: ShareRequest) -> Result<SharedSummary, OpError> {
        let owner = caller.identity(cx, r.owner.as_deref())?;
        share(cx, &caller.principal, &owner, &r.key, r.content, r.description).await
    }
}

/// Publishes a version of `key` as `owner` (authorised by the caller), counted against the
/// caller's token: every face's way to share (crosstalk's and cross-claude's).
pub async fn share(
    cx: &Ctx,
    principal: &Principal,
    owner: &str,
    key: &str,
    content: String,
    description: Option<String>,
) -> Result<SharedSummary, OpError> {
    // The store's own spelling of the key, so that one key is counted once.
    let key = key.trim();
    let counted = count_against(cx, principal, key).await?;
    let shared = cx.relay.share_data(owner, key, content, description).await;
    if counted && shared.is_err() {
        cx.shared_kept.forget(principal.key(), key);
    }
    Ok(shared?)
}

/// Counts shared data `key` against the caller's token, if it is one client's
/// (`--max-shared-keys-per-participant`): `true` if it was counted now, and must be forgotten
/// if the key is not written. At the limit by this node's count, the current keys are listed
/// first, so that those deleted (by anyone) give their place back.
async fn count_against(cx: &Ctx, principal: &Principal, key: &str) -> Result<bool, OpError> {
    let still = |_| async { Ok(cx.relay.list_shared_data().await?.into_iter().map(|s| s.key).collect()) };
    cx.shared_kept
        .admit(principal, key, still, |max| {
            format!(
                "this token keeps {max} shared data keys, the most one token may (--max-shared-keys-per-participant); \
                 delete one, or publish a new version of one you keep"
            )
        })
        .await
}

#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct GetDataRequest {
    pub key: String,
    /// A given version (default: the current one).
    pub version: Option<u64>,
}

/// One version of a shared entry, with its content.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct SharedEntry {
    pub key: String,
    pub owner: String,
    pub description: Option<String>,
    pub content: String,
    pub version: u64,
    pub updated_at: String,
    /// This version deleted the entry.
    pub deleted: bool,
}

impl From<SharedData> for SharedEntry {
    fn from(d: SharedData) -> Self {
        SharedEntry {
            updated_at: d.updated_at.to_rfc3339(),
            key: d.key,
            owner: d.owner,
            description: d.description,
            content: d.content,
            version: d.version,
            deleted: d.deleted,
        }
    }
}

pub struct GetData;

impl Operation for GetData {
    const NAME: &'static str = "get_shared_data";
    const DESCRIPTION: &'static str = "Read shared data by key (the current or a given version).";
    const READ_ONLY: bool = true;
    type Request = GetDataRequest;
    type Response = SharedEntry;

    async fn run(cx: &Ctx, _: Caller, r: GetDataRequest) -> Result<SharedEntry, OpError> {
        Ok(cx.relay.get_shared_data(&r.key, r.version).await?.into())
    }
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct SharedList {
    /// Current entries, without content.
    pub entries: Vec<SharedSummary>,
}

pub struct ListData;

impl Operation for ListData {
    const NAME: &'static str = "list_shared_data";
    const DESCRIPTION: &'static str = "Shared data keys with owner, description, size, version.";
    const READ_ONLY: bool = true;
    type Request = NoArgs;
    type Response = SharedList;

    async fn run(cx: &Ctx, _: Caller, _: NoArgs) -> Result<SharedList, OpError> {
        Ok(SharedList {
            entries: cx.relay.list_shared_data().await?,
        })
    }
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct DeleteDataRequest {
    pub key: String,
    /// The owner (default: you).
    #[serde(alias = "instance_id")]
    pub owner: Option<String>,
}

pub struct DeleteData;

impl Operation for DeleteData {
    const NAME: &'static str = "delete_shared_data";
    const DESCRIPTION: &'static str = "Delete your shared data key (earlier versions stay readable).";
    const READ_ONLY: bool = false;
    const DESTRUCTIVE: bool = true;
    const IDEMPOTENT: bool = true;
    type Request = DeleteDataRequest;
    type Response = SharedSummary;

    async fn run(cx: &Ctx, caller: Caller, r: DeleteDataRequest) -> Result<SharedSummary, OpError> {
        let owner = caller.identity(cx, r.owner.as_deref())?;
        let deleted = cx.relay.delete_shared_data(&owner, &r.key).await?;
        // Whoever deleted it, no token keeps it now.
        cx.shared_kept.forget_by_all(&deleted.key);
        Ok(deleted)
    }
}
