#!/usr/bin/env python3
"""Draws the plots of docs/performance.md from `devalloc_bench --json FILE`.

    scripts/plot_bench.py bench.json [OUT_DIR]     (default OUT_DIR: docs/img)

Writes three SVG files, with nothing but the Python standard library:
  bench_throughput_by_size.svg     GB/s of (a) devalloc, (b) per-tensor and
                                   (c) the limit against model size;
  bench_rss_by_size.svg            peak anonymous MiB above the destination
                                   of one load in a fresh process, per
                                   strategy, against model size;
  bench_throughput_by_staging.svg  GB/s of the staged path (direct = false)
                                   against the staging budget, beside the
                                   direct load and the limit (needs a run
                                   with --staging-sweep).
"""
import json
import math
import os
import sys

COLOURS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd"]
W, H, LEFT, RIGHT, TOP, BOTTOM = 640, 400, 70, 170, 40, 50


def svg_plot(path, title, xlabel, ylabel, series, log_x=True):
    """series: [(name, [(x, y), ...])]; x > 0 when log_x."""
    points = [p for _, s in series for p in s]
    if not points:
        return
    fx = (lambda v: math.log2(v)) if log_x else (lambda v: v)
    xs = [fx(x) for x, _ in points]
    x0, x1 = min(xs), max(xs)
    if x1 == x0:
        x1 = x0 + 1
    y1 = max(y for _, y in points) * 1.1 or 1
    pw, ph = W - LEFT - RIGHT, H - TOP - BOTTOM

    def px(x):
        return LEFT + (fx(x) - x0) / (x1 - x0) * pw

    def py(y):
        return TOP + ph - y / y1 * ph

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
           f'font-family="sans-serif" font-size="12">',
           f'<rect width="{W}" height="{H}" fill="white"/>',
           f'<text x="{W / 2}" y="20" text-anchor="middle" font-size="14">{title}</text>',
           f'<line x1="{LEFT}" y1="{TOP + ph}" x2="{LEFT + pw}" y2="{TOP + ph}" stroke="black"/>',
           f'<line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{TOP + ph}" stroke="black"/>',
           f'<text x="{LEFT + pw / 2}" y="{H - 10}" text-anchor="middle">{xlabel}</text>',
           f'<text x="15" y="{TOP + ph / 2}" text-anchor="middle" '
           f'transform="rotate(-90 15 {TOP + ph / 2})">{ylabel}</text>']
    for i in range(6):
        v = y1 * i / 5
        out.append(f'<line x1="{LEFT - 4}" y1="{py(v):.1f}" x2="{LEFT + pw}" y2="{py(v):.1f}" '
                   f'stroke="#ddd"/>')
        out.append(f'<text x="{LEFT - 8}" y="{py(v) + 4:.1f}" text-anchor="end">{v:.3g}</text>')
    for x in sorted({x for x, _ in points}):
        label = f"{x:g}"
        out.append(f'<text x="{px(x):.1f}" y="{TOP + ph + 18}" text-anchor="middle">{label}</text>')
    for k, (name, s) in enumerate(series):
        colour = COLOURS[k % len(COLOURS)]
        s = sorted(s)
        if len(s) > 1:
            path_d = " ".join(f"{'M' if j == 0 else 'L'}{px(x):.1f},{py(y):.1f}"
                              for j, (x, y) in enumerate(s))
            out.append(f'<path d="{path_d}" fill="none" stroke="{colour}" stroke-width="2"/>')
        for x, y in s:
            out.append(f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="3" fill="{colour}"/>')
        ly = TOP + 10 + 20 * k
        out.append(f'<line x1="{W - RIGHT + 15}" y1="{ly}" x2="{W - RIGHT + 35}" y2="{ly}" '
                   f'stroke="{colour}" stroke-width="2"/>')
        out.append(f'<text x="{W - RIGHT + 40}" y="{ly + 4}">{name}</text>')
    out.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")
    print("wrote", path)


def gbps(model, figure):
    return model["bytes"] / figure["median_s"] / 1e9


def main():
    if len(sys.argv) < 2:
        print(__doc__)
        return 2
    with open(sys.argv[1]) as f:
        data = json.load(f)
    out_dir = sys.argv[2] if len(sys.argv) > 2 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "docs", "img")
    os.makedirs(out_dir, exist_ok=True)
    models = [m for m in data["models"] if m["kind"] == "mixed"]
    mib = lambda m: m["bytes"] / 2**20

    def limit(m):
        if "limit" in m:  # the fastest (c) variant of the run
            return m["limit"]
        return min((m["limit_pread"], m["limit_mmap"]), key=lambda f: f["median_s"])

    svg_plot(os.path.join(out_dir, "bench_throughput_by_size.svg"),
             "Load throughput by model size (host plugin, warm)", "model size (MiB)", "GB/s",
             [("(a) devalloc", [(mib(m), gbps(m, m["devalloc"])) for m in models]),
              ("(b) per-tensor", [(mib(m), gbps(m, m["per_tensor"])) for m in models]),
              ("(c) limit", [(mib(m), gbps(m, limit(m))) for m in models]),
              ("(a) cold", [(mib(m), gbps(m, m["cold"])) for m in models])])
    def peak_anon(m, strategy):
        """MiB above the destination; older files: what the run added."""
        if "peak_anon_above_destination" in m:
            return m["peak_anon_above_destination"][strategy] / 2**20
        figure = limit(m) if strategy == "limit" else m[strategy]
        return figure["peak_anon_bytes"] / 2**20

    svg_plot(os.path.join(out_dir, "bench_rss_by_size.svg"),
             "Peak anonymous memory above the destination (one load, fresh process)",
             "model size (MiB)", "MiB",
             [("(a) devalloc", [(mib(m), peak_anon(m, "devalloc")) for m in models]),
              ("(b) per-tensor", [(mib(m), peak_anon(m, "per_tensor")) for m in models]),
              ("(c) limit", [(mib(m), peak_anon(m, "limit")) for m in models])])
    swept = [m for m in models if any("staging_bytes" in s for s in m["sweep"])]
    if swept:
        series = []
        for m in swept:
            series.append((f"staged, {mib(m):g} MiB",
                           [(s["staging_bytes"] / 2**20, gbps(m, s["figure"]))
                            for s in m["sweep"] if "staging_bytes" in s]))
            xs = [s["staging_bytes"] / 2**20 for s in m["sweep"] if "staging_bytes" in s]
            series.append((f"direct, {mib(m):g} MiB", [(x, gbps(m, m["devalloc"])) for x in xs]))
            series.append((f"limit, {mib(m):g} MiB", [(x, gbps(m, limit(m))) for x in xs]))
        svg_plot(os.path.join(out_dir, "bench_throughput_by_staging.svg"),
                 "Throughput by staging budget (direct = false)", "staging (MiB)", "GB/s",
                 series)
    return 0


if __name__ == "__main__":
    sys.exit(main())
