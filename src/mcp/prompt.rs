//! The `crosstalk-protocol` prompt: how an agent holds a conversation over the relay.

use rmcp::model::{ContentBlock, GetPromptResult, JsonObject, Prompt, PromptArgument, PromptMessage, Role};
use rmcp::ErrorData as McpError;

pub const PROMPT_NAME: &str = "crosstalk-protocol";
/// Longest `channel` or `name` argument quoted back into the prompt.
const MAX_ARG: usize = 64;

pub fn prompt() -> Prompt {
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

pub fn get(name: &str, args: Option<&JsonObject>) -> Result<GetPromptResult, McpError> {
    if name != PROMPT_NAME {
        return Err(McpError::invalid_params(
            format!("unknown prompt {name:?}; the prompt is {PROMPT_NAME}"),
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
