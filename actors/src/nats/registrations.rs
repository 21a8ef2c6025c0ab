//! Registered identities of a relay cluster, in a key-value bucket (`<STREAM>_INSTANCES`). A
//! registration is a compare-and-set, so two nodes cannot bind one live id to two sessions;
//! every node mirrors the bucket into its own identities ([`crate::identities`]) and
//! publishes, every few seconds, when it last heard from the identities bound on it.

use super::kv::{hex, Bucket, Coded, Step};
use crate::cluster::Registration;
use crate::error::RelayError;
use crosstalk_schema::Timestamp;
use std::time::Duration;

impl Coded for Registration {}

fn live(reg: &Registration, ttl: Duration) -> bool {
    reg.seen > 0 && Timestamp::now().0 - reg.seen < ttl.as_micros() as i64
}

#[derive(Clone)]
pub(super) struct Registrations {
    pub bucket: Bucket<Registration>,
}

impl Registrations {
    /// Binds `reg`'s id to its session across the cluster, unless another session holds it
    /// and was heard from within `ttl` on any node. Returns the registration as stored (its
    /// first registration time is the cluster's).
    pub async fn claim(
        &self,
        reg: Registration,
        ttl: Duration,
        take_over: Option<&str>,
    ) -> Result<Registration, RelayError> {
        let id = reg.instance.instance_id.clone();
        let claimed = self
            .bucket
            .change(&hex(&id), |current| {
                let mut reg = reg.clone();
                if let Some(held) = current.and_then(|s| s.value) {
                    let taken_over =
                        take_over.is_some_and(|o| held.session.as_deref().is_some_and(|s| s.starts_with(o)));
                    if held.session.is_some() && held.session != reg.session && !taken_over && live(&held, ttl) {
                        return Err(RelayError::Conflict(format!(
                            "instance id {id:?} is in use by another live session; pick another id, or wait \
                             until it has been silent for {} s",
                            ttl.as_secs()
                        )));
                    }
                    reg.instance.registered_at = held.instance.registered_at;
                }
                Ok(Step::Write(reg.clone(), reg))
            })
            .await?;
        claimed
            .ok_or_else(|| RelayError::Conflict(format!("instance id {id:?} is being registered elsewhere; try again")))
    }

    /// Records that `id`, bound to `session`, was heard from at `seen` (or signed off), if it
    /// is still bound to that session and the cluster has nothing newer. Gives up quietly when
    /// others keep changing it: the next round says it again.
    pub async fn heard(&self, id: &str, session: &str, seen: i64) -> Result<(), RelayError> {
        self.bucket
            .change(&hex(id), |current| {
                Ok(match current.and_then(|s| s.value) {
                    Some(mut reg) if reg.session.as_deref() == Some(session) && reg.seen.abs() < seen.abs() => {
                        reg.seen = seen;
                        Step::Write(reg, ())
                    }
                    _ => Step::Done(()),
                })
            })
            .await?;
        Ok(())
    }

    /// Every registration, then each change as it happens.
    pub async fn watch(&self) -> Result<impl futures_util::Stream<Item = Registration> + Unpin, RelayError> {
        self.bucket.watch(|change| change.value).await
    }
}
