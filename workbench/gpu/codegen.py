"""CUDA C for fused elementwise programs: one expression per op, one kernel per program.

:func:`kernel_source` turns a ``fused_elementwise`` program (see
:mod:`workbench.ops.fused`) and its input dtypes into the three strings of a
``cupy.ElementwiseKernel``: input parameters, output parameter and loop body.
Nothing here imports CuPy, so the generated code is tested on any machine.

>>> program = (("add", (0, 1), (), "float32"), ("relu", (2,), (), "float32"))
>>> params, out, body = kernel_source(program, ("float32", "float32"))
>>> params, out
('float32 in0, float32 in1', 'float32 out0')
>>> print(body)
const float v2 = in0 + in1;
const float v3 = (v2 > (float)0 || v2 != v2) ? v2 : (float)0;
out0 = v3;
"""

from __future__ import annotations

import math
import zlib

import numpy as np

from workbench.ops.registry import FLOATS

#: C type a generated kernel computes each dtype in: float16 and bfloat16 values are
#: computed in float and rounded once, when stored (or at a ``cast`` to them).
C_TYPES = {
    "bool": "bool",
    "int8": "signed char",
    "int16": "short",
    "int32": "int",
    "int64": "long long",
    "uint8": "unsigned char",
    "float16": "float",
    "bfloat16": "float",
    "float32": "float",
    "float64": "double",
}

#: How a stored half-precision value is read as float and written back, per kind of kernel:
#: ``elementwise`` (``cupy.ElementwiseKernel``, whose ``float16`` converts itself) and ``raw``
#: (CUDA C with ``cuda_fp16.h``/``cuda_bf16.h``). CuPy arrays have no bfloat16: raw kernels only.
HALF = {
    "elementwise": {"float16": ("((float){})", "(float16)({})")},
    "raw": {
        "float16": ("__half2float({})", "__float2half({})"),
        "bfloat16": ("__bfloat162float({})", "__float2bfloat16({})"),
    },
}
#: The C type of stored elements in raw kernels.
STORAGE = {**C_TYPES, "float16": "__half", "bfloat16": "__nv_bfloat16"}
HEADERS = {"float16": "#include <cuda_fp16.h>", "bfloat16": "#include <cuda_bf16.h>"}
FLOAT_DTYPES = (*FLOATS, "bfloat16")
#: Dtypes each kind of kernel can hold (CuPy arrays, and so elementwise kernels, have no bfloat16).
C_HALF_OK = {"elementwise": frozenset(C_TYPES) - {"bfloat16"}, "raw": frozenset(C_TYPES)}

FLOAT_ONLY = frozenset(
    {"divide", "pow", "exp", "log", "sqrt", "tanh", "sigmoid", "relu", "relu_grad", "rsqrt", "erf", "gelu", "gelu_grad"}
)

#: The C expression of each op: ``{0}``, ``{1}`` ... are its arguments, ``{T}`` the C
#: type of its result. Ops missing here (or with a dtype outside C_TYPES) stay unfused.
C_EXPRESSIONS = {
    "add": "{0} + {1}",
    "subtract": "{0} - {1}",
    "multiply": "{0} * {1}",
    "divide": "{0} / {1}",
    "pow": "pow({0}, {1})",
    "maximum": "({0} > {1} || {0} != {0}) ? {0} : {1}",  # NaN wins, as in NumPy
    "minimum": "({0} < {1} || {0} != {0}) ? {0} : {1}",
    "less": "{0} < {1}",
    "less_equal": "{0} <= {1}",
    "greater": "{0} > {1}",
    "greater_equal": "{0} >= {1}",
    "equal": "{0} == {1}",
    "not_equal": "{0} != {1}",
    "negative": "-{0}",
    "exp": "exp({0})",
    "log": "log({0})",
    "sqrt": "sqrt({0})",
    "tanh": "tanh({0})",
    "sigmoid": "({T})0.5 * tanh(({T})0.5 * {0}) + ({T})0.5",  # the kernel's tanh form
    "relu": "({0} > ({T})0 || {0} != {0}) ? {0} : ({T})0",
    "abs": "({0} < ({T})0) ? -{0} : {0}",
    "sign": "({0} > ({T})0) ? ({T})1 : (({0} < ({T})0) ? ({T})-1 : {0})",  # keeps 0 and NaN
    "where": "{0} ? {1} : {2}",
    "relu_grad": "({1} > ({T})0) ? {0} : ({T})0",
    "cast": "({T})({0})",
    "identity": "{0}",
    "stop_gradient": "{0}",
    "zeros_like": "({T})0",
    "ones_like": "({T})1",
    "rsqrt": "({T})1 / sqrt({0})",
    "square": "{0} * {0}",
    "erf": "erf({0})",
    "clip": "({0} < {1}) ? {1} : (({0} > {2}) ? {2} : {0})",  # min(max(x, lo), hi); NaN stays NaN
    # exact GELU; expression() swaps in the tanh forms for approximate="tanh"
    "gelu": "({T})0.5 * {0} * (({T})1 + erf({0} * ({T})0.7071067811865476))",
    "gelu_grad": "{0} * (({T})0.5 * (({T})1 + erf({1} * ({T})0.7071067811865476))"
    " + {1} * ({T})0.3989422804014327 * exp(({T})-0.5 * {1} * {1}))",
}

