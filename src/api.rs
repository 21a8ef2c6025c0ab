//! The REST API as types. Each route of the operation table is a constant here: its method, its
//! path, the status of a successful answer, its operation (whose request is what a client
//! sends) and the answer as the route shapes it. The REST face mounts them (`crate::rest`),
//! `/openapi.json` is built from them, and the clients call them
//! ([`crate::client::RelayClient::call`]), reading each answer through [`Wire`]. So a client
//! sends the operation's own request type and reads the route's own answer type: it cannot
//! build a path, a query or a body the relay does not take, and a field it reads is a field the
//! relay writes.

use crate::ops::channels::NoArgs;
use crate::ops::channels::{self, ChannelList, FoundChannels, Present, SearchResults};
use crate::ops::identity::{self, Instances};
use crate::ops::messages::{self, MessageList, Messages, Page, Waited};
use crate::ops::oauth::{ClientQuery, GrantId, GrantList, InviteRequest, NewInvite, Revoked};
use crate::ops::reservations::{self, ReservationList};
use crate::ops::sessions::{self, DirectivesView};
use crate::ops::shared::{self, SharedList};
use crate::ops::wake::{self, Pending, WakeList, WakeView};
use crate::ops::webhooks::{NewWebhook, WebhookId, WebhookList, WebhookView};
use crate::ops::Operation;
use crosstalk_actors::Posted;
use crosstalk_schema::{ChannelSummary, Message};
use schemars::JsonSchema;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::marker::PhantomData;
use std::sync::Arc;

/// An HTTP method of the API.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verb {
    Get,
    Post,
    Delete,
}

impl Verb {
    pub fn as_str(self) -> &'static str {
        match self {
            Verb::Get => "GET",
            Verb::Post => "POST",
            Verb::Delete => "DELETE",
        }
    }
}

/// A route of the REST API: operation `O` answered as `A`.
pub struct Route<O: Operation, A> {
    pub verb: Verb,
    /// The path, with `{name}` for each field of the request that goes in it.
    pub path: &'static str,
    /// The status of a successful answer.
    pub status: u16,
    /// The OpenAPI `operationId` when it is not derived from the operation's name and method.
    pub operation_id: Option<&'static str>,
    /// The route's answer, made from the operation's response.
    pub answer: fn(O::Response) -> A,
}

impl<O: Operation, A> Clone for Route<O, A> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<O: Operation, A> Copy for Route<O, A> {}

fn same<T>(t: T) -> T {
    t
}

impl<O: Operation> Route<O, O::Response> {
    /// A route answering with the operation's response as it is.
    const fn whole(verb: Verb, path: &'static str, status: u16) -> Self {
        Route {
            verb,
            path,
            status,
            operation_id: None,
            answer: same::<O::Response>,
        }
    }
}

impl<O: Operation, A> Route<O, A> {
    /// A route answering with a projection of the operation's response (crosstalk-mcp's bare
    /// lists).
    const fn shaped(verb: Verb, path: &'static str, status: u16, answer: fn(O::Response) -> A) -> Self {
        Route {
            verb,
            path,
            status,
            operation_id: None,
            answer,
        }
    }
}

/// A route of an admin face (the OAuth and webhook routes, `/api/oauth/…`, `/api/webhooks`):
/// not an operation of the table, typed alike. It takes `R` (path fields, then query or body,
/// as a [`Route`]) and answers `A`; `()` for an empty answer (204).
pub struct Admin<R, A> {
    pub verb: Verb,
    pub path: &'static str,
    types: PhantomData<fn(R) -> A>,
}

impl<R, A> Clone for Admin<R, A> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<R, A> Copy for Admin<R, A> {}

const fn admin<R, A>(verb: Verb, path: &'static str) -> Admin<R, A> {
    Admin {
        verb,
        path,
        types: PhantomData,
    }
}

/// What a client needs of a route: where it is, what it sends, and what it reads back.
pub trait Call: Copy {
    type Request: Serialize;
    type Read: DeserializeOwned;
    fn verb(&self) -> Verb;
    fn path(&self) -> &'static str;
}

impl<O, A> Call for Route<O, A>
where
    O: Operation,
    O::Request: Serialize,
    A: Wire,
{
    type Request = O::Request;
    type Read = A::Read;

    fn verb(&self) -> Verb {
        self.verb
    }

    fn path(&self) -> &'static str {
        self.path
    }
}

