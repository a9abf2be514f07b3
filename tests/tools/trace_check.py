#!/usr/bin/env python3
"""trace_check.py — check a trace file written by mpirpc (Chrome trace-event
JSON): it parses, otherData.reason contains the given text, and the slices
("ph":"X") named as given occur exactly as often as given.

usage: trace_check.py FILE [--reason TEXT] [NAME=COUNT ...]
Exit 0 and "trace_check.py: ok ..." when every check holds; 1 with the
failed checks listed; 2 for bad usage."""
import json
import sys
from collections import Counter


def main(argv):
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    path, reason, wanted = argv[1], None, {}
    args = argv[2:]
    while args:
        a = args.pop(0)
        if a == "--reason" and args:
            reason = args.pop(0)
        elif "=" in a and a.rsplit("=", 1)[1].isdigit():
            name, count = a.rsplit("=", 1)
            wanted[name] = int(count)
        else:
            print(f"trace_check.py: bad argument {a!r}", file=sys.stderr)
            return 2
    try:
        with open(path) as f:
            trace = json.load(f)
    except (OSError, ValueError) as e:
        print(f"trace_check.py: {path}: {e}", file=sys.stderr)
        return 1
    failed = []
    got_reason = trace.get("otherData", {}).get("reason", "")
    if reason is not None and reason not in got_reason:
        failed.append(f"reason {got_reason!r} lacks {reason!r}")
    counts = Counter(e.get("name") for e in trace.get("traceEvents", []) if e.get("ph") == "X")
    for name, count in wanted.items():
        if counts[name] != count:
            failed.append(f"{counts[name]} slices {name!r}, expected {count}")
    for f in failed:
        print(f"trace_check.py: {path}: {f}", file=sys.stderr)
    if failed:
        return 1
    print(f"trace_check.py: ok {path}: {len(trace['traceEvents'])} events, reason {got_reason!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
