//! `crosstalk wake`: the relay as an agent's re-invoker. It holds an identity's lease on the
//! relay (one wake process at a time), waits for the messages that wake the identity, and runs
//! the agent's command once per turn with those messages in its prompt. Where the identity has
//! handled up to is kept on the relay and moves only when the turn that was handed the
//! messages has ended, so restarts of either side hand nothing twice and miss nothing.
//!
//! Around the turns: a failing turn is retried with backoff and then handed to the humans as a
//! QUESTION; the loop guard stops waking for a channel where only agents have been waking each
//! other, and the hourly budget stops all waking, each asking a person, whose message resumes
//! it; SIGTERM lets a running turn finish within a grace period.

use super::{Failure, Outcome, Span};
use crate::api;
use crate::client::RelayClient;
use crate::ops::wake::{ActivityArg, HolderRequest, LeaseRequest, PendingRequest, TurnRequest, WakeView, Waking};
use crosstalk_schema::message::ANY_HUMAN;
use crosstalk_schema::wake::Turn;
use crosstalk_schema::{ChannelName, Meaning, Message, NewMessage, Timestamp};
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Why waking stopped, as the relay shows it ("paused by …").
const GUARD: &str = "the loop guard";
const BUDGET: &str = "the hourly budget";
/// How long the lease lasts unless renewed; it is renewed every third of it.
const LEASE_S: u64 = 30;
/// A turn's log per identity is kept under this size (the older half goes to `.1`).
const LOG_MAX_BYTES: u64 = 4 << 20;
/// Of each of a turn's output streams, the last this many bytes are kept (for the log, and
/// for `--post-output`).
const OUTPUT_KEPT: usize = 1 << 20;
/// The part of a turn's stdout `--post-output` posts, at most.
const OUTPUT_MAX_BYTES: usize = 16 << 10;
/// The longest a wait for messages lasts before it is asked again.
const PENDING_WAIT_S: f64 = 25.0;

/// How `crosstalk wake` runs.
pub struct Settings {
    pub me: String,
    pub listen: Vec<ChannelName>,
    pub command: Vec<String>,
    pub turn_timeout: Duration,
    pub retries: u32,
    pub loop_guard: u32,
    pub max_turns_per_hour: u32,
    pub post_output: bool,
    pub log_dir: Option<PathBuf>,
    pub grace: Duration,
}

/// `crosstalk wake`.
pub(super) async fn wake(c: RelayClient, s: Settings) -> Result<Outcome, Failure> {
    let program = s.command.first().ok_or_else(|| {
        Failure(
            "name the agent's command after --, e.g. crosstalk wake --as reviewer -- claude -p -c \"{prompt}\"".into(),
            2,
        )
    })?;
    if which(program).is_none() {
        return Err(Failure(
            format!("the command {program:?} was not found (not a file, and not on PATH)"),
            2,
        ));
    }
    let log = log_path(&s)?;
    let stop = Arc::new(AtomicBool::new(false));
    watch_signals(stop.clone());
    let holder = uuid::Uuid::new_v4().simple().to_string();
    wait_for_relay(&c, &stop).await?;
    let Some(taken) = take_lease(&c, &s.me, &holder, &stop).await? else {
        return Ok(Outcome::Done);
    };
    let lost = Arc::new(AtomicBool::new(false));
    let renewer = tokio::spawn(renew(c.clone(), s.me.clone(), holder.clone(), lost.clone()));
    let listening = if s.listen.is_empty() {
        "messages addressed to it".to_owned()
    } else {
        let names: Vec<&str> = s.listen.iter().map(ChannelName::as_str).collect();
        format!("messages addressed to it and every message on {}", names.join(", "))
    };
    eprintln!(
        "crosstalk wake: {} wakes on {listening}; each turn runs {}; turns log to {}",
        s.me,
        s.command.join(" "),
        log.display()
    );
    let mut w = Waker {
        c,
        s,
        holder,
        log,
        stop,
        lost,
        guard: HashMap::new(),
        paused: BTreeMap::new(),
        hour: VecDeque::new(),
        budget_paused: false,
        budget_question: None,
        budget_asked_on: Vec::new(),
    };
    // A pause stands across a restart until a person lifts it: the relay kept it.
    if let Some(p) = taken.paused {
        if p.why == BUDGET || p.channel.is_none() {
            w.budget_paused = true;
            w.budget_question = p.question;
            w.budget_asked_on = p.channel.into_iter().collect();
        } else if let Some(c) = p.channel {
            w.paused.insert(c, p.question.unwrap_or(0));
        }
        eprintln!(
            "crosstalk wake: {} is {}; a person's message lifts it",
            w.s.me, taken.state
        );
    }
    let result = w.run().await;
    renewer.abort();
    let release = HolderRequest {
        identity: w.s.me.clone(),
        holder: w.holder.clone(),
    };
    if let Err(f) = w.c.call(api::WAKE_RELEASE, &release).await {
        eprintln!(
            "crosstalk wake: could not give the lease back ({}); it lapses in {LEASE_S} s",
            f.0
        );
    }
    result
}

