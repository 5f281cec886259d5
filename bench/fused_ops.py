"""Forward + backward time of the fused ops (layer_norm, gelu, attention) against the same maths
composed from primitive ops, and against PyTorch eager (CPU), one thread each.

    python bench/fused_ops.py [--rounds 7]

Each case runs ``value, *gradients`` of ``sum(op(inputs) * weights)`` in float32; interleaved
rounds of ~0.3 s, medians of the per-round times.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time

import numpy as np
from threadpoolctl import threadpool_limits

import workbench as wb


def layer_norm_composite(x, s, o):
    mean = wb.mean(x, axis=-1, keepdims=True)
    c = x - mean
    var = wb.mean(c * c, axis=-1, keepdims=True)
    return c / wb.sqrt(var + 1e-5) * s + o


def gelu_composite(x):
    return 0.5 * x * (1.0 + wb.erf(x * (1 / math.sqrt(2))))


def attention_composite(q, k, v):
    s = wb.matmul(q, k, transpose_b=True) * (1 / math.sqrt(q.shape[-1]))
    return wb.matmul(wb.softmax(s), v)


CASES = {
    "layer_norm (256x64, 512)": (lambda x, s, o: wb.layer_norm(x, s, o), layer_norm_composite, [(256, 64, 512), (512,), (512,)]),
    "gelu (256x64, 512)": (wb.gelu, gelu_composite, [(256, 64, 512)]),
    "attention (64, 4, 64, 32)": (wb.scaled_dot_product_attention, attention_composite, [(64, 4, 64, 32)] * 3),
}  # fmt: skip


def workbench_step(fn, shapes):
    rng = np.random.default_rng(0)
    g = wb.Graph()
    with g.as_default():
        xs = [wb.placeholder(f"in{i}", shape=s) for i, s in enumerate(shapes)]
        y = fn(*xs)
        loss = wb.sum(y * wb.constant(rng.standard_normal(y.shape).astype(np.float32)))
        grads = wb.gradients(loss, xs)
    feeds = {x: rng.standard_normal(s).astype(np.float32) for x, s in zip(xs, shapes)}
    sess = wb.Session(g)
    fetches = [loss, *grads]
    return lambda: sess.run(fetches, feeds)


def torch_step(name, shapes):
    import torch

    F = torch.nn.functional
    rng = np.random.default_rng(0)
    xs = [torch.tensor(rng.standard_normal(s).astype(np.float32), requires_grad=True) for s in shapes]
    if name.startswith("layer_norm"):
        fn = lambda x, s, o: F.layer_norm(x, (shapes[1][0],), s, o)  # noqa: E731
    elif name.startswith("gelu"):
        fn = F.gelu
    else:
        fn = F.scaled_dot_product_attention
    w = torch.tensor(rng.standard_normal(tuple(fn(*xs).shape)).astype(np.float32))

    def step():
        for x in xs:
            x.grad = None
        (fn(*xs) * w).sum().backward()

    return step


def rate(step, seconds=0.3):
    step()
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        step()
        n += 1
    return (time.perf_counter() - start) / n


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    try:
        import torch

        torch.set_num_threads(1)
    except ImportError:
        torch = None
    with threadpool_limits(1):
        print("| case | fused ms | composite ms | composite/fused | torch ms | torch/fused |")
        print("|---|---:|---:|---:|---:|---:|")
        for name, (fused, composite, shapes) in CASES.items():
            steps = [workbench_step(fused, shapes), workbench_step(composite, shapes)]
            if torch is not None:
                steps.append(torch_step(name, shapes))
            times = [[] for _ in steps]
            for _ in range(args.rounds):
                for t, step in zip(times, steps):
                    t.append(rate(step))
            med = [statistics.median(t) * 1e3 for t in times]
            theirs = f"{med[2]:.2f} | {med[2] / med[0]:.2f}x" if torch is not None else "- | -"
            print(f"| {name} | {med[0]:.2f} | {med[1]:.2f} | {med[1] / med[0]:.2f}x | {theirs} |")


if __name__ == "__main__":
    main()
