//! Who has read a channel how far: every identity's inbox cursor on one channel, for the
//! delivery state of a message ("queued is not delivered").

use super::Registry;
use actix::prelude::*;
use crosstalk_schema::ChannelName;

/// Every identity with a read cursor on the channel, and the id it has read up to.
#[derive(Message)]
#[rtype(result = "Vec<(String, u64)>")]
pub struct ChannelCursors(pub ChannelName);

impl Handler<ChannelCursors> for Registry {
    type Result = MessageResult<ChannelCursors>;

    fn handle(&mut self, ChannelCursors(channel): ChannelCursors, _: &mut Context<Self>) -> Self::Result {
        let mut list: Vec<(String, u64)> = self
            .cursors
            .iter()
            .filter_map(|(who, m)| m.get(&channel).map(|id| (who.clone(), *id)))
            .collect();
        list.sort();
        MessageResult(list)
    }
}
