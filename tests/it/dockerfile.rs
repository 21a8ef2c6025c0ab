//! There is no Docker engine here, so this test mirrors the Dockerfile: it reads it, checks
//! the properties it promises, and runs the built binary with the image's environment and
//! command: exactly as the image does (all interfaces, a free port in place of the published
//! one, a fresh folder for the volume), with and without the `-e` of the documented run line,
//! sending requests to loopback only.

use crate::common;
use std::process::{Command, Stdio};

fn dockerfile() -> String {
    std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/Dockerfile")).expect("Dockerfile")
}

/// `KEY=VALUE` pairs of the runtime stage's ENV lines.
fn runtime_env(text: &str) -> Vec<(String, String)> {
    let runtime = text.rsplit("\nFROM ").next().unwrap();
    runtime
        .lines()
        .filter_map(|l| l.strip_prefix("ENV "))
        .flat_map(|l| l.split_whitespace())
        .filter_map(|kv| kv.split_once('=').map(|(k, v)| (k.to_owned(), v.to_owned())))
        .collect()
}

#[test]
fn dockerfile_is_multi_stage_non_root_with_a_volume() {
    let text = dockerfile();
    assert_eq!(text.lines().filter(|l| l.starts_with("FROM ")).count(), 2, "two stages");
    assert!(text.contains("RUN cargo build --release --locked -p crosstalk"));
    let user = text.lines().find_map(|l| l.strip_prefix("USER ")).expect("USER");
    assert_ne!(user.trim(), "root");
    assert!(text.contains("VOLUME [\"/data\"]"));
    assert!(text.contains("STOPSIGNAL SIGTERM"));
    let env = runtime_env(&text);
    assert!(
        env.contains(&("CROSSTALK_HOST".into(), "0.0.0.0".into())),
        "binds all interfaces in the container"
    );
    assert!(env.contains(&("CROSSTALK_DATA_DIR".into(), "/data".into())));
    // The lock file the image builds with is in sync with the manifests.
    let status = Command::new(env!("CARGO"))
        .args(["metadata", "--locked", "--offline", "--format-version", "1"])
        .args([
            "--filter-platform",
            &format!("{}-unknown-linux-gnu", std::env::consts::ARCH),
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert!(status.success(), "Cargo.lock is committed and current (--locked)");
}

/// The table `[name]` of a TOML file's text, as `key = value` pairs (this manifest's profiles
/// are flat tables of plain values).
fn toml_table(text: &str, name: &str) -> Vec<(String, String)> {
    let header = format!("[{name}]");
    text.lines()
        .skip_while(|l| l.trim() != header)
        .skip(1)
        .take_while(|l| !l.trim_start().starts_with('['))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.trim().to_owned(), v.trim().trim_matches('"').to_owned()))
        .collect()
}

/// The image (and `cargo install`) ships the release profile's binary: without debug info,
/// which made it 221 MB. The symbols profiling needs live in a profile of their own, which
/// bench/profile builds.
#[test]
fn the_release_binary_is_lean_and_profiling_keeps_its_symbols() {
    let root = env!("CARGO_MANIFEST_DIR");
    let manifest = std::fs::read_to_string(format!("{root}/Cargo.toml")).unwrap();
    let release = toml_table(&manifest, "profile.release");
    let get = |t: &[(String, String)], k: &str| t.iter().find(|(key, _)| key == k).map(|(_, v)| v.clone());
    assert!(
        matches!(get(&release, "debug").as_deref(), None | Some("false" | "0" | "none")),
        "the release profile keeps debug info: {release:?}"
    );
    assert!(
        matches!(
            get(&release, "strip").as_deref(),
            Some("true" | "debuginfo" | "symbols")
        ),
        "the release profile does not strip: {release:?}"
    );
    let profiling = toml_table(&manifest, "profile.profiling");
    assert_eq!(get(&profiling, "inherits").as_deref(), Some("release"), "{profiling:?}");
    assert!(
        matches!(
            get(&profiling, "debug").as_deref(),
            Some("1" | "2" | "true" | "limited" | "full" | "line-tables-only")
        ),
        "{profiling:?}"
    );
    assert_eq!(get(&profiling, "strip").as_deref(), Some("none"), "{profiling:?}");
    let profile_script = std::fs::read_to_string(format!("{root}/bench/profile")).unwrap();
    assert!(
        profile_script.contains("--profile profiling"),
        "bench/profile profiles the lean build"
    );
    // The Dockerfile copies what the release profile built.
    assert!(dockerfile().contains("COPY --from=build /src/target/release/crosstalk "));
}

/// Every file of this repository the Dockerfile's comments name exists (one named
/// `tests/dockerfile.rs` after it had moved to `tests/it/`).
#[test]
fn the_files_the_dockerfile_names_exist() {
    let text = dockerfile();
    let named: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with('#'))
        .flat_map(|l| l.split(|c: char| c.is_whitespace() || c == '(' || c == ')' || c == ','))
        .filter(|w| w.ends_with(".rs") || w.ends_with(".md"))
        .collect();
    assert!(!named.is_empty(), "the Dockerfile names the test that mirrors it");
    for path in named {
        assert!(
            std::path::Path::new(&format!("{}/{path}", env!("CARGO_MANIFEST_DIR"))).is_file(),
            "the Dockerfile names {path}, which does not exist"
        );
    }
}

