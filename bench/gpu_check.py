"""One run on a GPU machine: correctness of every op and of a training step, then speed.

Run from the repository root (see bench/gpu_check.sh for the exact command)::

    python3 bench/gpu_check.py            # on a CUDA machine with CuPy (and PyTorch for the table)
    python3 bench/gpu_check.py --dry-run  # anywhere: NumPy in place of CuPy, tiny sizes

Part (a) checks every op with a kernel (the cases of tests/ops/test_kernels.py,
with freshly perturbed inputs) on the GPU namespace against NumPy float64, in
float32 and float64 with a norm-wise relative-error bound per dtype, then a
full MLP training step (Adam, so the fused kernels, the generated parameter-group
update and cross-entropy kernels run) against a float64 NumPy session, the other
optimizers (weight decay, clipping) and a mixed-precision step likewise, and six
steps replayed as CUDA graphs (matmuls through capturable cuBLAS) against six
plain ones. Part (b) times MLP and small-CNN training steps against PyTorch CUDA
eager on the same model and batch (workbench with CUDA graph replay on and off,
float32 and float16 compute), the host time per captured step, and measures the
device's matmul and copy ceilings and the bandwidth of fused elementwise kernels.
Exits 1 when a correctness check fails; the timings never fail the run, they are
reported against TARGETS.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import statistics
import sys
import time
import traceback

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import workbench as wb  # noqa: E402
from workbench.gpu import codegen  # noqa: E402
from workbench.ops.registry import REGISTRY  # noqa: E402

BOUNDS = {"float32": 2e-5, "float64": 1e-10}  # norm-wise relative error against float64
TARGETS = {"mlp_vs_torch": 1.2, "cnn_vs_torch": 0.9, "mixed_vs_float32": 1.3, "captured_step_host_us": 50.0,
           "fused_fraction_of_copy": 0.7}  # fmt: skip
STARTED = time.perf_counter()


class Env:
    """What the check runs on: CuPy on a GPU, or NumPy in a dry run."""

    def __init__(self, dry: bool):
        self.dry = dry
        self.session_options = {"device": "gpu", "emulate": True} if dry else {"device": "gpu"}
        if dry:
            self.cp, self.xp, self.name = None, np, f"NumPy {np.__version__} (dry run, no GPU)"
            self.compilers = ()
        else:
            from workbench.gpu import GPU, import_cupy

            self.cp, self.xp, _ = import_cupy()
            self.gpu = GPU()  # its fused-kernel compilers also serve the plans timed directly
            props = self.cp.cuda.runtime.getDeviceProperties(0)
            name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
            self.name = f"{name}, CuPy {self.cp.__version__}, CUDA runtime {self.cp.cuda.runtime.runtimeGetVersion()}"
            self.compilers = self.gpu.fused_compilers
        try:
            import torch

            self.torch = torch
            self.torch_device = "cpu" if dry or not torch.cuda.is_available() else "cuda"
        except ImportError:
            self.torch, self.torch_device = None, None

    def to_device(self, a):
        return np.array(a) if self.dry else self.cp.asarray(a)

    def to_host(self, a):
        return np.asarray(a) if self.dry else self.cp.asnumpy(a)

    def sync(self):
        if not self.dry:
            self.cp.cuda.Device().synchronize()
        if self.torch_device == "cuda":
            self.torch.cuda.synchronize()

    def time(self, fn, repeats=5, number=10) -> float:
        """Median seconds per call of ``fn`` over ``repeats`` windows of ``number`` calls (synchronized)."""
        fn()
        self.sync()
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            for _ in range(number):
                fn()
            self.sync()
            times.append((time.perf_counter() - t0) / number)
        return statistics.median(times)


def banner(text):
    print(f"\n== {text} " + "=" * max(0, 70 - len(text)), flush=True)


# -- (a) correctness ----------------------------------------------------------------------


def load_kernel_cases():
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "ops", "test_kernels.py")
    spec = importlib.util.spec_from_file_location("wb_kernel_cases", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.KERNEL_CASES


def fresh(a, rng):
    """The same kind of input with new values: floats scaled by U(0.9, 1.1) (signs and order of size kept)."""
    a = np.asarray(a)
    if a.dtype.kind == "f":
        return a * rng.uniform(0.9, 1.1, a.shape)
    return a


def as_dtype(a, dtype):
    a = np.asarray(a)
    return a.astype(dtype) if a.dtype.kind == "f" else a


def run_op(xp, name, inputs, attrs):
    opdef = REGISTRY[name]
    attrs = dict(attrs)
    if opdef.random:
        attrs["rng"] = np.random.default_rng(7)
    out = opdef.kernel(xp, *inputs, **attrs)
    return out if isinstance(out, tuple) else (out,)


def rel_error(got, ref) -> float:
    got, ref = np.asarray(got, dtype=np.float64), np.asarray(ref, dtype=np.float64)
    scale = np.linalg.norm(ref.ravel()) or 1.0
    return float(np.linalg.norm((got - ref).ravel()) / scale)


def typed_attrs(name, attrs, dtype):
    """The case's attributes with float data (a constant's value, a fused program's dtypes) in ``dtype``."""
    attrs = dict(attrs)
    if name == "constant":
        attrs["value"] = as_dtype(attrs["value"], dtype)
    if name == "fused_elementwise":
        attrs["program"] = tuple((k, r, a, dtype if d.startswith("float") else d) for k, r, a, d in attrs["program"])
    return attrs


