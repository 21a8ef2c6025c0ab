//! Shared data: named blobs an identity publishes for others (drafts, specs, diffs). Each key
//! has one owner; only the owner can overwrite or delete it. Every version is kept.

use crate::commit::Committer;
use crate::error::RelayError;
use crate::store::{EventStore, Space};
use actix::prelude::*;
use crosstalk_schema::{codec, InvalidInput, SharedData, Timestamp};
use futures_util::future::BoxFuture;
use serde::Serialize;
use std::sync::Arc;
use std::time::Duration;

/// Longest shared data key, in bytes.
pub const MAX_KEY: usize = 256;

/// Publish a new version of `key`.
#[derive(Message, Clone)]
#[rtype(result = "Result<SharedSummary, RelayError>")]
pub struct PublishData {
    pub key: String,
    pub owner: String,
    pub content: String,
    pub description: Option<String>,
}

/// The current version of `key`, or a given one.
#[derive(Message)]
#[rtype(result = "Result<SharedData, RelayError>")]
pub struct Fetch {
    pub key: String,
    pub version: Option<u64>,
}

/// Every current entry, without content.
#[derive(Message)]
#[rtype(result = "Result<Vec<SharedSummary>, RelayError>")]
pub struct ListShared;

/// Delete `key` (the owner only); earlier versions stay readable by version.
#[derive(Message)]
#[rtype(result = "Result<SharedSummary, RelayError>")]
pub struct Unshare {
    pub key: String,
    pub owner: String,
}

/// A shared entry without its content.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, schemars::JsonSchema)]
pub struct SharedSummary {
    pub key: String,
    pub owner: String,
    pub description: Option<String>,
    pub version: u64,
    pub size: usize,
    pub updated_at: String,
    pub deleted: bool,
}

impl From<&SharedData> for SharedSummary {
    fn from(d: &SharedData) -> Self {
        SharedSummary {
            key: d.key.clone(),
            owner: d.owner.clone(),
            description: d.description.clone(),
            version: d.version,
            size: d.content.len(),
            updated_at: d.updated_at.to_rfc3339(),
            deleted: d.deleted,
        }
    }
}

/// Where shared data is kept: this relay's own [`SharedStore`] ([`Local`]) or, on a cluster,
/// the nodes' common store ([`crate::cluster::Cluster::shared_data`]). Every implementation
/// applies the same rules: [`valid_key`], [`next_version`], [`deletion`].
pub trait SharedDataStore: Send + Sync + 'static {
    /// Publishes a version of `share.key`; the caller has authorised `share.owner`.
    fn share(&self, share: PublishData) -> BoxFuture<'static, Result<SharedSummary, RelayError>>;
    /// The current version of `key`, or version `version` (a deleted key's current version
    /// is not found; its versions still are).
    fn fetch(&self, key: String, version: Option<u64>) -> BoxFuture<'static, Result<SharedData, RelayError>>;
    /// Every key's current version, deleted keys left out, by key.
    fn list(&self) -> BoxFuture<'static, Result<Vec<SharedSummary>, RelayError>>;
    /// Deletes `key`; the caller has authorised `owner`.
    fn delete(&self, owner: String, key: String) -> BoxFuture<'static, Result<SharedSummary, RelayError>>;
}

/// Shared data in this relay's own store, through its [`SharedStore`] actor.
pub struct Local {
    pub actor: Addr<SharedStore>,
    /// Longest a call waits for the actor.
    pub timeout: Duration,
}

impl SharedDataStore for Local {
    fn share(&self, share: PublishData) -> BoxFuture<'static, Result<SharedSummary, RelayError>> {
        let call = self.actor.send(share).timeout(self.timeout);
        Box::pin(async move { call.await? })
    }

    fn fetch(&self, key: String, version: Option<u64>) -> BoxFuture<'static, Result<SharedData, RelayError>> {
        let call = self.actor.send(Fetch { key, version }).timeout(self.timeout);
        Box::pin(async move { call.await? })
    }

    fn list(&self) -> BoxFuture<'static, Result<Vec<SharedSummary>, RelayError>> {
        let call = self.actor.send(ListShared).timeout(self.timeout);
        Box::pin(async move { call.await? })
    }

    fn delete(&self, owner: String, key: String) -> BoxFuture<'static, Result<SharedSummary, RelayError>> {
        let call = self.actor.send(Unshare { key, owner }).timeout(self.timeout);
        Box::pin(async move { call.await? })
    }
}

