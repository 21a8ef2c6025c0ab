//! Helpers the actors' tests share.

use crosstalk_actors::{EventStore, Relay};
use crosstalk_schema::{codec, ChannelName, NewMessage, Record};

pub fn ch(name: &str) -> ChannelName {
    ChannelName::parse(name).unwrap()
}

pub fn msg(sender: &str, body: &str) -> NewMessage {
    NewMessage {
        sender: sender.into(),
        body: body.into(),
        ..Default::default()
    }
}

/// The bodies of the channel's messages as the store holds them (what a restart would read).
pub fn stored_bodies(store: &dyn EventStore, channel: &str) -> Vec<String> {
    store
        .read(&ch(channel), 0, u64::MAX, 100_000)
        .unwrap()
        .into_iter()
        .filter_map(|(_, bytes)| match codec::decode::<Record>(&bytes) {
            Ok(Record::Message(m)) => Some(m.body),
            _ => None,
        })
        .collect()
}

/// The bodies of the channel's messages as the relay serves them.
pub async fn bodies(relay: &Relay, channel: &str) -> Vec<String> {
    relay
        .read(&ch(channel), 0, 10_000, None)
        .await
        .unwrap()
        .iter()
        .map(|p| p.message.body.clone())
        .collect()
}
