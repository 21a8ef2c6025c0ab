//! CPU time from /proc (Linux): each process's user + system time, and how much of the box's
//! cores sat idle, between two samples. The cluster workload uses it to say what a post costs
//! each process on the shared two cores (the NATS servers, each relay node, the load generator),
//! which is what bounds the cluster's rate on one box (docs/scaling.md).

use std::time::Instant;

/// CPU seconds `pid` has used so far (user + system), or `None` when /proc cannot tell.
pub fn process_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (user, system) = stat_times(&stat)?;
    Some((user + system) as f64 / ticks_per_second())
}

/// `(utime, stime)` in clock ticks from a `/proc/PID/stat` line. The command name (field 2)
/// is in parentheses and may hold spaces and parentheses of its own, so the fields are counted
/// from the last `)`: state is field 3, utime 14, stime 15.
fn stat_times(stat: &str) -> Option<(u64, u64)> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace().skip(11);
    Some((fields.next()?.parse().ok()?, fields.next()?.parse().ok()?))
}

fn ticks_per_second() -> f64 {
    // SAFETY: sysconf has no preconditions.
    match unsafe { libc::sysconf(libc::_SC_CLK_TCK) } {
        t if t > 0 => t as f64,
        _ => 100.0,
    }
}

/// `(idle, total)` jiffies of all cores from `/proc/stat`'s first line; idle counts iowait too
/// (a core waiting on a disk could have run anything else that was ready).
fn box_ticks() -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    cpu_line_ticks(stat.lines().next()?)
}

fn cpu_line_ticks(line: &str) -> Option<(u64, u64)> {
    let mut fields = line.split_whitespace();
    if fields.next()? != "cpu" {
        return None;
    }
    // user nice system idle iowait irq softirq steal (guest time is inside user already).
    let v: Vec<u64> = fields.take(8).map(|f| f.parse().ok()).collect::<Option<_>>()?;
    if v.len() < 5 {
        return None;
    }
    Some((v[3] + v[4], v.iter().sum()))
}

/// The processes to watch, in named groups (a group's processes are added up).
pub struct Watch {
    groups: Vec<(String, Vec<u32>)>,
}

/// A reading of every watched process and of the box.
pub struct Sample {
    at: Instant,
    groups: Vec<Option<f64>>,
    cores: Option<(u64, u64)>,
}

/// What each group used between two samples, in cores (CPU seconds per second), and the share
/// of the box's cores that sat idle.
pub struct Usage {
    pub groups: Vec<(String, f64)>,
    /// Seconds between the two samples.
    pub wall: f64,
    pub idle_share: Option<f64>,
}

impl Watch {
    pub fn new() -> Watch {
        Watch { groups: Vec::new() }
    }

    /// Adds a group; one with no processes reads as unreadable, so no usage is figured from it.
    pub fn group(mut self, name: &str, pids: Vec<u32>) -> Watch {
        self.groups.push((name.to_owned(), pids));
        self
    }

    pub fn sample(&self) -> Sample {
        Sample {
            at: Instant::now(),
            groups: self
                .groups
                .iter()
                .map(|(_, pids)| match pids.is_empty() {
                    true => None,
                    false => pids.iter().map(|&p| process_seconds(p)).sum::<Option<f64>>(),
                })
                .collect(),
            cores: box_ticks(),
        }
    }

    /// Between `before` and `after`; `None` when a process could not be read at either end
    /// (one exited, or no /proc).
    pub fn usage(&self, before: &Sample, after: &Sample) -> Option<Usage> {
        let wall = after.at.duration_since(before.at).as_secs_f64();
        if wall <= 0.0 {
            return None;
        }
        let mut groups = Vec::new();
        for (k, (name, _)) in self.groups.iter().enumerate() {
            let used = after.groups[k]? - before.groups[k]?;
            groups.push((name.clone(), used.max(0.0) / wall));
        }
        let idle_share = match (before.cores, after.cores) {
            (Some((i0, t0)), Some((i1, t1))) if t1 > t0 => Some(i1.saturating_sub(i0) as f64 / (t1 - t0) as f64),
            _ => None,
        };
        Some(Usage {
            groups,
            wall,
            idle_share,
        })
    }
}

impl Usage {
    /// Cores the named group used.
    pub fn cores(&self, name: &str) -> Option<f64> {
        self.groups.iter().find(|(n, _)| n == name).map(|(_, c)| *c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_a_stat_line_whose_command_holds_spaces_and_parentheses() {
        let line = "4242 (actix-rt|system (2) x) S 1 4242 4242 0 -1 4194560 500 0 0 0 1234 567 0 0 20 0 9 0 100 0 0";
        assert_eq!(stat_times(line), Some((1234, 567)));
        assert_eq!(stat_times("4242 (short"), None);
        assert_eq!(stat_times("4242 (x) S 1 2"), None);
    }

    #[test]
    fn reads_the_cores_line_counting_iowait_as_idle() {
        assert_eq!(cpu_line_ticks("cpu  100 5 50 800 40 1 2 2 0 0"), Some((840, 1000)));
        assert_eq!(cpu_line_ticks("cpu0 100 5 50 800 40 1 2 2 0 0"), None);
        assert_eq!(cpu_line_ticks("cpu  1 2"), None);
    }

    #[test]
    fn this_process_uses_cpu_between_two_samples() {
        let watch = Watch::new().group("me", vec![std::process::id()]);
        let before = watch.sample();
        // Spin until the kernel's count of this process's CPU time moves (it counts in clock
        // ticks), within a bound no loaded box reaches: fields read wrongly never move.
        let deadline = Instant::now() + std::time::Duration::from_secs(20);
        let mut x = 0u64;
        let usage = loop {
            for _ in 0..100_000 {
                x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
            }
            let usage = watch.usage(&before, &watch.sample()).expect("/proc readable");
            // At least 200 ms, so a tick more or less at either end is a small error.
            let long_enough = before.at.elapsed().as_millis() >= 200;
            if (long_enough && usage.cores("me").unwrap() > 0.0) || Instant::now() > deadline {
                break usage;
            }
        };
        std::hint::black_box(x);
        let me = usage.cores("me").unwrap();
        assert!(me > 0.0, "no CPU time counted in 20 s of spinning");
        // Not more than the machine's cores: rules out ticks read as seconds.
        assert!(
            me <= std::thread::available_parallelism().map_or(64, |n| n.get()) as f64 + 0.5,
            "{me}"
        );
        assert!(usage.idle_share.is_some_and(|s| (0.0..=1.0).contains(&s)));
        for gone in [vec![u32::MAX], vec![]] {
            let gone = Watch::new().group("gone", gone);
            assert!(gone.usage(&gone.sample(), &gone.sample()).is_none());
        }
    }
}
