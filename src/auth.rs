//! Bearer-token access control, crosstalk-mcp's model: an optional shared token
//! (`RELAY_TOKEN`) and optional per-participant tokens (`RELAY_PARTICIPANTS="id:token,…"`).
//! A participant token acts only as its own identity. With neither set, every request is let
//! in (loopback deployments). Tokens are compared in constant time and never logged.

use crate::error::ApiError;
use crate::ops::oauth::OAuth;
pub use crate::ops::Principal;
use actix_web::dev::ServiceRequest;
use actix_web::http::StatusCode;
use actix_web::{web, ResponseError};
use std::collections::HashMap;

#[derive(Debug, Clone, Default)]
pub struct Auth {
    shared: Option<String>,
    /// token → identity
    participants: HashMap<String, String>,
}

fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

impl Auth {
    /// `participants` is `id:token,id:token`.
    pub fn new(shared: Option<String>, participants: Option<&str>) -> Result<Auth, String> {
        let mut map = HashMap::new();
        for pair in participants
            .unwrap_or("")
            .split(',')
            .map(str::trim)
            .filter(|p| !p.is_empty())
        {
            let (id, token) = pair
                .split_once(':')
                .filter(|(id, token)| !id.trim().is_empty() && !token.trim().is_empty())
                .ok_or_else(|| "participants must be id:token pairs separated by commas".to_owned())?;
            map.insert(token.trim().to_owned(), id.trim().to_owned());
        }
        Ok(Auth {
            shared: shared.filter(|s| !s.trim().is_empty()),
            participants: map,
        })
    }

    /// There is an admin: the relay's own token (`--token`).
    pub fn admin(&self) -> bool {
        self.shared.is_some()
    }

    pub fn enabled(&self) -> bool {
        self.shared.is_some() || !self.participants.is_empty()
    }

    fn resolve(&self, token: &str) -> Option<Principal> {
        let mut found = None;
        // Look at every candidate so timing does not tell which one matched.
        if self
            .shared
            .as_deref()
            .is_some_and(|s| ct_eq(s.as_bytes(), token.as_bytes()))
        {
            found = Some(Principal::Shared);
        }
        for (t, id) in &self.participants {
            if ct_eq(t.as_bytes(), token.as_bytes()) && found.is_none() {
                found = Some(Principal::Participant(id.clone()));
            }
        }
        found
    }
}

fn token_of(req: &ServiceRequest) -> Option<String> {
    if let Some(h) = req.headers().get("authorization").and_then(|v| v.to_str().ok()) {
        let h = h.trim();
        if h.len() > 7 && h[..7].eq_ignore_ascii_case("bearer ") {
            return Some(h[7..].trim().to_owned());
        }
    }
    // cross-claude-mcp's Claude.ai connector URL carries the key: `?api_key=`, on `/cc/*` only.
    if req.path().starts_with("/cc/") {
        let q = web::Query::<HashMap<String, String>>::from_query(req.query_string()).ok()?;
        return q.get("api_key").cloned();
    }
    // EventSource cannot send headers: `?token=` (crosstalk-mcp's page sends `?relay_token=`)
    // is accepted on the SSE stream route only.
    if crate::http::is_sse_stream(req.path()) {
        let q = web::Query::<HashMap<String, String>>::from_query(req.query_string()).ok()?;
        return q.get("token").or_else(|| q.get("relay_token")).cloned();
    }
    None
}

/// Whether the request carries a token at all (one that fails is a guess; none is not).
pub fn presented(req: &ServiceRequest) -> bool {
    token_of(req).is_some()
}

/// Who the request is (from its token), or the 401 to answer. Called by the one middleware
/// in front of every route ([`crate::guard::guard`]). With `--oauth`, an access token the
/// relay issued ([`crate::ops::oauth`]) is looked up in the store, so a revocation is felt at
/// the next request on every node; and a 401 says where the OAuth metadata is.
pub async fn authenticate(req: &ServiceRequest) -> Result<Principal, Box<actix_web::HttpResponse>> {
    let Some(auth) = req.app_data::<web::Data<Auth>>() else {
        return Ok(Principal::Anyone);
    };
    if !auth.enabled() || crate::http::is_open(req.path()) {
        return Ok(Principal::Anyone);
    }
    let token = token_of(req);
    let oauth = req.app_data::<web::Data<OAuth>>();
    let mut found = token.as_deref().and_then(|t| auth.resolve(t));
    if let (None, Some(o), Some(t)) = (&found, oauth, token.as_deref()) {
        if t.starts_with(crate::ops::oauth::ACCESS_PREFIX) {
            match o.verify(t).await {
                Ok(v) => {
                    found = v.map(|v| {
                        // What a request that outlives this check is checked against again.
                        actix_web::HttpMessage::extensions_mut(req).insert(v.credential);
                        v.principal
                    })
                }
                Err(e) => {
                    tracing::warn!(error = %e.description, "an OAuth token could not be checked");
                    let status = StatusCode::from_u16(e.status).unwrap_or(StatusCode::SERVICE_UNAVAILABLE);
                    return Err(Box::new(
                        ApiError::new(
                            status,
                            "store_unavailable",
                            format!("the token could not be checked: {}", e.description),
                        )
                        .error_response(),
                    ));
                }
            }
        }
    }
    match found {
        Some(p) => Ok(p),
        None => Err(Box::new(crate::http::unauthorized(
            req.path(),
            token.is_some(),
            oauth.map(|o| o.get_ref()),
        ))),
    }
}

/// Whether the credential something long-lived was made with still holds: an MCP task, which
/// outlives its request and the relay's restarts, acts for its owner only while the OAuth
/// grant it was made through stands, or, made with a configured token, while that token's
/// principal is still configured (`--token`, `--participants`; none at all for `anyone`).
#[derive(Clone)]
pub struct Standing {
    auth: Auth,
    oauth: Option<OAuth>,
}

impl Standing {
    pub fn new(auth: Auth, oauth: Option<OAuth>) -> Self {
        Standing { auth, oauth }
    }

    /// Whether `owner` (and `grant`, the OAuth grant the thing was made through) still holds.
    pub async fn holds(&self, owner: &Principal, grant: Option<&str>) -> bool {
        let grant = grant.or(owner.grant_id());
        if let Some(g) = grant {
            return match &self.oauth {
                Some(o) => o.grant_stands(g).await,
                None => false,
            };
        }
        match owner {
            Principal::Anyone => !self.auth.enabled(),
            Principal::Shared => self.auth.admin(),
            Principal::Participant(id) => self.auth.participants.values().any(|p| p == id),
            Principal::Connector(_) => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolves_tokens() {
        let a = Auth::new(Some("s3cret".into()), Some("alice:ta, bob:tb")).unwrap();
        assert_eq!(a.resolve("s3cret"), Some(Principal::Shared));
        assert_eq!(a.resolve("tb"), Some(Principal::Participant("bob".into())));
        assert_eq!(a.resolve("s3cre"), None);
        assert_eq!(a.resolve(""), None);
        assert!(Auth::new(None, Some("nocolon")).is_err());
        assert!(!Auth::new(Some(" ".into()), None).unwrap().enabled());
    }
}