def check_op_case(env, name, case, dtype, rng):
    """None if fine, else a one-line reason."""
    inputs = [as_dtype(fresh(a, rng), dtype) for a in case.inputs]
    attrs, ref_attrs = typed_attrs(name, case.attrs, dtype), typed_attrs(name, case.attrs, "float64")
    ref = run_op(np, name, [as_dtype(a, np.float64) for a in inputs], ref_attrs)
    same_dtype = run_op(np, name, inputs, attrs)
    got = run_op(env.xp, name, [env.to_device(a) for a in inputs], attrs)
    for k, (g, r, s) in enumerate(zip(got, ref, same_dtype)):
        g = env.to_host(g)
        if g.shape != np.shape(r):
            return f"output {k}: shape {g.shape}, expected {np.shape(r)}"
        if g.dtype != np.asarray(s).dtype:
            return f"output {k}: dtype {g.dtype}, NumPy gives {np.asarray(s).dtype}"
        if g.dtype.kind in "biu":
            if not np.array_equal(g, np.asarray(r).astype(g.dtype)):
                return f"output {k}: {int(np.sum(g != r))} of {g.size} values differ"
        else:
            bound = BOUNDS.get(g.dtype.name, BOUNDS["float32"])
            err = rel_error(g, r)
            if not err <= bound:
                return f"output {k}: relative error {err:.2e} > {bound:.0e}"
    return None


def check_every_op(env, report) -> bool:
    banner("(a) every op with a kernel, GPU namespace against NumPy float64")
    try:
        cases = load_kernel_cases()
    except Exception:  # noqa: BLE001 - report, and still run the rest
        traceback.print_exc()
        report["ops"] = {"error": "could not load tests/ops/test_kernels.py"}
        return False
    rng = np.random.default_rng(int(time.time()))
    with_kernel = sorted(n for n, d in REGISTRY.items() if d.kernel is not None)
    failures, rows = [], {}
    for name in with_kernel:
        if name not in cases:
            failures.append(f"{name}: no sample case in tests/ops/test_kernels.py")
            continue
        status = []
        for dtype in ("float32", "float64"):
            for i, case in enumerate(cases[name]):
                try:
                    reason = check_op_case(env, name, case, dtype, rng)
                except Exception as e:  # noqa: BLE001
                    reason = f"raised {type(e).__name__}: {e}"
                if reason is not None:
                    failures.append(f"{name}[{i}] {dtype}: {reason}")
                    status.append(f"{dtype}#{i} FAIL")
        rows[name] = "ok" if not status else ", ".join(status)
    ok = not failures
    print(f"{len(with_kernel)} ops, {sum(len(cases.get(n, ())) for n in with_kernel)} cases x 2 dtypes: "
          f"{'all within bounds' if ok else f'{len(failures)} FAILED'} (bounds {BOUNDS})")  # fmt: skip
    for f in failures:
        print("  FAIL", f)
    report["ops"] = {"count": len(with_kernel), "failures": failures, "bounds": BOUNDS}
    return ok


def mlp_graph(sizes, dtype="float32", optimizer="adam", name="mlp", mixed=False):
    """The MLP; ``mixed``: float16 compute on float32 masters with a dynamic loss scale;
    ``optimizer``: ``"adam"``, ``"sgd"`` or an optimizer object."""
    g = wb.Graph(name=name)
    with g.as_default(), wb.mixed_precision("float16" if mixed else "float32"):
        x = wb.placeholder("x", shape=(None, sizes[0]), dtype=dtype)
        y = wb.placeholder("y", shape=(None,), dtype="int64")
        h = x
        for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
            w = wb.variable(f"w{i}", shape=(a, b), dtype=dtype)
            bias = wb.variable(f"b{i}", shape=(b,), init=0.01, dtype=dtype)
            h = wb.matmul(h, w) + bias
            if i < len(sizes) - 2:
                h = wb.relu(h)
        loss = wb.mean(wb.softmax_cross_entropy(h, y), name="loss")
        if isinstance(optimizer, str):
            optimizer = wb.optimizers.Adam(1e-3) if optimizer == "adam" else wb.optimizers.SGD(0.1)
        opt = optimizer
        train = opt.minimize(loss, loss_scale="dynamic" if mixed else None)
    return g, train, loss