/// The image builds from `COPY . .`: every crate the workspace patches in from a folder of its
/// own (`[patch.crates-io]`: the vendored sled, actix-http and rmcp) must be in the build context, not left out by
/// `.dockerignore`.
#[test]
fn the_build_context_holds_the_patched_crates() {
    let root = env!("CARGO_MANIFEST_DIR");
    let manifest = std::fs::read_to_string(format!("{root}/Cargo.toml")).unwrap();
    let patches = manifest.split("[patch.crates-io]").nth(1).expect("[patch.crates-io]");
    let paths: Vec<&str> = patches
        .lines()
        .take_while(|l| !l.starts_with('['))
        .filter_map(|l| l.split("path = \"").nth(1)?.split('"').next())
        .collect();
    assert!(
        paths.contains(&"vendor/sled") && paths.contains(&"vendor/actix-http") && paths.contains(&"vendor/rmcp"),
        "{paths:?}"
    );
    let ignored = std::fs::read_to_string(format!("{root}/.dockerignore")).unwrap();
    for path in paths {
        assert!(
            std::path::Path::new(&format!("{root}/{path}/Cargo.toml")).is_file(),
            "{path} is in the repository"
        );
        for rule in ignored.lines().map(|l| l.trim().trim_end_matches('/')) {
            assert!(
                rule.is_empty() || rule.starts_with('#') || !(path == rule || path.starts_with(&format!("{rule}/"))),
                ".dockerignore's {rule:?} leaves {path} out of the image's build"
            );
        }
    }
}

/// The documented `docker run` line's `-e KEY="VALUE"` settings; a `$TOKEN` value is the token
/// the comment above it says to generate.
fn run_line_env(text: &str, token: &str) -> Vec<(String, String)> {
    let line = text
        .lines()
        .find_map(|l| l.strip_prefix("# Run:"))
        .expect("a `# Run:` line");
    let words: Vec<&str> = line.split_whitespace().collect();
    assert!(
        text.contains("TOKEN=$(openssl rand -hex 32)"),
        "the Dockerfile says how to make a token"
    );
    words
        .windows(2)
        .filter(|w| w[0] == "-e")
        .filter_map(|w| w[1].split_once('='))
        .map(|(k, v)| (k.to_owned(), v.trim_matches('"').replace("$TOKEN", token)))
        .collect()
}

/// Runs the image's CMD with its ENV (the data volume in a fresh folder, the port free) plus
/// `extra`; answers the first line of stdout (or of stderr when it exits) and the port.
fn run_image(extra: &[(String, String)], data: &std::path::Path) -> (std::process::Child, String, u16) {
    let text = dockerfile();
    let cmd: Vec<String> = text
        .lines()
        .find_map(|l| l.strip_prefix("CMD "))
        .map(|c| serde_json::from_str(c).expect("CMD is a JSON array"))
        .unwrap();
    let port = common::free_port();
    let mut command = Command::new(env!("CARGO_BIN_EXE_crosstalk"));
    command
        .args(&cmd)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("HOME", data);
    for (k, v) in runtime_env(&text) {
        let v = match k.as_str() {
            "CROSSTALK_PORT" => port.to_string(),
            "CROSSTALK_DATA_DIR" => data.display().to_string(),
            "RUST_LOG" => "warn".to_owned(),
            _ => v,
        };
        command.env(k, v);
    }
    for (k, v) in extra {
        command.env(k, v);
    }
    let mut child = command.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let mut line = String::new();
    use std::io::{BufRead, Read};
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    if line.is_empty() {
        let _ = child.wait();
        child.stderr.take().unwrap().read_to_string(&mut line).unwrap();
    }
    (child, line, port)
}

/// The image's own settings with the documented run line's token: the relay listens on all
/// interfaces, answers /healthz, refuses a request without the token and takes one with it.
#[tokio::test]
async fn the_documented_docker_run_line_starts_a_relay_that_wants_its_token() {
    let text = dockerfile();
    let token = "0123456789abcdef0123456789abcdef";
    let data = tempfile::tempdir().unwrap();
    let (mut child, line, port) = run_image(&run_line_env(&text, token), data.path());
    assert!(
        line.starts_with(&format!("crosstalk listening on http://0.0.0.0:{port}")),
        "{line}"
    );
    let base = format!("http://127.0.0.1:{port}");
    let http = common::client();
    let health = http.get(format!("{base}/healthz")).send().await.unwrap();
    assert_eq!(health.status(), 200);
    let anonymous = http.get(format!("{base}/api/channels")).send().await.unwrap();
    assert_eq!(anonymous.status(), 401);
    let with_token = http
        .get(format!("{base}/api/channels"))
        .bearer_auth(token)
        .send()
        .await
        .unwrap();
    assert_eq!(with_token.status(), 200);
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        data.path().read_dir().unwrap().next().is_some(),
        "the store was created in the data dir"
    );
}

/// Without the run line's token the image refuses to start, and says why and what to do.
#[test]
fn the_image_without_a_token_refuses_to_start_and_says_why() {
    let data = tempfile::tempdir().unwrap();
    let (mut child, said, _) = run_image(&[], data.path());
    let status = child.wait().unwrap();
    assert!(!status.success());
    assert!(said.contains("without a token") && said.contains("--token"), "{said}");
    assert!(!said.contains("stack backtrace"), "{said}");
}
