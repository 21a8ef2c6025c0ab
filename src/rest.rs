//! The REST face at `/api`: crosstalk's route table, each route a method, a path and an
//! [`Operation`] from the operation table, plus the status it answers with and, where
//! crosstalk-mcp's shape is a bare list, the projection of the operation's response to that
//! list. [`crate::http::routes`] mounts it; the same table generates `/openapi.json`
//! (`crate::openapi`). Nothing here decides anything about messages, identities or sessions.

use crate::http::caller;
use crate::http::routes::{mount, route, Endpoint, RestFace};
use crate::ops::channels::{self, ChannelList, FoundChannels, Present, SearchResults};
use crate::ops::identity::{self, Instances};
use crate::ops::messages::{self, MessageList, Messages, Page, Waited};
use crate::ops::reservations;
use crate::ops::sessions::{self, DirectivesView};
use crate::ops::shared::{self, SharedList};
use crate::ops::Operation;
use actix_web::http::{Method, StatusCode};
use actix_web::web;
use schemars::JsonSchema;
use serde::Serialize;
use std::sync::LazyLock;

/// crosstalk's own REST face (`/api`).
pub const REST: RestFace = RestFace {
    name: "rest",
    caller: |req| caller(req, None),
};

/// A route answering with the operation's response as it is.
pub fn op<O: Operation>(method: Method, path: &'static str, status: StatusCode) -> Endpoint {
    shaped::<O, O::Response>(method, path, status, |r| r)
}

/// A route answering with a projection of the operation's response (crosstalk-mcp's bare
/// lists).
pub fn shaped<O, P>(method: Method, path: &'static str, status: StatusCode, project: fn(O::Response) -> P) -> Endpoint
where
    O: Operation,
    O::Response: 'static,
    P: Serialize + JsonSchema + 'static,
{
    route::<O, P>(REST, None, method, path, status, project)
}

/// crosstalk-mcp's long-poll answers a bare list; a wait with an identity answers the object.
#[derive(Serialize, JsonSchema)]
#[serde(untagged)]
pub enum WaitAnswer {
    Identified(Waited),
    Anonymous(Messages),
}

/// The route table. actix tries routes in this order: the hottest (a channel's messages)
/// first; literal segments (`/channels/search`) before parameters where two could match.
pub static ENDPOINTS: LazyLock<Vec<Endpoint>> = LazyLock::new(|| {
    use StatusCode as S;
    vec![
        shaped::<messages::Read, _>(Method::GET, "/api/channels/{channel}/messages", S::OK, |r: Page| {
            r.messages
        }),
        // crosstalk-mcp answers a stored post with 200, and its clients check for it.
        op::<messages::Post>(Method::POST, "/api/channels/{channel}/messages", S::OK),
        shaped::<channels::ListChannels, _>(Method::GET, "/api/channels", S::OK, |r: ChannelList| r.channels),
        op::<channels::CreateChannel>(Method::POST, "/api/channels", S::CREATED),
        shaped::<channels::FindChannel, _>(Method::GET, "/api/channels/search", S::OK, |r: FoundChannels| {
            r.channels
        }),
        op::<messages::GetMessage>(Method::GET, "/api/channels/{channel}/messages/{message_id}", S::OK),
        shaped::<messages::Replies, _>(
            Method::GET,
            "/api/channels/{channel}/messages/{message_id}/replies",
            S::OK,
            |r: MessageList| r.messages,
        ),
        op::<messages::GetReaders>(
            Method::GET,
            "/api/channels/{channel}/messages/{message_id}/readers",
            S::OK,
        ),
        shaped::<messages::Wait, _>(Method::GET, "/api/channels/{channel}/wait", S::OK, |w: Waited| {
            if w.identified {
                WaitAnswer::Identified(w)
            } else {
                WaitAnswer::Anonymous(w.messages)
            }
        }),
        shaped::<channels::Presence, _>(Method::GET, "/api/channels/{channel}/presence", S::OK, |p: Present| {
            p.participants
        }),
        op::<sessions::StartSession>(Method::POST, "/api/channels/{channel}/session", S::OK),
        op::<sessions::GetSession>(Method::GET, "/api/channels/{channel}/session", S::OK),
        op::<sessions::EndSession>(Method::DELETE, "/api/channels/{channel}/session", S::OK),
        shaped::<sessions::Directives, _>(
            Method::GET,
            "/api/channels/{channel}/directives",
            S::OK,
            DirectivesView::flat,
        ),
        op::<messages::Ask>(Method::POST, "/api/channels/{channel}/ask", S::OK),
        op::<identity::Register>(Method::POST, "/api/register", S::CREATED),
        op::<identity::Whoami>(Method::GET, "/api/whoami", S::OK),
        op::<identity::Unread>(Method::GET, "/api/unread", S::OK),
        shaped::<identity::ListInstances, _>(Method::GET, "/api/instances", S::OK, |r: Instances| r.instances),
        shaped::<identity::Inbox, _>(Method::GET, "/api/inbox", S::OK, |r: MessageList| r.messages),
        shaped::<channels::Search, _>(Method::GET, "/api/search", S::OK, |r: SearchResults| r.messages),
        // The same operation answered whole (with each hit's score and snippet).
        route::<channels::Search, SearchResults>(
            REST,
            Some("search_hits"),
            Method::GET,
            "/api/search/hits",
            S::OK,
            |r| r,
        ),
        shaped::<shared::ListData, _>(Method::GET, "/api/data", S::OK, |r: SharedList| r.entries),
        op::<shared::Share>(Method::POST, "/api/data", S::CREATED),
        op::<shared::GetData>(Method::GET, "/api/data/{key}", S::OK),
        op::<shared::DeleteData>(Method::DELETE, "/api/data/{key}", S::OK),
        op::<reservations::ListReservations>(Method::GET, "/api/reservations", S::OK),
        op::<reservations::Reserve>(Method::POST, "/api/reservations", S::OK),
        op::<reservations::RenewReservation>(Method::POST, "/api/reservations/{id}/renew", S::OK),
        op::<reservations::ReleaseReservation>(Method::DELETE, "/api/reservations/{id}", S::OK),
    ]
});

/// Mounts the operation table: one resource per path, a JSON 405 for other methods.
pub fn routes(cfg: &mut web::ServiceConfig) {
    mount(cfg, &ENDPOINTS);
}
