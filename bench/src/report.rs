//! The comparison table (stdout and BENCHMARKS.md), the targets each figure is judged
//! against, the machine description, and results.json for the chart.

use crate::workload::Record;
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt::Write as _;

#[derive(Debug, Clone, Copy)]
enum Goal {
    AtLeast(f64),
    AtMost(f64),
    /// At most `factor` × the figure under another key, plus `slack` (noise on a shared box).
    Within(&'static str, f64, f64),
}

/// One line of the table.
struct Row {
    key: &'static str,
    label: &'static str,
    unit: &'static str,
    higher_is_better: bool,
    goal: Option<Goal>,
    /// crosstalk must also beat crosstalk-mcp by this factor.
    min_advantage: Option<f64>,
    target_text: &'static str,
}

/// A figure recorded with no target and no peer to compare, lower being better (a cost).
const fn recorded_cost(key: &'static str, label: &'static str, unit: &'static str) -> Row {
    Row {
        key,
        label,
        unit,
        higher_is_better: false,
        goal: None,
        min_advantage: None,
        target_text: "recorded",
    }
}

const ROWS: &[Row] = &[
    Row {
        key: "post_per_s",
        label: "1. durable POST, {c} connections",
        unit: "/s",
        higher_is_better: true,
        goal: None,
        min_advantage: None,
        target_text: "recorded (latency-bound)",
    },
    Row {
        key: "post_p99_ms",
        label: "   POST latency p99",
        unit: "ms",
        higher_is_better: false,
        goal: Some(Goal::AtMost(3.0)),
        min_advantage: None,
        target_text: "≤ 3 ms",
    },
    Row {
        key: "post_cap_per_s",
        label: "1b. durable POST sustained (p99 ≤ 3 ms)",
        unit: "/s",
        higher_is_better: true,
        goal: Some(Goal::AtLeast(25_000.0)),
        min_advantage: Some(50.0),
        target_text: "≥ 25,000/s and ≥ 50×",
    },
    Row {
        key: "post_cap_conns",
        label: "    from connections",
        unit: "",
        higher_is_better: true,
        goal: None,
        min_advantage: None,
        target_text: "",
    },
    Row {
        key: "post_cap_p99_ms",
        label: "    its POST latency p99",
        unit: "ms",
        higher_is_better: false,
        goal: Some(Goal::AtMost(crate::workload::post::SUSTAINED_P99_MS)),
        min_advantage: None,
        target_text: "≤ 3 ms",
    },
    Row {
        key: "post_spread_per_s",
        label: "1c. durable POST, {most} c. over sixteen channels",
        unit: "/s",
        higher_is_better: true,
        goal: None,
        min_advantage: None,
        target_text: "recorded",
    },
    Row {
        key: "post_spread_p99_ms",
        label: "    its POST latency p99",
        unit: "ms",
        higher_is_better: false,
        goal: None,
        min_advantage: None,
        target_text: "",
    },
    Row {
        key: "tail_per_s",
        label: "2. tail reads (10 newest), {c} conns",
        unit: "/s",
        higher_is_better: true,
        goal: Some(Goal::AtLeast(40_000.0)),
        min_advantage: Some(30.0),
        target_text: "≥ 40,000/s and ≥ 30×",
    },
    Row {
        key: "wake_p50_ms",
        label: "3. wake latency p50",
        unit: "ms",
        higher_is_better: false,
        goal: None,
        min_advantage: None,
        target_text: "",
    },
    Row {
        key: "wake_p99_ms",
        label: "3. wake latency p99",
        unit: "ms",
        higher_is_better: false,
        goal: Some(Goal::AtMost(5.0)),
        min_advantage: None,
        target_text: "≤ 5 ms",
    },
    Row {
        key: "fanout_p50_ms",
        label: "4. fan-out to SSE subscribers p50",
        unit: "ms",
        higher_is_better: false,
        goal: None,
        min_advantage: None,
        target_text: "",
    },
    Row {
        key: "fanout_p99_ms",
        label: "4. fan-out to SSE subscribers p99",
        unit: "ms",
        higher_is_better: false,
        goal: Some(Goal::AtMost(50.0)),
        min_advantage: None,
        target_text: "≤ 50 ms",
    },
    Row {
        key: "idle_kb_per_sub",
        label: "5. RSS per idle SSE subscriber",
        unit: "KB",
        higher_is_better: false,
        goal: Some(Goal::AtMost(20.0)),
        min_advantage: None,
        target_text: "≤ 20 KB",
    },
    Row {
        key: "mcp_post_per_s",
        label: "6. MCP tools/call post_message",
        unit: "/s",
        higher_is_better: true,
        goal: Some(Goal::AtLeast(5_000.0)),
        min_advantage: None,
        target_text: "≥ 5,000/s",
    },
    Row {
        key: "mcp_wake_p50_ms",
        label: "6. MCP wake latency p50",
        unit: "ms",
        higher_is_better: false,
        goal: None,
        min_advantage: None,
        target_text: "",
    },
    Row {
        key: "mcp_wake_p99_ms",
        label: "6. MCP wake latency p99",
        unit: "ms",
        higher_is_better: false,
        goal: Some(Goal::AtMost(5.0)),
        min_advantage: None,
        target_text: "≤ 5 ms",
    },
    Row {
        key: "startup_s",
        label: "7. start-up with stored messages",
        unit: "s",
        higher_is_better: false,
        goal: Some(Goal::AtMost(2.0)),
        min_advantage: None,
        target_text: "≤ 2 s",
    },
    Row {
        key: "disk_bytes_per_msg",
        label: "8. bytes on disk per message",
        unit: "B",
        higher_is_better: false,
        goal: None,
        min_advantage: None,
        target_text: "",
    },
    Row {
        key: "disk_vs_payload",
        label: "8. disk ÷ posted JSON",
        unit: "×",
        higher_is_better: false,
        goal: Some(Goal::AtMost(3.0)),
        min_advantage: None,
        target_text: "≤ 3×",
    },
    Row {
        key: "fsync_post_per_s",
        label: "9. POST with --durability fsync",
        unit: "/s",
        higher_is_better: true,
        goal: None,
        min_advantage: None,
        target_text: "recorded",
    },
    Row {
        key: "fsync_post_p99_ms",
        label: "   fsync POST latency p99",
        unit: "ms",
        higher_is_better: false,
        goal: None,
        min_advantage: None,
        target_text: "",
    },
    Row {
        key: "channels_peak_rss_mb",
        label: "10. {touch} channels touched: peak RSS",
        unit: "MiB",
        higher_is_better: false,
        goal: Some(Goal::AtMost(300.0)),
        min_advantage: None,
        target_text: "≤ 300 MiB",
    },
    Row {
        key: "channels_idle_rss_mb",
        label: "10. RSS once they are idle",
        unit: "MiB",
        higher_is_better: false,
        goal: Some(Goal::AtMost(100.0)),
        min_advantage: None,
        target_text: "< 100 MiB",
    },
    Row {
        key: "channels_fresh_rss_mb",
        label: "10. a fresh relay on that store",
        unit: "MiB",
        higher_is_better: false,
        goal: None,
        min_advantage: None,
        target_text: "",
    },
    Row {
        key: "channels_live_p99_base_ms",
        label: "10. live channel POST p99, before",
        unit: "ms",
        higher_is_better: false,
        goal: None,
        min_advantage: None,
        target_text: "",
    },
    Row {
        key: "channels_live_p99_touch_ms",
        label: "10. … while {c} conns touch channels",
        unit: "ms",
        higher_is_better: false,
        goal: None,
        min_advantage: None,
        target_text: "",
    },
    Row {
        key: "channels_live_p99_closing_ms",
        label: "10. … while the idle ones close",
        unit: "ms",
        higher_is_better: false,
        goal: Some(Goal::Within("channels_live_p99_base_ms", 2.0, 1.0)),
        min_advantage: None,
        target_text: "≤ 2× before (+1 ms)",
    },
    Row {
        key: "waiters_p99_ms",
        label: "11. {waiters} waiters woken: p99",
        unit: "ms",
        higher_is_better: false,
        goal: Some(Goal::AtMost(100.0)),
        min_advantage: None,
        target_text: "≤ 100 ms",
    },
    Row {
        key: "waiters_rss_mb",
        label: "11. RSS of the {waiters} waiters",
        unit: "MiB",
        higher_is_better: false,
        goal: Some(Goal::AtMost(200.0)),
        min_advantage: None,
        target_text: "≤ 200 MiB",
    },
    Row {
        key: "stdio_push_p50_ms",
        label: "12. stdio push: post → host p50",
        unit: "ms",
        higher_is_better: false,
        goal: None,
        min_advantage: None,
        target_text: "",
    },
    Row {
        key: "stdio_push_p99_ms",
        label: "12. stdio push: post → host p99",
        unit: "ms",
        higher_is_better: false,
        goal: Some(Goal::AtMost(10.0)),
        min_advantage: None,
        target_text: "≤ 10 ms",
    },
    Row {
        key: "stdio_fleet_p99_ms",
        label: "12. 100 stdio children: p99",
        unit: "ms",
        higher_is_better: false,
        goal: Some(Goal::AtMost(50.0)),
        min_advantage: None,
        target_text: "≤ 50 ms",
    },
    Row {
        key: "cluster_wake_p99_ms",
        label: "13. 2 nodes on NATS: A → B long-poll p99",
        unit: "ms",
        higher_is_better: false,
        goal: Some(Goal::AtMost(10.0)),
        min_advantage: None,
        target_text: "≤ 10 ms",
    },
    Row {
        key: "cluster_sse_p99_ms",
        label: "13. … A → B SSE p99",
        unit: "ms",
        higher_is_better: false,
        goal: Some(Goal::AtMost(10.0)),
        min_advantage: None,
        target_text: "≤ 10 ms",
    },
    Row {
        key: "cluster_post_per_s",
        label: "13. durable POST over both nodes, {c} c.",
        unit: "/s",
        higher_is_better: true,
        goal: None,
        min_advantage: None,
        target_text: "recorded (latency-bound)",
    },
    Row {
        key: "cluster_post_p99_ms",
        label: "    cluster POST latency p99",
        unit: "ms",
        higher_is_better: false,
        goal: None,
        min_advantage: None,
        target_text: "",
    },
    Row {
        key: "cluster_events_per_message",
        label: "    one log message carries (node A)",
        unit: "events",
        higher_is_better: true,
        goal: None,
        min_advantage: None,
        target_text: "recorded",
    },
    Row {
        key: "cluster_cap_per_s",
        label: "13. … sustained (p99 ≤ 10 ms)",
        unit: "/s",
        higher_is_better: true,
        goal: Some(Goal::AtLeast(10_000.0)),
        min_advantage: None,
        target_text: "≥ 10,000/s",
    },
    Row {
        key: "cluster_cap_conns",
        label: "    from connections",
        unit: "",
        higher_is_better: true,
        goal: None,
        min_advantage: None,
        target_text: "",
    },
    Row {
        key: "cluster_cap_p99_ms",
        label: "    its POST latency p99",
        unit: "ms",
        higher_is_better: false,
        goal: Some(Goal::AtMost(crate::workload::cluster::SUSTAINED_P99_MS)),
        min_advantage: None,
        target_text: "≤ 10 ms",
    },
    Row {
        key: "cluster_cap_share_pct",
        label: "    as a share of the bare publisher",
        unit: "%",
        higher_is_better: true,
        goal: Some(Goal::AtLeast(50.0)),
        min_advantage: None,
        target_text: "≥ ½ the bare publisher",
    },
    recorded_cost(
        "cluster_cpu_servers_us",
        "13. CPU a post, two nodes, {most} c.: NATS",
        "µs",
    ),
    recorded_cost("cluster_cpu_nodes_us", "    … the two relay nodes together", "µs"),
    recorded_cost(
        "cluster_cpu_server_ms_per_message",
        "    … the NATS servers, a log message",
        "ms",
    ),
    recorded_cost("cluster_cpu_idle_pct", "    … the box's cores idle meanwhile", "%"),
    Row {
        key: "cluster1_post_per_s",
        label: "13. … on node A alone, the others stopped",
        unit: "/s",
        higher_is_better: true,
        goal: None,
        min_advantage: None,
        target_text: "recorded",
    },
    recorded_cost("cluster1_cpu_servers_us", "    CPU a post there: NATS servers", "µs"),
    recorded_cost("cluster1_cpu_nodes_us", "    CPU a post there: node A", "µs"),
    Row {
        key: "cluster3_post_per_s",
        label: "13. … over three relay nodes",
        unit: "/s",
        higher_is_better: true,
        goal: None,
        min_advantage: None,
        target_text: "recorded",
    },
    Row {
        key: "cluster5_post_per_s",
        label: "13. … over five relay nodes",
        unit: "/s",
        higher_is_better: true,
        goal: None,
        min_advantage: None,
        target_text: "recorded",
    },
    Row {
        key: "cluster_own1_post_per_s",
        label: "13. own channels: one node, {c} c.",
        unit: "/s",
        higher_is_better: true,
        goal: None,
        min_advantage: None,
        target_text: "recorded",
    },
    recorded_cost("cluster_own1_cpu_nodes_us", "    CPU a post there: the node", "µs"),
    Row {
        key: "cluster_own2_post_per_s",
        label: "13. … two nodes, {c} c. each",
        unit: "/s",
        higher_is_better: true,
        goal: None,
        min_advantage: None,
        target_text: "recorded",
    },
    recorded_cost("cluster_own2_cpu_nodes_us", "    CPU a post there: the nodes", "µs"),
    Row {
        key: "cluster_own3_post_per_s",
        label: "13. … three nodes, {c} c. each",
        unit: "/s",
        higher_is_better: true,
        goal: None,
        min_advantage: None,
        target_text: "recorded",
    },
    recorded_cost("cluster_own3_cpu_nodes_us", "    CPU a post there: the nodes", "µs"),
    Row {
        key: "cluster_bare_per_s",
        label: "13. bare JetStream publisher, same cluster",
        unit: "/s",
        higher_is_better: true,
        goal: None,
        min_advantage: None,
        target_text: "recorded (the reference)",
    },
    Row {
        key: "cluster_bare_p99_ms",
        label: "    bare publish → ack p99",
        unit: "ms",
        higher_is_better: false,
        goal: None,
        min_advantage: None,
        target_text: "",
    },
    recorded_cost(
        "cluster_bare_1ev_cpu_us",
        "    servers' CPU a post, 64 in flight, one a message",
        "µs",
    ),
    recorded_cost(
        "cluster_bare_16ev_cpu_us",
        "    … the same 64 posts, 16 a message",
        "µs",
    ),
    Row {
        key: "search_p50_ms",
        label: "14. search, {search} messages: query p50",
        unit: "ms",
        higher_is_better: false,
        goal: None,
        min_advantage: None,
        target_text: "",
    },
    Row {
        key: "search_p95_ms",
        label: "14. … query p95 (six kinds)",
        unit: "ms",
        higher_is_better: false,
        goal: Some(Goal::AtMost(5.0)),
        min_advantage: None,
        target_text: "≤ 5 ms",
    },
    Row {
        key: "search_index_per_s",
        label: "14. … indexing",
        unit: "/s",
        higher_is_better: true,
        goal: None,
        min_advantage: None,
        target_text: "recorded",
    },
    Row {
        key: "search_index_mib",
        label: "14. … index on disk",
        unit: "MiB",
        higher_is_better: false,
        goal: None,
        min_advantage: None,
        target_text: "recorded",
    },
    Row {
        key: "search_rss_mib",
        label: "14. … relay RSS after the queries",
        unit: "MiB",
        higher_is_better: false,
        goal: None,
        min_advantage: None,
        target_text: "recorded",
    },
    Row {
        key: "turn_start_p50_ms",
        label: "15. crosstalk wake: post → turn start p50",
        unit: "ms",
        higher_is_better: false,
        goal: None,
        min_advantage: None,
        target_text: "recorded",
    },
    Row {
        key: "turn_start_p99_ms",
        label: "15. crosstalk wake: post → turn start p99",
        unit: "ms",
        higher_is_better: false,
        goal: Some(Goal::AtMost(1000.0)),
        min_advantage: None,
        target_text: "≤ 1 s",
    },
    Row {
        key: "reference_crosstalk_16c_per_s",
        label: "16. durable POST beside the physical reference, 16-conn load: crosstalk",
        unit: "/s",
        higher_is_better: true,
        goal: None,
        min_advantage: None,
        target_text: "recorded",
    },
    Row {
        key: "reference_durable_16c_per_s",
        label: "    minimal durable server, same stack",
        unit: "/s",
        higher_is_better: true,
        goal: None,
        min_advantage: None,
        target_text: "recorded",
    },
    Row {
        key: "reference_http_16c_per_s",
        label: "    the same, HTTP alone (no store)",
        unit: "/s",
        higher_is_better: true,
        goal: None,
        min_advantage: None,
        target_text: "recorded",
    },
    Row {
        key: "reference_ratio_16c",
        label: "    crosstalk ÷ minimal durable",
        unit: "×",
        higher_is_better: true,
        goal: Some(Goal::AtLeast(0.9)),
        min_advantage: None,
        target_text: "≥ 0.9",
    },
    Row {
        key: "reference_crosstalk_64c_per_s",
        label: "16. durable POST beside the physical reference, 64-conn load: crosstalk",
        unit: "/s",
        higher_is_better: true,
        goal: None,
        min_advantage: None,
        target_text: "recorded",
    },
    Row {
        key: "reference_durable_64c_per_s",
        label: "    minimal durable server, same stack",
        unit: "/s",
        higher_is_better: true,
        goal: None,
        min_advantage: None,
        target_text: "recorded",
    },
    Row {
        key: "reference_http_64c_per_s",
        label: "    the same, HTTP alone (no store)",
        unit: "/s",
        higher_is_better: true,
        goal: None,
        min_advantage: None,
        target_text: "recorded",
    },
    Row {
        key: "reference_ratio_64c",
        label: "    crosstalk ÷ minimal durable",
        unit: "×",
        higher_is_better: true,
        goal: Some(Goal::AtLeast(0.9)),
        min_advantage: None,
        target_text: "≥ 0.9",
    },
    Row {
        key: "reference_crosstalk_index_catch_up_s",
        label: "    crosstalk's search index catching up after its side",
        unit: "s",
        higher_is_better: false,
        goal: None,
        min_advantage: None,
        target_text: "recorded",
    },
];

/// A figure for humans: thousands separated, sensible decimals.
pub fn num(v: f64) -> String {
    if !v.is_finite() {
        return "-".into();
    }
    let a = v.abs();
    if a >= 1000.0 {
        let s = format!("{:.0}", v);
        let (sign, digits) = s.split_at(if v < 0.0 { 1 } else { 0 });
        let mut out = String::new();
        for (i, ch) in digits.chars().enumerate() {
            if i > 0 && (digits.len() - i) % 3 == 0 {
                out.push(',');
            }
            out.push(ch);
        }
        format!("{sign}{out}")
    } else if a >= 100.0 {
        format!("{v:.0}")
    } else if a >= 10.0 {
        format!("{v:.1}")
    } else if a >= 1.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.3}")
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Line {
    pub key: String,
    pub label: String,
    pub unit: String,
    pub higher_is_better: bool,
    pub crosstalk: Option<f64>,
    pub peer: Option<f64>,
    /// How many times better crosstalk is (>1 = better), whichever way "better" points.
    pub advantage: Option<f64>,
    pub target: String,
    pub goal: Option<f64>,
    pub verdict: String,
}

/// A row's label with the plan's counts in place of its `{c}` (connections), `{most}` (the
/// sweep's largest connection count), `{touch}`, `{waiters}` and `{search}`: a run with other
/// counts (`--connections 64`, `--smoke`) must not be labelled with the defaults'.
fn label(text: &str, p: &crate::workload::Plan) -> String {
    let touch = match p.touch_channels {
        n if n >= 1000 && n % 1000 == 0 => format!("{}k", n / 1000),
        n => n.to_string(),
    };
    text.replace("{c}", &p.connections.to_string())
        .replace("{most}", &p.most_connections().to_string())
        .replace("{touch}", &touch)
        .replace("{waiters}", &num((p.waiter_channels * p.waiters_per_channel) as f64))
        .replace("{search}", &num(p.search_messages as f64))
}

pub fn lines(ours: &Record, peer: Option<&Record>, plan: &crate::workload::Plan) -> Vec<Line> {
    let judge = !plan.smoke;
    ROWS.iter()
        .map(|row| {
            let o = ours.values.get(row.key).copied();
            let p = peer.and_then(|r| r.values.get(row.key).copied());
            let advantage = match (o, p) {
                (Some(o), Some(p)) if o > 0.0 && p > 0.0 => Some(if row.higher_is_better { o / p } else { p / o }),
                _ => None,
            };
            let verdict = match (row.goal, o) {
                (None, _) => String::new(),
                (Some(_), None) => "not measured".into(),
                (Some(_), Some(_)) if !judge => "(smoke: not judged)".into(),
                (Some(goal), Some(v)) => {
                    let mut misses = Vec::new();
                    match goal {
                        Goal::AtLeast(t) if v < t => misses.push(format!("{:.0}% short", (1.0 - v / t) * 100.0)),
                        Goal::AtMost(t) if v > t && v < t * 1.5 => {
                            misses.push(format!("{:.0}% over", (v / t - 1.0) * 100.0))
                        }
                        Goal::AtMost(t) if v > t => misses.push(format!("{:.1}× over", v / t)),
                        Goal::Within(other, factor, slack) => match ours.values.get(other) {
                            Some(base) if v > base * factor + slack => {
                                misses.push(format!("{:.1}× the baseline", v / base))
                            }
                            Some(_) => {}
                            None => misses.push("no baseline".into()),
                        },
                        _ => {}
                    }
                    if let Some(min) = row.min_advantage {
                        match advantage {
                            Some(a) if a < min => misses.push(format!("only {a:.0}× crosstalk-mcp")),
                            Some(_) => {}
                            None => misses.push("no crosstalk-mcp figure to compare".into()),
                        }
                    }
                    if misses.is_empty() {
                        "met".into()
                    } else {
                        format!("MISSED ({})", misses.join("; "))
                    }
                }
            };
            Line {
                key: row.key.into(),
                label: label(row.label, plan),
                unit: row.unit.into(),
                higher_is_better: row.higher_is_better,
                crosstalk: o,
                peer: p,
                advantage,
                target: row.target_text.into(),
                goal: row.goal.and_then(|g| match g {
                    Goal::AtLeast(t) | Goal::AtMost(t) => Some(t),
                    Goal::Within(..) => None,
                }),
                verdict,
            }
        })
        .collect()
}

/// `32, 48 and 64`.
fn counted(counts: impl Iterator<Item = usize>) -> String {
    let mut all: Vec<String> = counts.map(|n| n.to_string()).collect();
    match all.pop() {
        Some(last) if !all.is_empty() => format!("{} and {last}", all.join(", ")),
        last => last.unwrap_or_default(),
    }
}

fn cell(v: Option<f64>, unit: &str) -> String {
    match v {
        // A count (connections): as it is.
        Some(v) if unit.is_empty() => format!("{v:.0}"),
        Some(v) => format!("{} {unit}", num(v)),
        None => "-".into(),
    }
}

/// A markdown table (also readable as plain text on a terminal).
pub fn table(lines: &[Line]) -> String {
    let mut rows = vec![[
        "workload".to_string(),
        "crosstalk".into(),
        "crosstalk-mcp".into(),
        "crosstalk advantage".into(),
        "target".into(),
        "verdict".into(),
    ]];
    for l in lines {
        rows.push([
            l.label.clone(),
            cell(l.crosstalk, &l.unit),
            cell(l.peer, &l.unit),
            l.advantage
                .map(|a| format!("{}×", num(a)))
                .unwrap_or_else(|| "-".into()),
            l.target.clone(),
            l.verdict.clone(),
        ]);
    }
    let widths: Vec<usize> = (0..6)
        .map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for (i, r) in rows.iter().enumerate() {
        out.push('|');
        for (c, text) in r.iter().enumerate() {
            let pad = widths[c] - text.chars().count();
            if c == 0 || c >= 4 {
                let _ = write!(out, " {text}{} |", " ".repeat(pad));
            } else {
                let _ = write!(out, " {}{text} |", " ".repeat(pad));
            }
        }
        out.push('\n');
        if i == 0 {
            out.push('|');
            for (c, w) in widths.iter().enumerate() {
                let dashes = "-".repeat(*w);
                if c == 0 || c >= 4 {
                    let _ = write!(out, ":{dashes}-|");
                } else {
                    let _ = write!(out, "-{dashes}:|");
                }
            }
            out.push('\n');
        }
    }
    out
}

/// What the figures were measured on.
#[derive(Debug, Clone, Serialize)]
pub struct Machine {
    pub nproc: usize,
    pub memory_gib: f64,
    pub cpu_model: String,
    pub kernel: String,
    pub loadavg_before: String,
    pub loadavg_after: String,
    /// Median time of one 4 KiB write + fdatasync in the output directory: the floor under
    /// every durable acknowledgement, whoever makes it.
    pub fsync_p50_ms: f64,
    pub fsync_p99_ms: f64,
}

/// Writes and syncs 4 KiB `FSYNC_ROUNDS` times in `dir`; returns (p50, p99) in ms.
fn fsync_latency(dir: &std::path::Path) -> (f64, f64) {
    use std::io::Write;
    const FSYNC_ROUNDS: usize = 200;
    let path = dir.join("fsync-probe");
    let Ok(mut f) = std::fs::File::create(&path) else {
        return (f64::NAN, f64::NAN);
    };
    let block = [0x5au8; 4096];
    let mut samples = Vec::with_capacity(FSYNC_ROUNDS);
    for _ in 0..FSYNC_ROUNDS {
        let t = std::time::Instant::now();
        if f.write_all(&block).and_then(|_| f.sync_data()).is_err() {
            break;
        }
        samples.push(t.elapsed());
    }
    let _ = std::fs::remove_file(&path);
    let s = crate::stats::summarize(&samples);
    (s.p50_ms, s.p99_ms)
}

pub fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

impl Machine {
    pub fn probe(dir: &std::path::Path) -> Machine {
        let (fsync_p50_ms, fsync_p99_ms) = fsync_latency(dir);
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        let mem_kib: f64 = meminfo
            .lines()
            .find_map(|l| l.strip_prefix("MemTotal:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(f64::NAN);
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu_model = cpuinfo
            .lines()
            .find_map(|l| l.strip_prefix("model name"))
            .map(|v| v.trim_start_matches([' ', '\t', ':']).trim().to_owned())
            .unwrap_or_else(|| "unknown".into());
        Machine {
            nproc: std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
            memory_gib: mem_kib / 1048576.0,
            cpu_model,
            kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
                .unwrap_or_default()
                .trim()
                .to_owned(),
            loadavg_before: loadavg(),
            loadavg_after: String::new(),
            fsync_p50_ms,
            fsync_p99_ms,
        }
    }
}

#[derive(Debug, Serialize)]
pub struct Results {
    pub date_utc: String,
    pub command: String,
    pub commit: String,
    pub smoke: bool,
    pub machine: Machine,
    pub lines: Vec<Line>,
    pub systems: BTreeMap<String, Record>,
}

pub fn markdown(r: &Results, p: &crate::workload::Plan) -> String {
    let m = &r.machine;
    let mut s = String::new();
    let _ = writeln!(s, "# Benchmarks: crosstalk vs crosstalk-mcp 2.0.0\n");
    let _ = writeln!(
        s,
        "Generated by `{}` on {} (commit `{}`). Every figure below comes from that run; \
         nothing is typed in by hand. Rerun to refresh. What each workload measures, and the notes \
         behind the figures, are in [docs/benchmarks.md](docs/benchmarks.md).\n",
        r.command, r.date_utc, r.commit
    );
    let _ = writeln!(
        s,
        "**Machine:** {} CPUs (`nproc`), {:.1} GiB RAM, {}, Linux {}. Load average (1/5/15 min) \
         {} before the run, {} after. One 4 KiB write + fdatasync on the data disk: p50 {:.2} ms, \
         p99 {:.2} ms. Servers and load generator share the box, on 127.0.0.1.\n",
        m.nproc, m.memory_gib, m.cpu_model, m.kernel, m.loadavg_before, m.loadavg_after, m.fsync_p50_ms, m.fsync_p99_ms
    );
    let _ = writeln!(s, "{}", table(&r.lines));
    let _ = writeln!(
        s,
        "\"crosstalk advantage\" is how many times better crosstalk is: its rate ÷ the peer's for \
         rates, the peer's cost ÷ its cost for latencies, memory and disk.\n\n![chart](bench/chart.png)\n"
    );
    let _ = writeln!(s, "## How each figure is taken\n");
    let secs = |d: std::time::Duration| d.as_secs_f64();
    let payload = crate::workload::message_json(0).len();
    for line in [
        format!("1. Durable POST: {c} keep-alive connections post `{{sender, type, body}}` ({b}-byte body, {payload}-byte JSON) to one channel in a closed loop for {d} s after {w} s of warm-up; only answers that are 200 (crosstalk: default `--durability flush`, acknowledged after the flush; crosstalk-mcp: after its SQLite commit) and name an id count. 1b: after (1), the same from {more} connections, one run after another on the same server and channel. With few connections, each waiting for its answer before its next post, the rate is connections ÷ one post's latency and crosstalk's CPU sits partly idle; with more, the server is the limit, and past that more connections only add waiting. crosstalk's sustained rate is its best run (of {sweep} connections) whose p99 stays within {p99} ms; crosstalk-mcp's is its best run whatever the p99 (none stays within it). Every run's rate and p99 are in results.json (`post_<N>c_per_s`, `post_<N>c_p99_ms`). 1c (crosstalk only): then the most connections again, spread evenly over 16 channels of their own (at least one connection each), each channel's batch carrying a few posts rather than dozens (`post_spread_per_s`).",
            c = p.connections, b = crate::workload::BODY_BYTES, d = secs(p.duration), w = secs(p.warmup),
            sweep = counted(p.post_connections()),
            more = counted(p.sweep_connections.iter().copied()),
            p99 = crate::workload::post::SUSTAINED_P99_MS),
        format!("2. Tail reads: {c} connections `GET …/messages?since_id=<newest − 10>` on the channel of (1), {d} s; every answer holds the ten newest messages.",
            c = p.connections, d = secs(p.duration)),
        format!("3. Wake: one client long-polls `…/wait?since_id=<newest>`; 20 ms later another posts. Time from just before the POST is sent until the waiter has read the message (includes the durable commit). Up to {} rounds, {} s at most.",
            p.wake_rounds, secs(p.wake_budget)),
        format!("4. Fan-out: {} SSE subscribers, each on its own connection, all past `event: ready`; {} posts, one at a time; time from just before each POST is sent until each subscriber has parsed its message event.",
            p.fanout_subscribers, p.fanout_rounds),
        format!("5. Memory: server RSS (`VmRSS` in /proc) before and 2 s after {} idle SSE subscribers are connected and ready; the difference ÷ subscribers, in KB (1,000 bytes).",
            p.idle_subscribers),
        format!("6. MCP: {c} connections, one streamable-HTTP session each (`initialize` → `Mcp-Session-Id` → `notifications/initialized`), then `tools/call post_message` in a closed loop, {d} s. MCP wake: one session blocks in `tools/call wait_for_message`; 20 ms later a REST client posts; time from just before the POST until the tool's answer is read, up to {r} rounds. Skipped where `/mcp` answers 404.",
            c = p.connections, d = secs(p.duration), r = p.wake_rounds),
        format!("7. Start-up: the store is filled with {n} messages over 8 channels (crosstalk: over HTTP with `--durability relaxed`, 64 connections; crosstalk-mcp: rows inserted into its SQLite file directly, as its POST would take hours), the server stopped with SIGTERM, then started normally; time from spawn to the first 200 from `/healthz` (crosstalk-mcp has none: `/ui`, which touches no data). Median of {k} restarts, page cache warm.",
            n = p.startup_messages, k = p.startup_restarts),
        format!("8. Disk: bytes allocated under the data directory after (7) ÷ {}, compared with the posted JSON ({payload} B).", p.startup_messages),
        "9. fsync POST: as (1), on a server of its own started with `--durability fsync` (every acknowledged post also `fdatasync`ed). crosstalk only.".to_string(),
        format!("10. Idle channels: a server of its own with `--idle-after-secs {q} --presence-ttl-secs {q}` (a poster counts as a party of the channel for the presence TTL; `--max-open-channels` at its default, 10,000); {n} channels posted once each from {c} connections while one more connection posts to a live channel (a post every millisecond); peak RSS sampled every 50 ms; then `crosstalk_channel_actors` from `/metrics` is polled until only the live channel is open; RSS is read once the search index has caught up (`crosstalk_search_channels_behind` 0) and 2 s more, then the relay is restarted on the same store and read the same way (the store's own footprint: sled's cache and the search postings). The live channel's POST p99 before the touch and from the touch until the idle ones closed. One closed channel is read back to check it kept its message. crosstalk only.",
            q = p.idle_after_secs, n = p.touch_channels, c = p.connections),
        format!("11. Waiters: a server of its own; {ch} channels with one message each; {w} waiters per channel, each on its own connection (nine in ten REST long-polls, one in ten an MCP session blocked in `wait_for_message`), all counted as pending by `/healthz`; RSS before and after they park; then one post to each channel from {c} connections; time from just before a channel's POST is sent until each of its waiters has its answer. crosstalk only.",
            ch = p.waiter_channels, w = p.waiters_per_channel, c = p.connections),
        format!("12. stdio push: a server of its own; one `crosstalk mcp --relay … --listen ch` child, initialized over its stdin as a host does; a REST post; time from just before the POST is sent until the child has written the `notifications/claude/channel` line for it on its stdout (read by the bench), up to {r} rounds. Then 100 children listening to one channel ({f} posts, one at a time): time from just before each POST until each child has written its line. A first, untimed post proves every child's stream is open. crosstalk only.",
            r = p.wake_rounds, f = p.fanout_rounds),
        format!("13. Two relay nodes on NATS JetStream: three nats-server 2.15 on this machine as one cluster (`scripts/nats-cluster`: `sync_interval: always`, every write on disk before it is acknowledged), two relays with `--store nats://… --nats-replicas 3`, each with its own data directory. A long-poll waiter and an SSE subscriber on node B; a post on node A; time from just before the POST is sent until each has the message, up to {r} rounds. Then durable POST as (1), half the connections to each node, on one channel, from {c} connections and then from each of {more} as in 1b: the sustained rate is the best run whose p99 stays within {p99} ms (every run is in results.json, `cluster_post_<N>c_per_s`); over the {c}-connection run node A's `/metrics` tell how many events a message of the log carried and where a post's time went (the wait for the node's message already on its way, the publish → acknowledgement, the acknowledgement → the node's fold, the fold → durable; in the notes); over the first run from {most} connections, each process's user and system time from /proc (the three servers, each node, the load generator) ÷ the posts, the box's idle share, and the servers' CPU a log message (the CPU rows; the whole step's CPU over its measured rate); {chs}then {c} connections split evenly over three and over five relay nodes (more started on the same servers); then, the others stopped, node A alone from {most} connections on one channel, one node folding each post where every node folded it before (`cluster1_post_per_s`, with its CPU a post taken the same way). The own-channel rows: with exactly one, two and then three nodes running (after the two-node steps, after the third node's start, and with node A alone), {c} connections on each node at once, each node's on a channel of its own: whether a node more adds throughput when clients keep to their own node's channels (`cluster_own<N>_post_per_s`, with each step's CPU a post taken as above; every node still folds every post). Last, with the relays stopped, a bare JetStream publisher (async-nats, the same servers, a stream of three replicas, one relay event's size a message (a relay message holds one or more events), 16 and then 256 publishes in flight, each awaiting its acknowledgement): the best rate and its publish → ack p99, the reference for the relay's cluster POST; then the three servers' CPU a post (their /proc time over the run ÷ the posts acknowledged, warm-up included) with 64 posts in flight either way, one a message from 64 publishes and then 16 a message from 4: what one message carrying several channels' events (as a node's messages do) saves the servers. crosstalk only.",
            c = p.connections, more = counted(p.sweep_connections.iter().copied()),
            most = p.most_connections(),
            chs = if p.cluster_channels.is_empty() {
                String::new()
            } else {
                format!(
                    "then the largest of those connection counts spread evenly over {} channels on both nodes (`cluster_post_<N>ch_per_s`, in the notes, with each process's CPU a post and the posts a log message carried, taken as above: `cluster_<N>ch_cpu_*`, `cluster_<N>ch_posts_per_message`); ",
                    counted(p.cluster_channels.iter().copied())
                )
            },
            p99 = crate::workload::cluster::SUSTAINED_P99_MS, r = p.wake_rounds),
        format!("14. Search: a server of its own, filled over HTTP (`--durability relaxed`, 64 connections) with {n} messages of 100 bytes on 16 channels, words drawn from a 5,000-word vocabulary with Zipf-like frequencies; the first search waits for the index to hold them all (indexing rate = messages ÷ that time); then six kinds of query (a common word, a rare word, a prefix, a phrase, a word with a transposed letter, two words), 200 times each one after another over one connection, `limit=20`: p50 and p95 of all (each kind's in `results.json`); the index's size on disk after a clean stop; the relay's RSS after the queries. crosstalk only.",
            n = p.search_messages),
        format!("15. crosstalk wake: a server of its own; one `crosstalk wake --as bench-agent` process whose command is `sh -c 'date +%s.%N >> FILE'`; a REST post of a DIRECTIVE to bench-agent; time from just before the POST is sent until the time the command wrote (one clock), up to {r} rounds, each after the turn before it ended. crosstalk only.",
            r = p.wake_rounds),
        format!("16. The physical reference (issue #57): crosstalk, `crosstalk-reference` (bench/src/reference.rs: the relay's stack — actix-web with a worker per core and `tcp_nodelay`, jemalloc, the vendored sled with the relay's cache and flush settings — with one route that parses a post once and one store thread that writes every queued post in one sled batch and one flush, then answers each) and the same server storing nothing, each on a data directory of its own; the three alternated for {r} rounds, each side posting from 16 and then 64 connections for {d:.0} s on the same body; the mean rate of the rounds, and crosstalk's as a share of the minimal durable server's. After crosstalk's side of each round a search makes it index what that side posted before the others are measured (it indexes only once posting pauses, and that work used to run during the reference's rounds and take its CPU); the time that took is the last line. crosstalk only.",
            r = p.reference_rounds, d = p.duration.min(std::time::Duration::from_secs(5)).as_secs_f64()),
    ] {
        let _ = writeln!(s, "{line}");
    }
    for (name, rec) in &r.systems {
        let _ = writeln!(s, "\n## Notes: {name}\n");
        for (w, status) in &rec.workloads {
            let _ = writeln!(s, "- workload `{w}`: {status}");
        }
        for n in &rec.notes {
            let _ = writeln!(s, "- {n}");
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::{counted, label, ROWS};
    use crate::workload::Plan;

    #[test]
    fn labels_name_the_plans_counts() {
        let full = Plan::full();
        let labels: Vec<String> = ROWS.iter().map(|r| label(r.label, &full)).collect();
        for want in [
            "1. durable POST, 16 connections",
            "10. 100k channels touched: peak RSS",
            "11. 10,000 waiters woken: p99",
            "13. durable POST over both nodes, 16 c.",
            "13. CPU a post, two nodes, 64 c.: NATS",
            "14. search, 1,000,000 messages: query p50",
        ] {
            assert!(labels.iter().any(|l| l == want), "no row {want:?}");
        }
        assert!(labels.iter().all(|l| !l.contains('{')), "{labels:?}");
        let more = Plan {
            connections: 64,
            ..Plan::full()
        };
        let labels: Vec<String> = ROWS.iter().map(|r| label(r.label, &more)).collect();
        assert!(labels.iter().any(|l| l == "13. durable POST over both nodes, 64 c."));
        assert!(labels.iter().all(|l| !l.contains("16 c")), "{labels:?}");
        let smoke = Plan::smoke();
        assert!(ROWS
            .iter()
            .any(|r| label(r.label, &smoke) == "10. 2k channels touched: peak RSS"));
        let most = smoke.most_connections();
        assert!(ROWS
            .iter()
            .any(|r| label(r.label, &smoke) == format!("13. CPU a post, two nodes, {most} c.: NATS")));
    }

    #[test]
    fn counts_read_as_a_list() {
        assert_eq!(counted([32, 48, 64].into_iter()), "32, 48 and 64");
        assert_eq!(counted([32, 64].into_iter()), "32 and 64");
        assert_eq!(counted([8].into_iter()), "8");
        assert_eq!(counted(std::iter::empty()), "");
    }
}