pub struct SharedStore {
    store: Arc<dyn EventStore>,
    committer: Committer,
    /// Largest content accepted, in bytes.
    max_size: usize,
    /// Versions handed to the store thread and not yet durable, by key.
    pending: std::collections::HashMap<String, SharedData>,
}

pub(crate) fn valid_key(key: &str) -> Result<String, RelayError> {
    let key = key.trim();
    if key.is_empty() {
        return Err(InvalidInput::Missing { field: "key" }.into());
    }
    if key.len() > MAX_KEY {
        return Err(InvalidInput::TooLong {
            field: "key",
            len: key.len(),
            max: MAX_KEY,
        }
        .into());
    }
    if key.chars().any(char::is_control) || key.contains('\0') {
        return Err(InvalidInput::ControlChars { field: "key" }.into());
    }
    Ok(key.to_owned())
}

/// The version `msg` makes of `current` (the current version of its key, `key` already
/// validated), by the ownership rules every store keeps.
pub(crate) fn next_version(
    key: &str,
    current: Option<&SharedData>,
    msg: &PublishData,
    max_size: usize,
) -> Result<SharedData, RelayError> {
    if msg.content.len() > max_size {
        return Err(InvalidInput::TooLong {
            field: "content",
            len: msg.content.len(),
            max: max_size,
        }
        .into());
    }
    if let Some(c) = current.filter(|c| !c.deleted && c.owner != msg.owner) {
        return Err(RelayError::Forbidden(format!(
            "shared data {key:?} belongs to {:?}; only its owner can change it",
            c.owner
        )));
    }
    // A new version without a description keeps the one it had.
    let description = msg
        .description
        .clone()
        .filter(|d| !d.trim().is_empty())
        .or_else(|| current.filter(|c| !c.deleted).and_then(|c| c.description.clone()));
    Ok(SharedData {
        key: key.to_owned(),
        owner: msg.owner.clone(),
        description,
        content: msg.content.clone(),
        version: current.map_or(1, |c| c.version + 1),
        updated_at: Timestamp::now(),
        deleted: false,
    })
}

/// The version that deletes `current` (the current version of `key`), if `owner` may.
pub(crate) fn deletion(key: &str, current: Option<SharedData>, owner: &str) -> Result<SharedData, RelayError> {
    let current = current.filter(|c| !c.deleted).ok_or_else(|| not_found(key, None))?;
    if current.owner != owner {
        return Err(RelayError::Forbidden(format!(
            "shared data {key:?} belongs to {:?}; only its owner can delete it",
            current.owner
        )));
    }
    Ok(SharedData {
        version: current.version + 1,
        content: String::new(),
        updated_at: Timestamp::now(),
        deleted: true,
        ..current
    })
}

/// The error for a key (or a version of it) that is not there.
pub(crate) fn not_found(key: &str, version: Option<u64>) -> RelayError {
    match version {
        None => RelayError::NotFound(format!("no shared data under {key:?}")),
        Some(v) => RelayError::NotFound(format!("shared data {key:?} has no version {v}")),
    }
}

fn version_key(key: &str, version: u64) -> Vec<u8> {
    let mut k = key.as_bytes().to_vec();
    k.push(0);
    k.extend_from_slice(&version.to_be_bytes());
    k
}

impl SharedStore {
    pub fn new(store: Arc<dyn EventStore>, committer: Committer, max_size: usize) -> Self {
        SharedStore {
            store,
            committer,
            max_size,
            pending: Default::default(),
        }
    }