def check_training_step(env, report) -> bool:
    banner("(a) MLP training steps (Adam, fused kernels) against a NumPy float64 session")
    sizes = [64, 128, 128, 10]
    rng = np.random.default_rng(int(time.time()) + 1)
    X, Y = rng.normal(size=(256, sizes[0])), rng.integers(0, sizes[-1], 256)
    g64, train64, loss64 = mlp_graph(sizes, "float64")
    ref = wb.Session(g64, seed=3)
    ref_losses = [ref.run([train64, loss64], {"x": X, "y": Y})[1] for _ in range(3)]
    ok, rows = True, {}
    for dtype in ("float32", "float64"):
        g, train, loss = mlp_graph(sizes, dtype)
        sess = wb.Session(g, seed=3, **env.session_options)
        losses = [sess.run([train, loss], {"x": X.astype(dtype), "y": Y})[1] for _ in range(3)]
        loss_err = max(abs(a - b) / abs(b) for a, b in zip(losses, ref_losses))
        weight_err = max(rel_error(sess.variables[k], v) for k, v in ref.variables.items())
        bound = BOUNDS[dtype] * (50 if dtype == "float32" else 1e3)  # three Adam steps amplify rounding
        passed = loss_err <= bound and weight_err <= bound
        ok &= passed
        plan, *_ = sess.plans.values()
        fused = sum(op.type == "fused_elementwise" for op in plan.step_ops)
        tail = [op.type for op in plan.step_ops if op.type in ("fused_update", "softmax_cross_entropy_with_grad")]
        rows[dtype] = {"loss_rel_err": loss_err, "weights_rel_err": weight_err, "bound": bound, "kernel_calls": len(plan),
                       "fused_ops": fused, "fused_tail": tail, "ok": passed}  # fmt: skip
        print(f"{dtype}: loss rel err {loss_err:.2e}, weights rel err {weight_err:.2e} (bound {bound:.0e}); "
              f"{len(plan)} kernel calls per step, {fused} fused, then {tail} -> {'ok' if passed else 'FAIL'}")  # fmt: skip
    report["training_step"] = rows
    ok &= check_optimizers(env, report, X, Y, sizes, ref_losses)
    return ok & check_graph_replay(env, report, X, Y, sizes)


OPTIMIZERS = {
    "adamw_clipped": lambda: wb.optimizers.Adam(1e-3, weight_decay=0.01, clip_norm=1.0),
    "nesterov_decay": lambda: wb.optimizers.Momentum(0.05, nesterov=True, weight_decay=1e-3),
    "sgd_clipped": lambda: wb.optimizers.SGD(0.1, clip_norm=0.5),
}


def check_optimizers(env, report, X, Y, sizes, adam_losses) -> bool:
    """Three steps of each optimizer in float32 (one generated update kernel per step) and of
    mixed-precision Adam (float16 compute, dynamic loss scale) against float64 NumPy sessions."""
    ok, rows = True, {}
    for name, make in [*OPTIMIZERS.items(), ("adam_float16", None)]:
        g64, train64, loss64 = mlp_graph(sizes, "float64", optimizer=make() if make else "adam")
        ref = wb.Session(g64, seed=3)
        g, train, loss = mlp_graph(sizes, "float32", optimizer=make() if make else "adam", mixed=make is None)
        sess = wb.Session(g, seed=3, **env.session_options)
        got, want = [], []
        for _ in range(3):
            want.append(ref.run([train64, loss64], {"x": X, "y": Y})[1])
            got.append(sess.run([train, loss], {"x": X.astype(np.float32), "y": Y})[1])
        loss_err = max(abs(a - b) / abs(b) for a, b in zip(got, want))
        weight_err = max(rel_error(sess.variables[k], v) for k, v in ref.variables.items() if k in sess.variables)
        bound = 2e-2 if make is None else BOUNDS["float32"] * 50
        # float16 gradients: Adam's near-sign steps move the 0.01 biases differently where a gradient rounds to 0
        weight_bound = 1e-1 if make is None else bound
        passed = loss_err <= bound and weight_err <= weight_bound
        ok &= passed
        rows[name] = {"loss_rel_err": loss_err, "weights_rel_err": weight_err, "bound": bound, "ok": passed}
        print(f"{name}: loss rel err {loss_err:.2e} (bound {bound:.0e}), weights rel err {weight_err:.2e} (bound {weight_bound:.0e}) -> "
              f"{'ok' if passed else 'FAIL'}")  # fmt: skip
    report["optimizers"] = rows
    return ok


