//! Shared data: publish, read, list, delete, wherever the relay keeps it
//! ([`crate::shared::SharedDataStore`]: its own store, or the cluster's).

use super::Relay;
use crate::error::RelayError;
use crate::shared::{PublishData, SharedSummary};
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
        let share = PublishData {
            key: key.to_owned(),
            owner: owner.to_owned(),
            content,
            description,
        };
        self.inner.shared.share(share).await
    }

    pub async fn get_shared_data(&self, key: &str, version: Option<u64>) -> Result<SharedData, RelayError> {
        self.inner.shared.fetch(key.to_owned(), version).await
    }

    pub async fn list_shared_data(&self) -> Result<Vec<SharedSummary>, RelayError> {
        self.inner.shared.list().await
    }

    /// Deletes `key`; the caller has authorised `owner`.
    pub async fn delete_shared_data(&self, owner: &str, key: &str) -> Result<SharedSummary, RelayError> {
        self.inner.shared.delete(owner.to_owned(), key.to_owned()).await
    }
}
