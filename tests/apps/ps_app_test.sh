#!/bin/bash
# ps_app_test.sh — the parameter-server apps' tests (apps/param_server, apps/batch_ps),
# one case per ctest test:
#   ps_app_test.sh CASE BUILD_DIR SANITIZE(0|1) MPIEXEC [MPIEXEC FLAGS...]
# Cases: train_dist train_batch grad_dist shard_dist shard_batch resume_dist resume_batch resume_trainers
#        bad_options. Sanitizer builds run fewer steps (several times slower) against
#        a lower accuracy bar. Every case asserts; any failure exits non-zero.
set -euo pipefail
case=$1 build=$2 sanitize=$3 mpiexec=$4
shift 4
flags=("$@")
ps=$build/apps/param_server/param_server
bps=$build/apps/batch_ps/batch_ps
tools=$build/tests/apps
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export MPIRPC_FASHION_MNIST_DIR=${MPIRPC_FASHION_MNIST_DIR:-/usr/share/datasets/fashion-mnist}
if [ ! -r "$MPIRPC_FASHION_MNIST_DIR/train-images-idx3-ubyte.gz" ] && [ "$case" != bad_options ]; then
  echo "skipping: Fashion-MNIST not installed (Debian package dataset-fashion-mnist)"
  exit 77
fi

run() { local np=$1; shift; "$mpiexec" "${flags[@]}" -n "$np" "$@"; }
fail() { echo "FAIL: $*" >&2; exit 1; }
# field NAME FILE: a number from the app's JSON summary line
field() { sed -n "s/.*\"$1\":\([0-9.e+-]*\).*/\1/p" "$2" | tail -1; }
at_least() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a >= b) }'; }

# train APP NP MIN_ACC ARGS...: train, then check the accuracy, the metrics CSV and the PNG.
train() {
  local app=$1 np=$2 min=$3
  shift 3
  run "$np" "$app" --metrics "$tmp/m.csv" --log-interval 1 "$@" > "$tmp/out" 2> "$tmp/err" || { cat "$tmp/err"; fail "$app exited $?"; }
  cat "$tmp/err" "$tmp/out"
  local acc; acc=$(field test_acc "$tmp/out")
  [ -n "$acc" ] || fail "no JSON summary line"
  at_least "$acc" "$min" || fail "test accuracy $acc < $min"
  head -1 "$tmp/m.csv" | grep -qx "step,epoch,wall_s,loss,samples_per_s,test_acc" || fail "metrics header"
  [ "$(wc -l < "$tmp/m.csv")" -ge 3 ] || fail "too few metrics rows"
  tail -1 "$tmp/m.csv" | grep -q ",0\.[0-9]*$" || fail "no test accuracy in the last metrics row"
  if command -v gnuplot > /dev/null; then
    [ "$(head -c 4 "$tmp/m.png" | od -An -c | tr -d ' ')" = "211PNG" ] || fail "no PNG plot"
  fi
  echo "PASS: test accuracy $acc >= $min"
}

steps=300 min=0.72
[ "$sanitize" = 1 ] && steps=120 min=0.62
# Hogwild (2 trainers updating one PS without synchronising) reaches a
# different accuracy on every run, as the updates interleave: 0.69-0.785
# after 300 steps in 42 runs on the 2-core VM (5 below 0.72, with this
# session's library and the previous one alike; CI saw 0.6911). Batch mode is
# deterministic (0.7235 every run) and keeps the tighter bar.
hogwild_min=$min
[ "$sanitize" = 1 ] || hogwild_min=0.65

case $case in
train_dist)  # 2 trainers on one PS, Hogwild through RPC forward + dist backward + DistributedOptimizer
  train "$ps" 3 "$hogwild_min" --max-steps "$steps" ;;
train_batch) # 2 trainers, gradients averaged on the PS (async function), then the model back to both
  train "$bps" 3 "$min" --max-steps "$steps" ;;
grad_dist)   # one dist step's gradients == a local forward/backward of the same model and batch
  run 2 "$ps" --max-steps 1 --batch 32 --lr 0.5 --seed 3 --checkpoint-dir "$tmp/g1" > /dev/null
  "$tools/ps_grad_check" "$tmp/g1" mlp 3 32 0.5
  run 3 "$ps" --model cnn --ps 2 --max-steps 1 --batch 16 --lr 0.5 --seed 4 --checkpoint-dir "$tmp/g2" > /dev/null
  "$tools/ps_grad_check" "$tmp/g2" cnn 4 16 0.5 ;;
shard_dist)  # the model on 1 PS or sharded over 2: the same parameters after the same steps
  n=40; [ "$sanitize" = 1 ] && n=15
  run 2 "$ps" --ps 1 --max-steps $n --checkpoint-dir "$tmp/a" > /dev/null
  run 3 "$ps" --ps 2 --max-steps $n --checkpoint-dir "$tmp/b" > /dev/null
  "$tools/ps_ckpt_compare" "$tmp/a" "$tmp/b" model. ;;
shard_batch)
  n=40; [ "$sanitize" = 1 ] && n=15
  run 2 "$bps" --ps 1 --optimizer adam --lr 0.001 --max-steps $n --checkpoint-dir "$tmp/a" > /dev/null
  run 3 "$bps" --ps 2 --optimizer adam --lr 0.001 --max-steps $n --checkpoint-dir "$tmp/b" > /dev/null
  "$tools/ps_ckpt_compare" "$tmp/a" "$tmp/b" model. ;;
