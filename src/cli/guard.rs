//! `crosstalk guard`: staged paths against the exclusive reservations others hold, and the
//! pre-commit hook that runs it.

use super::{Failure, Outcome, RelayArgs};
use crate::api;
use crate::client::{shell_quote, RelayClient};
use crate::ops::reservations::ListReservationsRequest;

/// The first line of a hook `crosstalk guard --install` wrote: how it knows its own.
const GUARD_HOOK_MARK: &str = "# written by crosstalk guard --install";

/// Runs `git` in the current directory; its stdout, or why it failed in one line (git's
/// first line of complaint, not the usage text some of its commands print after it).
fn git(args: &[&str]) -> Result<Vec<u8>, Failure> {
    let out = std::process::Command::new("git")
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| Failure(format!("cannot run git ({e}): crosstalk guard needs git on PATH"), 2))?;
    if !out.status.success() {
        let said = String::from_utf8_lossy(&out.stderr);
        let first = said
            .lines()
            .map(str::trim)
            .find(|l| !l.is_empty())
            .unwrap_or("no reason given");
        return Err(Failure(format!("git {} failed: {first}", args.join(" ")), 2));
    }
    Ok(out.stdout)
}

/// Refuses to go on outside a git checkout, saying where to run instead.
fn in_checkout() -> Result<(), Failure> {
    let out = std::process::Command::new("git")
        .args(["rev-parse", "--git-dir"])
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| Failure(format!("cannot run git ({e}): crosstalk guard needs git on PATH"), 2))?;
    if !out.status.success() {
        let here = std::env::current_dir().map_or_else(|_| "here".into(), |d| d.display().to_string());
        return Err(Failure(
            format!(
                "{here} is not in a git checkout: run crosstalk guard inside the repository whose commits it checks"
            ),
            2,
        ));
    }
    Ok(())
}

/// `crosstalk guard --install`: the hook runs this binary with the same settings (the token
/// stays in the environment, never in the file).
fn install_guard(relay: &RelayArgs, me: Option<&str>, project: Option<&str>) -> Result<Outcome, Failure> {
    in_checkout()?;
    let hooks = String::from_utf8_lossy(&git(&["rev-parse", "--git-path", "hooks"])?)
        .trim()
        .to_owned();
    let hook = std::path::Path::new(&hooks).join("pre-commit");
    if let Ok(existing) = std::fs::read_to_string(&hook) {
        if !existing.contains(GUARD_HOOK_MARK) {
            return Err(Failure(
                format!(
                    "{} exists and is not crosstalk's; add `crosstalk guard` to it yourself",
                    hook.display()
                ),
                2,
            ));
        }
    }
    let exe = std::env::current_exe().map_err(|e| Failure(format!("cannot find this program: {e}"), 2))?;
    let mut line = format!("exec {} guard", shell_quote(&exe.to_string_lossy()));
    if let Some(url) = &relay.relay {
        line.push_str(&format!(" --relay {}", shell_quote(url)));
    }
    if let Some(me) = me {
        line.push_str(&format!(" --as {}", shell_quote(me)));
    }
    if let Some(p) = project {
        line.push_str(&format!(" --project {}", shell_quote(p)));
    }
    let script = format!(
        "#!/bin/sh\n{GUARD_HOOK_MARK}: refuses a commit that touches paths another agent holds.\n\
         # Skip it once with git commit --no-verify.\n{line}\n"
    );
    std::fs::create_dir_all(&hooks).map_err(|e| Failure(format!("cannot create {hooks}: {e}"), 2))?;
    std::fs::write(&hook, script).map_err(|e| Failure(format!("cannot write {}: {e}", hook.display()), 2))?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&hook, std::fs::Permissions::from_mode(0o755))
            .map_err(|e| Failure(format!("cannot make {} executable: {e}", hook.display()), 2))?;
    }
    eprintln!("wrote {}", hook.display());
    Ok(Outcome::Done)
}

/// `crosstalk guard`: the staged paths against the exclusive reservations others hold. A path
/// no reservation pattern could spell ([`reservation::path`]) cannot be checked: it is refused
/// too, with why, whatever is reserved.
async fn guard(c: &RelayClient, me: &str, project: Option<&str>) -> Result<Outcome, Failure> {
    use crosstalk_schema::reservation;
    in_checkout()?;
    let staged = git(&["diff", "--cached", "--name-only", "--no-renames", "-z"])?;
    let mut paths: Vec<&str> = Vec::new();
    let mut unfit = 0;
    for raw in staged.split(|b| *b == 0).filter(|p| !p.is_empty()) {
        match reservation::path(raw) {
            Ok(p) => paths.push(p),
            Err(why) => {
                unfit += 1;
                // Escaped: a control character in a name must not reach the terminal.
                eprintln!(
                    "{:?}: cannot be checked against reservations: {why}",
                    String::from_utf8_lossy(raw)
                );
            }
        }
    }
    if paths.is_empty() && unfit == 0 {
        return Ok(Outcome::Done);
    }
    let request = ListReservationsRequest {
        project: Some(project.unwrap_or("").to_owned()),
        holder: None,
    };
    let list = c.call(api::LIST_RESERVATIONS, &request).await?;
    let mut blocked = 0;
    for r in list.reservations.iter().filter(|r| r.holder != me && r.exclusive) {
        for path in &paths {
            let covering = r.paths.iter().find(|p| reservation::matches(p, path));
            if let Some(pattern) = covering {
                blocked += 1;
                let reason = Some(r.reason.as_str()).filter(|s| !s.is_empty());
                eprintln!(
                    "{path}: held by {} ({pattern}, exclusive, until {}): {}",
                    r.holder,
                    r.expires_at,
                    reason.unwrap_or("no reason given")
                );
            }
        }
    }
    let refused = match (blocked, unfit) {
        (0, 0) => return Ok(Outcome::Done),
        (b, 0) => format!("{b} staged path(s) are held by another agent; ask the holder"),
        (0, u) => format!("{u} staged path(s) cannot be checked against reservations; rename them"),
        (b, u) => format!(
            "{b} staged path(s) are held by another agent and {u} cannot be checked; ask the holder, rename them"
        ),
    };
    Err(Failure(format!("{refused}, or commit with --no-verify"), 1))
}

/// `crosstalk guard`, or with `--install` the hook that runs it before each commit.
pub(super) async fn guard_command(
    c: &RelayClient,
    relay: RelayArgs,
    me: Option<String>,
    project: Option<String>,
    install: bool,
) -> Result<Outcome, Failure> {
    if install {
        return install_guard(&relay, me.as_deref(), project.as_deref());
    }
    let Some(me) = me.filter(|m| !m.trim().is_empty()) else {
        return Err(Failure("name who is committing: --as ID (or CROSSTALK_AS)".into(), 2));
    };
    guard(c, &me, project.as_deref()).await
}
