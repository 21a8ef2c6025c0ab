//! Shared data of a relay cluster, in two key-value buckets: the current version of every key
//! (`<STREAM>_DATA`), and every version by key and number (`<STREAM>_DATA_VERSIONS`). A change
//! is a compare-and-set on the current entry's revision, so when two nodes change one key at
//! once exactly one wins and the other tries again from the new current version, with the same
//! ownership rules as on a relay of its own ([`crate::shared`]).

use super::kv::{hex, Bucket, Coded, Step};
use crate::error::RelayError;
use crate::shared::{self, PublishData, SharedDataStore, SharedSummary};
use crosstalk_schema::SharedData;
use futures_util::future::BoxFuture;

impl Coded for SharedData {}

/// The two buckets.
#[derive(Clone)]
pub(super) struct Buckets {
    pub current: Bucket<SharedData>,
    pub versions: Bucket<SharedData>,
}

/// The cluster's shared data, taking contents of up to `max_size` bytes.
#[derive(Clone)]
pub(super) struct SharedBuckets {
    pub buckets: Buckets,
    /// Largest content accepted, in bytes.
    pub max_size: usize,
}

impl Buckets {
    /// Applies `change` to the current version of `key` (compare-and-set, retried), then
    /// records the new version.
    async fn change(
        &self,
        key: &str,
        change: impl Fn(Option<SharedData>) -> Result<SharedData, RelayError>,
    ) -> Result<SharedData, RelayError> {
        let next = self
            .current
            .change(&hex(key), |current| {
                let next = change(current.and_then(|s| s.value))?;
                Ok(Step::Write(next.clone(), next))
            })
            .await?
            .ok_or_else(|| {
                RelayError::Conflict(format!("shared data {key:?} is being changed by others; try again"))
            })?;
        self.versions
            .put(&format!("{}.{}", hex(key), next.version), &next)
            .await?;
        Ok(next)
    }

    /// The current version of `key`, or version `version`.
    async fn version(&self, key: &str, version: Option<u64>) -> Result<Option<SharedData>, RelayError> {
        let current = self.current.get(&hex(key)).await?;
        match version {
            None => Ok(current),
            // The newest version is also the current entry (its version record follows it).
            Some(v) if current.as_ref().is_some_and(|c| c.version == v) => Ok(current),
            Some(v) => self.versions.get(&format!("{}.{v}", hex(key))).await,
        }
    }
}

impl SharedDataStore for SharedBuckets {
    fn share(&self, share: PublishData) -> BoxFuture<'static, Result<SharedSummary, RelayError>> {
        let (this, max) = (self.buckets.clone(), self.max_size);
        Box::pin(async move {
            let key = shared::valid_key(&share.key)?;
            let next = this
                .change(&key, |current| {
                    shared::next_version(&key, current.as_ref(), &share, max)
                })
                .await?;
            Ok(SharedSummary::from(&next))
        })
    }

    fn fetch(&self, key: String, version: Option<u64>) -> BoxFuture<'static, Result<SharedData, RelayError>> {
        let this = self.buckets.clone();
        Box::pin(async move {
            let key = shared::valid_key(&key)?;
            let found = this.version(&key, version).await?;
            // The current version of a deleted key is not there; its versions still are.
            let found = found.filter(|d| version.is_some() || !d.deleted);
            found.ok_or_else(|| shared::not_found(&key, version))
        })
    }

    fn list(&self) -> BoxFuture<'static, Result<Vec<SharedSummary>, RelayError>> {
        let this = self.buckets.clone();
        Box::pin(async move {
            let mut all: Vec<SharedData> = this
                .current
                .values(usize::MAX)
                .await?
                .into_iter()
                .map(|(_, d)| d)
                .collect();
            all.sort_by(|a, b| a.key.cmp(&b.key));
            Ok(all.iter().filter(|d| !d.deleted).map(SharedSummary::from).collect())
        })
    }

    fn delete(&self, owner: String, key: String) -> BoxFuture<'static, Result<SharedSummary, RelayError>> {
        let this = self.buckets.clone();
        Box::pin(async move {
            let key = shared::valid_key(&key)?;
            let next = this
                .change(&key, |current| shared::deletion(&key, current, &owner))
                .await?;
            Ok(SharedSummary::from(&next))
        })
    }
}