struct Waker {
    c: RelayClient,
    s: Settings,
    holder: String,
    log: PathBuf,
    stop: Arc<AtomicBool>,
    lost: Arc<AtomicBool>,
    /// Per channel, turns in a row that only agents' messages woke.
    guard: HashMap<String, u32>,
    /// Channels the loop guard stopped waking for, with the question that asks a person.
    /// Their messages stay unhandled on the relay until a person writes there.
    paused: BTreeMap<String, u64>,
    /// When the turns of the last hour started.
    hour: VecDeque<Instant>,
    budget_paused: bool,
    /// The question that asks a person to lift the budget's pause.
    budget_question: Option<u64>,
    /// The channel that question is on.
    budget_asked_on: Vec<String>,
}

/// How a turn's command ended.
enum Ran {
    Ok(String),
    Failed(String),
    /// Stopped by SIGTERM past the grace period: nothing it was handed counts as handled.
    Stopped,
}

impl Waker {
    async fn run(&mut self) -> Result<Outcome, Failure> {
        self.rest(BTreeMap::new(), None).await;
        while !self.stop.load(Ordering::SeqCst) && !self.lost.load(Ordering::SeqCst) {
            let request = PendingRequest {
                identity: self.s.me.clone(),
                holder: self.holder.clone(),
                listen: Some(
                    self.s
                        .listen
                        .iter()
                        .map(ChannelName::as_str)
                        .collect::<Vec<_>>()
                        .join(","),
                ),
                paused: if self.budget_paused {
                    Some("*".to_owned())
                } else {
                    Some(self.paused.keys().cloned().collect::<Vec<_>>().join(","))
                },
                timeout_s: Some(PENDING_WAIT_S),
                limit: None,
            };
            let call = self.c.try_call(api::WAKE_PENDING, &request);
            let answer = tokio::select! {
                answer = call => answer,
                () = stopped(&self.stop) => break,
            };
            let pending = match answer {
                Ok(p) => p,
                Err(e) => {
                    if self.stop.load(Ordering::SeqCst) {
                        break;
                    }
                    // A conflict here is the lease: it lapsed, and another took it.
                    if e.is_conflict() {
                        eprintln!("crosstalk wake: {e}");
                        self.lost.store(true, Ordering::SeqCst);
                        break;
                    }
                    eprintln!("crosstalk wake: {e}; trying again");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    continue;
                }
            };
            if pending.messages.is_empty() {
                continue;
            }
            self.turn(pending.messages, pending.scanned).await?;
        }
        if self.lost.load(Ordering::SeqCst) {
            return Err(Failure(
                format!(
                    "crosstalk wake: lost {}'s lease to another wake process; stopping",
                    self.s.me
                ),
                2,
            ));
        }
        Ok(Outcome::Done)
    }