resume_dist|resume_batch) # killed (SIGKILL) after epoch 1, resumed: bit-identical to a run that never stopped
  # Adam in both: its moments live in the optimizers, so only a checkpoint with the optimizer state resumes exactly
  if [ $case = resume_dist ]; then app=$ps np=2; else app=$bps np=3; fi
  opt=(--optimizer adam --lr 0.001)
  limit=1920; [ "$sanitize" = 1 ] && limit=1280  # 30 (20) steps per epoch with one trainer
  args=(--epochs 2 --train-limit $limit --checkpoint-every 7 "${opt[@]}")
  run $np "$app" "${args[@]}" --checkpoint-dir "$tmp/a" --metrics "$tmp/a.csv" > /dev/null
  if MPIRPC_APP_KILL_AFTER_EPOCH=1 run $np "$app" "${args[@]}" --checkpoint-dir "$tmp/b" --metrics "$tmp/b.csv" \
       > /dev/null 2> "$tmp/kill.err"; then
    fail "the run to be killed ended normally"
  fi
  grep -q "killing this process" "$tmp/kill.err" || { cat "$tmp/kill.err"; fail "not killed by the hook"; }
  run $np "$app" "${args[@]}" --checkpoint-dir "$tmp/b" --metrics "$tmp/b.csv" --resume > /dev/null 2> "$tmp/resume.err" \
    || { cat "$tmp/resume.err"; fail "resume failed"; }
  grep "resuming from" "$tmp/resume.err"
  "$tools/ps_ckpt_compare" "$tmp/a" "$tmp/b"
  # the resumed run's metrics continue the killed one's: the same steps as the uninterrupted run
  diff <(cut -d, -f1,2 "$tmp/a.csv") <(cut -d, -f1,2 "$tmp/b.csv") || fail "metrics steps differ" ;;
resume_trainers) # 2 trainers (Hogwild, so not bit-identical): each resumes its own optimizer state
  limit=1920; [ "$sanitize" = 1 ] && limit=1280  # 15 (10) steps per epoch and trainer
  args=(--epochs 2 --train-limit $limit --checkpoint-every 4 --optimizer adam --lr 0.001 --checkpoint-dir "$tmp/c")
  if MPIRPC_APP_KILL_AFTER_EPOCH=1 run 3 "$ps" "${args[@]}" > /dev/null 2> "$tmp/kill.err"; then
    fail "the run to be killed ended normally"
  fi
  grep -q "killing this process" "$tmp/kill.err" || { cat "$tmp/kill.err"; fail "not killed by the hook"; }
  run 3 "$ps" "${args[@]}" --resume > /dev/null 2> "$tmp/resume.err" ||
    { cat "$tmp/kill.err" "$tmp/resume.err"; fail "resume failed"; }
  grep "resuming from" "$tmp/resume.err"
  # in the last checkpoint, both trainers' Adam step counts equal the steps run: a restarted state would count fewer
  python3 - "$tmp/c" <<'PY' || fail "optimizer state not carried over"
import glob, json, struct, sys
path = max(glob.glob(sys.argv[1] + "/ckpt-*.safetensors"), key=lambda p: int(p.split("ckpt-")[1].split(".")[0]))
raw = open(path, "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
hdr = json.loads(raw[8:8 + n])
step = int(hdr["__metadata__"]["app.step"])
for t in (0, 1):
    e = hdr["optim.trainer%d.state.0.step" % t]
    b, _ = e["data_offsets"]
    got = struct.unpack("<q", raw[8 + n + b:8 + n + b + 8])[0]
    print("%s: trainer %d Adam step %d, run step %d" % (path, t, got, step))
    assert got == step, "trainer %d: Adam step %d != %d" % (t, got, step)
assert hdr["__metadata__"]["ps_app.trainers"] == "2"
PY
  # the same checkpoint with another number of trainers: refused, saying why
  if run 4 "$ps" "${args[@]}" --resume > /dev/null 2> "$tmp/wrong.err"; then fail "resumed with 3 trainers"; fi
  grep -q "optimizer state of 2 trainer(s); this run has 3" "$tmp/wrong.err" || { cat "$tmp/wrong.err"; fail "no clear message"; } ;;
bad_options) # exit 2 with one line naming the option; missing data names the package (exit 1)
  expect() { # expect CODE PATTERN COMMAND...
    local code=$1 pat=$2 rc=0; shift 2
    "$@" > "$tmp/o" 2> "$tmp/e" || rc=$?
    cat "$tmp/e"
    [ "$rc" = "$code" ] || fail "$* exited $rc, expected $code"
    grep -q -- "$pat" "$tmp/e" || fail "$*: no '$pat' in the message"
  }
  for app in "$ps" "$bps"; do
    expect 2 "option --epochs: expected an integer, got 'x'" "$app" --epochs x
    expect 2 "option --epochs: 0 is out of range" "$app" --epochs 0
    expect 2 "unknown or ambiguous option '--bogus'" "$app" --bogus
    expect 2 "option --model: 'rnn' is not one of mlp|cnn" "$app" --model rnn
    expect 2 "option --lr needs a value" "$app" --lr
    expect 2 "option --ps: model mlp has 2 shardable stages" "$app" --ps 3
    expect 2 "option --resume needs --checkpoint-dir" "$app" --resume
    expect 1 "Install the Debian package dataset-fashion-mnist" "$app" --data "$tmp/nowhere"
    expect 1 "$tmp/nowhere/train-images-idx3-ubyte.gz" "$app" --data "$tmp/nowhere"
    "$app" --help | grep -q -- "--checkpoint-dir" || fail "--help"
    expect 2 "leave no trainer" run 1 "$app"
  done ;;
*) fail "unknown case $case" ;;
esac