def check_graph_replay(env, report, X, Y, sizes) -> bool:
    """Six Adam steps with CUDA graph replay against six plain steps: same losses and weights."""
    g, train, loss = mlp_graph(sizes, "float32")
    plain = wb.Session(g, seed=3, **env.session_options, cuda_graphs=False)
    graphs = wb.Session(g, seed=3, **env.session_options, cuda_graphs=True)
    capture = getattr(graphs.device, "capture", None)
    if capture is not None and getattr(capture, "blas_error", None):
        print(f"  capturable cuBLAS unavailable: {capture.blas_error}")
    events = []
    graphs.events.subscribe(lambda e: events.append(e) if e["kind"] == "graph_capture" else None)
    feed = {"x": X.astype(np.float32), "y": Y}
    losses = [(plain.run([train, loss], feed)[1], graphs.run([train, loss], feed)[1]) for _ in range(6)]
    loss_err = max(abs(a - b) / abs(a) for a, b in losses)
    weight_err = max(rel_error(graphs.variables[k], v) for k, v in plain.variables.items())
    replays = graphs.device.graph_replays
    bound = 1e-5
    passed = loss_err <= bound and weight_err <= bound and (env.dry or replays == 3)
    print(f"CUDA graph replay, 6 steps: loss rel err {loss_err:.2e}, weights rel err {weight_err:.2e} (bound {bound:.0e}); "
          f"{replays} replays (expected {'0 in a dry run' if env.dry else 3}) -> {'ok' if passed else 'FAIL'}")  # fmt: skip
    for plan_graphs in graphs.device.plan_graphs():  # why a plan was or was not captured
        print(
            f"  plan of {len(plan_graphs.plan.steps)} steps: obstacle {plan_graphs.obstacle!r}, "
            f"signatures ready {len(plan_graphs.ready)}, captures {plan_graphs.captures}, replays {plan_graphs.replays}"
        )
        fresh = [n for n in plan_graphs.names if plan_graphs.plan.state.get(n) is None]
        if fresh:
            print(f"  variables missing from the state: {fresh}")
    for e in events:
        print(f"  graph_capture event: {e['status']} {e.get('reason') or e.get('signature')}")
    report["graph_replay"] = {"loss_rel_err": loss_err, "weights_rel_err": weight_err, "replays": replays, "ok": passed,
                              "events": [{k: str(v) for k, v in e.items()} for e in events]}  # fmt: skip
    return passed


def check_codegen(env, report) -> bool:
    """Every fused program of an Adam MLP plan generates CUDA source (and compiles, on a GPU)."""
    g, train, loss = mlp_graph([32, 64, 10], "float32")
    sess = wb.Session(g, **env.session_options)
    sess.run(train, {"x": np.zeros((8, 32), np.float32), "y": np.zeros(8, np.int64)})
    (plan,) = sess.plans.values()
    ops_ = [op for op in plan.step_ops if op.type == "fused_elementwise"]
    missing = [
        op.name for op in ops_ if codegen.kernel_source(op.attrs["program"], [t.dtype for t in op.inputs]) is None
    ]
    compiled = None if env.dry else sess.device.kernels.compiled
    print(f"fused programs in an Adam MLP step: {len(ops_)}, without CUDA source: {missing or 'none'}"
          + ("" if compiled is None else f", ElementwiseKernels built so far: {compiled}"))  # fmt: skip
    report["codegen"] = {"programs": len(ops_), "without_source": missing, "compiled": compiled}
    return not missing and (compiled is None or compiled > 0)


# -- (b) speed ------------------------------------------------------------------------------


def deadline_passed(limit) -> bool:
    return time.perf_counter() - STARTED > limit


def measure_ceilings(env, report, dry):
    banner("(b) device ceilings")
    rows = {}
    n = 256 if dry else 8192
    flops = 2 * n**3
    xp = env.xp
    a = env.to_device(np.random.default_rng(0).standard_normal((n, n), dtype=np.float32))
    t = env.time(lambda: xp.matmul(a, a), repeats=3, number=3 if dry else 5)
    rows["matmul_fp32_cupy_tflops"] = flops / t / 1e12
    torch = env.torch
    if torch is not None:
        dev = env.torch_device
        for label, dtype, tf32 in (
            ("fp32", torch.float32, False),
            ("tf32", torch.float32, True),
            ("bf16", torch.bfloat16, False),
        ):
            if dev == "cuda":
                torch.backends.cuda.matmul.allow_tf32 = tf32
            ta = torch.randn(n, n, device=dev, dtype=dtype)
            t = env.time(lambda: torch.matmul(ta, ta), repeats=3, number=3 if dry else 10)
            rows[f"matmul_{label}_torch_tflops"] = flops / t / 1e12
        if dev == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = False
    size = (1 << 20) if dry else (1 << 28)  # floats: 1 GiB on a GPU
    src = env.to_device(np.ones(size, np.float32))
    dst = env.to_device(np.zeros(size, np.float32))

    def copy():
        dst[...] = src

    t = env.time(copy, repeats=5, number=10)
    rows["copy_gbps"] = 2 * src.nbytes / t / 1e9  # read + write
    for k, v in rows.items():
        print(f"{k:32s} {v:10.1f}")
    report["ceilings"] = rows
    return rows