    /// One batch of waking messages: resumes what a person's message lifts, holds back what
    /// a pause holds, guards against loops and the budget, and runs the turn.
    async fn turn(&mut self, found: Vec<Waking<Message>>, scanned: BTreeMap<String, u64>) -> Result<(), Failure> {
        let mut by_channel: BTreeMap<String, Vec<Waking<Message>>> = BTreeMap::new();
        for w in found {
            by_channel.entry(w.message.channel.clone()).or_default().push(w);
        }
        // A person's message resumes what the guard or the budget paused. The relay hands a
        // paused channel's messages only with a person's, so all of them come now.
        let humans: BTreeSet<String> = by_channel
            .iter()
            .filter(|(_, ms)| ms.iter().any(|w| w.human))
            .map(|(c, _)| c.clone())
            .collect();
        for c in &humans {
            if self.paused.remove(c).is_some() {
                eprintln!("crosstalk wake: a person wrote on {c}: waking for it again");
            }
            self.guard.insert(c.clone(), 0);
        }
        if self.budget_paused && !humans.is_empty() {
            self.budget_paused = false;
            self.hour.clear();
        }
        let mut scanned = scanned;
        let mut batch: Vec<Message> = Vec::new();
        for (c, ms) in by_channel {
            let messages: Vec<Message> = ms.into_iter().map(|w| w.message).collect();
            if self.paused.contains_key(&c) || self.budget_paused {
                hold_back(&mut scanned, &messages);
            } else {
                batch.extend(messages);
            }
        }
        // The loop guard: turns in a row that only agents woke, per channel.
        let channels: BTreeSet<String> = batch.iter().map(|m| m.channel.clone()).collect();
        for c in &channels {
            if humans.contains(c) {
                continue;
            }
            let n = self.guard.entry(c.clone()).or_default();
            *n += 1;
            if self.s.loop_guard > 0 && *n > self.s.loop_guard {
                let agents: BTreeSet<&str> = batch
                    .iter()
                    .filter(|m| &m.channel == c)
                    .map(|m| m.sender.as_str())
                    .collect();
                let body = format!(
                    "crosstalk wake stopped waking {} for #{c}: {} turns in a row were woken only by agents ({}), \
                     with no person in between. Answer this (or write on #{c}) to let it go on.",
                    self.s.me,
                    self.s.loop_guard,
                    agents.into_iter().collect::<Vec<_>>().join(", ")
                );
                let question = self.ask_humans(c, body).await;
                self.paused.insert(c.clone(), question.unwrap_or(0));
                self.tell(
                    ActivityArg::Paused,
                    std::slice::from_ref(c),
                    Some(GUARD),
                    question,
                    BTreeMap::new(),
                    None,
                )
                .await;
            }
        }
        let (batch, held): (Vec<Message>, Vec<Message>) =
            batch.into_iter().partition(|m| !self.paused.contains_key(&m.channel));
        hold_back(&mut scanned, &held);
        // The hourly budget, across every channel.
        let hour_ago = Instant::now().checked_sub(Duration::from_secs(3600));
        while self.hour.front().is_some_and(|t| Some(*t) < hour_ago) {
            self.hour.pop_front();
        }
        if !batch.is_empty() && self.s.max_turns_per_hour > 0 && self.hour.len() >= self.s.max_turns_per_hour as usize {
            let c = batch[0].channel.clone();
            let body = format!(
                "crosstalk wake stopped waking {}: it ran {} turns in the last hour, its budget \
                 (--max-turns-per-hour). Answer this (or write on any of its channels) to let it go on.",
                self.s.me, self.s.max_turns_per_hour
            );
            let question = self.ask_humans(&c, body).await;
            self.budget_paused = true;
            self.budget_question = question;
            self.budget_asked_on = vec![c];
            hold_back(&mut scanned, &batch);
            self.tell(
                ActivityArg::Paused,
                &self.budget_asked_on,
                Some(BUDGET),
                question,
                scanned,
                None,
            )
            .await;
            return Ok(());
        }
        if batch.is_empty() {
            self.rest(scanned, None).await;
            return Ok(());
        }
        self.hour.push_back(Instant::now());
        let channels: Vec<String> = batch
            .iter()
            .map(|m| m.channel.clone())
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        let prompt = prompt(&self.s.me, &self.c.base, &batch);
        let mut attempt = 0;
        loop {
            attempt += 1;
            let started = Timestamp::now().millis();
            self.tell(ActivityArg::Working, &channels, None, None, BTreeMap::new(), None)
                .await;
            let ran = self.run_command(&prompt, &channels, attempt).await;
            let ended = Timestamp::now().millis();
            let record = |outcome: &str| Turn {
                started_ms: started,
                ended_ms: ended,
                channels: channels.clone(),
                messages: batch.len() as u32,
                outcome: outcome.to_owned(),
                attempt,
            };
            match ran {
                Ran::Ok(stdout) => {
                    if self.s.post_output && !stdout.trim().is_empty() {
                        self.post_output(&batch[0].channel, &stdout).await;
                    }
                    self.rest(scanned, Some(record("ok"))).await;
                    return Ok(());
                }
                Ran::Stopped => {
                    self.rest(BTreeMap::new(), Some(record("stopped"))).await;
                    return Ok(());
                }
                Ran::Failed(why) if attempt > self.s.retries => {
                    let ids: Vec<String> = batch.iter().map(|m| format!("#{} on {}", m.id, m.channel)).collect();
                    let body = format!(
                        "crosstalk wake could not run {}'s turn for {}: it failed {attempt} times, last: {why}. \
                         These messages need a person.",
                        self.s.me,
                        ids.join(", ")
                    );
                    self.ask_humans(&batch[0].channel, body).await;
                    self.rest(scanned, Some(record(&why))).await;
                    return Ok(());
                }
                Ran::Failed(why) => {
                    self.rest(BTreeMap::new(), Some(record(&why))).await;
                    let backoff = Duration::from_secs(1 << attempt.min(6));
                    eprintln!("crosstalk wake: turn failed ({why}); again in {} s", backoff.as_secs());
                    if sleep_unless_stopped(backoff, &self.stop).await {
                        return Ok(());
                    }
                }
            }
        }
    }

