"""Anchor: PyTorch 1.13 torch.distributed.rpc (TensorPipe) echoing lists of tensors,
the same lists bench_rpc's tensor_list_echo and param_list_echo lines send:
256 x 1 KiB and 4096 x 256 B uint8 tensors, and ResNet-18's 62 float32
parameter tensors (torchvision's resnet18() named_parameters() shapes, built
here without torchvision; bench_rpc.c lists the same shapes).
Prints one JSON line per list: median microseconds of rpc_sync(echo) round trips.
Run: /usr/bin/python3 tests/bench/torch_param_echo.py [--quick]
(spawns 2 processes on localhost, as ../shared/anchors/torch_rpc_bench.py does)"""
import json
import os
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed.rpc as rpc
import torch.multiprocessing as mp


def echo(x):
    return x


def resnet18_shapes():
    shapes = [(64, 3, 7, 7), (64,), (64,)]
    widths = [64, 128, 256, 512]
    for layer, w in enumerate(widths):
        cin = widths[layer - 1] if layer else 64
        for block in range(2):
            shapes += [(w, w if block else cin, 3, 3), (w,), (w,), (w, w, 3, 3), (w,), (w,)]
            if layer > 0 and block == 0:
                shapes += [(w, cin, 1, 1), (w,), (w,)]
    shapes += [(1000, 512), (1000,)]
    assert len(shapes) == 62
    return shapes


def median_us(fn, reps):
    fn()
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def run(rank, world, port, out, quick):
    os.environ['MASTER_ADDR'] = '127.0.0.1'
    os.environ['MASTER_PORT'] = str(port)
    opts = rpc.TensorPipeRpcBackendOptions(num_worker_threads=4, rpc_timeout=120)
    rpc.init_rpc(f"worker{rank}", rank=rank, world_size=world, rpc_backend_options=opts)
    if rank == 0:
        lines = []
        for count, nbytes in [(256, 1024), (4096, 256)]:
            lst = [torch.full((nbytes,), i % 256, dtype=torch.uint8) for i in range(count)]
            reps = (10 if quick else 50) if count <= 256 else (3 if quick else 10)  # 4096: ~1.6 s each
            us = median_us(lambda: rpc.rpc_sync("worker1", echo, args=(lst,)), reps)
            lines.append({"name": "torch_tensor_list_echo", "tensors": count, "bytes_each": nbytes,
                          "median_us": round(us, 3)})
        params = [torch.ones(s) for s in resnet18_shapes()]
        nbytes = sum(p.numel() * 4 for p in params)
        us = median_us(lambda: rpc.rpc_sync("worker1", echo, args=(params,)), 3 if quick else 10)
        lines.append({"name": "torch_param_list_echo", "model": "resnet18", "tensors": len(params),
                      "bytes": nbytes, "median_us": round(us, 3)})
        with open(out, 'w') as f:
            f.write("".join(json.dumps(l, separators=(',', ':')) + "\n" for l in lines))
    rpc.shutdown()


if __name__ == '__main__':
    quick = '--quick' in sys.argv[1:]
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, 'out.jsonl')
        port = 29600 + os.getpid() % 300
        mp.spawn(run, args=(2, port, out, quick), nprocs=2, join=True)
        print(open(out).read(), end='')
