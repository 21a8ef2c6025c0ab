"""Draws bench/chart.png from bench/out/results.json: one panel per judged figure, crosstalk
beside crosstalk-mcp on a log scale, the target as a dashed line. Every value comes from the
results file; nothing here is a figure of its own."""

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

PANELS = [
    ("post_cap_per_s", "sustained durable POSTs/s, p99 ≤ 3 ms (higher is better)"),
    ("tail_per_s", "tail reads/s (higher is better)"),
    ("mcp_post_per_s", "MCP post_message calls/s (higher is better)"),
    ("wake_p99_ms", "wake latency p99, ms (lower is better)"),
    ("fanout_p99_ms", "fan-out p99, ms (lower is better)"),
    ("idle_kb_per_sub", "KB per idle SSE subscriber (lower is better)"),
    ("startup_s", "start-up with 1M messages, s (lower is better)"),
    ("disk_vs_payload", "disk ÷ posted JSON (lower is better)"),
]


def main(src: str, dst: str) -> None:
    with open(src) as f:
        results = json.load(f)
    lines = {line["key"]: line for line in results["lines"]}
    fig, axes = plt.subplots(2, 4, figsize=(16, 7.5))
    for ax, (key, title) in zip(axes.flat, PANELS):
        line = lines.get(key, {})
        names, values, colors = [], [], []
        for name, field, color in (("crosstalk", "crosstalk", "#2b7bba"), ("crosstalk-mcp", "peer", "#d9822b")):
            v = line.get(field)
            if v is not None and v > 0:
                names.append(name)
                values.append(v)
                colors.append(color)
        ax.set_title(title, fontsize=10)
        if not values:
            ax.text(0.5, 0.5, "not measured", ha="center", va="center", transform=ax.transAxes)
            ax.set_xticks([])
            ax.set_yticks([])
            continue
        bars = ax.bar(names, values, color=colors)
        ax.set_yscale("log")
        for bar, v in zip(bars, values):
            ax.annotate(f"{v:,.3g}" if v < 1000 else f"{v:,.0f}", (bar.get_x() + bar.get_width() / 2, v),
                        ha="center", va="bottom", fontsize=9)
        if line.get("goal") is not None:
            ax.axhline(line["goal"], color="#444", linestyle="--", linewidth=1)
            ax.annotate(f"target {line['target']}", (0.02, line["goal"]), xycoords=("axes fraction", "data"),
                        fontsize=8, va="bottom", color="#444")
        ax.margins(y=0.25)
    m = results["machine"]
    fig.suptitle(
        f"crosstalk vs crosstalk-mcp 2.0.0 — {results['date_utc']}, {m['nproc']} CPUs, {m['cpu_model']}, "
        f"load {m['loadavg_before']} → {m['loadavg_after']}",
        fontsize=11,
    )
    fig.tight_layout()
    fig.savefig(dst, dpi=100)
    print(f"wrote {dst}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