    fn current(&self, key: &str) -> Result<Option<SharedData>, RelayError> {
        if let Some(p) = self.pending.get(key) {
            return Ok(Some(p.clone()));
        }
        match self.store.get_aux(Space::SharedData, key.as_bytes())? {
            None => Ok(None),
            Some(bytes) => Ok(Some(codec::decode(&bytes).map_err(|e| {
                RelayError::Store(crate::StoreError::Corrupt(format!("shared data {key:?}: {e}")))
            })?)),
        }
    }

    /// Hands the new version to the store thread; answers once it is durable.
    fn write(&mut self, entry: SharedData) -> ResponseActFuture<Self, Result<SharedSummary, RelayError>> {
        let encoded = codec::encode(&entry);
        let versions = vec![(version_key(&entry.key, entry.version), Some(encoded.clone()))];
        let current = vec![(entry.key.as_bytes().to_vec(), Some(encoded))];
        let ticket = self.committer.write(Box::new(move |store: &dyn EventStore| {
            let mut undo = store.write_aux(Space::SharedVersions, &versions)?;
            match store.write_aux(Space::SharedData, &current) {
                Ok(more) => {
                    undo.0.extend(more.0);
                    Ok(undo)
                }
                Err(e) => {
                    let _ = store.undo(undo);
                    Err(e)
                }
            }
        }));
        // Until it is durable, the next version of the key counts from this one.
        self.pending.insert(entry.key.clone(), entry.clone());
        let (key, version) = (entry.key.clone(), entry.version);
        let summary = SharedSummary::from(&entry);
        Box::pin(ticket.durable().into_actor(self).map(move |result, act, _| {
            if act.pending.get(&key).is_some_and(|p| p.version == version) {
                act.pending.remove(&key);
            }
            result?;
            Ok(summary)
        }))
    }
}

impl Actor for SharedStore {
    type Context = Context<Self>;
}

impl Handler<PublishData> for SharedStore {
    type Result = ResponseActFuture<Self, Result<SharedSummary, RelayError>>;

    fn handle(&mut self, msg: PublishData, _: &mut Context<Self>) -> Self::Result {
        let prepared = (|| {
            let key = valid_key(&msg.key)?;
            let current = self.current(&key)?;
            next_version(&key, current.as_ref(), &msg, self.max_size)
        })();
        match prepared {
            Ok(entry) => self.write(entry),
            Err(e) => Box::pin(actix::fut::ready(Err(e))),
        }
    }
}

impl Handler<Unshare> for SharedStore {
    type Result = ResponseActFuture<Self, Result<SharedSummary, RelayError>>;

    fn handle(&mut self, msg: Unshare, _: &mut Context<Self>) -> Self::Result {
        let prepared = (|| {
            let key = valid_key(&msg.key)?;
            let current = self.current(&key)?;
            deletion(&key, current, &msg.owner)
        })();
        match prepared {
            Ok(entry) => self.write(entry),
            Err(e) => Box::pin(actix::fut::ready(Err(e))),
        }
    }
}

impl Handler<Fetch> for SharedStore {
    type Result = Result<SharedData, RelayError>;

    fn handle(&mut self, msg: Fetch, _: &mut Context<Self>) -> Self::Result {
        let key = valid_key(&msg.key)?;
        let found = match msg.version {
            None => self.current(&key)?.filter(|c| !c.deleted),
            Some(v) => match self.store.get_aux(Space::SharedVersions, &version_key(&key, v))? {
                None => None,
                Some(bytes) => Some(codec::decode(&bytes).map_err(|e| {
                    RelayError::Store(crate::StoreError::Corrupt(format!("shared data {key:?} v{v}: {e}")))
                })?),
            },
        };
        found.ok_or_else(|| not_found(&key, msg.version))
    }
}

impl Handler<ListShared> for SharedStore {
    type Result = Result<Vec<SharedSummary>, RelayError>;

    fn handle(&mut self, _: ListShared, _: &mut Context<Self>) -> Self::Result {
        let mut out = Vec::new();
        for (_, bytes) in self.store.scan_aux(Space::SharedData, b"", usize::MAX)? {
            if let Ok(d) = codec::decode::<SharedData>(&bytes) {
                if !d.deleted {
                    out.push(SharedSummary::from(&d));
                }
            }
        }
        Ok(out)
    }
}
