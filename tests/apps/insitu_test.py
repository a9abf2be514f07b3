#!/usr/bin/python3
"""insitu_heat's tests (apps/insitu_heat), one case per ctest test:

    insitu_test.py CASE BINARY SANITIZE(0|1) MPIEXEC [MPIEXEC FLAGS...]

Cases (3 ranks: 2 simulation ranks, 1 learner; a small grid):
  identical     the simulation in 2 row strips (MPI_Sendrecv) and on a 2 x 2
                Cartesian grid (non-blocking halos, 5 ranks), each streaming to
                the learner and with --no-stream (mpirpc never initialized), on
                an uneven 63 x 62 grid, ends with the same field, bit for bit:
                the same checksum and the same bytes in the --field files.
  counts        samples sent == acknowledged == received == trained on + held
                out, none failed or skipped, and as many as sampled steps; with
                --when-full skip and a one-sample window, skipped samples are
                counted: sent + skipped == sampled steps, sent == received.
  learns        the surrogate's validation error ends below 0.5 x its first
                value; the metrics CSV has the error column and the PNG exists;
                with 1 simulation rank and one sample in flight (deterministic),
                validating on every 2nd row and column (--val-cells) learns too
                and ends within 1.5x of the whole-block error.
  thread_level  the host initializes MPI with MPI_THREAD_SERIALIZED: mpr_init
                fails naming MPI_THREAD_MULTIPLE, the simulation runs without
                in-situ training and ends with the same checksum, exit 0.
  two_learners  5 ranks: 3 simulation ranks (uneven: 63 rows) stream to 2 learners
                (ranks 0 and 2 to learner 0, rank 1 to learner 1): same field as
                without streaming, and the counts add up over both learners.
  shared        4 ranks: 2 simulation ranks, 2 learners training one surrogate
                (--learners-share: learner 0 holds it, each learner steps it with
                its DistributedOptimizer from gradients of its own samples): the
                validation error ends below half its first value, both learners
                trained, and learner 0's Adam for each learner counts exactly the
                steps that learner made (its gradients were applied there); a
                shared run stopped half-way and resumed (under ASan only this,
                for time): learner 0's checkpoint
                holds the model, both their optimizer state, and each learner's
                Adam on learner 0 counts the steps of both halves.
  resume        1 simulation rank + 1 learner with one sample in flight (so the
                learner gets the samples in step order): a run stopped half-way
                (its checkpoint: the field, the learner's model, Adam state,
                replay and validation samples, random state, counts) and resumed
                ends with checkpoint tensors (parameters, Adam moments, ...)
                bit-identical to an uninterrupted run's, the same metadata but
                the wall clock and the count of evaluations, the same field;
                --resume without a checkpoint exits 1 saying what is missing.
  bad_options   a bad value, an unknown option, --checkpoint-every and too few
                ranks exit 2.
Every case prints what ran; any failed check exits 1.
"""
import json
import os
import struct
import subprocess
import sys
import tempfile

SMALL = ["--nx", "64", "--ny", "64", "--steps", "300", "--every", "5", "--log-interval", "1000"]


def run(cmd, cwd, expect=0):
    print("+", " ".join(cmd), flush=True)
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=cwd)
    out = p.stdout.decode(errors="replace")
    sys.stdout.write(out)
    check(p.returncode == expect, f"exit status {p.returncode}, expected {expect}")
    lines = [l for l in out.splitlines() if l.startswith("{") and l.endswith("}")]
    return out, (json.loads(lines[-1]) if lines else None)


def check(cond, what):
    if not cond:
        print(f"insitu_test.py: FAILED: {what}", flush=True)
        sys.exit(1)


def safetensors(path):
    """{name: raw bytes} and the metadata of a .safetensors file."""
    with open(path, "rb") as f:
        b = f.read()
    n = struct.unpack("<Q", b[:8])[0]
    header = json.loads(b[8:8 + n])
    meta = header.pop("__metadata__", {})
    data = b[8 + n:]
    return {k: (v["dtype"], v["shape"], data[v["data_offsets"][0]:v["data_offsets"][1]]) for k, v in header.items()}, meta


