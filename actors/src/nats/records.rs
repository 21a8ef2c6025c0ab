//! A cluster's small records ([`crate::records`]): one key-value bucket per kind
//! (`<STREAM>_OAUTH_INVITES`, `_OAUTH_CLIENTS`, `_OAUTH_CODES`, `_OAUTH_GRANTS`,
//! `_OAUTH_TOKENS`, `_WEBHOOKS`, `_WEBHOOK_DELIVERIES`), so a token minted on one node is
//! honoured, and a revocation felt, on every node at its next request. Every read is answered
//! by the bucket's leader, never by a replica a moment behind: what one node was answered for
//! (a revocation, a new token, an invite) is what the next read on any node sees. A
//! single-use record is taken with a delete that expects the revision read (of two nodes
//! taking one invite or code at once, one gets it); a swap writes only over the revision of
//! the value expected.

use super::kv::{self, Bucket};
use super::STREAM_READY_TIMEOUT;
use crate::error::RelayError;
use crate::records::{Answer, Kind, RecordStore};
use async_nats::jetstream;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::OnceCell;

/// The buckets, each opened the first time it is used: a cluster that never turns OAuth on
/// never creates OAuth's, and one kind's first use waits for its bucket only.
#[derive(Clone)]
pub(super) struct RecordBuckets {
    pub js: jetstream::Context,
    pub stream: String,
    pub replicas: usize,
    pub buckets: Arc<[OnceCell<Bucket<Vec<u8>>>; Kind::ALL.len()]>,
}

impl RecordBuckets {
    async fn bucket(&self, kind: Kind) -> Result<Bucket<Vec<u8>>, RelayError> {
        let at = Kind::ALL.iter().position(|k| *k == kind).expect("every kind is in ALL");
        let b = self.buckets[at]
            .get_or_try_init(|| async {
                let open = kv::Open {
                    js: &self.js,
                    setup: &self.js,
                    stream: &self.stream,
                    replicas: self.replicas,
                    deadline: tokio::time::Instant::now() + STREAM_READY_TIMEOUT,
                };
                Ok::<_, RelayError>(
                    Bucket::open(&open, kind.tag().1, Duration::ZERO, "records")
                        .await?
                        .reading_from_leader()
                        .forgetting_deletes(),
                )
            })
            .await?;
        Ok(b.clone())
    }
}

impl RecordStore for RecordBuckets {
    fn get(&self, kind: Kind, key: String) -> Answer<Option<Vec<u8>>> {
        let this = self.clone();
        Box::pin(async move { this.bucket(kind).await?.get(&key).await })
    }

    fn put(&self, kind: Kind, key: String, value: Vec<u8>) -> Answer<()> {
        let this = self.clone();
        Box::pin(async move { this.bucket(kind).await?.put(&key, &value).await })
    }

    fn delete(&self, kind: Kind, key: String) -> Answer<()> {
        let this = self.clone();
        Box::pin(async move { this.bucket(kind).await?.delete(&key).await })
    }

    fn take(&self, kind: Kind, key: String) -> Answer<Option<Vec<u8>>> {
        let this = self.clone();
        Box::pin(async move { this.bucket(kind).await?.take(&key).await })
    }

    fn swap(&self, kind: Kind, key: String, expected: Option<Vec<u8>>, new: Option<Vec<u8>>) -> Answer<bool> {
        let this = self.clone();
        Box::pin(async move { this.bucket(kind).await?.swap(&key, expected, new).await })
    }

    /// The bucket's stream's last sequence, asked of its leader: every put or delete takes
    /// one. Asking costs the servers a stream info, where a listing costs one naming every
    /// key and then a read of each.
    fn version(&self, kind: Kind) -> Answer<Option<u64>> {
        let this = self.clone();
        Box::pin(async move { Ok(Some(this.bucket(kind).await?.revision().await?)) })
    }

    fn list(&self, kind: Kind) -> Answer<Vec<(String, Vec<u8>)>> {
        let this = self.clone();
        Box::pin(async move { this.bucket(kind).await?.values(crate::records::MAX_LISTED).await })
    }

    fn list_group(&self, kind: Kind, group: String) -> Answer<Vec<(String, Vec<u8>)>> {
        let this = self.clone();
        Box::pin(async move {
            this.bucket(kind)
                .await?
                .values_in(&group, crate::records::MAX_LISTED)
                .await
        })
    }

    fn list_after(&self, kind: Kind, after: Option<String>, max: usize) -> Answer<Vec<(String, Vec<u8>)>> {
        let this = self.clone();
        Box::pin(async move { this.bucket(kind).await?.values_after(after.as_deref(), max).await })
    }
}
