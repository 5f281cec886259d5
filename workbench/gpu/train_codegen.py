"""CUDA C for the fused training-step ops (see :mod:`workbench.ops.fused_train`); no CuPy needed.

:func:`update_kernel_source` writes one kernel for a ``fused_update`` op: a
grid-stride loop over the elements of all its lanes one after another, each
thread reading every input of its element, running the lane program (the same
expressions as fused elementwise kernels, :mod:`workbench.gpu.codegen`) and
writing the new values of the variables. An element's outputs are written after
all its inputs are read, so the outputs may be the variables' own arrays.

:func:`cross_entropy_kernel_source` writes the kernel of
``softmax_cross_entropy_with_grad``: one thread per row (the classes of a row
in a loop), the loss row and the logits' gradient written in one pass, the
softmax never stored.

Half-precision values are computed in float, like everywhere in the generator.
"""

from __future__ import annotations

import zlib

from workbench.gpu.codegen import C_TYPES, HEADERS, STORAGE, body_lines, load, store

#: Threads per block of these kernels.
BLOCK = 256
# NVRTC compiles without the C headers that define INFINITY and NAN; these are device intrinsics
INFINITY, NAN = "__int_as_float(0x7f800000)", "__int_as_float(0x7fc00000)"


def _headers(dtypes) -> list[str]:
    return sorted({HEADERS[d] for d in dtypes if d in HEADERS})


def _named(prefix: str, text: str) -> str:
    return f"{prefix}_{zlib.crc32(text.encode()):08x}"


def update_kernel_source(program, dtypes, stores, lanes: int, width: int) -> tuple[str, str] | None:
    """``(name, CUDA source)`` of a ``fused_update`` kernel, or None when the generator cannot.

    ``dtypes``: of one lane's program inputs, its ``width`` own then the shared ones.
    Signature: every lane's inputs (lane after lane), every lane's outputs, each
    lane's element count (``long long``), then the shared inputs (one element each).
    """
    found = body_lines(program, dtypes, dialect="raw", loaded=True)
    if found is None:
        return None
    lines, _, _ = found
    out_dtypes = [dtypes[k] for k in range(len(stores))]
    step_dtypes = list(dtypes) + [step[3] for step in program]
    if any(step_dtypes[r] != d for r, d in zip(stores, out_dtypes)):
        return None
    shared = range(width, len(dtypes))
    args = [f"const {C_TYPES[d]} in{i}" for i, d in enumerate(dtypes)] + [
        f"{C_TYPES[d]}& r{k}" for k, d in enumerate(out_dtypes)
    ]
    results = [f"    r{k} = {_value(r, len(dtypes))};" for k, r in enumerate(stores)]
    lane_fn = "\n".join(
        [
            "__device__ __forceinline__ void wb_lane(" + ", ".join(args) + ") {",
            *(f"    {line}" for line in lines),
            *results,
            "}",
        ]
    )
    params = [f"const {STORAGE[dtypes[i]]}* l{lane}_{i}" for lane in range(lanes) for i in range(width)]
    params += [f"{STORAGE[d]}* o{lane}_{k}" for lane in range(lanes) for k, d in enumerate(out_dtypes)]
    params += [f"long long n{lane}" for lane in range(lanes)]
    params += [f"const {STORAGE[dtypes[i]]}* s{i}" for i in shared]
    name = _named("wb_update", f"{lane_fn} {lanes} {width}")
    body = [
        f'extern "C" __global__ void {name}({", ".join(params)}) {{',
        *(f"    const {C_TYPES[dtypes[i]]} sh{i} = {load(f's{i}[0]', dtypes[i], 'raw')};" for i in shared),
        "    const long long total = " + " + ".join(f"n{lane}" for lane in range(lanes)) + ";",
        "    const long long stride = (long long)blockDim.x * gridDim.x;",
        "    for (long long j = (long long)blockIdx.x * blockDim.x + threadIdx.x; j < total; j += stride) {",
        "        long long i = j;",
        *(line for lane in range(lanes) for line in _lane_lines(lane, width, dtypes, out_dtypes, lane == lanes - 1)),
        "    }",
        "}",
    ]
    return name, "\n".join([*_headers(dtypes), lane_fn, "", *body]) + "\n"


