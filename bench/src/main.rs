//! `crosstalk-bench`: starts crosstalk (and crosstalk-mcp when its virtualenv is there) on
//! 127.0.0.1 with fresh data directories, runs the same workloads against each, one server at
//! a time, prints the comparison, and writes results.json (and BENCHMARKS.md when asked).
//! `--smoke` runs every workload for about a second with tiny counts and fails only if a
//! workload does not work. `bench/run` is the one command that wraps this.

mod client;
mod cpu;
mod report;
mod scrape;
mod stats;
mod target;
mod workload;

use anyhow::Context as _;
use clap::Parser;
use std::path::{Path, PathBuf};
use std::time::Duration;
use target::{Kind, Launcher};
use workload::{Done, Plan, Record};

/// Descriptors the harness keeps for itself besides its subscribers.
const FD_RESERVE: usize = 512;

#[derive(Debug, Parser)]
#[command(
    name = "crosstalk-bench",
    about = "Benchmark crosstalk against crosstalk-mcp on loopback"
)]
struct Args {
    /// About a second per workload with tiny counts; exit non-zero only if a workload fails to work.
    #[arg(long)]
    smoke: bool,
    /// The `crosstalk` binary to benchmark.
    #[arg(long)]
    relay_bin: PathBuf,
    /// crosstalk-mcp's console script (in bench/.venv); without it the peer is "not available".
    #[arg(long)]
    peer_bin: Option<PathBuf>,
    /// Python of the peer's virtualenv, to fill its SQLite file [default: next to --peer-bin].
    #[arg(long)]
    peer_python: Option<PathBuf>,
    /// Logs, data directories and results.json.
    #[arg(long, default_value = "bench/out")]
    out: PathBuf,
    /// Write the markdown report here (BENCHMARKS.md).
    #[arg(long)]
    report: Option<PathBuf>,
    /// Comma-separated subset: post,tail,wake,fanout,idle,mcp,startup,fsync,channels,waiters,stdio,cluster,search,turns,reference [default: all].
    #[arg(long)]
    only: Option<String>,
    /// Measured seconds of each throughput workload.
    #[arg(long)]
    duration_secs: Option<f64>,
    /// Posting connections of the throughput workloads [default: 16].
    #[arg(long)]
    connections: Option<usize>,
    /// Comma-separated channel counts the cluster's POST load is also spread over [default: 4,16].
    #[arg(long, value_delimiter = ',')]
    cluster_channels: Option<Vec<usize>>,
    #[arg(long)]
    fanout_subscribers: Option<usize>,
    #[arg(long)]
    idle_subscribers: Option<usize>,
    /// Idle subscribers for crosstalk-mcp [default: as for crosstalk].
    #[arg(long)]
    peer_idle_subscribers: Option<usize>,
    #[arg(long)]
    startup_messages: Option<u64>,
    /// Threads of the load generator's runtime.
    #[arg(long, default_value_t = 2)]
    client_threads: usize,
    /// Runs crosstalk under this command, e.g. "valgrind --tool=callgrind" (bench/profile).
    #[arg(long)]
    relay_wrapper: Option<String>,
    /// Runs `HOOK start|end WORKLOAD PID` around each workload (bench/profile uses it to
    /// profile one workload at a time).
    #[arg(long)]
    hook: Option<PathBuf>,
    /// The command to record in the report [default: this process's arguments].
    #[arg(long)]
    command_line: Option<String>,
}

/// In run order. MCP runs before the SSE fleets so a peer still draining thousands of closed
/// streams does not slow it down.
const ALL: &[&str] = &[
    "post",
    "tail",
    "wake",
    "mcp",
    "fanout",
    "idle",
    "startup",
    "fsync",
    "channels",
    "waiters",
    "stdio",
    "cluster",
    "search",
    "turns",
    "reference",
];
/// Workloads of crosstalk alone: each starts a server of its own with the flags it measures.
const OURS_ONLY: &[&str] = &[
    "fsync",
    "channels",
    "waiters",
    "stdio",
    "cluster",
    "search",
    "turns",
    "reference",
];

