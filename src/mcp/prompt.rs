//! The protocol prompts: `crosstalk-protocol` (on `/mcp`) and `cross-claude-protocol` (on
//! `/cc/mcp`, cross-claude-mcp's protocol in our words): how an agent holds a conversation.

use rmcp::model::{ContentBlock, GetPromptResult, JsonObject, Prompt, PromptArgument, PromptMessage, Role};
use rmcp::ErrorData as McpError;

use super::Face;

pub const PROMPT_NAME: &str = "crosstalk-protocol";
pub const CC_PROMPT_NAME: &str = "cross-claude-protocol";
/// Longest `channel` or `name` argument quoted back into the prompt.
const MAX_ARG: usize = 64;

pub fn prompt(face: Face) -> Prompt {
    if face == Face::CrossClaude {
        return Prompt::new(
            CC_PROMPT_NAME,
            Some("How to work with other AI instances on the cross-claude message bus"),
            Some(vec![
                PromptArgument::new("channel")
                    .with_description("The channel to work in")
                    .with_required(false),
                PromptArgument::new("name")
                    .with_description("Your instance_id")
                    .with_required(false),
            ]),
        )
        .with_title("cross-claude protocol");
    }
    Prompt::new(
        PROMPT_NAME,
        Some("How to hold a conversation with other agents over crosstalk"),
        Some(vec![
            PromptArgument::new("channel")
                .with_description("The channel to talk on")
                .with_required(false),
            PromptArgument::new("name")
                .with_description("Your sender name")
                .with_required(false),
        ]),
    )
    .with_title("crosstalk conversation protocol")
}

pub fn get(face: Face, name: &str, args: Option<&JsonObject>) -> Result<GetPromptResult, McpError> {
    let expected = match face {
        Face::Crosstalk => PROMPT_NAME,
        Face::CrossClaude => CC_PROMPT_NAME,
    };
    if name != expected {
        return Err(McpError::invalid_params(
            format!("unknown prompt {name:?}; the prompt is {expected}"),
            None,
        ));
    }
    let arg = |key: &str, default: &str| -> String {
        args.and_then(|a| a.get(key))
            .and_then(|v| v.as_str())
            .map(|s| s.trim())
            .filter(|s| !s.is_empty())
            .map(|s| s.chars().filter(|c| !c.is_control()).take(MAX_ARG).collect())
            .unwrap_or_else(|| default.to_owned())
    };
    let channel = arg("channel", "<channel>");
    let me = arg("name", "<your name>");
    if face == Face::CrossClaude {
        return Ok(GetPromptResult::new(vec![PromptMessage::new(
            Role::User,
            ContentBlock::text(cross_claude(&channel, &me)),
        )])
        .with_description("The cross-claude protocol"));
    }
    let text = format!(
        "You are talking with other agents (and humans) over crosstalk, a relay of durable, ordered \
channels. Your sender name is {me}; the channel is {channel}.\n\
\n\
1. Catch up: get_messages(channel=\"{channel}\", since_id=0). Remember next_since_id: it is the \
largest id you have seen. If has_more is true, call again with it.\n\
2. Speak: post_message(channel=\"{channel}\", sender=\"{me}\", type=..., body=...). Types: message \
(default), question (you need an answer), answer (set reply_to to the question's id), status \
(progress), done (you have finished). Set recipient to address one participant.\n\
3. Listen: wait_for_message(channel=\"{channel}\", since_id=<largest id seen>). It blocks until \
something new arrives and returns it; on [] (timeout) call it again with the same since_id. Never \
poll get_messages in a loop, and never pass a smaller since_id than you have already seen.\n\
4. Your own posts come back to you too: skip messages whose sender is {me}.\n\
5. When your part is finished, post type done with a one-line summary, and stop waiting once every \
other participant has posted done too.\n\
\n\
Keep bodies short and self-contained: the others read them cold."
    );
    Ok(
        GetPromptResult::new(vec![PromptMessage::new(Role::User, ContentBlock::text(text))])
            .with_description("The crosstalk conversation protocol"),
    )
}

/// cross-claude-mcp's protocol, in our words.
fn cross_claude(channel: &str, me: &str) -> String {
    format!(
        "You are one of several AI instances sharing a message bus of named channels. Your instance_id \
is {me}.\n\
\n\
Start: register(instance_id=\"{me}\"), then list_channels and pick the most specific channel for your \
work ({channel} if that is it; general only when nothing fits). find_channel searches names and \
descriptions; create_channel only when none fits. If you move to another channel, say so in the old \
one first.\n\
\n\
Messages: send_message(channel, content, message_type). Types: message (default), request (you want \
something), response (set in_reply_to to the request's id), status (progress), handoff (passing the \
work on), done (you are finished: nobody should wait for you). Content over ~500 characters goes in \
share_data(key, content); send a short message naming the key.\n\
\n\
Listening, honestly: wait_for_reply(channel, after_id=<the largest id you have seen>) blocks until \
someone else posts, then returns it with last_id; call it again with that. It lasts as long as your \
host lets a tool call run (progress notifications keep it alive); when it returns with no reply you \
are NOT listening until you call it again. check_messages returns what you have not read, never \
twice. A coordinator waits with role=active; background workers wait with role=parked, so they hear \
everything without holding the conversation up. One wait per channel: a new one replaces the old. \
When every active party waits and nobody speaks, one is told to speak first.\n\
\n\
Finish: when your part is done, send message_type done with a one-line summary; when the other side \
sends done, reply done if you are finished too, and stop waiting."
    )
}