def main(argv):
    case, binary, sanitize, mpiexec = argv[0], argv[1], argv[2] == "1", argv[3:]
    small = SMALL if not sanitize else SMALL[:4] + ["--steps", "150"] + SMALL[6:]
    sampled = int(small[small.index("--steps") + 1]) // 5  # steps 0, 5, 10, ... below --steps
    mpi3 = mpiexec + ["-n", "3", binary]
    if case != "learns":  # less training where only the counts and the simulation matter
        small = small + ["--steps-per-sample", "2"]
    with tempfile.TemporaryDirectory() as tmp:
        if case == "identical":
            grid = ["--nx", "62", "--ny", "63"]  # uneven blocks in both directions (the last --nx/--ny count)
            runs = [("a", mpi3, ["--no-stream", "--decomp", "strips"]),  # 2 strips, no mpirpc
                    ("b", mpi3, ["--decomp", "strips"]),  # 2 strips, streaming
                    ("c", mpiexec + ["-n", "5", binary], ["--decomp", "2d"]),  # 2 x 2 blocks, streaming
                    ("d", mpiexec + ["-n", "5", binary], ["--decomp", "2d", "--no-stream"])]  # 2 x 2, no mpirpc
            if sanitize:  # 5 processes are slow under ASan: the 2 x 2 grid streams, strips without
                runs = [runs[0], runs[2]]
            res = {}
            for name, cmd, opts in runs:
                _, res[name] = run(cmd + small + grid + opts + ["--field", name + ".bin"], tmp)
            a = res["a"]
            check(a and not a["stream"] and a["decomp"] == "strips" and a["dims"] == [2, 1], "strips summary")
            c = res["c"]
            check(c and c["stream"] and c["ok"] and c["decomp"] == "2d" and c["dims"] == [2, 2] and c["samples_sent"] > 0,
                  "2 x 2 blocks streamed")
            with open(os.path.join(tmp, "a.bin"), "rb") as f:
                da = f.read()
            check(len(da) == 62 * 63 * 8, "field file size")
            for name, j in res.items():
                check(j["checksum"] == a["checksum"], f"checksum of run {name} {j['checksum']} != {a['checksum']}")
                with open(os.path.join(tmp, name + ".bin"), "rb") as f:
                    check(f.read() == da, f"field file {name}.bin differs from a.bin")
                if j["stream"]:
                    check(j["ok"] and j["samples_sent"] > 0, f"run {name} streamed")
            print(f"identical: {sorted(res)} all end with checksum {a['checksum']}")
        elif case == "counts":
            _, j = run(mpi3 + small, tmp)
            check(j and j["ok"], "summary ok")
            per_rank = 2 * sampled
            check(j["samples_sent"] == per_rank, f"{j['samples_sent']} sent, {per_rank} sampled steps")
            check(j["samples_sent"] == j["samples_acked"] == j["samples_received"], "sent == acked == received")
            check(j["samples_received"] == j["samples_trained"] + j["samples_held_out"], "received == trained + held out")
            check(j["samples_failed"] == 0 and j["samples_skipped"] == 0, "none failed or skipped")
            check(j["samples_held_out"] > 0 and j["samples_trained"] > j["samples_held_out"], "both trained and held out")
            _, k = run(mpi3 + small + ["--when-full", "skip", "--max-inflight", "1", "--inbox", "1",
                                       "--steps-per-sample", "20"], tmp)
            check(k and k["ok"], "summary ok (skip)")
            check(k["samples_sent"] + k["samples_skipped"] == per_rank, "sent + skipped == sampled steps")
            check(k["samples_sent"] == k["samples_received"] == k["samples_trained"] + k["samples_held_out"],
                  "sent == received == trained + held out (skip)")
            print(f"skip policy: {k['samples_skipped']} of {per_rank} samples skipped (counted)")
        elif case == "two_learners":
            mpi5 = mpiexec + ["-n", "5", binary, "--learners", "2"]
            uneven = small + ["--ny", "63"]  # 3 strips of 21 rows (the last --ny counts)
            _, b = run(mpi5 + uneven, tmp)
            check(b and b["ok"] and b["sims"] == 3 and b["learners"] == 2, "summary ok, 3 + 2 ranks")
            if not sanitize:  # 5 processes are slow under ASan; "identical" checks the field there
                _, a = run(mpi5 + uneven + ["--no-stream"], tmp)
                check(a["checksum"] == b["checksum"], "the same field with and without streaming")
            check(b["samples_sent"] == 3 * sampled == b["samples_received"] == b["samples_trained"] + b["samples_held_out"],
                  "sent == received == trained + held out over both learners")
        elif case == "learns":
            _, j = run(mpi3 + small + ["--metrics", "m.csv"], tmp)
            check(j and j["ok"], "summary ok")
            first, final = j["first_val_err"], j["final_val_err"]
            check(final < 0.5 * first, f"validation error {first:.4f} -> {final:.4f}, not below half")
            with open(os.path.join(tmp, "m.csv")) as f:
                rows = f.read().splitlines()
            check(rows[0].endswith("sim_step,val_rel_err,samples_trained,samples_received") and len(rows) >= 4,
                  "metrics CSV columns and rows")
            check(os.path.getsize(os.path.join(tmp, "m.png")) > 0, "the PNG plot")
            check(j["learner_busy_s"] >= j["learner_validate_s"] > 0 and j["drain_s"] >= 0, "learner and drain times")
            # validation (and the scales) on every 2nd row and column (--val-cells 1024 of a 64 x 64 block) against
            # every cell, in the same deterministic run (1 simulation rank, one sample in flight: the learner gets
            # the samples in step order): learns as well, and ends within 1.5x of the whole-block error
            mpi2 = mpiexec + ["-n", "2", binary] + small + ["--max-inflight", "1"]
            _, w = run(mpi2 + ["--val-cells", "0"], tmp)
            _, k = run(mpi2 + ["--val-cells", "1024"], tmp)
            for name, x in (("whole blocks", w), ("subsampled", k)):
                check(x and x["ok"] and x["final_val_err"] < 0.5 * x["first_val_err"],
                      f"{name}: validation error {x['first_val_err']:.4f} -> {x['final_val_err']:.4f}, not below half")
            check(w["final_val_err"] / 1.5 < k["final_val_err"] < 1.5 * w["final_val_err"],
                  f"subsampled validation error {k['final_val_err']:.4f} against {w['final_val_err']:.4f} on whole blocks")
        elif case == "thread_level":
            _, a = run(mpi3 + small + ["--no-stream"], tmp)
            out, b = run(mpi3 + small + ["--thread-level", "serialized"], tmp)
            check("MPI_THREAD_MULTIPLE" in out and "without in-situ training" in out, "mpr_init's error is shown")
            check(b and not b["stream"] and "stream_error" in b and b["ok"], "stream off, with the error")
            check(a["checksum"] == b["checksum"], "the simulation's result is unchanged")
        elif case == "shared":
            # 2 simulation ranks, 2 learners training ONE surrogate held by learner 0 (--learners-share)
            mpi4 = mpiexec + ["-n", "4", binary, "--learners", "2", "--learners-share"] + small
            runs = [run(mpi4, tmp)[1]] if not sanitize else []  # under ASan only the two halves below (time)
            half = int(small[small.index("--steps") + 1]) // 2
            _, b1 = run(mpi4 + ["--steps", str(half), "--checkpoint-dir", "S"], tmp)
            _, b2 = run(mpi4 + ["--checkpoint-dir", "S", "--resume"], tmp)
            for j in runs + [b1, b2]:
                check(j and j["ok"] and j["learners_share"] and j["learners"] == 2, "summary ok, 2 learners sharing")
                trained, adam = j["learner_trained"], j["learner_adam_steps"]
                check(all(n > 0 for n in trained) and sum(trained) == j["samples_trained"], f"both learners trained: {trained}")
                check(j["samples_sent"] == j["samples_received"] == j["samples_trained"] + j["samples_held_out"],
                      "sent == received == trained + held out")
            for j in runs + [b1]:
                check(all(n > 0 for n in j["learner_adam_steps"]) and j["learner_owner_steps"] == j["learner_adam_steps"],
                      f"both learners' DistributedOptimizer steps were applied on learner 0: {j['learner_adam_steps']} "
                      f"steps, {j['learner_owner_steps']} applied")
            j = runs[0] if runs else b2  # b2's first error is the one the stopped run measured (in the checkpoint)
            first, final = j["first_val_err"], j["final_val_err"]
            check(final < 0.5 * first, f"the shared model's validation error {first:.4f} -> {final:.4f}, not below half")
            print(f"shared: error {first:.4f} -> {final:.4f}; per learner {j['learner_trained']} samples, "
                  f"{j['learner_adam_steps']} Adam steps")
            # stopped half-way and resumed: each learner's Adam on learner 0 continues its step count
            check(b2.get("resumed_at") == half, "the second half resumed")
            check(b2["learner_owner_steps"] == [x + y for x, y in zip(b1["learner_adam_steps"], b2["learner_adam_steps"])],
                  f"the resumed DistributedOptimizers continue: {b1['learner_adam_steps']} + {b2['learner_adam_steps']} "
                  f"steps, {b2['learner_owner_steps']} on learner 0")
            t0, _ = safetensors(os.path.join(tmp, "S", "learner0", f"ckpt-{half:010d}.safetensors"))
            t1, _ = safetensors(os.path.join(tmp, "S", "learner1", f"ckpt-{half:010d}.safetensors"))
            check(any(k.startswith("model.") for k in t0) and not any(k.startswith("model.") for k in t1),
                  "the model is in learner 0's checkpoint only")
            check(all(any(k.startswith("optim.state.") for k in t) for t in (t0, t1)), "both hold their optimizer state")
        elif case == "resume":
            # 1 simulation rank + 1 learner, one sample in flight: the learner sees the samples in step order,
            # so its training is a function of them and a resumed run can be compared bit for bit.
            mpi2 = mpiexec + ["-n", "2", binary]
            one = small + ["--max-inflight", "1"]
            half = int(small[small.index("--steps") + 1]) // 2
            _, a = run(mpi2 + one + ["--checkpoint-dir", "A"], tmp)  # uninterrupted
            _, b1 = run(mpi2 + one + ["--steps", str(half), "--checkpoint-dir", "B"], tmp)  # stopped half-way
            _, b2 = run(mpi2 + one + ["--checkpoint-dir", "B", "--resume"], tmp)  # resumed
            check(a["ok"] and b1["ok"] and b2["ok"] and b2.get("resumed_at") == half, "three runs ok, the last resumed")
            check(b1["samples_sent"] + b2["samples_sent"] == a["samples_sent"] and
                  b1["samples_trained"] + b2["samples_trained"] == a["samples_trained"] and
                  b1["adam_steps"] + b2["adam_steps"] == a["adam_steps"], "the two halves add up to the whole run")
            check(a["checksum"] == b2["checksum"], "the resumed simulation ends with the same field")
            steps = int(small[small.index("--steps") + 1])
            ta, ma = safetensors(os.path.join(tmp, "A", "learner0", f"ckpt-{steps:010d}.safetensors"))
            tb, mb = safetensors(os.path.join(tmp, "B", "learner0", f"ckpt-{steps:010d}.safetensors"))
            check(sorted(ta) == sorted(tb), f"the same checkpoint entries: {sorted(set(ta) ^ set(tb))}")
            for prefix in ("model.", "optim.state.", "learner.inv_scale", "replay.", "val."):
                check(any(k.startswith(prefix) for k in ta), f"the checkpoint has {prefix}*")
            differ = [k for k in ta if ta[k] != tb[k]]
            check(not differ, f"tensors differ after resuming: {differ}")
            # all metadata equal but the wall clock and the number of evaluations (the stopped run's final one)
            meta_differ = [k for k in ma if ma[k] != mb.get(k) and k not in ("app.wall_s", "learner.evals")]
            check(not meta_differ and len(ma) == len(mb), f"metadata differ: {meta_differ}")
            check(int(ma["learner.adam_steps"]) == a["adam_steps"] > 0, "Adam steps in the checkpoint")
            print(f"resume: {len(ta)} tensors ({sum(k.startswith('model.') for k in ta)} parameters) bit-identical "
                  f"to the uninterrupted run's after {ma['learner.adam_steps']} Adam steps")
            out, _ = run(mpi2 + one + ["--checkpoint-dir", "empty", "--resume"], tmp, expect=1)
            check("lacks the simulation's field" in out, "--resume without a checkpoint says so")
        elif case == "bad_options":
            out, _ = run([binary, "--every", "0"], tmp, expect=2)
            check("every" in out, "names --every")
            out, _ = run([binary, "--checkpoint-dir", "x", "--checkpoint-every", "5"], tmp, expect=2)
            check("end of the run" in out, "--checkpoint-every is refused")
            out, _ = run([binary, "--decomp", "3d"], tmp, expect=2)
            check("decomp" in out, "names --decomp")
            out, _ = run([binary, "--bogus"], tmp, expect=2)
            check("bogus" in out, "names --bogus")
            out, _ = run(mpiexec + ["-n", "2", binary, "--learners", "2"] + small, tmp, expect=2)
            check("simulation rank" in out, "too few ranks")
        else:
            check(False, f"unknown case {case}")
    print("insitu_test.py: passed")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