FUSED_CHAINS = {
    "bias+relu": lambda x, b: wb.relu(x + b),
    "adam moment": lambda m, g: 0.9 * m + 0.1 * g,
    "adam step": lambda m, v: 1e-3 * m / (wb.sqrt(v) + 1e-8),
    "8-op chain": lambda x, y: wb.tanh(wb.sigmoid(x * 1.5 - y) * 2.0 + wb.abs(y)) * 0.5 + x,
}


def measure_fused(env, report, copy_gbps, dry):
    banner("(b) fused elementwise kernels: achieved bandwidth")
    from workbench.graph.fusion import fuse_elementwise
    from workbench.graph.plan import Plan

    shape = (1 << 8, 1 << 10) if dry else (1 << 16, 1 << 10)  # 2-D, same shapes: the flat 1-D kernel path
    rng = np.random.default_rng(0)
    a = env.to_device(rng.random(shape, dtype=np.float32) + 0.5)
    b = env.to_device(rng.random(shape, dtype=np.float32) + 0.5)
    rows = {}
    for label, chain in FUSED_CHAINS.items():
        g = wb.Graph(name="chain")
        with g.as_default():
            p = wb.placeholder("a", shape=shape)
            q = wb.placeholder("b", shape=shape)
            out = chain(p, q)
        fused = fuse_elementwise(g, keep=[out.name], supported=codegen.supports_op)
        plans = {kind: Plan(graph, [out.name], ["a", "b"], env.xp, {}, compilers=env.compilers)
                 for kind, graph in (("fused", fused), ("unfused", g))}  # fmt: skip
        result = {}
        for kind, plan in plans.items():
            t = env.time(lambda: plan.run([a, b]), repeats=5, number=10)
            result[kind] = 3 * a.nbytes / t / 1e9  # two inputs read, one output written
        (op,) = [op for op in fused.operations if op.type == "fused_elementwise"]
        kernel = REGISTRY["fused_elementwise"].kernel
        program = op.attrs["program"]
        t = env.time(lambda: kernel(env.xp, a, b, program=program, compilers=env.compilers), repeats=5, number=10)
        result["kernel"] = 3 * a.nbytes / t / 1e9  # the kernel call alone, without the plan around it
        check = rel_error(env.to_host(plans["fused"].run([a, b])[0]), env.to_host(plans["unfused"].run([a, b])[0]))
        fraction = result["fused"] / copy_gbps
        rows[label] = {"fused_gbps": result["fused"], "kernel_gbps": result["kernel"], "unfused_gbps": result["unfused"],
                       "fraction_of_copy": fraction, "kernel_fraction_of_copy": result["kernel"] / copy_gbps,
                       "ops": len(plans["unfused"]), "rel_err": check}  # fmt: skip
        print(f"{label:12s} {len(plans['unfused'])} ops: fused {result['fused']:8.1f} GB/s ({fraction:5.0%} of copy), "
              f"kernel alone {result['kernel']:8.1f} GB/s ({result['kernel'] / copy_gbps:5.0%}), "
              f"unfused {result['unfused']:8.1f} GB/s, fused vs unfused rel err {check:.1e}")  # fmt: skip
    report["fused"] = rows
    return rows