    /// Records the state between turns (paused by the budget or the guard, else listening),
    /// what is handled, and the turn that ended, if one did.
    async fn rest(&self, handled: BTreeMap<String, u64>, turn: Option<Turn>) {
        if self.budget_paused {
            self.tell(
                ActivityArg::Paused,
                &self.budget_asked_on,
                Some(BUDGET),
                self.budget_question,
                handled,
                turn,
            )
            .await;
        } else if let Some((channel, question)) = self.paused.iter().next() {
            let question = Some(*question).filter(|q| *q > 0);
            self.tell(
                ActivityArg::Paused,
                std::slice::from_ref(channel),
                Some(GUARD),
                question,
                handled,
                turn,
            )
            .await;
        } else {
            self.tell(ActivityArg::Listening, &[], None, None, handled, turn).await;
        }
    }

    /// Records what the identity does now, and what is handled, on the relay.
    async fn tell(
        &self,
        activity: ActivityArg,
        channels: &[String],
        why: Option<&str>,
        question: Option<u64>,
        handled: BTreeMap<String, u64>,
        turn: Option<Turn>,
    ) {
        let request = TurnRequest {
            identity: self.s.me.clone(),
            holder: self.holder.clone(),
            activity,
            channels: channels.to_vec(),
            why: why.map(str::to_owned),
            question,
            handled,
            turn,
        };
        // A turn's end must reach the relay, or its messages would be handed again.
        for attempt in 0..30 {
            match self.c.try_call(api::WAKE_TURN, &request).await {
                Ok(_) => return,
                Err(e) if e.is_conflict() => {
                    eprintln!("crosstalk wake: {e}");
                    self.lost.store(true, Ordering::SeqCst);
                    return;
                }
                Err(e) => {
                    if attempt == 0 {
                        eprintln!("crosstalk wake: recording the turn failed ({e}); trying again");
                    }
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        }
    }

    /// A QUESTION to the humans on `channel`, from the identity; its id.
    async fn ask_humans(&self, channel: &str, body: String) -> Option<u64> {
        let channel = ChannelName::parse(channel).ok()?;
        let question = NewMessage {
            sender: self.s.me.clone(),
            kind: Some(Meaning::Question.into()),
            body,
            recipient: Some(ANY_HUMAN.to_owned()),
            ..NewMessage::default()
        };
        match self.c.post(&channel, question).await {
            Ok(m) => Some(m.id),
            Err(f) => {
                eprintln!("crosstalk wake: asking a person on {channel} failed: {}", f.0);
                None
            }
        }
    }

    async fn post_output(&self, channel: &str, stdout: &str) {
        let Ok(channel) = ChannelName::parse(channel) else {
            return;
        };
        let mut body = stdout.trim().to_owned();
        if body.len() > OUTPUT_MAX_BYTES {
            let mut cut = OUTPUT_MAX_BYTES;
            while !body.is_char_boundary(cut) {
                cut -= 1;
            }
            body.truncate(cut);
        }
        let message = NewMessage {
            sender: self.s.me.clone(),
            body,
            ..NewMessage::default()
        };
        if let Err(f) = self.c.post(&channel, message).await {
            eprintln!("crosstalk wake: posting the turn's output failed: {}", f.0);
        }
    }

    /// Runs the command once: `{prompt}` in its arguments is the prompt, else the prompt is its
    /// stdin. Its stdout and stderr go to the log.
    async fn run_command(&self, prompt: &str, channels: &[String], attempt: u32) -> Ran {
        let in_args = self.s.command.iter().any(|a| a.contains("{prompt}"));
        let args: Vec<String> = self.s.command[1..]
            .iter()
            .map(|a| a.replace("{prompt}", prompt))
            .collect();
        let mut cmd = tokio::process::Command::new(&self.s.command[0]);
        cmd.args(&args)
            .env("CROSSTALK_URL", &self.c.base)
            .env("CROSSTALK_AS", &self.s.me)
            .env("CROSSTALK_CHANNELS", channels.join(","))
            .env("CROSSTALK_WAKE_ATTEMPT", attempt.to_string())
            .stdin(if in_args { Stdio::null() } else { Stdio::piped() })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        match &self.c.token {
            Some(t) => cmd.env("CROSSTALK_TOKEN", t),
            None => cmd.env_remove("CROSSTALK_TOKEN"),
        };
        #[cfg(unix)]
        cmd.process_group(0);
        // Killed with wake, even by SIGKILL, which gives it no time to stop its turn.
        #[cfg(target_os = "linux")]
        // SAFETY: prctl(2) in the child between fork and exec, touching nothing of the parent.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let mut child = match cmd.spawn() {
            Ok(c) => c,
            Err(e) => return Ran::Failed(format!("could not start {}: {e}", self.s.command[0])),
        };
        if !in_args {
            if let Some(mut stdin) = child.stdin.take() {
                let text = prompt.to_owned();
                tokio::spawn(async move {
                    let _ = stdin.write_all(text.as_bytes()).await;
                });
            }
        }
        let mut out = child.stdout.take();
        let mut err = child.stderr.take();
        // Each stream's last OUTPUT_KEPT bytes: a turn that writes without end costs no more.
        let collect = tokio::spawn(async move {
            let read_out = async {
                match out.as_mut() {
                    Some(s) => tail(s, OUTPUT_KEPT).await,
                    None => Vec::new(),
                }
            };
            let read_err = async {
                match err.as_mut() {
                    Some(s) => tail(s, OUTPUT_KEPT).await,
                    None => Vec::new(),
                }
            };
            tokio::join!(read_out, read_err)
        });
        let started = Instant::now();
        let mut stopping: Option<Instant> = None;
        let status = loop {
            let tick = tokio::time::sleep(Duration::from_millis(100));
            tokio::select! {
                status = child.wait() => break status.ok(),
                _ = tick => {}
            }
            if started.elapsed() > self.s.turn_timeout {
                kill(&mut child).await;
                let _ = child.wait().await;
                let (o, e) = collect.await.unwrap_or_default();
                self.write_log(attempt, &o, &e, "timed out");
                return Ran::Failed(format!("timed out after {} s", self.s.turn_timeout.as_secs()));
            }
            if self.stop.load(Ordering::SeqCst) {
                let since = *stopping.get_or_insert_with(|| {
                    eprintln!(
                        "crosstalk wake: stopping; the running turn has {} s to finish",
                        self.s.grace.as_secs_f64()
                    );
                    Instant::now()
                });
                if since.elapsed() > self.s.grace {
                    kill(&mut child).await;
                    let _ = child.wait().await;
                    let (o, e) = collect.await.unwrap_or_default();
                    self.write_log(attempt, &o, &e, "stopped");
                    return Ran::Stopped;
                }
            }
        };
        let (o, e) = collect.await.unwrap_or_default();
        let outcome = match status {
            Some(s) if s.success() => None,
            Some(s) => Some(match s.code() {
                Some(code) => format!("exit {code}"),
                None => "killed".to_owned(),
            }),
            None => Some("killed".to_owned()),
        };
        self.write_log(attempt, &o, &e, outcome.as_deref().unwrap_or("ok"));
        match outcome {
            None => Ran::Ok(String::from_utf8_lossy(&o).into_owned()),
            Some(why) => Ran::Failed(why),
        }
    }

    /// Appends a turn's output to the identity's log, keeping it under [`LOG_MAX_BYTES`].
    fn write_log(&self, attempt: u32, out: &[u8], err: &[u8], outcome: &str) {
        let mut entry = format!(
            "=== turn at {} (attempt {attempt}): {outcome}\n",
            Timestamp::now().to_rfc3339()
        )
        .into_bytes();
        entry.extend_from_slice(out);
        if !err.is_empty() {
            entry.extend_from_slice(b"--- stderr\n");
            entry.extend_from_slice(err);
        }
        entry.push(b'\n');
        append_log(&self.log, LOG_MAX_BYTES, &entry);
    }
}

/// Appends `entry` to the log at `path`; when that would take it past `max` bytes, the log
/// becomes `<path>.1` first (replacing the one before), so the two together stay under twice
/// `max` however many turns run.
fn append_log(path: &Path, max: u64, entry: &[u8]) {
    let len = std::fs::metadata(path).map_or(0, |m| m.len());
    if len > 0 && len + entry.len() as u64 > max {
        let _ = std::fs::rename(path, path.with_extension("log.1"));
    }
    if let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open(path) {
        let _ = f.write_all(entry);
    }
}

/// Reads `r` to its end, keeping only its last `keep` bytes (and saying how much was cut).
async fn tail(r: &mut (impl tokio::io::AsyncRead + Unpin), keep: usize) -> Vec<u8> {
    let mut kept = Vec::new();
    let mut cut = 0u64;
    let mut chunk = vec![0u8; 64 << 10];
    loop {
        match r.read(&mut chunk).await {
            Ok(0) | Err(_) => break,
            Ok(n) => kept.extend_from_slice(&chunk[..n]),
        }
        if kept.len() > 2 * keep {
            let over = kept.len() - keep;
            cut += over as u64;
            kept.drain(..over);
        }
    }
    if kept.len() > keep {
        let over = kept.len() - keep;
        cut += over as u64;
        kept.drain(..over);
    }
    if cut > 0 {
        let mut out = format!("[… {cut} earlier bytes not kept]\n").into_bytes();
        out.extend_from_slice(&kept);
        return out;
    }
    kept
}

/// Keeps `held`'s channels unhandled from their first held message on: the relay hands them
/// again once a person lifts the pause, whatever happens to this process meanwhile.
fn hold_back(scanned: &mut BTreeMap<String, u64>, held: &[Message]) {
    for m in held {
        let at = scanned.entry(m.channel.clone()).or_insert(m.id - 1);
        *at = (*at).min(m.id - 1);
    }
}

/// Stops a turn's command and everything it started (its process group).
async fn kill(child: &mut tokio::process::Child) {
    #[cfg(unix)]
    if let Some(pid) = child.id() {
        // SAFETY: signals the process group the child leads (it was started in its own).
        unsafe {
            libc::kill(-(pid as i32), libc::SIGKILL);
        }
    }
    let _ = child.start_kill();
}

/// The prompt of a turn: every new message, and how to answer.
fn prompt(me: &str, relay: &str, batch: &[Message]) -> String {
    let mut p = format!("You are {me} on the crosstalk relay at {relay}. New messages for you:\n\n");
    let mut last: BTreeMap<&str, u64> = BTreeMap::new();
    for m in batch {
        let to = m.recipient.as_deref().map(|r| format!(", to {r}")).unwrap_or_default();
        let reply = m.reply_to.map(|r| format!(", replying to #{r}")).unwrap_or_default();
        p.push_str(&format!(
            "[{} #{}] from {} ({}{to}{reply}):\n{}\n\n",
            m.channel, m.id, m.sender, m.kind, m.body
        ));
        let at = last.entry(m.channel.as_str()).or_default();
        *at = (*at).max(m.id);
    }
    let next: Vec<String> = last.iter().map(|(c, id)| format!("{c} after #{id}")).collect();
    p.push_str(&format!(
        "Answer as {me}: post with your crosstalk tools (post_message with sender {me}) or \
         `crosstalk send CHANNEL \"…\" --as {me}`, with reply_to set to the message you answer. \
         These are handled once this turn ends; read on from {}.\n",
        next.join(", ")
    ));
    p
}

/// Where turns log: `--log-dir`, else the local relay's folder, else the temporary directory.
fn log_path(s: &Settings) -> Result<PathBuf, Failure> {
    let dir = match &s.log_dir {
        Some(d) => d.clone(),
        None => crate::client::local_data_dir()
            .map(|d| d.join("wake"))
            .unwrap_or_else(|| std::env::temp_dir().join("crosstalk-wake")),
    };
    std::fs::create_dir_all(&dir).map_err(|e| Failure(format!("cannot create {}: {e}", dir.display()), 2))?;
    let safe: String =
        s.me.chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || "-_.".contains(c) {
                    c
                } else {
                    '_'
                }
            })
            .collect();
    Ok(dir.join(format!("{safe}.log")))
}