#: ``approximate="tanh"`` forms of gelu and its gradient (``t`` = tanh(sqrt(2/pi) (x + 0.044715 x^3))).
_GELU_TANH_T = "tanh(({T})0.7978845608028654 * ({X} + ({T})0.044715 * {X} * {X} * {X}))"
GELU_TANH = {
    "gelu": "({T})0.5 * {0} * (({T})1 + " + _GELU_TANH_T.replace("{X}", "{0}") + ")",
    "gelu_grad": "{0} * (({T})0.5 * (({T})1 + " + _GELU_TANH_T.replace("{X}", "{1}") + ") + ({T})0.5 * {1} * "
    "(({T})1 - " + _GELU_TANH_T.replace("{X}", "{1}") + " * " + _GELU_TANH_T.replace("{X}", "{1}") + ") * "
    "({T})0.7978845608028654 * (({T})1 + ({T})0.134145 * {1} * {1}))",
}


def supported(op_type: str, in_dtypes, out_dtype: str) -> bool:
    """Whether the generator has an expression for this op with these dtypes."""
    if op_type not in C_EXPRESSIONS or out_dtype not in C_TYPES or any(d not in C_TYPES for d in in_dtypes):
        return False
    if op_type in FLOAT_ONLY and out_dtype not in FLOAT_DTYPES:
        return False
    if op_type in ("negative", "abs", "sign") and out_dtype == "bool":
        return False
    return True


def supports_op(op) -> bool:
    """:func:`supported` for a graph operation (the fusion pass's ``supported`` predicate)."""
    return supported(op.type, [t.dtype for t in op.inputs], op.outputs[0].dtype)


def rounded(value: float, dtype: str) -> float:
    """``value`` rounded to ``dtype`` (to nearest, ties to even), as a Python float."""
    if dtype == "bfloat16":  # the top 16 bits of the float32, rounded
        bits = int(np.array(value, np.float32).view(np.uint32))
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        return float(np.array(bits, np.uint32).view(np.float32))
    return float(np.dtype(dtype).type(value))


def literal(value, dtype: str) -> str:
    """A C literal of ``value`` as ``dtype``: exact for every float dtype."""
    if dtype == "bool":
        return "true" if value else "false"
    if dtype in FLOAT_DTYPES:
        value = rounded(float(value), dtype)
        if not math.isfinite(value):
            raise ValueError(f"no C literal for {value}")
        return f"({C_TYPES[dtype]}){value!r}"  # repr is exact; float32 values round-trip
    return f"({C_TYPES[dtype]}){int(value)}"


def load(name: str, dtype: str, dialect: str) -> str:
    """The C expression reading stored element ``name`` of ``dtype`` in its compute type."""
    half = HALF[dialect].get(dtype)
    return half[0].format(name) if half else name


def store(value: str, dtype: str, dialect: str) -> str:
    """The C expression turning a computed ``value`` into a stored element of ``dtype``."""
    half = HALF[dialect].get(dtype)
    return half[1].format(value) if half else value


def expression(op_type: str, args, out_dtype: str, attrs: dict | None = None, dialect: str = "elementwise") -> str:
    """The C expression of one step; ``args`` are C names or literals."""
    ctype = C_TYPES[out_dtype]
    if op_type == "cast" and out_dtype == "bool":
        return f"({args[0]} != 0)"
    if op_type == "cast" and out_dtype in HALF[dialect]:  # computed in float, but rounded here as NumPy does
        return load(store(args[0], out_dtype, dialect), out_dtype, dialect)
    if op_type in GELU_TANH and (attrs or {}).get("approximate") == "tanh":
        return GELU_TANH[op_type].format(*args, T=ctype)
    return C_EXPRESSIONS[op_type].format(*args, T=ctype)


