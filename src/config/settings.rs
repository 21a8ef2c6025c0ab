//! Every setting of `crosstalk serve` in one table: its flag, the environment variables read
//! for it (in order), and its default. [`super::Config::resolve`] reads the variables named
//! here and the defaults' constants; `serve --help` shows both from here ([`command`]); and a
//! test holds docs/operations.md's tables to what `serve --help` says
//! (`tests/it/cli.rs`). A default that is a number or a name is the constant the code uses,
//! so the three cannot disagree.

use crate::client::served;
use crosstalk_actors::nats;
use crosstalk_actors::relay;

/// A setting's default as people read it.
pub enum Default {
    /// A value of the code, shown as it is.
    Value(fn() -> String),
    /// A default that is not one value (`cores`, `none`, `keep`).
    Words(&'static str),
}

pub struct Setting {
    /// The flag, without its dashes.
    pub flag: &'static str,
    /// The environment variables read for it, the first set winning; none: only the flag.
    pub env: &'static [&'static str],
    /// A switch: its variable turns it on when `1` (or `true`, `yes`, `on`).
    pub switch: bool,
    pub default: Default,
}

impl Setting {
    /// The environment variables as `serve --help` and docs/operations.md name them.
    pub fn env_text(&self) -> String {
        match self.env {
            [] => "—".into(),
            vars => vars
                .iter()
                .map(|v| if self.switch { format!("{v}=1") } else { (*v).to_owned() })
                .collect::<Vec<_>>()
                .join(", "),
        }
    }

    pub fn default_text(&self) -> String {
        match &self.default {
            Default::Value(f) => f(),
            Default::Words(w) => (*w).to_owned(),
        }
    }
}

