#!/usr/bin/python3
"""Run an app (through mpiexec or not) and check what it did, for ctest.

    run_app.py [--exit N] [--regex R]... [--json EXPR]... [--file F]... [--cwd DIR]
               [--skip-if R] -- command...

Passes when the command's exit status is N (default 0), every regex R is
found in its output (stdout and stderr together), and every EXPR (a Python
expression over `j`, the last JSON object line the command printed) is
true, and every file F (relative to DIR) exists and is not empty. The
output is echoed first, so a failure shows what happened. With --skip-if R,
an output matching R (say, "no GPU visible") exits 77 instead, which ctest
reports as skipped where the test sets SKIP_RETURN_CODE 77.
"""
import json
import os
import re
import subprocess
import sys


def main(argv):
    expect_exit, regexes, checks, cwd, files, skip_if = 0, [], [], None, [], None
    i = 0
    while argv[i] != "--":
        opt, val = argv[i], argv[i + 1]
        if opt == "--exit":
            expect_exit = int(val)
        elif opt == "--regex":
            regexes.append(val)
        elif opt == "--json":
            checks.append(val)
        elif opt == "--cwd":
            cwd = val
        elif opt == "--file":
            files.append(val)
        elif opt == "--skip-if":
            skip_if = val
        else:
            sys.exit(f"run_app.py: unknown option {opt}")
        i += 2
    cmd = argv[i + 1:]
    if cwd:
        os.makedirs(cwd, exist_ok=True)
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=cwd)
    out = p.stdout.decode(errors="replace")
    sys.stdout.write(out)
    if skip_if and re.search(skip_if, out, re.M):
        print(f"run_app.py: skipping: the output matches /{skip_if}/")
        return 77
    ok = True
    if p.returncode != expect_exit:
        print(f"run_app.py: exit status {p.returncode}, expected {expect_exit}")
        ok = False
    for r in regexes:
        if not re.search(r, out, re.M):
            print(f"run_app.py: output lacks /{r}/")
            ok = False
    for f in files:
        path = os.path.join(cwd or ".", f)
        if not os.path.isfile(path) or os.path.getsize(path) == 0:
            print(f"run_app.py: no file {path}")
            ok = False
    if checks:
        # The last JSON object line; mpirun merges the ranks' stdout and stderr, so
        # a line another write was cut into may carry it after some text.
        j = None
        for l in out.splitlines():
            at = l.find('{"')
            if at >= 0 and l.endswith("}"):
                try:
                    j = json.loads(l[at:])
                except ValueError:
                    pass
        for c in checks:
            if j is None or not eval(c, {}, {"j": j}):
                print(f"run_app.py: summary {j} fails: {c}")
                ok = False
    print("run_app.py: " + ("passed" if ok else "FAILED"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
