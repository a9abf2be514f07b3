#!/usr/bin/python3
"""Checkpoint/--resume test for an app, for ctest.

    resume_test.py --workdir DIR --length-option OPT --total N --first M
                   --columns c1,c2,... [--skip-if R] -- command...

Runs the command three times in a fresh DIR: (A) straight to `OPT N` with
--metrics A.csv; (B1) to `OPT M` with --metrics B.csv --checkpoint-dir ckpt;
(B2) to `OPT N` with the same metrics file and --checkpoint-dir ckpt --resume.
Passes when every run exits 0, B2 says it resumed, and the listed columns of
B.csv equal A.csv's row by row, exactly: the resumed run continued as if it
had never stopped. With --skip-if R, a first run whose output matches R
(say, "no GPU visible") exits 77 instead (ctest: skipped where the test sets
SKIP_RETURN_CODE 77).
"""
import re
import csv
import os
import shutil
import subprocess
import sys


def run(cmd, cwd, skip_if=None):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=cwd)
    out = p.stdout.decode(errors="replace")
    print("$ " + " ".join(cmd) + "\n" + out)
    if skip_if and re.search(skip_if, out, re.M):
        print(f"resume_test.py: skipping: the output matches /{skip_if}/")
        sys.exit(77)
    if p.returncode != 0:
        sys.exit(f"resume_test.py: exit status {p.returncode}")
    return out


def columns(path, names):
    with open(path) as f:
        rows = list(csv.DictReader(f))
    return [tuple(r[n] for n in names) for r in rows]


def main(argv):
    opts = {}
    i = 0
    while argv[i] != "--":
        opts[argv[i]] = argv[i + 1]
        i += 2
    cmd = argv[i + 1:]
    wd, opt = opts["--workdir"], opts["--length-option"]
    shutil.rmtree(wd, ignore_errors=True)
    os.makedirs(wd)
    names = opts["--columns"].split(",")
    run(cmd + ["--metrics", "A.csv", opt, opts["--total"]], wd, opts.get("--skip-if"))
    run(cmd + ["--metrics", "B.csv", "--checkpoint-dir", "ckpt", opt, opts["--first"]], wd)
    out = run(cmd + ["--metrics", "B.csv", "--checkpoint-dir", "ckpt", "--resume", opt, opts["--total"]], wd)
    if "Resumed from" not in out:
        sys.exit("resume_test.py: the second run did not resume")
    a, b = columns(os.path.join(wd, "A.csv"), names), columns(os.path.join(wd, "B.csv"), names)
    if not a or a != b:
        for k, (x, y) in enumerate(zip(a, b)):
            if x != y:
                print(f"row {k + 1}: straight {x} resumed {y}")
                break
        sys.exit(f"resume_test.py: {len(a)} straight rows vs {len(b)} resumed rows differ")
    print(f"resume_test.py: passed: {len(a)} rows of {names} identical")


if __name__ == "__main__":
    main(sys.argv[1:])
