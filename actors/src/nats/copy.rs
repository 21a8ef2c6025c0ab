//! A channel's log on a cluster node: this node's copy of the channel's part of the shared
//! stream ([`ChannelLog`]). Its events get their order from the stream, a batch waits longer
//! for the store (the copy cannot go on without it), a refused batch stops the node, and
//! retention is decided once, as an event of the log.

use super::NatsCluster;
use crate::channel::LoggedTrims;
use crate::cluster::{ChannelLog, Sequenced, TrimNext, TrimPlan, TrimStep};
use crate::error::RelayError;
use crate::proposals::Proposals;
use crate::store::StoreError;
use crosstalk_schema::{ChannelName, ChannelState, CutState, Record};
use futures_util::future::BoxFuture;
use std::time::Duration;

pub(super) struct LogCopy {
    pub(super) cluster: NatsCluster,
    pub(super) channel: ChannelName,
    pub(super) trims: LoggedTrims,
    pub(super) proposals: Proposals,
}

impl ChannelLog for LogCopy {
    fn sequence(&self, record: &Record, idempotency_key: Option<&str>) -> Sequenced {
        use crate::cluster::Cluster as _;
        if let Err(why) = self.cluster.health() {
            return Sequenced::Log(Box::pin(std::future::ready(Err(RelayError::StoreUnavailable(why)))));
        }
        let entry = super::log::Log::entry(record, idempotency_key);
        Sequenced::Log(Box::pin(self.cluster.appends.append(&self.channel, entry)))
    }

    fn commit_deadline(&self) -> Duration {
        crate::commit::FOLD_COMMIT_TIMEOUT
    }

    fn refused_batch(&self, error: &StoreError) {
        // A node's copy must stay a prefix of the shared log: folding on past a batch its
        // store refused would leave a hole that a restart cannot see (it resumes after the
        // channel's last stored id). Stop instead; the restart replays the log from there.
        tracing::error!(channel = %self.channel, error = %error,
            "this node's store refused events of the shared log; exiting so that a restart replays them");
        std::process::exit(75);
    }

    fn trims_without_policy(&self) -> bool {
        // A cut another node logged is applied here whatever this node's own policy.
        true
    }

    fn trim_pass(&self, policy: bool, state: &ChannelState) -> Option<TrimStep> {
        self.trims.pass(policy, state)
    }

    fn trimmed(&mut self, plan: TrimPlan, removed: Option<(u64, usize)>, trimmed_through: u64) -> TrimNext {
        self.trims.trimmed(plan, removed, trimmed_through)
    }

    fn publish_cut(&self, cut: CutState) -> BoxFuture<'static, Result<(), RelayError>> {
        let (cuts, log, several, channel) = (
            self.cluster.cuts.clone(),
            self.cluster.log.clone(),
            self.cluster.several.clone(),
            self.channel.clone(),
        );
        Box::pin(async move { cuts.publish(&log, &several, &channel, cut).await })
    }

    fn cut_published(&mut self, through: u64) {
        self.trims.published(through);
    }

    fn proposing(&mut self, busy: bool) {
        self.trims.proposing(busy);
    }

    fn installed(&mut self, through: u64) {
        self.trims.installed(through);
    }

    fn proposals(&mut self) -> Option<&mut Proposals> {
        Some(&mut self.proposals)
    }
}
