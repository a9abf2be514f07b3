#!/usr/bin/python3
"""Resume C optimizer checkpoints in PyTorch (used by tests/unit/test_optim_interop.c).

    /usr/bin/python3 tests/ref/check_optim_interop.py DIR REF

DIR holds, for reference cases of REF (tests/data/ref_optim.safetensors):
  <case>.<dt>.state.safetensors   mpr_optimizer_state_save after k of the 10 steps
  <case>.<dt>.params.safetensors  the parameters then ("p0", "p1")
For each pair this script builds the torch optimizer of the saved kind with the
saved options, loads the C state with load_state_dict (its "state.<i>.<key>"
entries are PyTorch's state keys; "step" becomes the float tensor PyTorch keeps),
runs the remaining steps with REF's gradients and checks the parameters against
REF's uninterrupted PyTorch trajectory (1e-6 relative in float32, 1e-12 in
float64). Prints "optim interop ok N" when every case passed.
"""
import json
import os
import struct
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_refs import load_safetensors  # noqa: E402

CLASSES = {"sgd": torch.optim.SGD, "adagrad": torch.optim.Adagrad, "adam": torch.optim.Adam,
           "adamw": torch.optim.AdamW, "rmsprop": torch.optim.RMSprop}
FIELDS = {"sgd": ["lr", "momentum", "dampening", "weight_decay", "nesterov", "maximize"],
          "adagrad": ["lr", "lr_decay", "weight_decay", "initial_accumulator_value", "eps", "maximize"],
          "adam": ["lr", "eps", "weight_decay", "amsgrad", "maximize"],
          "adamw": ["lr", "eps", "weight_decay", "amsgrad", "maximize"],
          "rmsprop": ["lr", "alpha", "eps", "weight_decay", "momentum", "centered", "maximize"]}


def metadata(path):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(n)).get("__metadata__", {})


def option(meta, k):
    v = meta[k]
    return v == "true" if v in ("true", "false") else float(v)


def main(d, ref_path):
    ref = {k: torch.from_numpy(v.copy()) for k, v in load_safetensors(ref_path).items()}
    done, bad = 0, 0
    for fn in sorted(os.listdir(d)):
        if not fn.endswith(".state.safetensors"):
            continue
        case, dt = fn.split(".")[:2]
        meta = metadata(os.path.join(d, fn))
        state = load_safetensors(os.path.join(d, fn))
        params_np = load_safetensors(os.path.join(d, f"{case}.{dt}.params.safetensors"))
        params = [torch.from_numpy(params_np[f"p{j}"].copy()).requires_grad_(True) for j in range(2)]
        kind = meta["kind"]
        kw = {k: option(meta, k) for k in FIELDS[kind]}
        if kind in ("adam", "adamw"):
            kw["betas"] = (option(meta, "beta1"), option(meta, "beta2"))
        opt = CLASSES[kind](params, **kw)
        sd = opt.state_dict()
        st = {}
        for name, arr in state.items():
            _, i, key = name.split(".", 2)
            t = torch.from_numpy(arr.copy())
            st.setdefault(int(i), {})[key] = t.to(torch.float32) if key == "step" else t
        sd["state"] = st
        opt.load_state_dict(sd)
        k = int(st[0]["step"].item())
        for s in range(k, 10):
            for j, p in enumerate(params):
                p.grad = ref[f"grads.{dt}.p{j}"][s].clone()
            opt.step()
        tol = 1e-6 if dt == "f32" else 1e-12
        for j, p in enumerate(params):
            want = ref[f"{case}.{dt}.p{j}"][9]
            err = ((p.detach() - want).abs() / want.abs()).max().item()
            if not err <= tol:
                print(f"{case} {dt} p{j}: resumed in torch after step {k}, rel err {err:.3g} > {tol}")
                bad += 1
        done += 1
    if bad == 0 and done > 0:
        print(f"optim interop ok {done}")
    return 1 if bad or not done else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
