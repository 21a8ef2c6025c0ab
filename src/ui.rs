//! The web console at `/ui`, for the humans in the loop: three static files embedded in the
//! binary (the relay stays one file to deploy), no build step, nothing fetched from another
//! origin. The page holds no data: everything it shows comes from the REST API and SSE
//! streams, authenticated with the token the person enters, like any other client. So the page
//! itself loads without a token (its paths are `crate::http::console`'s, which the auth
//! middleware lets in), and `/` redirects to it, as crosstalk-mcp's does.

use crate::http::console;
use actix_web::http::header;
use actix_web::{web, HttpResponse};
use crosstalk_schema::ChannelName;
use std::sync::LazyLock;

/// The page, with the relay's channel-name rule in its new-channel field: the one rule the
/// relay applies, checked in the browser before the request is sent.
static INDEX: LazyLock<String> =
    LazyLock::new(|| include_str!("ui/index.html").replace("{{channel-pattern}}", &html_pattern()));
const SCRIPT: &str = include_str!("ui/app.js");
const STYLE: &str = include_str!("ui/app.css");

/// What may run on the page: its own script and style, requests to its own origin, nothing
/// else (no inline script, so a message body can never become code).
pub const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; \
    img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// [`ChannelName::pattern`] as an HTML `pattern` attribute reads it: anchored already, with no
/// surrounding whitespace (the page trims the name), and in the `v` mode of regular
/// expressions, where a `-` in a class is escaped.
fn html_pattern() -> String {
    let pattern = ChannelName::pattern();
    let bare = pattern.trim_start_matches(r"^\s*").trim_end_matches(r"\s*$");
    bare.replace("-]", r"\-]")
}

fn asset(body: &'static str, content_type: &'static str) -> HttpResponse {
    HttpResponse::Ok()
        .content_type(content_type)
        .insert_header((header::CONTENT_SECURITY_POLICY, CSP))
        .insert_header((header::X_CONTENT_TYPE_OPTIONS, "nosniff"))
        .insert_header((header::REFERRER_POLICY, "no-referrer"))
        .insert_header((header::X_FRAME_OPTIONS, "DENY"))
        // Embedded in this binary: a new release serves new files; revalidate each load.
        .insert_header((header::CACHE_CONTROL, "no-cache"))
        .body(body)
}

pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.route(
        console::ROOT,
        // 307, as crosstalk-mcp answers (tests/differential).
        web::get().to(|| async {
            HttpResponse::TemporaryRedirect()
                .insert_header((header::LOCATION, console::PAGE))
                .finish()
        }),
    )
    .route(
        console::PAGE,
        web::get().to(|| async { asset(&INDEX, "text/html; charset=utf-8") }),
    )
    .route(
        console::PAGE_SLASH,
        web::get().to(|| async { asset(&INDEX, "text/html; charset=utf-8") }),
    )
    .route(
        console::SCRIPT,
        web::get().to(|| async { asset(SCRIPT, "text/javascript; charset=utf-8") }),
    )
    .route(
        console::STYLE,
        web::get().to(|| async { asset(STYLE, "text/css; charset=utf-8") }),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_checks_new_channel_names_with_the_relays_rule() {
        assert!(!INDEX.contains("{{"), "a placeholder is left on the page");
        let attribute = format!(r#"pattern="{}""#, html_pattern());
        assert!(INDEX.contains(&attribute), "the page lacks {attribute}");
        // Markup-safe as it is, and `v`-mode-safe: every `-` in a class is escaped or a range.
        assert!(!html_pattern().contains(['"', '&', '<']));
        assert!(!html_pattern().replace(r"\-]", "").contains("-]"));
    }
}
