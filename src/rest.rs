//! The REST face at `/api`: crosstalk's route table, each route a method, a path and an
//! [`Operation`] from the operation table, plus the status it answers with and, where
//! crosstalk-mcp's shape is a bare list, the projection of the operation's response to that
//! list. [`crate::http::routes`] mounts it; the same table generates `/openapi.json`
//! (`crate::openapi`). Nothing here decides anything about messages, identities or sessions.

use crate::api::{self, Route};
use crate::http::caller;
use crate::http::routes::{mount, route, Endpoint, RestFace};
use crate::ops::Operation;
use actix_web::http::StatusCode;
use actix_web::web;
use schemars::JsonSchema;
use serde::Serialize;
use std::sync::LazyLock;

/// crosstalk's own REST face (`/api`).
pub const REST: RestFace = RestFace {
    name: "rest",
    caller: |req| caller(req, None),
};

/// The REST face's endpoint for a route of the API.
pub fn endpoint<O, A>(r: Route<O, A>) -> Endpoint
where
    O: Operation,
    O::Response: 'static,
    A: Serialize + JsonSchema + 'static,
{
    let method = crate::http::routes::method(r.verb);
    let status = StatusCode::from_u16(r.status).unwrap_or(StatusCode::OK);
    route::<O, A>(REST, r.operation_id, method, r.path, status, r.answer)
}

/// The route table. actix tries routes in this order: the hottest (a channel's messages)
/// first; literal segments (`/channels/search`) before parameters where two could match.
pub static ENDPOINTS: LazyLock<Vec<Endpoint>> = LazyLock::new(|| {
    vec![
        endpoint(api::READ),
        endpoint(api::POST),
        endpoint(api::LIST_CHANNELS),
        endpoint(api::CREATE_CHANNEL),
        endpoint(api::FIND_CHANNEL),
        endpoint(api::GET_MESSAGE),
        endpoint(api::REPLIES),
        endpoint(api::READERS),
        endpoint(api::WAIT),
        endpoint(api::PRESENCE),
        endpoint(api::START_SESSION),
        endpoint(api::GET_SESSION),
        endpoint(api::END_SESSION),
        endpoint(api::DIRECTIVES),
        endpoint(api::ASK),
        endpoint(api::REGISTER),
        endpoint(api::WHOAMI),
        endpoint(api::UNREAD),
        endpoint(api::INSTANCES),
        endpoint(api::INBOX),
        endpoint(api::SEARCH),
        endpoint(api::SEARCH_HITS),
        endpoint(api::LIST_DATA),
        endpoint(api::SHARE),
        endpoint(api::GET_DATA),
        endpoint(api::DELETE_DATA),
        endpoint(api::LIST_RESERVATIONS),
        endpoint(api::RESERVE),
        endpoint(api::RENEW_RESERVATION),
        endpoint(api::RELEASE_RESERVATION),
        endpoint(api::WAKE_LIST),
        endpoint(api::WAKE_LEASE),
        endpoint(api::WAKE_RELEASE),
        endpoint(api::WAKE_PENDING),
        endpoint(api::WAKE_TURN),
    ]
});

/// Mounts the operation table: one resource per path, a JSON 405 for other methods.
pub fn routes(cfg: &mut web::ServiceConfig) {
    mount(cfg, &ENDPOINTS);
}
