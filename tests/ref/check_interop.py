#!/usr/bin/python3
"""Check that files written by the C library are readable by NumPy/PyTorch tooling,
and write files back for the C side to read (used by tests/unit/test_audit_interop.c).

    /usr/bin/python3 tests/ref/check_interop.py DIR

DIR holds what the C test wrote:
  a_f32.npy     float32 [2, 3, 4], v[i] = 0.5 * i - 3
  a_f64_t.npy   float64 [4, 3], the transpose of arange(12).reshape(3, 4) * 1.1 (saved from a strided view)
  a_i64.npy     int64 [5], v[i] = i * 1000000007 - 2**40
  a_scalar.npy  float64 0-d, 2.5
  a_empty.npy   float32 [0, 3]
  model.safetensors  nn.Sequential(Linear(4, 3), ReLU(), Linear(3, 2)) parameters from the C module
  x.npy, y_c.npy     an input [5, 4] and the C module's output for it
This script loads them with numpy.load and a safetensors reader that validates the
layout as the `safetensors` package does (header JSON, dtypes, data_offsets sorted,
contiguous from 0 to the end of the file, sizes = numel * itemsize), loads the state
dict into the same torch model with strict=True, checks its output against y_c, and
then writes back:
  torch_y.npy             torch's output for x (np.save)
  model2.safetensors      the parameters * -0.5 + 0.1 (written by a plain writer)
  torch_y2.npy            the modified model's output for x
Exit status 0 and "interop ok" when every check passed.
"""
import json
import struct
import sys

import numpy as np

DTYPES = {"F32": np.float32, "F64": np.float64, "I64": np.int64, "I32": np.int32, "U8": np.uint8}


def fail(msg):
    print("interop FAILED:", msg)
    sys.exit(1)


def read_safetensors(path):
    raw = open(path, "rb").read()
    if len(raw) < 8:
        fail(f"{path}: shorter than 8 bytes")
    (n,) = struct.unpack("<Q", raw[:8])
    if 8 + n > len(raw):
        fail(f"{path}: header length {n} beyond the file")
    text = raw[8:8 + n].decode("utf-8")
    if not text.startswith("{"):
        fail(f"{path}: header does not start with '{{'")
    header = json.loads(text)
    data = raw[8 + n:]
    entries = []
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            if not all(isinstance(k, str) and isinstance(v, str) for k, v in e.items()):
                fail(f"{path}: metadata must map strings to strings")
            continue
        if set(e) != {"dtype", "shape", "data_offsets"}:
            fail(f"{path}: entry {name} has keys {sorted(e)}")
        dt = DTYPES.get(e["dtype"])
        if dt is None:
            fail(f"{path}: entry {name} has dtype {e['dtype']}")
        b, en = e["data_offsets"]
        numel = int(np.prod(e["shape"], dtype=np.int64))
        if en - b != numel * np.dtype(dt).itemsize:
            fail(f"{path}: entry {name} spans {en - b} bytes for shape {e['shape']}")
        entries.append((b, en, name))
        out[name] = np.frombuffer(data[b:en], dtype=np.dtype(dt).newbyteorder("<")).reshape(e["shape"])
    entries.sort()
    pos = 0
    for b, en, name in entries:
        if b != pos:
            fail(f"{path}: entry {name} starts at {b}, expected {pos} (holes or overlap)")
        pos = en
    if pos != len(data):
        fail(f"{path}: data is {len(data)} bytes, entries cover {pos}")
    return out, header.get("__metadata__", {})


def write_safetensors(path, tensors):
    header, blobs, off = {}, [], 0
    inv = {v: k for k, v in DTYPES.items()}
    for name, a in tensors.items():
        a = np.ascontiguousarray(a)
        b = a.astype(a.dtype.newbyteorder("<")).tobytes()
        header[name] = {"dtype": inv[a.dtype.type], "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def expect_npy(path, dtype, shape, values):
    a = np.load(path, allow_pickle=False)
    if a.dtype != np.dtype(dtype) or a.shape != tuple(shape):
        fail(f"{path}: got {a.dtype} {a.shape}, want {np.dtype(dtype)} {tuple(shape)}")
    if not np.array_equal(a, np.asarray(values, dtype=dtype).reshape(shape)):
        fail(f"{path}: values differ: {a!r}")
    # the same bytes through np.lib.format's reader on an open file (memory-mappable layout)
    m = np.load(path, mmap_mode="r")
    if a.size and not np.array_equal(np.asarray(m), a):
        fail(f"{path}: mmap load differs")


def main():
    d = sys.argv[1]
    expect_npy(f"{d}/a_f32.npy", np.float32, (2, 3, 4), np.arange(24) * 0.5 - 3)
    expect_npy(f"{d}/a_f64_t.npy", np.float64, (4, 3), (np.arange(12).reshape(3, 4) * 1.1).T)
    expect_npy(f"{d}/a_i64.npy", np.int64, (5,), np.arange(5, dtype=np.int64) * 1000000007 - 2 ** 40)
    expect_npy(f"{d}/a_scalar.npy", np.float64, (), 2.5)
    expect_npy(f"{d}/a_empty.npy", np.float32, (0, 3), [])

    params, _ = read_safetensors(f"{d}/model.safetensors")
    want = {"0.weight": (3, 4), "0.bias": (3,), "2.weight": (2, 3), "2.bias": (2,)}
    if {k: v.shape for k, v in params.items()} != want:
        fail(f"model.safetensors holds {{{', '.join(f'{k}: {v.shape}' for k, v in params.items())}}}")

    import torch
    import torch.nn as nn
    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))
    model.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in params.items()}, strict=True)
    x = torch.from_numpy(np.load(f"{d}/x.npy"))
    with torch.no_grad():
        y = model(x)
    y_c = np.load(f"{d}/y_c.npy")
    if not np.allclose(y.numpy(), y_c, rtol=1e-5, atol=1e-6):
        fail(f"torch output {y.numpy()!r} differs from the C output {y_c!r}")
    np.save(f"{d}/torch_y.npy", y.numpy())
    new = {k: (v * -0.5 + 0.1).astype(np.float32) for k, v in params.items()}
    write_safetensors(f"{d}/model2.safetensors", new)
    model.load_state_dict({k: torch.from_numpy(v) for k, v in new.items()}, strict=True)
    with torch.no_grad():
        np.save(f"{d}/torch_y2.npy", model(x).numpy())
    print("interop ok")


if __name__ == "__main__":
    main()