/// Raises the soft open-file limit to the hard one; returns the new soft limit.
fn raise_nofile() -> usize {
    // SAFETY: getrlimit/setrlimit on our own process with a valid struct.
    unsafe {
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
            return 1024;
        }
        lim.rlim_cur = lim.rlim_max;
        libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim);
        lim.rlim_cur as usize
    }
}

fn sh(cmd: &str, args: &[&str]) -> String {
    std::process::Command::new(cmd)
        .args(args)
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_else(|| "unknown".into())
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(args.client_threads.max(1))
        .enable_all()
        .build()?;
    let failed = rt.block_on(run(args))?;
    if failed > 0 {
        eprintln!("{failed} workload(s) failed");
        std::process::exit(1);
    }
    Ok(())
}

/// Runs the `--hook` command, if any, and waits for it.
fn hook(hook: Option<&Path>, phase: &str, workload: &str, pid: u32) {
    if let Some(h) = hook {
        match std::process::Command::new(h)
            .args([phase, workload, &pid.to_string()])
            .status()
        {
            Ok(s) if s.success() => {}
            other => eprintln!("hook {phase} {workload}: {other:?}"),
        }
    }
}

fn record_outcome(rec: &mut Record, kind: Kind, name: &str, outcome: anyhow::Result<Done>, failed: &mut usize) {
    let status = match outcome {
        Ok(Done::Ran) => "ok".to_owned(),
        Ok(Done::Skipped(why)) => format!("skipped: {why}"),
        Err(e) => {
            *failed += 1;
            format!("FAILED: {e:#}")
        }
    };
    println!("[{}] {name}: {status}", kind.name());
    rec.workloads.insert(name.to_owned(), status);
}

/// Runs every selected workload against one kind of server; returns the failures.
/// What every system's run shares.
struct Setup<'a> {
    data_root: &'a Path,
    /// Workloads chosen with `--only` (all by default).
    selected: &'a [String],
    /// Most subscribers the open-file limit allows.
    max_subscribers: usize,
    hook: Option<&'a Path>,
}