def bench_host_overhead(env, report):
    """Microseconds per training step of a tiny MLP (16-16-16-10, batch 8, Adam), where the
    device does next to nothing: the host's Python and launch cost per step and per kernel call."""
    banner("(b) host overhead per step: tiny MLP, launches and Python dominate")
    sizes, batch = [16, 16, 16, 10], 8
    rng = np.random.default_rng(8)
    X = rng.standard_normal((batch, sizes[0]), dtype=np.float32)
    Y = rng.integers(0, sizes[-1], batch)
    g, train, _ = mlp_graph(sizes, "float32")
    sess = wb.Session(g, **env.session_options)
    dx, dy = env.to_device(X), env.to_device(Y)
    sess.run(train, {"x": dx, "y": dy})
    plan, *_ = sess.plans.values()
    kernels = getattr(sess.device, "kernels", None)
    vector_before = getattr(kernels, "vector_calls", 0)
    repeats, number = 5, 100
    step = env.time(lambda: sess.run(train, {"x": dx, "y": dy}), repeats=repeats, number=number)
    row = {"workbench_us": step * 1e6, "kernel_calls": len(plan), "us_per_call": step * 1e6 / len(plan),
           "vector_kernel_calls_per_step": (getattr(kernels, "vector_calls", 0) - vector_before) / (1 + repeats * number)}  # fmt: skip
    captured = wb.Session(g, **env.session_options, cuda_graphs=True)
    for _ in range(3):  # warm-up, warm-up, capture
        captured.run(train, {"x": dx, "y": dy})
    row["captured_us"] = env.time(lambda: captured.run(train, {"x": dx, "y": dy}), repeats=repeats, number=number) * 1e6
    row["captured_host_us"] = host_time(env, lambda: captured.run(train, {"x": dx, "y": dy}), number) * 1e6
    row["captured_replays"] = captured.device.graph_replays
    torch = env.torch
    if torch is not None:
        model, opt = torch_mlp_step(env, sizes, batch)
        tx, ty = torch.from_numpy(X).to(env.torch_device), torch.from_numpy(Y).to(env.torch_device)

        def torch_step():
            opt.zero_grad(set_to_none=True)
            torch.nn.functional.cross_entropy(model(tx), ty).backward()
            opt.step()

        row["torch_us"] = env.time(torch_step, repeats=5, number=100) * 1e6
        row["ratio"] = row["torch_us"] / row["workbench_us"]
    print(
        f"captured step: {row['captured_us']:8.1f} us/step, {row['captured_host_us']:6.1f} us of host time "
        f"({row['captured_replays']} replays)"
    )
    print(f"workbench {row['workbench_us']:8.1f} us/step, {len(plan)} kernel calls, {row['us_per_call']:5.1f} us/call, "
          f"{row['vector_kernel_calls_per_step']:.1f} vectorized fused calls/step; "
          f"torch {row.get('torch_us', float('nan')):8.1f} us/step; torch/workbench {row.get('ratio', float('nan')):.2f}")  # fmt: skip
    report["host_overhead"] = row
    return row


def host_time(env, fn, number) -> float:
    """Seconds of host time per call of ``fn``: calls queued back to back, without waiting for the device."""
    fn()
    env.sync()
    t0 = time.perf_counter()
    for _ in range(number):
        fn()
    host = (time.perf_counter() - t0) / number
    env.sync()
    return host


def torch_mlp_step(env, sizes, batch):
    torch = env.torch
    dev = env.torch_device
    layers = []
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        layers.append(torch.nn.Linear(a, b))
        if i < len(sizes) - 2:
            layers.append(torch.nn.ReLU())
    model = torch.nn.Sequential(*layers).to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    return model, opt