def _value(ref: int, n_inputs: int) -> str:
    return f"in{ref}" if ref < n_inputs else f"v{ref}"


def _lane_lines(lane: int, width: int, dtypes, out_dtypes, last: bool) -> list[str]:
    """The loop's branch for lane ``lane``: run the lane program on element ``i`` of its arrays."""
    args = [load(f"l{lane}_{i}[i]", dtypes[i], "raw") for i in range(width)] + [
        f"sh{i}" for i in range(width, len(dtypes))
    ]
    outs = [f"r{k}" for k in range(len(out_dtypes))]
    lines = [
        *(f"{C_TYPES[d]} r{k};" for k, d in enumerate(out_dtypes)),
        f"wb_lane({', '.join(args + outs)});",
        *(f"o{lane}_{k}[i] = {store(f'r{k}', d, 'raw')};" for k, d in enumerate(out_dtypes)),
    ]
    if last:
        return [f"        {{ {' '.join(lines)} }}"]
    return [f"        if (i < n{lane}) {{ {' '.join(lines)} continue; }}", f"        i -= n{lane};"]


def cross_entropy_kernel_source(dtype: str, label_dtype: str, mean: bool) -> tuple[str, str] | None:
    """``(name, CUDA source)`` of ``softmax_cross_entropy_with_grad`` for one-element upstream gradients.

    Signature: ``(logits, labels, upstream, loss, dlogits, long long rows, long long classes,
    long long count)``; the gradient of row ``r`` is ``upstream / count`` (``mean``) or
    ``upstream``. A label outside ``0 .. classes - 1`` gives NaN in its row.
    """
    if (
        dtype not in ("float16", "bfloat16", "float32", "float64")
        or label_dtype not in C_TYPES
        or label_dtype.startswith("f")
    ):
        return None
    t, s, lt = C_TYPES[dtype], STORAGE[dtype], C_TYPES[label_dtype]
    x, picked = load("z[c]", dtype, "raw"), load("z[y]", dtype, "raw")
    scale = f"{load('upstream[0]', dtype, 'raw')}" + (f" / ({t})count" if mean else "")
    name = _named("wb_sce_grad", f"{dtype} {label_dtype} {mean}")
    lines = [
        *_headers([dtype]),
        f'extern "C" __global__ void {name}(const {s}* logits, const {lt}* labels, const {s}* upstream, {s}* loss, '
        f"{s}* dlogits, long long rows, long long classes, long long count) {{",
        f"    const {t} g = {scale};",
        "    const long long stride = (long long)blockDim.x * gridDim.x;",
        "    for (long long row = (long long)blockIdx.x * blockDim.x + threadIdx.x; row < rows; row += stride) {",
        f"        const {s}* z = logits + row * classes;",
        f"        {s}* d = dlogits + row * classes;",
        "        const long long y = (long long)labels[row];",
        "        if (y < 0 || y >= classes) {",
        f"            loss[row] = {store(f'({t}){NAN}', dtype, 'raw')};",
        f"            for (long long c = 0; c < classes; ++c) d[c] = {store(f'({t}){NAN}', dtype, 'raw')};",
        "            continue;",
        "        }",
        f"        {t} m = -({t}){INFINITY};",
        f"        for (long long c = 0; c < classes; ++c) {{ const {t} v = {x}; if (v > m || v != v) m = v; }}",  # NaN wins
        f"        {t} sum = 0;",
        f"        for (long long c = 0; c < classes; ++c) sum += exp({x} - m);",
        f"        loss[row] = {store(f'log(sum) - ({picked} - m)', dtype, 'raw')};",
        "        for (long long c = 0; c < classes; ++c) {",
        f"            const {t} p = exp({x} - m) / sum;",
        f"            d[c] = {store(f'(p - (c == y ? ({t})1 : ({t})0)) * g', dtype, 'raw')};",
        "        }",
        "    }",
        "}",
    ]
    return name, "\n".join(lines) + "\n"


def grid(n: int, multiprocessors: int) -> int:
    """Blocks of a launch over ``n`` threads' work: enough for every item, at most 8 per SM."""
    return max(1, min(multiprocessors * 8, (n + BLOCK - 1) // BLOCK))
