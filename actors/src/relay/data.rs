//! Shared data over its actor: publish, read, list, delete.

use super::{Relay, ACTOR_CALL_TIMEOUT};
use crate::error::RelayError;
use crate::shared::{Fetch, ListShared, Share, SharedSummary, Unshare};
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
        self.inner
            .shared
            .send(Share {
                key: key.to_owned(),
                owner: owner.to_owned(),
                content,
                description,
            })
            .timeout(ACTOR_CALL_TIMEOUT)
            .await?
    }

    pub async fn get_shared_data(&self, key: &str, version: Option<u64>) -> Result<SharedData, RelayError> {
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
        self.inner.shared.send(ListShared).timeout(ACTOR_CALL_TIMEOUT).await?
    }

    /// Deletes `key`; the caller has authorised `owner`.
    pub async fn delete_shared_data(&self, owner: &str, key: &str) -> Result<SharedSummary, RelayError> {
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
