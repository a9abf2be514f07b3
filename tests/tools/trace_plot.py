#!/usr/bin/env python3
"""trace_plot.py — draw an mpirpc trace (MPIRPC_TRACE=<prefix> writes <prefix>.json) as a PNG
timeline with gnuplot (gnuplot-nox, which the apps' plots use already).

One row per thread, grouped by rank (the trace's process and thread names); slices as boxes,
colored by category (rpc, rref, dist_autograd, autograd, optim, user, control), nested slices
drawn thinner; the flow arrows of the trace (a call's send -> its handler in blue, the reply's
send -> the caller's completion in red) as arrows between the rows.

usage: trace_plot.py TRACE.json [TRACE.json ...] OUT.png [--from MS] [--to MS] [--width PX] [--height PX]
  Several files are drawn as one: the per-rank files of a non-graceful stop
  (<prefix>.rank<r>.json, already in rank 0's clock) lie side by side.
  --from/--to: the window to draw, in milliseconds since the trace's zero (default: all).
Prints one line: the number of slices, flows and rows drawn. Exit status 1 on a bad trace or
when gnuplot fails (its message is shown).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

COLORS = {"rpc": "#4c72b0", "rref": "#dd8452", "dist_autograd": "#55a868", "autograd": "#8172b3",
          "optim": "#c44e52", "user": "#937860", "control": "#8c8c8c"}
CALL_ARROW, REPLY_ARROW = "#1f3fbf", "#d62728"


def load(path):
    with open(path) as f:
        root = json.load(f)
    events = root["traceEvents"] if isinstance(root, dict) else root
    if not isinstance(events, list):
        raise ValueError("no traceEvents list")
    return events


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("trace", nargs="+")
    ap.add_argument("out")
    ap.add_argument("--from", dest="t0", type=float, default=None)
    ap.add_argument("--to", dest="t1", type=float, default=None)
    ap.add_argument("--width", type=int, default=1600)
    ap.add_argument("--height", type=int, default=0)
    a = ap.parse_args()
    events = []
    for path in a.trace:
        try:
            events += load(path)
        except (OSError, ValueError, KeyError) as e:
            sys.exit(f"trace_plot.py: cannot read {path}: {e}")

    proc_names, thread_names = {}, {}
    for e in events:
        if e.get("ph") == "M" and e.get("name") == "process_name":
            proc_names[e["pid"]] = e["args"]["name"]
        elif e.get("ph") == "M" and e.get("name") == "thread_name":
            thread_names[(e["pid"], e["tid"])] = e["args"]["name"]

    def visible(ts, dur=0.0):  # ms window
        start, end = ts / 1000.0, (ts + dur) / 1000.0
        return (a.t0 is None or end >= a.t0) and (a.t1 is None or start <= a.t1)

    slices = [e for e in events if e.get("ph") == "X" and visible(e["ts"], e.get("dur", 0))]
    flows = {}
    for e in events:
        if e.get("ph") in ("s", "f"):
            flows.setdefault(e["id"], {})[e["ph"]] = e
    tracks = sorted({(e["pid"], e["tid"]) for e in slices})
    if not tracks:
        sys.exit("trace_plot.py: no slices in the window")
    row = {t: i for i, t in enumerate(reversed(tracks))}  # rank 0 at the top

    # Nesting depth per track: slices sorted by start, a stack of open ends.
    depth = {}
    for t in tracks:
        open_ends = []
        for e in sorted((e for e in slices if (e["pid"], e["tid"]) == t), key=lambda e: (e["ts"], -e.get("dur", 0))):
            while open_ends and open_ends[-1] <= e["ts"]:
                open_ends.pop()
            depth[id(e)] = len(open_ends)
            open_ends.append(e["ts"] + e.get("dur", 0))

    with tempfile.TemporaryDirectory() as tmp:
        boxes, arrows = os.path.join(tmp, "boxes.dat"), os.path.join(tmp, "arrows.dat")
        with open(boxes, "w") as f:
            for e in slices:
                y = row[(e["pid"], e["tid"])]
                half = 0.38 * (0.72 ** depth[id(e)])
                x0, x1 = e["ts"] / 1000.0, (e["ts"] + max(e.get("dur", 0), 0.5)) / 1000.0
                color = int(COLORS.get(e.get("cat"), "#999999")[1:], 16)
                f.write(f"{(x0 + x1) / 2:.6f} {y} {x0:.6f} {x1:.6f} {y - half:.3f} {y + half:.3f} {color}\n")
        n_flows = 0
        with open(arrows, "w") as f:
            for fid, p in flows.items():
                s, t = p.get("s"), p.get("f")
                if not s or not t or not (visible(s["ts"]) or visible(t["ts"])):
                    continue
                if (s["pid"], s["tid"]) not in row or (t["pid"], t["tid"]) not in row:
                    continue
                ys, yf = row[(s["pid"], s["tid"])], row[(t["pid"], t["tid"])]
                color = int((REPLY_ARROW if int(fid) % 2 else CALL_ARROW)[1:], 16)
                f.write(f"{s['ts'] / 1000.0:.6f} {ys} {(t['ts'] - s['ts']) / 1000.0:.6f} {yf - ys} {color}\n")
                n_flows += 1
        labels = ", ".join(
            '"{} {}" {}'.format(proc_names.get(t[0], f"rank {t[0]}").replace('"', "'"),
                                thread_names.get(t, f"thread {t[1]}").replace('"', "'"), row[t])
            for t in tracks)
        height = a.height or max(400, 60 + 34 * len(tracks))
        legend = ", ".join(f'NaN with boxes fc rgb "{c}" title "{k}"' for k, c in COLORS.items())
        script = f"""
set terminal pngcairo size {a.width},{height} font "DejaVu Sans,10" noenhanced
set output "{a.out}"
set title "mpirpc trace: {", ".join(os.path.basename(p) for p in a.trace)} (blue arrows: call -> handler, red: reply -> caller)"
set xlabel "time since rank 0's mpr_init (ms)"
set ytics ({labels})
set yrange [-0.7:{len(tracks) - 0.3}]
{"set xrange [%s:%s]" % ("" if a.t0 is None else a.t0, "" if a.t1 is None else a.t1)}
set grid xtics
set key outside right top
set style fill solid 0.9 noborder
plot "{boxes}" using 1:2:3:4:5:6:7 with boxxyerror lc rgb variable notitle, \\
     "{arrows}" using 1:2:3:4:5 with vectors head size screen 0.006,20 filled lw 1 lc rgb variable notitle, \\
     {legend}
"""
        r = subprocess.run(["gnuplot"], input=script, text=True, capture_output=True)
        if r.returncode != 0 or not os.path.exists(a.out):
            sys.stderr.write(r.stderr)
            sys.exit("trace_plot.py: gnuplot failed")
    print(f"trace_plot.py: {len(slices)} slices, {n_flows} flows, {len(tracks)} rows -> {a.out}")


if __name__ == "__main__":
    main()