const fn value(flag: &'static str, env: &'static [&'static str], default: fn() -> String) -> Setting {
    Setting {
        flag,
        env,
        switch: false,
        default: Default::Value(default),
    }
}

const fn words(flag: &'static str, env: &'static [&'static str], default: &'static str) -> Setting {
    Setting {
        flag,
        env,
        switch: false,
        default: Default::Words(default),
    }
}

const fn switch(flag: &'static str, env: &'static [&'static str]) -> Setting {
    Setting {
        flag,
        env,
        switch: true,
        default: Default::Words("off"),
    }
}

fn secs(d: std::time::Duration) -> String {
    d.as_secs().to_string()
}

pub const SETTINGS: &[Setting] = &[
    // Network
    value("host", &served::HOST_VARS, || served::DEFAULT_HOST.into()),
    value("port", &served::PORT_VARS, || served::DEFAULT_PORT.to_string()),
    words("workers", &["CROSSTALK_WORKERS"], "cores"),
    words("allowed-hosts", &["CROSSTALK_ALLOWED_HOSTS"], "loopback"),
    words("cors-origins", &["CROSSTALK_CORS_ORIGINS"], "none"),
    // Access
    words("token", &["CROSSTALK_TOKEN", "RELAY_TOKEN"], "none"),
    words(
        "participants",
        &["CROSSTALK_PARTICIPANTS", "RELAY_PARTICIPANTS"],
        "none",
    ),
    words("participants-file", &["CROSSTALK_PARTICIPANTS_FILE"], "none"),
    switch("webhooks-allow-private", &["CROSSTALK_WEBHOOKS_ALLOW_PRIVATE"]),
    words("humans", &["CROSSTALK_HUMANS"], "none"),
    switch("insecure-open", &[]),
    switch("oauth", &["CROSSTALK_OAUTH"]),
    words("public-url", &["CROSSTALK_PUBLIC_URL"], "the address it serves"),
    // Limits
    value("max-body-bytes", &["CROSSTALK_MAX_BODY_BYTES"], || {
        crosstalk_schema::DEFAULT_MAX_BODY_BYTES.to_string()
    }),
    value("max-shared-bytes", &["CROSSTALK_MAX_SHARED_BYTES"], || {
        relay::DEFAULT_MAX_SHARED_BYTES.to_string()
    }),
    value("rate-limit", &["CROSSTALK_RATE_LIMIT"], || {
        crate::guard::DEFAULT_RATE.to_string()
    }),
    value("auth-failure-rate", &["CROSSTALK_AUTH_FAILURE_RATE"], || {
        crate::guard::DEFAULT_AUTH_FAILURE_RATE.to_string()
    }),
    value("max-channels", &["CROSSTALK_MAX_CHANNELS"], || {
        relay::DEFAULT_MAX_CHANNELS.to_string()
    }),
    value(
        "max-channels-per-participant",
        &["CROSSTALK_MAX_CHANNELS_PER_PARTICIPANT"],
        || relay::DEFAULT_MAX_CHANNELS_PER_OPENER.to_string(),
    ),
    value(
        "max-reservations-per-participant",
        &["CROSSTALK_MAX_RESERVATIONS_PER_PARTICIPANT"],
        || crate::ops::DEFAULT_MAX_RESERVATIONS.to_string(),
    ),
    value(
        "max-shared-keys-per-participant",
        &["CROSSTALK_MAX_SHARED_KEYS_PER_PARTICIPANT"],
        || crate::ops::DEFAULT_MAX_SHARED_KEYS.to_string(),
    ),
    value(
        "max-waits-per-principal",
        &["CROSSTALK_MAX_WAITS_PER_PRINCIPAL"],
        || crate::ops::DEFAULT_MAX_HELD.to_string(),
    ),
    value(
        "max-sessions-per-principal",
        &["CROSSTALK_MAX_SESSIONS_PER_PRINCIPAL"],
        || crate::mcp::owner::DEFAULT_MAX_SESSIONS.to_string(),
    ),
    value(
        "max-sessions-per-participant",
        &["CROSSTALK_MAX_SESSIONS_PER_PARTICIPANT"],
        || crate::mcp::owner::DEFAULT_MAX_SESSIONS_PER_PARTICIPANT.to_string(),
    ),
    value("max-url-bytes", &["CROSSTALK_MAX_URL_BYTES"], || {
        crate::guard::DEFAULT_MAX_URL_BYTES.to_string()
    }),
    value("max-answer-bytes", &["CROSSTALK_MAX_ANSWER_BYTES"], || {
        relay::DEFAULT_MAX_ANSWER_BYTES.to_string()
    }),
    value("wait-cap-secs", &["CROSSTALK_WAIT_CAP_SECS"], || {
        super::DEFAULT_WAIT_CAP_SECS.to_string()
    }),
    value("mcp-wait-cap-secs", &["CROSSTALK_MCP_WAIT_CAP_SECS"], || {
        super::DEFAULT_MCP_WAIT_CAP_SECS.to_string()
    }),
    value("task-wait-cap-secs", &["CROSSTALK_TASK_WAIT_CAP_SECS"], || {
        super::DEFAULT_TASK_WAIT_CAP_SECS.to_string()
    }),
    value("tools", &["CROSSTALK_TOOLS"], || {
        crate::mcp::tools::ToolChoice::default().name().into()
    }),
    // Coordination timing and memory
    value("presence-ttl-secs", &["CROSSTALK_PRESENCE_TTL_SECS"], || {
        secs(relay::DEFAULT_PRESENCE_TTL)
    }),
    value("release-grace-ms", &["CROSSTALK_RELEASE_GRACE_MS"], || {
        relay::DEFAULT_RELEASE_GRACE.as_millis().to_string()
    }),
    value("idle-after-secs", &["CROSSTALK_IDLE_AFTER_SECS"], || {
        secs(relay::DEFAULT_IDLE_AFTER)
    }),
    value("max-open-channels", &["CROSSTALK_MAX_OPEN_CHANNELS"], || {
        relay::DEFAULT_MAX_OPEN_CHANNELS.to_string()
    }),
    // Storage
    words(
        "data-dir",
        &served::DATA_DIR_VARS,
        "~/.local/share/crosstalk/store ($XDG_DATA_HOME/crosstalk/store; ./crosstalk-data with no home directory)",
    ),
    value("durability", &["CROSSTALK_DURABILITY"], || "flush".into()),
    words("store", &["CROSSTALK_STORE"], "sled"),
    // Cluster
    value("nats-replicas", &["CROSSTALK_NATS_REPLICAS"], || {
        nats::DEFAULT_REPLICAS.to_string()
    }),
    value("nats-linger-ms", &["CROSSTALK_NATS_LINGER_MS"], || {
        nats::DEFAULT_LINGER.as_millis().to_string()
    }),
    value("nats-stream", &["CROSSTALK_NATS_STREAM"], || {
        nats::DEFAULT_STREAM.into()
    }),
    words("nats-creds", &["CROSSTALK_NATS_CREDS"], "none"),
    words("nats-user", &["CROSSTALK_NATS_USER"], "none"),
    words("nats-password", &["CROSSTALK_NATS_PASSWORD"], "none"),
    words("nats-token", &["CROSSTALK_NATS_TOKEN"], "none"),
    words("nats-tls-ca", &["CROSSTALK_NATS_TLS_CA"], "none"),
    words("nats-tls-cert", &["CROSSTALK_NATS_TLS_CERT"], "none"),
    switch("nats-tls-required", &[]),
    // Retention
    words("retention-max-age-secs", &["CROSSTALK_RETENTION_MAX_AGE_SECS"], "keep"),
    words("retention-max-count", &["CROSSTALK_RETENTION_MAX_COUNT"], "keep"),
    words("retention-channels", &["CROSSTALK_RETENTION_CHANNELS"], "none"),
    value(
        "retention-interval-secs",
        &["CROSSTALK_RETENTION_INTERVAL_SECS"],
        || secs(relay::DEFAULT_RETENTION_EVERY),
    ),
];

/// The setting of `flag`. Every flag of `serve` has one (a test checks it).
pub fn setting(flag: &str) -> &'static Setting {
    SETTINGS
        .iter()
        .find(|s| s.flag == flag)
        .unwrap_or_else(|| panic!("--{flag} has no entry in SETTINGS"))
}

/// The environment variables of `flag`.
pub fn env(flag: &str) -> &'static [&'static str] {
    setting(flag).env
}

/// The command line, each `serve` flag's help ending with its environment variables and its
/// default, from [`SETTINGS`].
pub fn command() -> clap::Command {
    use clap::CommandFactory;
    super::Cli::command().mut_subcommand("serve", |mut serve| {
        for s in SETTINGS {
            let tail = format!("[env: {}] [default: {}]", s.env_text(), s.default_text());
            // The derived arguments are named after their fields.
            serve = serve.mut_arg(s.flag.replace('-', "_"), |a| {
                let help = a.get_help().map(ToString::to_string).unwrap_or_default();
                let long = a.get_long_help().map(ToString::to_string);
                let a = a.help(format!("{help} {tail}"));
                match long {
                    Some(long) => a.long_help(format!("{long}\n{tail}")),
                    None => a,
                }
            });
        }
        serve
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every flag of `serve` but the hidden ones and --help is in the table, once.
    #[test]
    fn every_serve_flag_has_its_setting() {
        let cmd = command();
        let serve = cmd.find_subcommand("serve").unwrap();
        let flags: Vec<&str> = serve
            .get_arguments()
            .filter(|a| !a.is_hide_set())
            .filter_map(|a| a.get_long())
            .filter(|f| *f != "help")
            .collect();
        let table: Vec<&str> = SETTINGS.iter().map(|s| s.flag).collect();
        let mut sorted = table.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), table.len(), "a flag is in SETTINGS twice");
        for f in &flags {
            assert!(table.contains(f), "--{f} is not in SETTINGS");
        }
        for f in &table {
            assert!(flags.contains(f), "SETTINGS names --{f}, which serve does not have");
        }
    }
}
