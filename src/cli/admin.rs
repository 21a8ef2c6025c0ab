//! The admin's commands (they need the relay's own token): OAuth invites and connections, and
//! webhooks.

use super::{delete, Failure, Json, Outcome, Span};
use crate::api;
use crate::client::RelayClient;
use crate::ops::channels::NoArgs;
use crate::ops::oauth::{ClientQuery, GrantId, InviteRequest};
use crate::ops::webhooks::{NewWebhook, WebhookId};
use anstream::println;
use serde_json::Value;

/// `crosstalk invite`.
pub(super) async fn invite(
    c: &RelayClient,
    me: Option<String>,
    expires: Option<Span>,
    note: Option<String>,
) -> Result<Outcome, Failure> {
    let request = InviteRequest {
        identity: me,
        // Whole seconds, rounded up: `0.5` is a second, not a refused zero.
        expires_in_s: expires.map(|d| d.0.as_secs() + u64::from(d.0.subsec_nanos() > 0)),
        note,
    };
    let invite = c.call(api::MINT_INVITE, &request).await?;
    eprintln!(
        "invite {} for {}, good once until {}; type it into the relay's consent page:",
        invite.invite_id,
        invite
            .identity
            .map_or("anyone (not the admin)".to_owned(), |a| format!("{a:?}")),
        invite.expires_at,
    );
    println!("{}", invite.code);
    Ok(Outcome::Done)
}

/// `crosstalk clients`.
pub(super) async fn clients(
    c: &RelayClient,
    revoke: Option<String>,
    revoke_client: Option<String>,
    json: bool,
) -> Result<Outcome, Failure> {
    match (revoke, revoke_client) {
        (Some(g), _) => {
            let missing = format!("there is no connection {g:?} (see crosstalk clients)");
            delete(c, api::REVOKE_GRANT, &GrantId { grant: g.clone() }, &missing).await?;
            eprintln!("revoked {g}: its tokens are refused from now on");
        }
        (None, Some(id)) => {
            let query = ClientQuery { client_id: id.clone() };
            let r = c.call(api::REVOKE_CLIENT, &query).await?;
            eprintln!("revoked {} connection(s) of {id}", r.revoked);
        }
        (None, None) => {
            let all = c.call(api::LIST_CLIENTS, &NoArgs {}).await?.clients;
            if all.is_empty() && !json {
                eprintln!("no OAuth connections (mint an invite with crosstalk invite)");
            }
            for g in &all {
                if json {
                    println!("{}", Json(g));
                } else {
                    println!(
                        "{:<14} {:<28} as {:<16} via {:<24} since {}",
                        g.grant,
                        g.client_name,
                        g.identity.as_deref().unwrap_or("anyone"),
                        g.redirect_host,
                        g.created_at,
                    );
                }
            }
        }
    }
    Ok(Outcome::Done)
}

/// `crosstalk webhooks`.
pub(super) async fn webhooks(
    c: &RelayClient,
    add: Option<String>,
    channel: Option<String>,
    types: Vec<String>,
    format: Option<String>,
    remove: Option<String>,
    json: bool,
) -> Result<Outcome, Failure> {
    if let Some(url) = add {
        let format = match format.as_deref() {
            None => None,
            Some(f) => Some(
                serde_json::from_value(Value::String(f.to_ascii_lowercase()))
                    .map_err(|_| Failure(format!("--format {f:?}: use json or slack"), 2))?,
            ),
        };
        let Some(channel) = channel else {
            return Err(Failure("name the channel to follow: --channel CH".into(), 2));
        };
        let hook = c
            .call(
                api::ADD_WEBHOOK,
                &NewWebhook {
                    channel,
                    url,
                    types,
                    format,
                },
            )
            .await?;
        eprintln!(
            "webhook {} follows {}; it signs each delivery with this secret (shown once):",
            hook.id, hook.channel
        );
        println!("{}", hook.secret.unwrap_or_default());
        return Ok(Outcome::Done);
    }
    if let Some(id) = remove {
        let missing = format!("there is no webhook {id:?} (see crosstalk webhooks)");
        delete(c, api::REMOVE_WEBHOOK, &WebhookId { id: id.clone() }, &missing).await?;
        eprintln!("removed webhook {id}");
        return Ok(Outcome::Done);
    }
    let all = c.call(api::LIST_WEBHOOKS, &NoArgs {}).await?.webhooks;
    if all.is_empty() && !json {
        eprintln!("no webhooks (add one with crosstalk webhooks --add URL --channel CH)");
    }
    for h in &all {
        if json {
            println!("{}", Json(h));
            continue;
        }
        let d = &h.delivery;
        let state = match &d.last_error {
            Some(e) => format!("FAILING ({} attempts): {e}", d.attempts),
            None => format!("ok, {} delivered", d.delivered),
        };
        println!(
            "{:<14} #{:<16} {:<8} {:<28} {} — {}",
            h.id,
            h.channel,
            h.format.as_str(),
            if h.types.is_empty() {
                "all types".to_owned()
            } else {
                h.types.join(",")
            },
            h.url,
            state
        );
    }
    Ok(Outcome::Done)
}