impl<R: Serialize, A: DeserializeOwned> Call for Admin<R, A> {
    type Request = R;
    type Read = A;

    fn verb(&self) -> Verb {
        self.verb
    }

    fn path(&self) -> &'static str {
        self.path
    }
}

/// How a client reads what the relay answers: the type that deserializes what the answer's
/// own type serializes (itself, where it can be read back).
pub trait Wire {
    type Read: DeserializeOwned;
}

/// A message as the relay keeps it ready to send is read as the message.
impl Wire for Arc<Posted> {
    type Read = Message;
}

impl<T: Wire> Wire for Vec<T> {
    type Read = Vec<T::Read>;
}

macro_rules! read_as_itself {
    ($($t:ty),* $(,)?) => {
        $(impl Wire for $t {
            type Read = $t;
        })*
    };
}

read_as_itself!(ChannelSummary, ReservationList, shared::SharedEntry, WakeView, WakeList);

impl Wire for Pending {
    type Read = Pending<Message>;
}

impl Wire for Waited {
    type Read = Waited<Message>;
}

impl Wire for WaitAnswer {
    type Read = WaitAnswer<Message>;
}

/// crosstalk-mcp's long-poll answers a bare list; a wait with an identity answers the object.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
#[schemars(rename = "WaitAnswer")]
pub enum WaitAnswer<M = Arc<Posted>> {
    Identified(Waited<M>),
    Anonymous(Vec<M>),
}

impl<M> WaitAnswer<M> {
    /// The messages the wait brought, whichever shape it answered.
    pub fn messages(self) -> Vec<M> {
        match self {
            WaitAnswer::Identified(w) => w.messages,
            WaitAnswer::Anonymous(m) => m,
        }
    }
}

use Verb::{Delete, Get, Post};

pub const READ: Route<messages::Read, Messages> =
    Route::shaped(Get, "/api/channels/{channel}/messages", 200, |r: Page| r.messages);
// crosstalk-mcp answers a stored post with 200, and its clients check for it.
pub const POST: Route<messages::Post, Arc<Posted>> = Route::whole(Post, "/api/channels/{channel}/messages", 200);
pub const LIST_CHANNELS: Route<channels::ListChannels, Vec<ChannelSummary>> =
    Route::shaped(Get, "/api/channels", 200, |r: ChannelList| r.channels);
pub const CREATE_CHANNEL: Route<channels::CreateChannel, crosstalk_actors::ChannelInfo> =
    Route::whole(Post, "/api/channels", 201);
pub const FIND_CHANNEL: Route<channels::FindChannel, Vec<crosstalk_actors::ChannelInfo>> =
    Route::shaped(Get, "/api/channels/search", 200, |r: FoundChannels| r.channels);
pub const GET_MESSAGE: Route<messages::GetMessage, Arc<Posted>> =
    Route::whole(Get, "/api/channels/{channel}/messages/{message_id}", 200);
pub const REPLIES: Route<messages::Replies, Messages> = Route::shaped(
    Get,
    "/api/channels/{channel}/messages/{message_id}/replies",
    200,
    |r: MessageList| r.messages,
);
pub const READERS: Route<messages::GetReaders, messages::Readers> =
    Route::whole(Get, "/api/channels/{channel}/messages/{message_id}/readers", 200);
pub const WAIT: Route<messages::Wait, WaitAnswer> =
    Route::shaped(Get, "/api/channels/{channel}/wait", 200, |w: Waited| {
        if w.identified {
            WaitAnswer::Identified(w)
        } else {
            WaitAnswer::Anonymous(w.messages)
        }
    });
pub const PRESENCE: Route<channels::Presence, Vec<crosstalk_actors::Participant>> =
    Route::shaped(Get, "/api/channels/{channel}/presence", 200, |p: Present| {
        p.participants
    });
pub const START_SESSION: Route<sessions::StartSession, sessions::SessionView> =
    Route::whole(Post, "/api/channels/{channel}/session", 200);
pub const GET_SESSION: Route<sessions::GetSession, sessions::SessionView> =
    Route::whole(Get, "/api/channels/{channel}/session", 200);
pub const END_SESSION: Route<sessions::EndSession, sessions::SessionEnded> =
    Route::whole(Delete, "/api/channels/{channel}/session", 200);
