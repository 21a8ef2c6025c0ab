//! Directives: INTERRUPT and DIRECTIVE messages and open QUESTIONs for a recipient.

use super::Relay;
use crate::error::RelayError;
use crate::view::{Posted, Scan};
use crosstalk_schema::message::ANY_HUMAN;
use crosstalk_schema::{ChannelName, Meaning};
use std::sync::Arc;

/// What `get_directives` returns.
#[derive(Debug, Clone)]
pub struct Directives {
    /// INTERRUPT and DIRECTIVE messages after `since_id` for the recipient or for everyone.
    pub directives: Vec<Arc<Posted>>,
    /// QUESTIONs still open for the recipient or for everyone.
    pub open_questions: Vec<Arc<Posted>>,
    pub next_since_id: u64,
}

/// Whether a message addressed to `recipient` is for `who`: a broadcast (no recipient, or
/// `any-human`) is for everyone; anything else only for its recipient. With no `who`, only
/// broadcasts (crosstalk-mcp's rule).
fn for_recipient(recipient: Option<&str>, who: Option<&str>) -> bool {
    match (recipient, who) {
        (None, _) => true,
        (Some(r), _) if r.eq_ignore_ascii_case(ANY_HUMAN) => true,
        (Some(r), Some(w)) => r.eq_ignore_ascii_case(w),
        (Some(_), None) => false,
    }
}

impl Relay {
    /// INTERRUPTs, DIRECTIVEs and open QUESTIONs for `recipient` (or for everyone).
    pub async fn directives(
        &self,
        channel: &ChannelName,
        recipient: Option<&str>,
        since_id: u64,
    ) -> Result<Directives, RelayError> {
        let Some(view) = self.existing_view(channel).await? else {
            return Ok(Directives {
                directives: Vec::new(),
                open_questions: Vec::new(),
                next_since_id: since_id,
            });
        };
        let mut directives = Vec::new();
        let mut cursor = since_id;
        loop {
            let Scan {
                found: batch, scanned, ..
            } = view.read_scanned(cursor, 1000, usize::MAX)?;
            let done = scanned == cursor;
            cursor = scanned;
            directives.extend(batch.into_iter().filter(|p| {
                matches!(p.message.kind.meaning(), Meaning::Interrupt | Meaning::Directive)
                    && for_recipient(p.message.recipient.as_deref(), recipient)
            }));
            if done || cursor >= view.last_id() {
                break;
            }
        }
        let state = view.channel_state();
        let mut open_questions = Vec::new();
        for (id, to) in state.open_questions.range(since_id + 1..) {
            if for_recipient(to.as_deref(), recipient) {
                if let Some(q) = view.get(*id)? {
                    open_questions.push(q);
                }
            }
        }
        Ok(Directives {
            directives,
            open_questions,
            next_since_id: cursor,
        })
    }
}
