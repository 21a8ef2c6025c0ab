//! Shared data: publish, read, list, delete. On a relay of its own, through its actor; on a
//! cluster node, in the cluster's key-value buckets ([`crate::nats::SharedBuckets`]), under the
//! same rules ([`crate::shared`]).

use super::{Relay, ACTOR_CALL_TIMEOUT};
use crate::error::RelayError;
use crate::shared::{self, Fetch, ListShared, Share, SharedSummary, Unshare};
use crosstalk_schema::SharedData;

impl Relay {
    /// Publishes a version of `key`; the caller has authorised `owner`.
    pub async fn share_data(
        &self,
        owner: &str,
        key: &str,
        content: String,
        description: Option<String>,
    ) -> Result<SharedSummary, RelayError> {
        let msg = Share {
            key: key.to_owned(),
            owner: owner.to_owned(),
            content,
            description,
        };
        if let Some(log) = &self.inner.log {
            let key = shared::valid_key(key)?;
            let max = self.inner.max_shared_bytes;
            let next = log
                .shared()
                .change(&key, |current| shared::next_version(&key, current.as_ref(), &msg, max))
                .await?;
            return Ok(SharedSummary::from(&next));
        }
        self.inner.shared.send(msg).timeout(ACTOR_CALL_TIMEOUT).await?
    }

    pub async fn get_shared_data(&self, key: &str, version: Option<u64>) -> Result<SharedData, RelayError> {
        if let Some(log) = &self.inner.log {
            let key = shared::valid_key(key)?;
            let found = log.shared().fetch(&key, version).await?;
            // The current version of a deleted key is not there; its versions still are.
            let found = found.filter(|d| version.is_some() || !d.deleted);
            return found.ok_or_else(|| shared::not_found(&key, version));
        }
        self.inner
            .shared
            .send(Fetch {
                key: key.to_owned(),
                version,
            })
            .timeout(ACTOR_CALL_TIMEOUT)
            .await?
    }

    pub async fn list_shared_data(&self) -> Result<Vec<SharedSummary>, RelayError> {
        if let Some(log) = &self.inner.log {
            let all = log.shared().list().await?;
            return Ok(all.iter().filter(|d| !d.deleted).map(SharedSummary::from).collect());
        }
        self.inner.shared.send(ListShared).timeout(ACTOR_CALL_TIMEOUT).await?
    }

    /// Deletes `key`; the caller has authorised `owner`.
    pub async fn delete_shared_data(&self, owner: &str, key: &str) -> Result<SharedSummary, RelayError> {
        if let Some(log) = &self.inner.log {
            let key = shared::valid_key(key)?;
            let next = log
                .shared()
                .change(&key, |current| shared::deletion(&key, current, owner))
                .await?;
            return Ok(SharedSummary::from(&next));
        }
        self.inner
            .shared
            .send(Unshare {
                key: key.to_owned(),
                owner: owner.to_owned(),
            })
            .timeout(ACTOR_CALL_TIMEOUT)
            .await?
    }
}