pub const DIRECTIVES: Route<sessions::Directives, Messages> =
    Route::shaped(Get, "/api/channels/{channel}/directives", 200, DirectivesView::flat);
pub const ASK: Route<messages::Ask, messages::Asked> = Route::whole(Post, "/api/channels/{channel}/ask", 200);
pub const REGISTER: Route<identity::Register, identity::RegisterAnswer> = Route::whole(Post, "/api/register", 201);
pub const WHOAMI: Route<identity::Whoami, identity::WhoAmI> = Route::whole(Get, "/api/whoami", 200);
pub const UNREAD: Route<identity::Unread, identity::UnreadCounts> = Route::whole(Get, "/api/unread", 200);
pub const INSTANCES: Route<identity::ListInstances, Vec<crosstalk_actors::InstanceView>> =
    Route::shaped(Get, "/api/instances", 200, |r: Instances| r.instances);
pub const INBOX: Route<identity::Inbox, Messages> = Route::shaped(Get, "/api/inbox", 200, |r: MessageList| r.messages);
pub const SEARCH: Route<channels::Search, Messages> =
    Route::shaped(Get, "/api/search", 200, |r: SearchResults| r.messages);
/// The same operation answered whole (with each hit's score and snippet).
pub const SEARCH_HITS: Route<channels::Search, SearchResults> = Route {
    verb: Get,
    path: "/api/search/hits",
    status: 200,
    operation_id: Some("search_hits"),
    answer: same::<SearchResults>,
};
pub const LIST_DATA: Route<shared::ListData, Vec<crosstalk_actors::SharedSummary>> =
    Route::shaped(Get, "/api/data", 200, |r: SharedList| r.entries);
pub const SHARE: Route<shared::Share, crosstalk_actors::SharedSummary> = Route::whole(Post, "/api/data", 201);
pub const GET_DATA: Route<shared::GetData, shared::SharedEntry> = Route::whole(Get, "/api/data/{key}", 200);
pub const DELETE_DATA: Route<shared::DeleteData, crosstalk_actors::SharedSummary> =
    Route::whole(Delete, "/api/data/{key}", 200);
pub const LIST_RESERVATIONS: Route<reservations::ListReservations, ReservationList> =
    Route::whole(Get, "/api/reservations", 200);
pub const RESERVE: Route<reservations::Reserve, reservations::Reserved> = Route::whole(Post, "/api/reservations", 200);
pub const RENEW_RESERVATION: Route<reservations::RenewReservation, reservations::ReservationView> =
    Route::whole(Post, "/api/reservations/{id}/renew", 200);
pub const RELEASE_RESERVATION: Route<reservations::ReleaseReservation, reservations::Released> =
    Route::whole(Delete, "/api/reservations/{id}", 200);
pub const WAKE_LEASE: Route<wake::WakeLeaseOp, WakeView> = Route::whole(Post, "/api/wake/{identity}/lease", 200);
pub const WAKE_RELEASE: Route<wake::WakeRelease, WakeView> = Route::whole(Delete, "/api/wake/{identity}/lease", 200);
pub const WAKE_PENDING: Route<wake::WakePending, Pending> = Route::whole(Get, "/api/wake/{identity}/pending", 200);
pub const WAKE_TURN: Route<wake::WakeTurn, WakeView> = Route::whole(Post, "/api/wake/{identity}/turn", 200);
pub const WAKE_LIST: Route<wake::WakeListOp, WakeList> = Route::whole(Get, "/api/wake", 200);

pub const MINT_INVITE: Admin<InviteRequest, NewInvite> = admin(Post, "/api/oauth/invites");
pub const LIST_CLIENTS: Admin<NoArgs, GrantList> = admin(Get, "/api/oauth/clients");
pub const REVOKE_CLIENT: Admin<ClientQuery, Revoked> = admin(Delete, "/api/oauth/clients");
pub const REVOKE_GRANT: Admin<GrantId, ()> = admin(Delete, "/api/oauth/clients/{grant}");
pub const ADD_WEBHOOK: Admin<NewWebhook, WebhookView> = admin(Post, "/api/webhooks");
pub const LIST_WEBHOOKS: Admin<NoArgs, WebhookList> = admin(Get, "/api/webhooks");
pub const REMOVE_WEBHOOK: Admin<WebhookId, ()> = admin(Delete, "/api/webhooks/{id}");