def bench_mlp(env, report, dry, limit):
    banner("(b) training steps/s: workbench device='gpu' against PyTorch eager (same model, batch, Adam, float32)")
    torch = env.torch
    sizes = [64, 128, 128, 10] if dry else [1024, 1024, 1024, 10]
    batches = (32, 128) if dry else (512, 4096)
    rows = []
    for batch in batches:
        if deadline_passed(limit):
            print(f"batch {batch}: skipped, time is up")
            continue
        rng = np.random.default_rng(batch)
        X = rng.standard_normal((batch, sizes[0]), dtype=np.float32)
        Y = rng.integers(0, sizes[-1], batch)
        g, train, loss = mlp_graph(sizes, "float32")
        sess = wb.Session(g, **env.session_options, cuda_graphs=True)
        plain = wb.Session(g, **env.session_options, cuda_graphs=False)
        dx, dy = env.to_device(X), env.to_device(Y)
        wb_dev = 1 / env.time(lambda: sess.run(train, {"x": dx, "y": dy}), number=20)
        wb_host = 1 / env.time(lambda: sess.run(train, {"x": X, "y": Y}), number=20)
        wb_plain = 1 / env.time(lambda: plain.run(train, {"x": dx, "y": dy}), number=20)
        row = {"model": "mlp " + "-".join(map(str, sizes)), "batch": batch, "workbench": wb_dev, "workbench_host_feeds": wb_host,
               "workbench_no_graphs": wb_plain, "graph_replays": sess.device.graph_replays}  # fmt: skip
        if torch is not None:
            model, opt = torch_mlp_step(env, sizes, batch)
            tx, ty = torch.from_numpy(X).to(env.torch_device), torch.from_numpy(Y).to(env.torch_device)
            px, py = torch.from_numpy(X), torch.from_numpy(Y)
            if env.torch_device == "cuda":
                px, py = px.pin_memory(), py.pin_memory()

            def step(x, y):
                opt.zero_grad(set_to_none=True)
                torch.nn.functional.cross_entropy(model(x), y).backward()
                opt.step()

            row["torch"] = 1 / env.time(lambda: step(tx, ty), number=20)
            row["torch_host_feeds"] = 1 / env.time(
                lambda: step(px.to(env.torch_device, non_blocking=True), py.to(env.torch_device, non_blocking=True)),
                number=20,
            )
            row["ratio"] = row["workbench"] / row["torch"]
        rows.append(row)
        g16, train16, _ = mlp_graph(sizes, mixed=True)  # float16 matmuls, float32 masters and loss
        mixed = wb.Session(g16, **env.session_options, cuda_graphs=True)
        mixed_plain = wb.Session(g16, **env.session_options, cuda_graphs=False)
        rows.append({"model": row["model"] + " f16", "batch": batch,
                     "workbench": 1 / env.time(lambda: mixed.run(train16, {"x": dx, "y": dy}), number=20),
                     "workbench_no_graphs": 1 / env.time(lambda: mixed_plain.run(train16, {"x": dx, "y": dy}), number=20),
                     "graph_replays": mixed.device.graph_replays})  # fmt: skip
        rows[-1]["vs_float32"] = rows[-1]["workbench"] / row["workbench"]
        print(
            f"batch {batch}: float16 compute {rows[-1]['vs_float32']:.2f}x float32; bfloat16: not run "
            "(CuPy arrays have no bfloat16 dtype; the generator writes bfloat16 kernels, see gpu/codegen.py)"
        )
    rows += bench_cnn(env, dry, limit)
    print(
        "wb steps/s: CUDA graph replay on (device feeds), on (host feeds), off (device feeds); replays: graph launches"
    )
    print(f"{'model':28s} {'batch':>6s} {'wb steps/s':>11s} {'(host feeds)':>12s} {'(no graphs)':>11s} {'replays':>8s} "
          f"{'torch':>9s} {'(host)':>9s} {'ratio':>6s}")  # fmt: skip
    nan = float("nan")
    for r in rows:
        print(f"{r['model']:28s} {r['batch']:6d} {r['workbench']:11.1f} {r.get('workbench_host_feeds', nan):12.1f} "
              f"{r.get('workbench_no_graphs', nan):11.1f} {r.get('graph_replays', -1):8d} "
              f"{r.get('torch', nan):9.1f} {r.get('torch_host_feeds', nan):9.1f} {r.get('ratio', nan):6.2f}")  # fmt: skip
    report["steps_per_s"] = rows
    return rows


