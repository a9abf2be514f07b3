#!/usr/bin/python3
"""Generate tests/data/ref_optim.safetensors: PyTorch 1.13 optimizer trajectories
and learning-rate schedules for test_optim_ref.

Run from anywhere with Debian's torch (python3-torch 1.13):
    /usr/bin/python3 tests/ref/gen_optim_refs.py

Contents (every float in both float32 and float64, <dt> = f32 / f64):
  init.<dt>.p<j>          the initial parameters (two tensors, shapes [3, 4] and [5],
                          magnitudes in [1, 2] so 10 steps never bring one near zero)
  grads.<dt>.p<j>         [10, *shape]: the gradient given at each of the 10 steps
  <case>.<dt>.p<j>        [10, *shape]: the parameter after each step
  sched.<name>            [n] float64: the learning rate after each scheduler step
Metadata: "case.<case>" = "kind=adam,lr=0.01,amsgrad=1,..." (the options that differ
from the kind's defaults, names as mpr_optim_options_t, betas as beta1/beta2), and
"sched.<name>" = "kind=step,lr=..,step_size=..,gamma=..,steps=.." likewise.
Gradients are seeded, so reruns give identical files. The optimizers run with
their default implementation (foreach off on CPU: the single-tensor path).
"""
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_refs import OUT, save_safetensors  # noqa: E402

STEPS = 10
SHAPES = [(3, 4), (5,)]

# (case name, kind, options differing from the kind's defaults)
CASES = [
    ("sgd_plain", "sgd", dict(lr=0.01)),
    ("sgd_momentum", "sgd", dict(lr=0.01, momentum=0.9)),
    ("sgd_damp_wd", "sgd", dict(lr=0.01, momentum=0.9, dampening=0.5, weight_decay=0.1)),
    ("sgd_nesterov_wd", "sgd", dict(lr=0.01, momentum=0.9, nesterov=True, weight_decay=0.01)),
    ("sgd_maximize", "sgd", dict(lr=0.01, momentum=0.5, maximize=True)),
    ("adagrad_plain", "adagrad", dict(lr=0.05)),
    ("adagrad_decay_wd_init", "adagrad",
     dict(lr=0.05, lr_decay=0.05, weight_decay=0.1, initial_accumulator_value=0.2)),
    ("adagrad_maximize_eps", "adagrad", dict(lr=0.05, eps=1e-3, maximize=True)),
    ("adam_plain", "adam", dict(lr=0.01)),
    ("adam_wd", "adam", dict(lr=0.01, weight_decay=0.1)),
    ("adam_amsgrad", "adam", dict(lr=0.01, amsgrad=True)),
    ("adam_all", "adam",
     dict(lr=0.01, beta1=0.8, beta2=0.99, eps=1e-6, weight_decay=0.05, amsgrad=True, maximize=True)),
    ("adamw_plain", "adamw", dict(lr=0.01)),
    ("adamw_wd_amsgrad", "adamw", dict(lr=0.01, weight_decay=0.1, amsgrad=True)),
    ("adamw_maximize", "adamw", dict(lr=0.01, maximize=True, eps=1e-6)),
    ("rmsprop_plain", "rmsprop", dict(lr=1e-3)),
    ("rmsprop_centered", "rmsprop", dict(lr=1e-3, centered=True)),
    ("rmsprop_momentum", "rmsprop", dict(lr=1e-3, momentum=0.9)),
    ("rmsprop_all", "rmsprop",
     dict(lr=1e-3, alpha=0.9, centered=True, momentum=0.9, weight_decay=0.1, eps=1e-4)),
    ("rmsprop_maximize", "rmsprop", dict(lr=1e-3, maximize=True, weight_decay=0.01)),
]

SCHEDS = [
    ("step", dict(kind="step", lr=0.1, step_size=3, gamma=0.5, steps=12)),
    ("cosine", dict(kind="cosine", lr=0.1, t_max=5, eta_min=0.001, steps=17)),
    ("cosine_long", dict(kind="cosine", lr=0.05, t_max=10, eta_min=0.0, steps=25)),
]

CLASSES = {"sgd": torch.optim.SGD, "adagrad": torch.optim.Adagrad, "adam": torch.optim.Adam,
           "adamw": torch.optim.AdamW, "rmsprop": torch.optim.RMSprop}


def torch_kwargs(opts):
    kw = dict(opts)
    if "beta1" in kw or "beta2" in kw:
        kw["betas"] = (kw.pop("beta1", 0.9), kw.pop("beta2", 0.999))
    return kw


def encode(opts):
    return ",".join(f"{k}={int(v) if isinstance(v, bool) else repr(v)}" for k, v in opts.items())


def main():
    gen = torch.Generator().manual_seed(1234)
    base = []
    for shape in SHAPES:
        mag = torch.rand(shape, generator=gen, dtype=torch.float64) + 1.0
        sign = torch.where(torch.rand(shape, generator=gen, dtype=torch.float64) < 0.5, -1.0, 1.0)
        base.append(mag * sign)
    grads64 = [torch.randn((STEPS,) + shape, generator=gen, dtype=torch.float64) for shape in SHAPES]
    out, meta = {}, {"generator": "tests/ref/gen_optim_refs.py", "torch": torch.__version__}
    smallest = math.inf
    for dt, name in [(torch.float32, "f32"), (torch.float64, "f64")]:
        init = [b.to(dt) for b in base]
        grads = [g.to(dt) for g in grads64]
        for j in range(len(SHAPES)):
            out[f"init.{name}.p{j}"] = init[j]
            out[f"grads.{name}.p{j}"] = grads[j]
        for case, kind, opts in CASES:
            meta[f"case.{case}"] = f"kind={kind}," + encode(opts)
            params = [p.clone().requires_grad_(True) for p in init]
            opt = CLASSES[kind](params, **torch_kwargs(opts))
            traj = [[] for _ in params]
            for s in range(STEPS):
                for j, p in enumerate(params):
                    p.grad = grads[j][s].clone()
                opt.step()
                for j, p in enumerate(params):
                    traj[j].append(p.detach().clone())
                    smallest = min(smallest, p.detach().abs().min().item())
            for j in range(len(params)):
                out[f"{case}.{name}.p{j}"] = torch.stack(traj[j])
    for sname, s in SCHEDS:
        meta[f"sched.{sname}"] = encode(s).replace("'", "")
        p = torch.zeros(1, requires_grad=True)
        opt = torch.optim.SGD([p], lr=s["lr"])
        if s["kind"] == "step":
            sch = torch.optim.lr_scheduler.StepLR(opt, step_size=s["step_size"], gamma=s["gamma"])
        else:
            sch = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=s["t_max"], eta_min=s["eta_min"])
        lrs = []
        for _ in range(s["steps"]):
            opt.step()
            sch.step()
            lrs.append(opt.param_groups[0]["lr"])
        out[f"sched.{sname}"] = torch.tensor(lrs, dtype=torch.float64)
    assert smallest > 0.1, f"a parameter came within {smallest} of zero: relative checks would be fragile"
    path = os.path.join(OUT, "ref_optim.safetensors")
    save_safetensors(path, out, meta)
    print(f"wrote {path}: {len(out)} tensors, smallest |param| {smallest:.3f}")


if __name__ == "__main__":
    main()
