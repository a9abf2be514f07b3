#!/usr/bin/env python3
"""backward_overlap_check.py — check, on a trace of the pipeline app (MPIRPC_TRACE), that the
distributed backward is pipelined across stages (issue #15, autograd/dist/backward.c):

1. on every stage rank the "dist backward (piece)" slices of one pass never run on two threads
   at once: the pieces of one context run one after the other, in arrival order (not
   time-sliced on several threads). A piece may contain later ones on its own thread: a piece
   that waits for the answer to its own request (stage 2's, whose gradients go on to stage 1)
   runs the context's next requests meanwhile, nested in its slice;
2. in most mini-batches the first piece on stage 1 (rank 1, the last stage the gradients
   reach) begins before the last piece on stage 2 (rank 2) begins: micro-batch 0's gradients
   go on to stage 1 while stage 2 still has micro-batches to start.

usage: backward_overlap_check.py TRACE.json [--min-fraction F]   (default 0.5)
       backward_overlap_check.py PREFIX [--min-fraction F] --run -- COMMAND...
  --run: first run COMMAND with MPIRPC_TRACE=PREFIX (its directory made), then check PREFIX.json.
Prints what it measured; exit status 1 when a check fails or the command fails.
"""
import argparse
import json
import os
import subprocess
import sys


def main():
    argv = sys.argv[1:]
    command = []
    if "--" in argv:
        command = argv[argv.index("--") + 1:]
        argv = argv[:argv.index("--")]
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("--min-fraction", type=float, default=0.5)
    ap.add_argument("--run", action="store_true")
    a = ap.parse_args(argv)
    path = a.trace
    if a.run:
        if not command:
            ap.error("--run needs -- COMMAND...")
        os.makedirs(os.path.dirname(os.path.abspath(a.trace)), exist_ok=True)
        rc = subprocess.run(command, env=dict(os.environ, MPIRPC_TRACE=a.trace)).returncode
        if rc != 0:
            print(f"backward_overlap_check: the command exited with {rc}")
            return 1
        path = a.trace + ".json"
    with open(path) as f:
        root = json.load(f)
    events = root["traceEvents"] if isinstance(root, dict) else root
    roots = sorted((e["ts"], e["ts"] + e["dur"]) for e in events
                   if e.get("ph") == "X" and e.get("name") == "dist backward (root)" and e.get("pid") == 0)
    pieces = [e for e in events if e.get("ph") == "X" and e.get("name") == "dist backward (piece)"]
    if len(roots) < 2:
        print(f"backward_overlap_check: {len(roots)} backward passes in the trace (need 2 or more)")
        return 1
    ok = True
    overlapped = 0
    for i, (b, end) in enumerate(roots):
        inside = [e for e in pieces if b <= e["ts"] <= end]
        per_rank = {}
        for e in inside:
            per_rank.setdefault(e["pid"], []).append((e["ts"], e["ts"] + e["dur"], e["tid"]))
        if 1 not in per_rank or 2 not in per_rank:
            print(f"pass {i}: no pieces on ranks 1 and 2 ({sorted(per_rank)})")
            return 1
        for rank, sl in per_rank.items():
            sl.sort()
            open_slices = []  # (end, tid) of the slices begun and not yet ended, outermost first
            for b1, e1, t1 in sl:
                open_slices = [(e0, t0) for e0, t0 in open_slices if e0 > b1 + 1.0]  # 1 us of clock slack
                for e0, t0 in open_slices:
                    if t0 != t1 or e1 > e0 + 1.0:
                        print(f"pass {i}: two pieces overlap on rank {rank}: one until {e0:.0f} (thread {t0}), "
                              f"[{b1:.0f}, {e1:.0f}] (thread {t1}) not nested in it")
                        ok = False
                open_slices.append((e1, t1))
        first1 = per_rank[1][0][0]
        last_begin2 = max(b for b, _, _ in per_rank[2])
        lead_ms = (last_begin2 - first1) / 1000
        print(f"pass {i}: {len(per_rank[2])} pieces on rank 2, {len(per_rank[1])} on rank 1; "
              f"rank 1 began {lead_ms:.2f} ms before rank 2's last piece began")
        if first1 < last_begin2:
            overlapped += 1
    frac = overlapped / len(roots)
    print(f"backward overlapped across stages in {overlapped} of {len(roots)} passes")
    if frac < a.min_fraction:
        print(f"backward_overlap_check: fewer than {a.min_fraction:.0%} of the passes overlap")
        ok = False
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
