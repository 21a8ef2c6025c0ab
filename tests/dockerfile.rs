//! There is no Docker engine here, so this test mirrors the Dockerfile: it reads it, checks
//! the properties it promises, and runs the built binary with the image's environment and
//! command (host and port swapped for loopback and port 0).

mod common;
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

/// The image builds from `COPY . .`: every crate the workspace patches in from a folder of its
/// own (`[patch.crates-io]`, the vendored sled) must be in the build context, not left out by
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
    assert!(paths.contains(&"vendor/sled"), "{paths:?}");
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

#[test]
fn the_image_command_starts_the_relay_from_its_environment() {
    let text = dockerfile();
    let cmd: Vec<String> = text
        .lines()
        .find_map(|l| l.strip_prefix("CMD "))
        .map(|c| serde_json::from_str(c).expect("CMD is a JSON array"))
        .unwrap();
    let data = tempfile::tempdir().unwrap();
    let mut command = Command::new(env!("CARGO_BIN_EXE_crosstalk"));
    command
        .args(&cmd)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default());
    for (k, v) in runtime_env(&text) {
        let v = match k.as_str() {
            "CROSSTALK_HOST" => "127.0.0.1".to_owned(),
            "CROSSTALK_PORT" => "0".to_owned(),
            "CROSSTALK_DATA_DIR" => data.path().display().to_string(),
            _ => v,
        };
        command.env(k, v);
    }
    let mut child = command.stdout(Stdio::piped()).stderr(Stdio::null()).spawn().unwrap();
    let mut line = String::new();
    use std::io::BufRead;
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let _ = child.kill();
    let _ = child.wait();
    assert!(line.starts_with("crosstalk listening on http://127.0.0.1:"), "{line}");
    assert!(
        data.path().read_dir().unwrap().next().is_some(),
        "the store was created in the data dir"
    );
}
