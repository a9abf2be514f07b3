#!/usr/bin/python3
"""Generate the PyTorch reference files the C tests compare against.

Run from anywhere with Debian's torch (python3-torch 1.13):
    /usr/bin/python3 tests/ref/gen_refs.py
Writes into tests/data/ (next to this script's parent):
  io_*.npy                 files written by numpy.save (dtypes, 0-d, Fortran order,
                           big-endian) for test_tensor_io
  ref_ops.safetensors      per op: inputs, output and input gradients for a fixed
                           upstream gradient (test_ref_ops)
  ref_audit_ops.safetensors  more variants of those ops, same layout (test_ref_ops)
  ref_<model>.safetensors  small models: weights (PyTorch names), input, output, loss
                           and every parameter gradient (test_ref_models)
(ref_optim.safetensors, optimizer trajectories and LR schedules, comes from the
sibling gen_optim_refs.py.)
Inputs are seeded, so reruns give identical files. Everything is float32 except
index tensors (int64).
"""
import json
import os
import struct
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(os.path.dirname(HERE), "data")

_DT = {np.float32: "F32", np.float64: "F64", np.int64: "I64", np.int32: "I32", np.uint8: "U8"}


def save_safetensors(path, tensors, metadata=None):
    """Minimal safetensors writer (the `safetensors` package is not in Debian 12)."""
    header, blobs, off = {}, [], 0
    if metadata:
        header["__metadata__"] = {k: str(v) for k, v in metadata.items()}
    for name, t in tensors.items():
        a = t.detach().cpu().numpy() if isinstance(t, torch.Tensor) else np.asarray(t)
        a = np.array(a, order="C", copy=True)  # (ascontiguousarray would turn 0-d into 1-d)
        dt = _DT[a.dtype.type]
        b = a.astype(a.dtype.newbyteorder("<"), copy=False).tobytes()
        header[name] = {"dtype": dt, "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def load_safetensors(path):
    """Reader used to check files written by the C library (see check_c_file)."""
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    inv = {v: k for k, v in _DT.items()}
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        b, en = e["data_offsets"]
        out[name] = np.frombuffer(raw[8 + n + b:8 + n + en], dtype=inv[e["dtype"]]).reshape(e["shape"])
    return out


def gen_io():
    base = np.arange(24).reshape(2, 3, 4)
    for dt, name in [(np.float32, "f32"), (np.float64, "f64"), (np.int64, "i64"), (np.int32, "i32"),
                     (np.uint8, "u8")]:
        np.save(os.path.join(OUT, f"io_{name}.npy"), base.astype(dt))
    np.save(os.path.join(OUT, "io_scalar_f64.npy"), np.float64(2.5))
    np.save(os.path.join(OUT, "io_fortran.npy"), np.asfortranarray(base.astype(np.float32)))
    np.save(os.path.join(OUT, "io_bigendian.npy"), base.astype(">f4"))


# ---------------------------------------------------------------- ops
def record_case(out, r, name, fn, inputs, needs_grad=None):
    """One op case into `out`: NAME.in0.., NAME.out, NAME.gout (drawn with r) and
    NAME.grad0... Float inputs get requires_grad unless needs_grad says otherwise."""
    ins = []
    for i, t in enumerate(inputs):
        t = t.clone()
        rg = t.is_floating_point() if needs_grad is None else needs_grad[i]
        if rg:
            t.requires_grad_(True)
        ins.append(t)
        out[f"{name}.in{i}"] = t.detach()
    y = fn(*ins)
    gy = r(*y.shape) if y.dim() > 0 else torch.tensor(1.0)
    out[f"{name}.out"] = y.detach()
    out[f"{name}.gout"] = gy
    y.backward(gy)
    for i, t in enumerate(ins):
        if t.requires_grad:
            out[f"{name}.grad{i}"] = t.grad.detach()


def gen_ops():
    g = torch.Generator().manual_seed(1234)

    def r(*shape, lo=-1.0, hi=1.0):
        return (torch.rand(*shape, generator=g) * (hi - lo) + lo).float()

    out = {}

    def case(name, fn, inputs, needs_grad=None):
        record_case(out, r, name, fn, inputs, needs_grad)

    # elementwise (broadcasting in the binary ones)
    case("add", torch.add, [r(3, 4), r(4)])
    case("sub", torch.sub, [r(2, 1, 4), r(3, 1)])
    case("mul", torch.mul, [r(3, 4), r(3, 1)])
    case("div", torch.div, [r(3, 4), r(1, 4, lo=0.5, hi=2.0)])
    case("neg", torch.neg, [r(3, 4)])
    case("pow", lambda a: torch.pow(a, 3.0), [r(3, 4)])
    case("pow_half", lambda a: torch.pow(a, 0.5), [r(3, 4, lo=0.1, hi=2.0)])
    case("exp", torch.exp, [r(3, 4)])
    case("log", torch.log, [r(3, 4, lo=0.1, hi=3.0)])
    case("sqrt", torch.sqrt, [r(3, 4, lo=0.1, hi=3.0)])
    case("abs", torch.abs, [r(3, 4)])
    case("clamp", lambda a: torch.clamp(a, -0.5, 0.4), [r(3, 4)])
    case("relu", torch.relu, [r(3, 4)])
    case("tanh", torch.tanh, [r(3, 4)])
    case("sigmoid", torch.sigmoid, [r(3, 4)])
    case("gelu", F.gelu, [r(3, 4, lo=-3, hi=3)])
    # reductions
    case("sum", torch.sum, [r(3, 4)])
    case("mean", torch.mean, [r(3, 4)])
    case("sum_dim1", lambda a: a.sum(dim=1), [r(3, 4, 5)])
    case("mean_dim0_keep", lambda a: a.mean(dim=0, keepdim=True), [r(3, 4)])
    case("max_dim1", lambda a: a.max(dim=1).values, [r(3, 5)])
    # matmul / linear
    case("matmul", torch.matmul, [r(5, 7), r(7, 3)])
    case("matmul_batched", torch.matmul, [r(2, 5, 7), r(2, 7, 3)])
    case("matmul_bcast", torch.matmul, [r(2, 5, 7), r(7, 3)])
    case("linear", F.linear, [r(6, 5), r(4, 5), r(4)])
    # softmax family and losses
    case("softmax", lambda a: F.softmax(a, dim=1), [r(4, 6, lo=-3, hi=3)])
    case("log_softmax", lambda a: F.log_softmax(a, dim=1), [r(4, 6, lo=-3, hi=3)])
    tgt = torch.randint(0, 6, (4,), generator=g)
    case("cross_entropy", F.cross_entropy, [r(4, 6, lo=-3, hi=3), tgt])
    case("nll_loss", F.nll_loss, [F.log_softmax(r(4, 6), dim=1).detach(), tgt])
    case("mse_loss", F.mse_loss, [r(3, 4), r(3, 4)])
    # embedding / indexing / joining
    idx = torch.tensor([[0, 2, 4], [4, 1, 0]])
    case("embedding", lambda w, i: F.embedding(i, w), [r(5, 3), idx])
    case("index_select", lambda a, i: torch.index_select(a, 0, i), [r(5, 3), torch.tensor([4, 0, 4, 2])])
    case("gather", lambda a, i: torch.gather(a, 1, i), [r(3, 4), torch.tensor([[0, 3], [1, 1], [2, 0]])])
    case("cat", lambda a, b: torch.cat([a, b], dim=1), [r(2, 3), r(2, 2)])
    case("stack", lambda a, b: torch.stack([a, b], dim=0), [r(2, 3), r(2, 3)])
    # views, splits and reductions composed with math (their backward goes through the view)
    case("split1", lambda a: torch.split(a, 2, dim=1)[1] * 2.0, [r(3, 5)])
    case("chunk2", lambda a: torch.chunk(a, 3, dim=0)[2].exp(), [r(7, 2)])
    case("max_all", torch.max, [r(4, 5)])
    case("sum_dims02", lambda a: a.sum(dim=(0, 2)), [r(2, 3, 4)])
    case("transpose_matmul", lambda a, b: a.transpose(0, 1) @ b, [r(4, 3), r(4, 2)])
    case("permute3", lambda a: a.permute(2, 0, 1).contiguous() * 3.0, [r(2, 3, 4)])
    case("narrow_mul", lambda a, b: a.narrow(1, 1, 2) * b, [r(3, 4), r(3, 2)])
    case("reshape_sum", lambda a: a.reshape(4, 3).sum(dim=0), [r(3, 4)])
    case("unsqueeze_add", lambda a, b: a.unsqueeze(1) + b, [r(3, 4), r(2, 4)])
    case("log_softmax_dim0", lambda a: F.log_softmax(a, dim=0), [r(4, 3, lo=-2, hi=2)])
    case("dropout_eval", lambda a: F.dropout(a, 0.5, training=False) * 1.5, [r(3, 4)])
    case("mse_loss_both", F.mse_loss, [r(3, 4), r(3, 4)], needs_grad=[True, True])
    # conv / pool
    case("conv2d", lambda x, w, b: F.conv2d(x, w, b, stride=1, padding=1), [r(2, 3, 6, 6), r(4, 3, 3, 3), r(4)])
    case("conv2d_s2", lambda x, w, b: F.conv2d(x, w, b, stride=2, padding=0), [r(1, 2, 7, 7), r(3, 2, 3, 3), r(3)])
    case("max_pool2d", lambda x: F.max_pool2d(x, 2), [r(2, 3, 6, 6)])
    save_safetensors(os.path.join(OUT, "ref_ops.safetensors"), out, {"generator": "tests/ref/gen_refs.py",
                                                                        "torch": torch.__version__})


# ---------------------------------------------------------------- models
def dump_model(name, model, x, loss_fn, extra=None):
    """Weights use PyTorch's parameter names; grads are '<param>.grad'."""
    out = {}
    for pname, p in model.named_parameters():
        out[pname] = p.detach().clone()
    for k, v in (extra or {}).items():
        out[k] = v
    out["input"] = x
    y = model(x) if not isinstance(x, tuple) else model(*x)
    if isinstance(y, tuple):
        y = y[0]
    loss = loss_fn(y)
    loss.backward()
    out["output"] = y.detach()
    out["loss"] = loss.detach()
    for pname, p in model.named_parameters():
        out[pname + ".grad"] = p.grad.detach()
    save_safetensors(os.path.join(OUT, f"ref_{name}.safetensors"), out, {"generator": "tests/ref/gen_refs.py"})


def make_cnn():
    """The tutorial's MNIST CNN, shrunk: conv-relu-pool, conv-relu-pool, fc. A Sequential
    so parameter names ("0.weight", "3.weight", "7.weight") match mpr_sequential's."""
    return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(4, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Linear(8 * 3 * 3, 10))


class EmbLinear(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(20, 8)
        self.fc = nn.Linear(8, 5)

    def forward(self, idx):
        return self.fc(self.emb(idx))


class LSTMNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(input_size=4, hidden_size=6, num_layers=2, batch_first=True)
        self.fc = nn.Linear(6, 3)

    def forward(self, x):
        y, _ = self.lstm(x)
        return self.fc(y)


def gen_models():
    torch.manual_seed(7)
    g = torch.Generator().manual_seed(99)
    # MLP 12-16-10 (the fashion-mnist MLP's shape, shrunk) with cross-entropy
    mlp = nn.Sequential(nn.Linear(12, 16), nn.ReLU(), nn.Linear(16, 10))
    x = torch.rand(5, 12, generator=g)
    y = torch.randint(0, 10, (5,), generator=g)
    dump_model("mlp", mlp, x, lambda o: F.cross_entropy(o, y), {"target": y})
    # CNN on 1x12x12 images
    cnn = make_cnn()
    x = torch.rand(2, 1, 12, 12, generator=g)
    y = torch.randint(0, 10, (2,), generator=g)
    dump_model("cnn", cnn, x, lambda o: F.cross_entropy(o, y), {"target": y})
    # 2-layer LSTM, batch_first, then linear; loss = mse against a fixed target
    lstm = LSTMNet()
    x = torch.rand(2, 5, 4, generator=g) * 2 - 1
    t = torch.rand(2, 5, 3, generator=g)
    dump_model("lstm", lstm, x, lambda o: F.mse_loss(o, t), {"target": t})
    # 2-layer LSTM, time-major, with an initial state given and the final state used in the loss
    lstm2 = nn.LSTM(input_size=3, hidden_size=4, num_layers=2)
    x = torch.rand(6, 2, 3, generator=g) * 2 - 1
    h0 = (torch.rand(2, 2, 4, generator=g) - 0.5).requires_grad_(True)
    c0 = (torch.rand(2, 2, 4, generator=g) - 0.5).requires_grad_(True)
    out = {n: p.detach().clone() for n, p in lstm2.named_parameters()}
    out.update({"input": x, "h0": h0.detach().clone(), "c0": c0.detach().clone()})
    y, (hn, cn) = lstm2(x, (h0, c0))
    loss = (y ** 2).mean() + 0.1 * hn.sum() + 0.1 * (cn ** 2).sum()
    loss.backward()
    out.update({"output": y.detach(), "hn": hn.detach(), "cn": cn.detach(), "loss": loss.detach(),
                "h0.grad": h0.grad, "c0.grad": c0.grad})
    for n, p in lstm2.named_parameters():
        out[n + ".grad"] = p.grad
    save_safetensors(os.path.join(OUT, "ref_lstm_state.safetensors"), out, {"generator": "tests/ref/gen_refs.py"})
    # embedding + linear with cross-entropy over the flattened tokens
    el = EmbLinear()
    idx = torch.randint(0, 20, (3, 4), generator=g)
    y = torch.randint(0, 5, (12,), generator=g)
    dump_model("emb_linear", el, idx, lambda o: F.cross_entropy(o.reshape(-1, 5), y), {"target": y})


# ---------------------------------------------------------------- audit: more variants per op
def gen_audit_ops():
    """Variants of the ops in gen_ops (other dims, keepdim, no bias, strides and
    padding, ignore_index, 1-D matmul operands...) written to ref_audit_ops.safetensors
    for test_ref_ops; same layout as ref_ops.safetensors. Separate file and
    generator so ref_ops.safetensors stays byte-identical."""
    g = torch.Generator().manual_seed(4321)

    def r(*shape, lo=-1.0, hi=1.0):
        return (torch.rand(*shape, generator=g) * (hi - lo) + lo).float()

    out = {}

    def case(name, fn, inputs):
        record_case(out, r, name, fn, inputs)

    case("div_bcast_both", torch.div, [r(3, 1), r(1, 4, lo=0.5, hi=2.0)])
    case("pow_neg", lambda a: torch.pow(a, -1.5), [r(3, 4, lo=0.3, hi=2.0)])
    case("clamp_min_only", lambda a: torch.clamp(a, min=-0.2), [r(3, 4)])
    case("mean_dims12", lambda a: a.mean(dim=(1, 2)), [r(2, 3, 4)])
    case("sum_last_keep", lambda a: a.sum(dim=-1, keepdim=True), [r(2, 3, 4)])
    case("max_dim0_keep", lambda a: a.max(dim=0, keepdim=True).values, [r(4, 3)])
    case("matmul_vec_mat", torch.matmul, [r(4), r(4, 3)])
    case("matmul_mat_vec", torch.matmul, [r(3, 4), r(4)])
    case("matmul_bcast_both", torch.matmul, [r(2, 1, 3, 4), r(3, 4, 2)])
    case("linear_3d", F.linear, [r(2, 3, 5), r(4, 5), r(4)])
    case("linear_nobias", lambda x, w: F.linear(x, w), [r(6, 5), r(4, 5)])
    case("softmax_dim0", lambda a: F.softmax(a, dim=0), [r(3, 4, lo=-3, hi=3)])
    case("log_softmax_3d", lambda a: F.log_softmax(a, dim=-1), [r(2, 3, 4, lo=-3, hi=3)])
    tgt = torch.tensor([2, -100, 0, 4, -100])
    case("cross_entropy_ignore", F.cross_entropy, [r(5, 6, lo=-3, hi=3), tgt])
    case("nll_loss_ignore", F.nll_loss, [r(5, 6), tgt])
    case("cross_entropy_1d", F.cross_entropy, [r(6, lo=-3, hi=3), torch.tensor(3)])
    case("mse_loss_3d", F.mse_loss, [r(2, 3, 4), r(2, 3, 4)])
    case("embedding_3d", lambda w, i: F.embedding(i, w), [r(6, 4), torch.tensor([[[5, 0], [5, 5]], [[1, 0], [2, 5]]])])
    case("index_select_dim1", lambda a, i: torch.index_select(a, 1, i), [r(3, 5, 2), torch.tensor([4, 4, 0])])
    case("gather_dim0", lambda a, i: torch.gather(a, 0, i), [r(3, 4), torch.tensor([[2, 0, 1, 1], [0, 0, 2, 1]])])
    case("cat_dim0_3", lambda a, b, c: torch.cat([a, b, c], dim=0), [r(1, 3), r(2, 3), r(3, 3)])
    case("stack_dim2", lambda a, b: torch.stack([a, b], dim=2), [r(2, 3), r(2, 3)])
    case("conv2d_nobias_rect", lambda x, w: F.conv2d(x, w, None, stride=(2, 1), padding=(1, 2)),
         [r(2, 2, 5, 6), r(3, 2, 3, 2)])
    case("conv2d_1x1", lambda x, w, b: F.conv2d(x, w, b), [r(2, 3, 4, 4), r(5, 3, 1, 1), r(5)])
    case("max_pool2d_k3s2p1", lambda x: F.max_pool2d(x, 3, 2, 1), [r(2, 2, 7, 6)])
    case("max_pool2d_rect", lambda x: F.max_pool2d(x, (2, 3), (1, 2)), [r(1, 3, 5, 7)])
    save_safetensors(os.path.join(OUT, "ref_audit_ops.safetensors"), out,
                     {"generator": "tests/ref/gen_refs.py", "torch": torch.__version__})


def check_c_file(path):
    """Print the tensors of a safetensors file written by the C library (manual check)."""
    for k, v in load_safetensors(path).items():
        print(k, v.dtype, v.shape)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--check":
        check_c_file(sys.argv[2])
        sys.exit(0)
    os.makedirs(OUT, exist_ok=True)
    torch.set_num_threads(1)
    gen_io()
    gen_ops()
    gen_audit_ops()
    gen_models()
    total = sum(os.path.getsize(os.path.join(OUT, f)) for f in os.listdir(OUT))
    print(f"wrote reference files to {OUT} ({total} bytes)")