def cnn_graph(channels, classes, size):
    g = wb.Graph(name="cnn")
    with g.as_default():
        x = wb.placeholder("x", shape=(None, channels, size, size))
        y = wb.placeholder("y", shape=(None,), dtype="int64")
        h = wb.relu(wb.conv2d(x, wb.variable("c1", shape=(16, channels, 3, 3), init="he_uniform"), padding="same"))
        h = wb.max_pool2d(h, 2)
        h = wb.relu(wb.conv2d(h, wb.variable("c2", shape=(32, 16, 3, 3), init="he_uniform"), padding="same"))
        h = wb.max_pool2d(h, 2)
        h = wb.reshape(h, (-1, 32 * (size // 4) ** 2))
        logits = wb.matmul(h, wb.variable("w", shape=(32 * (size // 4) ** 2, classes))) + wb.variable(
            "b", shape=(classes,), init="zeros"
        )
        loss = wb.mean(wb.softmax_cross_entropy(logits, y))
        train = wb.optimizers.Adam(1e-3).minimize(loss)
    return g, train


def bench_cnn(env, dry, limit):
    if deadline_passed(limit):
        print("cnn: skipped, time is up")
        return []
    torch = env.torch
    batch, size, channels, classes = (16, 8, 1, 10) if dry else (256, 32, 3, 10)
    rng = np.random.default_rng(5)
    X = rng.standard_normal((batch, channels, size, size), dtype=np.float32)
    Y = rng.integers(0, classes, batch)
    g, train = cnn_graph(channels, classes, size)
    sess = wb.Session(g, **env.session_options, cuda_graphs=True)
    plain = wb.Session(g, **env.session_options, cuda_graphs=False)
    dx, dy = env.to_device(X), env.to_device(Y)
    row = {"model": f"cnn conv16-conv32 {size}x{size}", "batch": batch,
           "workbench": 1 / env.time(lambda: sess.run(train, {"x": dx, "y": dy}), repeats=3, number=5),
           "workbench_no_graphs": 1 / env.time(lambda: plain.run(train, {"x": dx, "y": dy}), repeats=3, number=5)}  # fmt: skip
    row["graph_replays"] = sess.device.graph_replays
    if torch is not None:
        nn = torch.nn
        model = nn.Sequential(
            nn.Conv2d(channels, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(32 * (size // 4) ** 2, classes),
        ).to(env.torch_device)  # fmt: skip
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        tx, ty = torch.from_numpy(X).to(env.torch_device), torch.from_numpy(Y).to(env.torch_device)

        def step():
            opt.zero_grad(set_to_none=True)
            torch.nn.functional.cross_entropy(model(tx), ty).backward()
            opt.step()

        row["torch"] = 1 / env.time(step, repeats=3, number=5)
        row["ratio"] = row["workbench"] / row["torch"]
    return [row]


def verdicts(report):
    lines = []
    rows = report.get("steps_per_s", [])
    for r in rows:
        if "ratio" not in r:
            continue
        kind = "mlp_vs_torch" if r["model"].startswith("mlp") else "cnn_vs_torch"
        plain = r.get("workbench_no_graphs", float("nan")) / r["torch"]
        lines.append(f"{r['model']} at batch {r['batch']}: {r['ratio']:.2f}x PyTorch eager with CUDA graphs, {plain:.2f}x "
                     f"without (target >= {TARGETS[kind]}x): {'met' if r['ratio'] >= TARGETS[kind] else 'NOT met'}")  # fmt: skip
    for r in rows:
        if "vs_float32" in r:
            target = TARGETS["mixed_vs_float32"]
            lines.append(f"{r['model']} at batch {r['batch']}: {r['vs_float32']:.2f}x float32 (target >= {target}x): "
                         f"{'met' if r['vs_float32'] >= target else 'NOT met'}")  # fmt: skip
    overhead = report.get("host_overhead", {})
    if "captured_host_us" in overhead:
        target = TARGETS["captured_step_host_us"]
        lines.append(f"host time per captured step: {overhead['captured_host_us']:.1f} us (target < {target} us): "
                     f"{'met' if overhead['captured_host_us'] < target and overhead['captured_replays'] else 'NOT met'}")  # fmt: skip
    fused = report.get("fused", {})
    if fused:
        worst = min(fused.values(), key=lambda r: r["fraction_of_copy"])["fraction_of_copy"]
        target = TARGETS["fused_fraction_of_copy"]
        lines.append(f"fused chains: worst {worst:.0%} of copy bandwidth (target >= {target:.0%}): "
                     f"{'met' if worst >= target else 'NOT met'}")  # fmt: skip
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="NumPy in place of CuPy, tiny sizes (no GPU needed)")
    parser.add_argument(
        "--time-limit", type=float, default=240.0, help="skip the remaining timings after this many seconds"
    )
    parser.add_argument("--json", help="also write the report as JSON to this file")
    args = parser.parse_args(argv)
    dry = args.dry_run or os.environ.get("WB_GPU_CHECK_DRY") == "1"
    env = Env(dry)
    report = {"date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "device": env.name, "python": platform.python_version(),
              "numpy": np.__version__, "torch": getattr(env.torch, "__version__", None), "dry_run": dry}  # fmt: skip
    print(f"workbench GPU check, {report['date']}\ndevice: {env.name}\ntorch: {report['torch']} on {env.torch_device}")
    ok = True
    for check in (check_every_op, check_training_step, check_codegen):
        try:
            ok &= check(env, report)
        except Exception:  # noqa: BLE001 - a crash in one check must not hide the others
            traceback.print_exc()
            ok = False
    for section in ("ceilings", "fused", "overhead", "mlp"):
        try:
            if section == "ceilings":
                ceilings = measure_ceilings(env, report, dry)
            elif section == "fused" and not deadline_passed(args.time_limit):
                measure_fused(env, report, ceilings["copy_gbps"], dry)
            elif section == "overhead" and not deadline_passed(args.time_limit):
                bench_host_overhead(env, report)
            elif section == "mlp":
                bench_mlp(env, report, dry, args.time_limit)
        except Exception:  # noqa: BLE001 - timings are reported, never fatal
            traceback.print_exc()
    banner("summary")
    for line in verdicts(report):
        print(line)
    print(f"correctness: {'PASSED' if ok else 'FAILED'}; {time.perf_counter() - STARTED:.0f} s in all")
    report["correct"] = ok
    out = args.json or (os.path.join(os.environ["OUT"], "gpu_check.json") if os.environ.get("OUT") else None)
    if out:
        with open(out, "w") as f:
            json.dump(report, f, indent=1, default=float)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