def body_lines(
    program, in_dtypes, dialect: str = "elementwise", loaded: bool = False
) -> tuple[list[str], str, str] | None:
    """The C lines of ``program`` over inputs ``in0``, ``in1`` ...: ``(lines, result name, result dtype)``.

    ``loaded``: the inputs are values in their compute types already, not stored elements.
    """
    dtypes = list(in_dtypes)
    if any(d not in C_TYPES or d not in C_HALF_OK[dialect] for d in dtypes):
        return None
    names = [f"in{i}" if loaded else load(f"in{i}", d, dialect) for i, d in enumerate(dtypes)]
    lines = []
    for kind, refs, attrs, dtype in program:
        k = len(names)
        if dtype not in C_HALF_OK[dialect]:
            return None
        if kind == "constant":
            value = attrs[0][1]
            if dtype not in C_TYPES or (isinstance(value, float) and not math.isfinite(value)):
                return None
            names.append(literal(value, dtype))
            dtypes.append(dtype)
            continue
        if not supported(kind, [dtypes[r] for r in refs], dtype):
            return None
        expr = expression(kind, [names[r] for r in refs], dtype, dict(attrs), dialect)
        lines.append(f"const {C_TYPES[dtype]} v{k} = {expr};")
        names.append(f"v{k}")
        dtypes.append(dtype)
    return lines, names[-1], dtypes[-1]


def kernel_source(program, in_dtypes) -> tuple[str, str, str] | None:
    """``(in_params, out_params, body)`` of a ``cupy.ElementwiseKernel``, or None if unsupported."""
    found = body_lines(program, in_dtypes)
    if found is None:
        return None
    lines, result, out_dtype = found
    params = ", ".join(f"{d} in{i}" for i, d in enumerate(in_dtypes))
    return params, f"{out_dtype} out0", "\n".join([*lines, f"out0 = {store(result, out_dtype, 'elementwise')};"])


#: Threads per block of the vectorized kernels (their grid is a few blocks per SM).
VECTOR_BLOCK = 256
VECTOR_LANES = ("x", "y", "z", "w")


def vector_kernel_source(program, n_inputs: int, scalars=()) -> tuple[str, str] | None:
    """``(name, CUDA source)`` of a float32 kernel that runs ``program`` 4 elements per thread.

    Full inputs are read, and the output written, as ``float4`` (16-byte loads and
    stores) in a grid-stride loop over ``n / 4`` vectors; the last ``n % 4``
    elements take a plain loop. Inputs whose position is in ``scalars`` hold one
    element, read once per thread (a 0-d array broadcast over the others). The
    caller checks that full inputs and the output are 16-byte aligned.
    Signature: ``(const float* in0, ..., float* out0, long long n)``.
    """
    found = body_lines(program, ["float32"] * n_inputs)
    if found is None or found[2] != "float32" or len(scalars) >= n_inputs:
        return None
    lines, result, _ = found
    args = [f"in{i}" for i in range(n_inputs)]
    op = "\n".join(
        [f"__device__ __forceinline__ float wb_op({', '.join(f'const float {a}' for a in args)}) {{"]
        + [f"    {line}" for line in lines]
        + [f"    return {result};", "}"]
    )
    full = [i for i in range(n_inputs) if i not in scalars]
    params = ", ".join([*(f"const float* __restrict__ p{i}" for i in range(n_inputs)), "float* out0", "long long n"])
    name = f"wb_vec4_{zlib.crc32(f'{op} {sorted(scalars)}'.encode()):08x}"
    lane = lambda c: ", ".join(f"s{i}" if i in scalars else f"a{i}.{c}" for i in range(n_inputs))  # noqa: E731
    element = ", ".join(f"s{i}" if i in scalars else f"p{i}[i]" for i in range(n_inputs))
    body = [
        f'extern "C" __global__ void {name}({params}) {{',
        *(f"    const float s{i} = p{i}[0];" for i in sorted(scalars)),
        "    const long long start = (long long)blockIdx.x * blockDim.x + threadIdx.x;",
        "    const long long stride = (long long)blockDim.x * gridDim.x;",
        "    const long long n4 = n / 4;",
        "    float4* out4 = reinterpret_cast<float4*>(out0);",
        "    for (long long i = start; i < n4; i += stride) {",
        *(f"        const float4 a{i} = reinterpret_cast<const float4*>(p{i})[i];" for i in full),
        "        float4 r;",
        *(f"        r.{c} = wb_op({lane(c)});" for c in VECTOR_LANES),
        "        out4[i] = r;",
        "    }",
        "    for (long long i = n4 * 4 + start; i < n; i += stride) {",
        f"        out0[i] = wb_op({element});",
        "    }",
        "}",
    ]
    return name, op + "\n\n" + "\n".join(body) + "\n"


def vector_grid(n: int, multiprocessors: int) -> int:
    """Blocks of a vectorized launch over ``n`` elements: enough for every vector, at most 8 per SM."""
    vectors = max(1, (n + 3) // 4)
    return max(1, min(multiprocessors * 8, (vectors + VECTOR_BLOCK - 1) // VECTOR_BLOCK))


def kernel_name(body: str) -> str:
    """A stable, readable kernel name (it shows up in profiles)."""
    return f"wb_fused_{zlib.crc32(body.encode()):08x}"