async fn bench_one(
    plan: &Plan,
    launcher: &Launcher,
    python: Option<&PathBuf>,
    setup: &Setup<'_>,
    rec: &mut Record,
) -> anyhow::Result<usize> {
    let kind = launcher.kind;
    let (data_root, max_subscribers, hook_cmd) = (setup.data_root, setup.max_subscribers, setup.hook);
    let want = |w: &str| setup.selected.iter().any(|s| s == w);
    let mut failed = 0;
    let dir = data_root.join(kind.name());
    if dir.exists() {
        std::fs::remove_dir_all(&dir)?;
    }
    if ["post", "tail", "wake", "fanout", "idle", "mcp"]
        .iter()
        .any(|w| want(w))
    {
        let (server, ready) = launcher.start(&dir, &[], "main").await?;
        println!(
            "[{}] listening on {} (ready in {:.0} ms)",
            kind.name(),
            server.addr,
            ready.as_secs_f64() * 1e3
        );
        let pid = server.pid()?;
        let mut last_id = 0;
        if want("post") || want("tail") {
            let outcome = {
                hook(hook_cmd, "start", "post", pid);
                let o = workload::post::post(plan, &server, rec).await;
                hook(hook_cmd, "end", "post", pid);
                o
            }
            .map(|id| {
                last_id = id;
                Done::Ran
            });
            record_outcome(rec, kind, "post", outcome, &mut failed);
        }
        if want("tail") {
            let outcome = {
                hook(hook_cmd, "start", "tail", pid);
                let o = workload::post::tail(plan, &server, rec, last_id).await;
                hook(hook_cmd, "end", "tail", pid);
                o
            };
            record_outcome(rec, kind, "tail", outcome, &mut failed);
        }
        if want("wake") {
            let outcome = {
                hook(hook_cmd, "start", "wake", pid);
                let o = workload::wake::wake(plan, &server, rec).await;
                hook(hook_cmd, "end", "wake", pid);
                o
            };
            record_outcome(rec, kind, "wake", outcome, &mut failed);
        }
        if want("mcp") {
            let outcome = {
                hook(hook_cmd, "start", "mcp", pid);
                let o = workload::mcp::mcp_post(plan, &server, rec).await;
                hook(hook_cmd, "end", "mcp", pid);
                o
            };
            record_outcome(rec, kind, "mcp", outcome, &mut failed);
            let outcome = workload::mcp::mcp_wake(plan, &server, rec).await;
            record_outcome(rec, kind, "mcp wake", outcome, &mut failed);
        }
        if want("fanout") {
            let outcome = {
                hook(hook_cmd, "start", "fanout", pid);
                let o = workload::fanout::fanout(plan, &server, rec).await;
                hook(hook_cmd, "end", "fanout", pid);
                o
            };
            record_outcome(rec, kind, "fanout", outcome, &mut failed);
        }
        if want("idle") {
            let outcome = {
                hook(hook_cmd, "start", "idle", pid);
                let o = workload::fanout::idle(plan, &server, rec, max_subscribers).await;
                hook(hook_cmd, "end", "idle", pid);
                o
            };
            record_outcome(rec, kind, "idle", outcome, &mut failed);
        }
        if let Err(e) = server.stop().await {
            record_outcome(rec, kind, "clean stop", Err(e), &mut failed);
        }
        std::fs::remove_dir_all(&dir)?;
    }
    for name in OURS_ONLY.iter().filter(|w| want(w)) {
        if kind != Kind::Crosstalk {
            continue;
        }
        let dir = data_root.join(format!("{}-{name}", kind.name()));
        if dir.exists() {
            std::fs::remove_dir_all(&dir)?;
        }
        let outcome = match *name {
            "fsync" => workload::scale::fsync_post(plan, launcher, &dir, rec).await,
            "channels" => workload::scale::channels(plan, launcher, &dir, rec).await,
            "stdio" => workload::stdio::stdio(plan, launcher, &dir, rec).await,
            "cluster" => workload::cluster::cluster(plan, launcher, &dir, rec).await,
            "search" => workload::search::search(plan, launcher, &dir, rec).await,
            "turns" => workload::turns::turns(plan, launcher, &dir, rec).await,
            "reference" => workload::reference::reference(plan, launcher, &dir, rec).await,
            _ => workload::scale::waiters(plan, launcher, &dir, rec).await,
        };
        record_outcome(rec, kind, name, outcome, &mut failed);
        let _ = std::fs::remove_dir_all(&dir);
    }
    if want("startup") {
        let startup_dir = data_root.join(format!("{}-startup", kind.name()));
        let outcome = workload::startup::startup_and_disk(plan, launcher, python, &startup_dir, rec).await;
        record_outcome(rec, kind, "startup+disk", outcome, &mut failed);
    }
    Ok(failed)
}