/// `program` as the OS would find it: a path, or a name on `PATH`.
fn which(program: &str) -> Option<PathBuf> {
    let p = Path::new(program);
    if p.components().count() > 1 {
        return p.is_file().then(|| p.to_path_buf());
    }
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|d| d.join(program))
        .find(|c| c.is_file())
}

fn watch_signals(stop: Arc<AtomicBool>) {
    tokio::spawn(async move {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            let (Ok(mut term), Ok(mut int)) = (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) else {
                return;
            };
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
        }
        #[cfg(not(unix))]
        let _ = tokio::signal::ctrl_c().await;
        stop.store(true, Ordering::SeqCst);
    });
}

/// Returns once asked to stop.
async fn stopped(stop: &AtomicBool) {
    while !stop.load(Ordering::SeqCst) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Sleeps `d`, or less if asked to stop; whether it was.
async fn sleep_unless_stopped(d: Duration, stop: &AtomicBool) -> bool {
    let end = Instant::now() + d;
    while Instant::now() < end {
        if stop.load(Ordering::SeqCst) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop.load(Ordering::SeqCst)
}

/// Waits until the relay answers, saying so once, as the bridge does.
async fn wait_for_relay(c: &RelayClient, stop: &AtomicBool) -> Result<(), Failure> {
    let mut said = false;
    loop {
        match c.health().await {
            Ok(_) => return Ok(()),
            Err(e) => {
                if !said {
                    eprintln!(
                        "crosstalk wake: {}; waiting for it (start it with crosstalk serve)",
                        c.unreachable(&e).0
                    );
                    said = true;
                }
            }
        }
        if sleep_unless_stopped(Duration::from_secs(1), stop).await {
            return Err(Failure("stopped before the relay answered".into(), 2));
        }
    }
}

/// Takes the identity's lease, waiting while another wake process holds it (saying which):
/// the identity's state as it took it, or `None` if asked to stop meanwhile.
async fn take_lease(c: &RelayClient, me: &str, holder: &str, stop: &AtomicBool) -> Result<Option<WakeView>, Failure> {
    let request = LeaseRequest {
        identity: me.to_owned(),
        holder: holder.to_owned(),
        host: host(),
        pid: std::process::id(),
        ttl_s: LEASE_S,
    };
    let mut said = false;
    loop {
        match c.try_call(api::WAKE_LEASE, &request).await {
            Ok(view) => return Ok(Some(view)),
            Err(e) if e.is_conflict() => {
                if !said {
                    eprintln!("crosstalk wake: {e}; waiting until it stops");
                    said = true;
                }
            }
            Err(e) => return Err(e.failure),
        }
        if sleep_unless_stopped(Duration::from_secs(1), stop).await {
            return Ok(None);
        }
    }
}

/// Renews the lease every third of its time; marks it lost if another holder took it.
async fn renew(c: RelayClient, me: String, holder: String, lost: Arc<AtomicBool>) {
    let request = LeaseRequest {
        identity: me,
        holder,
        host: host(),
        pid: std::process::id(),
        ttl_s: LEASE_S,
    };
    loop {
        tokio::time::sleep(Duration::from_secs(LEASE_S / 3)).await;
        if let Err(e) = c.try_call(api::WAKE_LEASE, &request).await {
            if e.is_conflict() {
                eprintln!("crosstalk wake: {e}");
                lost.store(true, Ordering::SeqCst);
                return;
            }
        }
    }
}

fn host() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".into())
}

impl From<Span> for Duration {
    fn from(s: Span) -> Duration {
        s.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_log_stays_under_twice_its_limit_however_many_turns_run() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("reviewer.log");
        let entry = vec![b'x'; 300];
        for _ in 0..100 {
            append_log(&log, 1000, &entry);
        }
        let now = std::fs::metadata(&log).unwrap().len();
        let before = std::fs::metadata(log.with_extension("log.1")).unwrap().len();
        assert!(now <= 1000 && before <= 1000, "{now} and {before}");
        assert_eq!((now + before) % 300, 0, "no entry is split");
        assert!(now > 0 && before > 0);
        // One turn larger than the limit is still written whole, alone.
        append_log(&log, 1000, &vec![b'y'; 2500]);
        assert_eq!(std::fs::metadata(&log).unwrap().len(), 2500);
    }

    #[tokio::test]
    async fn a_turns_output_keeps_its_last_bytes_only() {
        let big: Vec<u8> = (0..5_000_000u32).map(|i| (i % 251) as u8).collect();
        let kept = tail(&mut big.as_slice(), 1 << 20).await;
        let note = b"[\xe2\x80\xa6 3951424 earlier bytes not kept]\n";
        assert!(kept.starts_with(note), "{:?}", String::from_utf8_lossy(&kept[..60]));
        assert_eq!(&kept[note.len()..], &big[big.len() - (1 << 20)..]);
        let small = b"short".to_vec();
        assert_eq!(tail(&mut small.as_slice(), 1 << 20).await, small);
    }
}
