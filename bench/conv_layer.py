"""One convolution layer, forward and both gradients: workbench's kernels, their GEMMs alone,
and PyTorch's convolution (oneDNN), on one CPU thread.

Run from the repository root::

    .venv/bin/python bench/conv_layer.py                      # the CNN's second layer, 8x8 and 32x32
    .venv/bin/python bench/conv_layer.py --sizes 8 --batch 256 --rounds 9

The layer is the second convolution of ``bench/models.py``'s CNN: 32 -> 64 channels, 3x3,
stride 1, "same" padding, float32, input laid out as the layer before leaves it (channel,
height, width, batch in memory). Contenders, timed in interleaved windows (the order rotates),
medians over rounds, milliseconds of the process's CPU time per forward + backward:

- ``workbench``: ``workbench.ops.im2col.conv``, ``conv_filter_grad`` and ``conv_input_grad``,
  the kernels the ``conv2d`` op and its gradients run on NumPy;
- ``workbench, one block``: the same kernels with ``im2col.BLOCK_BYTES`` unbounded, so each
  makes its whole im2col matrix at once (what the cache blocks save);
- ``GEMMs only``: the three matrix products those kernels make (forward, filter gradient,
  input gradient) on matrices built beforehand: what NumPy's BLAS alone takes;
- ``PyTorch``: ``torch.nn.functional.conv2d`` forward and ``torch.autograd.grad`` of both
  gradients (``torch.set_num_threads(1)``);
- ``sgemm peak``: one 1024x1024x1024 float32 product, the BLAS's best rate on this core.

GFLOP/s count the three GEMMs' 3 x 2 x O x C*kh*kw x Ho*Wo*N multiply-adds for every contender.
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"  # before numpy and torch load their BLAS

import argparse  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
from threadpoolctl import threadpool_limits  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from workbench.ops import im2col  # noqa: E402

torch.set_num_threads(1)
torch.set_num_interop_threads(1)

C_IN, C_OUT, K = 32, 64, 3


def contenders(batch: int, size: int):
    rng = np.random.default_rng(0)
    x_t = rng.standard_normal((C_IN, size, size, batch), dtype=np.float32)  # CHWN in memory
    x = im2col.chwn(x_t)  # the (N, C, H, W) view
    w = rng.standard_normal((C_OUT, C_IN, K, K), dtype=np.float32) * 0.05
    g = im2col.chwn(rng.standard_normal((C_OUT, size, size, batch), dtype=np.float32))
    stride, padding = (1, 1), "same"

    def workbench_step():
        im2col.conv(np, x, w, stride, padding)
        im2col.conv_filter_grad(np, x, g, w, stride, padding)
        im2col.conv_input_grad(np, g, x.shape, w, stride, padding)

    def one_block_step():  # the same kernels with every position in one block (no cache blocking)
        saved, im2col.BLOCK_BYTES = im2col.BLOCK_BYTES, 1 << 62
        try:
            workbench_step()
        finally:
            im2col.BLOCK_BYTES = saved

    cols = np.ascontiguousarray(im2col.columns(np, x, (K, K), stride, padding)[0])
    w2 = np.ascontiguousarray(w.reshape(C_OUT, -1))
    g2 = np.ascontiguousarray(im2col.channel_major(np, g))
    out_f = np.empty((C_OUT, cols.shape[1]), np.float32)
    out_w = np.empty(w2.shape, np.float32)
    out_x = np.empty(cols.shape, np.float32)

    def gemms():
        np.matmul(w2, cols, out=out_f)
        np.matmul(g2, cols.T, out=out_w)
        np.matmul(w2.T, g2, out=out_x)

    tx = torch.from_numpy(np.ascontiguousarray(x)).requires_grad_(True)
    tw = torch.from_numpy(w.copy()).requires_grad_(True)
    tg = torch.from_numpy(np.ascontiguousarray(g))

    def torch_step():
        y = torch.nn.functional.conv2d(tx, tw, padding=1)
        torch.autograd.grad(y, (tx, tw), tg)

    a = np.ones((1024, 1024), np.float32)
    b = np.ones((1024, 1024), np.float32)
    c = np.empty((1024, 1024), np.float32)

    def peak():
        np.matmul(a, b, out=c)

    flops = 3 * 2 * C_OUT * C_IN * K * K * size * size * batch
    return {
        "workbench": (workbench_step, flops),
        "workbench, one block": (one_block_step, flops),
        "GEMMs only": (gemms, flops),
        "PyTorch": (torch_step, flops),
        "sgemm peak": (peak, 2 * 1024**3),
    }


def window(fn, seconds: float) -> float:
    """CPU milliseconds per call over a window of at least ``seconds``."""
    fn()
    calls, start = 0, time.process_time()
    while True:
        fn()
        calls += 1
        spent = time.process_time() - start
        if spent >= seconds and calls >= 3:
            return spent / calls * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[8, 32])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=0.4, help="length of each timed window")
    args = parser.parse_args()
    print(f"torch {torch.__version__}, numpy {np.__version__}, one thread each; medians of {args.rounds} rounds")
    print("| input | contender | ms | GFLOP/s | vs PyTorch |")
    print("|:---|:---|---:|---:|---:|")
    with threadpool_limits(1):
        for size in args.sizes:
            runs = contenders(args.batch, size)
            names = list(runs)
            times = {name: [] for name in names}
            for r in range(args.rounds):
                order = names[r % len(names) :] + names[: r % len(names)]
                for name in order:
                    times[name].append(window(runs[name][0], args.seconds))
            ms = {name: statistics.median(t) for name, t in times.items()}
            for name in names:
                rate = runs[name][1] / (ms[name] * 1e-3) / 1e9
                versus = "" if name == "sgemm peak" else f"{ms['PyTorch'] / ms[name]:.2f}x"
                shape = f"({args.batch}, {C_IN}, {size}, {size})"
                print(f"| {shape} | {name} | {ms[name]:.2f} | {rate:.1f} | {versus} |")


if __name__ == "__main__":
    main()