async fn run(args: Args) -> anyhow::Result<usize> {
    let mut plan = if args.smoke { Plan::smoke() } else { Plan::full() };
    if let Some(s) = args.duration_secs {
        plan.duration = Duration::from_secs_f64(s);
    }
    if let Some(n) = args.connections {
        plan.connections = n.max(1);
    }
    if let Some(c) = args.cluster_channels {
        plan.cluster_channels = c.into_iter().filter(|&n| n > 1).collect();
    }
    if let Some(n) = args.fanout_subscribers {
        plan.fanout_subscribers = n;
    }
    if let Some(n) = args.idle_subscribers {
        plan.idle_subscribers = n;
    }
    if let Some(n) = args.startup_messages {
        plan.startup_messages = n;
    }
    let selected: Vec<String> = match &args.only {
        Some(list) => list.split(',').map(|s| s.trim().to_owned()).collect(),
        None => ALL.iter().map(|s| s.to_string()).collect(),
    };
    if let Some(bad) = selected.iter().find(|s| !ALL.contains(&s.as_str())) {
        anyhow::bail!("unknown workload {bad:?}; choose from {ALL:?}");
    }
    let nofile = raise_nofile();
    let max_subscribers = nofile.saturating_sub(FD_RESERVE);
    let log_dir = args.out.join("logs");
    let data_root = args.out.join("data");
    std::fs::create_dir_all(&data_root)?;
    let mut machine = report::Machine::probe(&data_root);
    println!(
        "crosstalk-bench: {} mode, {} CPUs, load average {}, open-file limit {nofile}, fdatasync p50 {:.2} ms",
        if plan.smoke { "smoke" } else { "full" },
        machine.nproc,
        machine.loadavg_before,
        machine.fsync_p50_ms
    );

    let mut failed = 0;
    let mut systems = std::collections::BTreeMap::new();
    let ours = Launcher {
        kind: Kind::Crosstalk,
        wrapper: args
            .relay_wrapper
            .as_deref()
            .map(|w| w.split_whitespace().map(String::from).collect())
            .unwrap_or_default(),
        program: std::fs::canonicalize(&args.relay_bin).with_context(|| format!("{}", args.relay_bin.display()))?,
        log_dir: log_dir.clone(),
    };
    let mut rec = Record::default();
    let setup = Setup {
        data_root: &data_root,
        selected: &selected,
        max_subscribers,
        hook: args.hook.as_deref(),
    };
    failed += bench_one(&plan, &ours, None, &setup, &mut rec)
        .await
        .context("crosstalk")?;
    systems.insert(Kind::Crosstalk.name().to_owned(), rec);

    match args.peer_bin.as_ref().filter(|p| p.exists()) {
        None => println!("[crosstalk-mcp] not available: no --peer-bin (`bench/run` without --smoke installs it)"),
        Some(program) => {
            let peer = Launcher {
                kind: Kind::Peer,
                wrapper: Vec::new(),
                program: std::fs::canonicalize(program)?,
                log_dir: log_dir.clone(),
            };
            let python = args
                .peer_python
                .clone()
                .or_else(|| program.parent().map(|d| d.join("python")))
                .map(|p| std::fs::canonicalize(&p).unwrap_or(p));
            let mut peer_plan = plan.clone();
            if let Some(n) = args.peer_idle_subscribers {
                peer_plan.idle_subscribers = n;
            }
            let mut rec = Record::default();
            let setup = Setup { hook: None, ..setup };
            failed += bench_one(&peer_plan, &peer, python.as_ref(), &setup, &mut rec)
                .await
                .context("crosstalk-mcp")?;
            systems.insert(Kind::Peer.name().to_owned(), rec);
        }
    }
    let _ = std::fs::remove_dir(&data_root);
    machine.loadavg_after = report::loadavg();

    let lines = report::lines(&systems[Kind::Crosstalk.name()], systems.get(Kind::Peer.name()), &plan);
    println!("\n{}", report::table(&lines));
    for (name, rec) in &systems {
        for n in &rec.notes {
            println!("[{name}] {n}");
        }
    }
    println!(
        "load average before {}, after {}",
        machine.loadavg_before, machine.loadavg_after
    );
    // The bench's own outputs from an earlier run do not make the measured code uncommitted.
    let dirty = !sh(
        "git",
        &[
            "status",
            "--porcelain",
            "--untracked-files=no",
            "--",
            ".",
            ":!BENCHMARKS.md",
            ":!bench/chart.png",
        ],
    )
    .is_empty();
    let results = report::Results {
        date_utc: sh("date", &["-u", "+%Y-%m-%d %H:%M UTC"]),
        command: args
            .command_line
            .clone()
            .unwrap_or_else(|| std::env::args().collect::<Vec<_>>().join(" ")),
        commit: format!(
            "{}{}",
            sh("git", &["rev-parse", "--short", "HEAD"]),
            if dirty { " + uncommitted changes" } else { "" }
        ),
        smoke: plan.smoke,
        machine,
        lines,
        systems,
    };
    std::fs::create_dir_all(&args.out)?;
    let json_path = args.out.join("results.json");
    std::fs::write(&json_path, serde_json::to_string_pretty(&results)?)?;
    println!("wrote {}", json_path.display());
    if let Some(path) = &args.report {
        std::fs::write(path, report::markdown(&results, &plan))?;
        println!("wrote {}", path.display());
    }
    Ok(failed)
}
