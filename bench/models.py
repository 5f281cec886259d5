"""Training steps of real models: workbench's local executor against PyTorch eager on the CPU.

Run from the repository root (one thread each: ``torch.set_num_threads(1)``, NumPy's BLAS
limited to one thread with threadpoolctl)::

    .venv/bin/python bench/models.py                 # every model, batch 64 and 256
    .venv/bin/python bench/models.py --models cnn --batches 64 --rounds 5

Models (the same shapes, initial weights and data in both frameworks, float32, SGD):

- ``cnn``: the two-layer CNN of the digits (1x8x8): conv 3x3 32 "same" + ReLU, conv 3x3 64
  "same" + ReLU, 2x2 max pool, dense to 10 classes;
- ``cnn32``: the same CNN on 3x32x32 inputs;
- ``attention``: a pre-LN transformer block on (batch, 8, 32) tokens: layer norm, 4-head
  self-attention, residual, layer norm, GELU MLP (4x), residual, mean over tokens, dense;
- ``transformer``, ``resnet``, ``rnn``: the models of :mod:`workbench.models` (those of the
  notebook ``notebooks/models.ipynb``) on rows of 64 pixels, built by their builders, trained
  with their Adam (batch norm in training mode), against PyTorch modules of the same layers
  given the workbench session's initial variables (``F.linear``/``F.conv2d``/``F.batch_norm``
  as ``torch.nn``'s layers call them, ``torch.nn.RNN`` for the Elman RNN), ``torch.optim.Adam``.

Each round times a window of steps of each implementation in turn (the order rotates), so
load from other processes hits both; the medians over the rounds are reported, in steps per
second of the process's CPU time (both run on one thread, so that is each step's own time,
without what other processes on a shared machine take).
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
import torch.nn.functional as F  # noqa: E402
from threadpoolctl import threadpool_limits  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import workbench as wb  # noqa: E402

torch.set_num_threads(1)
torch.set_num_interop_threads(1)

LR = 0.01
CLASSES = 10


# -- the CNN ----------------------------------------------------------------------------------


def cnn_shapes(channels_in: int, size: int) -> dict:
    return {
        "k1": (32, channels_in, 3, 3),
        "b1": (32,),
        "k2": (64, 32, 3, 3),
        "b2": (64,),
        "w": (64 * (size // 2) ** 2, CLASSES),
        "b": (CLASSES,),
    }


def cnn_workbench(params: dict, channels_in: int, size: int):
    g = wb.Graph(name="cnn")
    with g.as_default():
        x = wb.placeholder("x", shape=(None, channels_in, size, size))
        y = wb.placeholder("y", shape=(None,), dtype="int64")
        v = {k: wb.variable(k, init=a) for k, a in params.items()}
        h = wb.relu(wb.conv2d(x, v["k1"], padding="same") + wb.reshape(v["b1"], (32, 1, 1)))
        h = wb.relu(wb.conv2d(h, v["k2"], padding="same") + wb.reshape(v["b2"], (64, 1, 1)))
        h = wb.max_pool2d(h, 2)
        logits = wb.matmul(wb.reshape(h, (-1, params["w"].shape[0])), v["w"]) + v["b"]
        loss = wb.mean(wb.softmax_cross_entropy(logits, y))
        train = wb.optimizers.SGD(LR).minimize(loss)
    sess = wb.Session(g, seed=0)

    def step(xb, yb):
        return sess.run([loss, train], {"x": xb, "y": yb})[0]

    return step


class TorchCNN(torch.nn.Module):
    def __init__(self, params: dict):
        super().__init__()
        self.c1 = torch.nn.Conv2d(params["k1"].shape[1], 32, 3, padding=1)
        self.c2 = torch.nn.Conv2d(32, 64, 3, padding=1)
        self.fc = torch.nn.Linear(params["w"].shape[0], CLASSES)
        with torch.no_grad():
            self.c1.weight.copy_(torch.from_numpy(params["k1"]))
            self.c1.bias.copy_(torch.from_numpy(params["b1"]))
            self.c2.weight.copy_(torch.from_numpy(params["k2"]))
            self.c2.bias.copy_(torch.from_numpy(params["b2"]))
            self.fc.weight.copy_(torch.from_numpy(params["w"].T.copy()))
            self.fc.bias.copy_(torch.from_numpy(params["b"]))

    def forward(self, x):
        h = F.relu(self.c2(F.relu(self.c1(x))))
        return self.fc(torch.flatten(F.max_pool2d(h, 2), 1))


# -- the attention block ------------------------------------------------------------------------

TOKENS, D, HEADS = 8, 32, 4


def attention_shapes() -> dict:
    return {
        "g1": (D,),
        "o1": (D,),
        "wqkv": (D, 3 * D),
        "bqkv": (3 * D,),
        "wo": (D, D),
        "bo": (D,),
        "g2": (D,),
        "o2": (D,),
        "w1": (D, 4 * D),
        "b1": (4 * D,),
        "w2": (4 * D, D),
        "b2": (D,),
        "w": (D, CLASSES),
        "b": (CLASSES,),
    }


def attention_workbench(params: dict):
    """Written with the ops of the registry (layer_norm, gelu, scaled_dot_product_attention)."""
    g = wb.Graph(name="attention")
    with g.as_default():
        x = wb.placeholder("x", shape=(None, TOKENS, D))
        y = wb.placeholder("y", shape=(None,), dtype="int64")
        v = {k: wb.variable(k, init=a) for k, a in params.items()}
        h = wb.layer_norm(x, v["g1"], v["o1"])
        qkv = wb.matmul(h, v["wqkv"]) + v["bqkv"]  # (N, T, 3D)
        heads = wb.transpose(wb.reshape(qkv, (-1, TOKENS, 3, HEADS, D // HEADS)), (2, 0, 3, 1, 4))
        att = wb.scaled_dot_product_attention(heads[0], heads[1], heads[2])  # (N, H, T, D/H)
        att = wb.reshape(wb.transpose(att, (0, 2, 1, 3)), (-1, TOKENS, D))
        x = x + wb.matmul(att, v["wo"]) + v["bo"]
        h = wb.layer_norm(x, v["g2"], v["o2"])
        x = x + wb.matmul(wb.gelu(wb.matmul(h, v["w1"]) + v["b1"]), v["w2"]) + v["b2"]
        logits = wb.matmul(wb.mean(x, axis=1), v["w"]) + v["b"]
        loss = wb.mean(wb.softmax_cross_entropy(logits, y))
        train = wb.optimizers.SGD(LR).minimize(loss)
    sess = wb.Session(g, seed=0)

    def step(xb, yb):
        return sess.run([loss, train], {"x": xb, "y": yb})[0]

    return step


class TorchAttention(torch.nn.Module):
    def __init__(self, params: dict):
        super().__init__()
        self.p = torch.nn.ParameterDict({k: torch.nn.Parameter(torch.from_numpy(a.copy())) for k, a in params.items()})

    def forward(self, x):
        p = self.p
        h = F.layer_norm(x, (D,), p["g1"], p["o1"], eps=1e-5)
        qkv = (h @ p["wqkv"] + p["bqkv"]).reshape(-1, TOKENS, 3, HEADS, D // HEADS).permute(2, 0, 3, 1, 4)
        att = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2])
        att = att.transpose(1, 2).reshape(-1, TOKENS, D)
        x = x + att @ p["wo"] + p["bo"]
        h = F.layer_norm(x, (D,), p["g2"], p["o2"], eps=1e-5)
        x = x + F.gelu(h @ p["w1"] + p["b1"]) @ p["w2"] + p["b2"]
        return x.mean(dim=1) @ p["w"] + p["b"]


# -- the models of workbench.models ----------------------------------------------------------------


def builder_workbench(name: str):
    """(step, initial variables by name) of ``workbench.models.BUILDERS[name]``, trained as the
    notebook trains it (``training`` fed True where the model has batch norm)."""
    m = wb.models.BUILDERS[name]()
    sess = wb.Session(m["graph"], seed=0)
    variables = m["graph"].trainable_variables
    params = dict(zip([v.name for v in variables], sess.run(variables), strict=True))
    extra = {"training": True} if "training" in m else {}

    def step(xb, yb):
        return sess.run([m["loss"], m["train"]], {"x": xb, "y": yb, **extra})[0]

    return step, params


class TorchParams(torch.nn.Module):
    """Parameters named as workbench's variables; dense kernels (in, out) kept as PyTorch's (out, in)."""

    def __init__(self, params: dict):
        super().__init__()
        self.p = torch.nn.ParameterDict(
            {k.replace("/", "__"): torch.nn.Parameter(torch.from_numpy(a.T.copy() if self._dense(k, a) else a.copy()))
             for k, a in params.items()}
        )  # fmt: skip

    @staticmethod
    def _dense(name: str, a) -> bool:
        return name.endswith("kernel") and a.ndim == 2

    def __getitem__(self, name: str):
        return self.p[name.replace("/", "__")]

    def linear(self, x, scope: str, bias: bool = True):
        return F.linear(x, self[f"{scope}/kernel"], self[f"{scope}/bias"] if bias else None)


class TorchTransformer(TorchParams):
    def forward(self, x):
        d, heads = 32, 4
        h = self.linear(x.reshape(-1, 8, 8), "embed/tokens") + self["embed/positions"]
        for i in range(2):
            b = f"block{i}/"
            n = F.layer_norm(h, (d,), self[b + "layer_norm/gamma"], self[b + "layer_norm/beta"], eps=1e-5)
            qkv = self.linear(n, b + "multi_head_attention/qkv", bias=False)
            qkv = qkv.reshape(-1, 8, 3, heads, d // heads).permute(2, 0, 3, 1, 4)
            att = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2]).transpose(1, 2).reshape(-1, 8, d)
            h = h + self.linear(att, b + "multi_head_attention/out")
            n = F.layer_norm(h, (d,), self[b + "layer_norm_1/gamma"], self[b + "layer_norm_1/beta"], eps=1e-5)
            h = h + self.linear(F.gelu(self.linear(n, b + "mlp_in")), b + "mlp_out")
        h = F.layer_norm(h, (d,), self["final_norm/gamma"], self["final_norm/beta"], eps=1e-5)
        return self.linear(h.mean(dim=1), "head")


class TorchResNet(TorchParams):
    """The ResNet's layers; TensorFlow's "same" padding for the stride-2 3x3 convolution on 8x8
    puts its one padded row and column after the image (PyTorch's ``padding=1`` pads both sides)."""

    def __init__(self, params: dict):
        super().__init__(params)
        for k, a in params.items():
            if k.endswith("/gamma"):
                scope = k[: -len("/gamma")].replace("/", "__")
                self.register_buffer(scope + "__mean", torch.zeros(a.shape))
                self.register_buffer(scope + "__var", torch.ones(a.shape))

    def bn(self, x, scope: str):
        key = scope.replace("/", "__")
        return F.batch_norm(x, getattr(self, key + "__mean"), getattr(self, key + "__var"),
                            self[f"{scope}/gamma"], self[f"{scope}/beta"], training=True, momentum=0.01, eps=1e-3)  # fmt: skip

    def forward(self, x):
        x = x.reshape(-1, 1, 8, 8)
        h = F.relu(self.bn(F.conv2d(x, self["stem/conv2d/kernel"], padding=1), "stem/batch_norm"))
        out = F.relu(self.bn(F.conv2d(h, self["block0/conv2d/kernel"], padding=1), "block0/batch_norm"))
        out = self.bn(F.conv2d(out, self["block0/conv2d_1/kernel"], padding=1), "block0/batch_norm_1")
        h = F.relu(out + h)
        out = F.conv2d(F.pad(h, (0, 1, 0, 1)), self["block1/conv2d/kernel"], stride=2)
        out = F.relu(self.bn(out, "block1/batch_norm"))
        out = self.bn(F.conv2d(out, self["block1/conv2d_1/kernel"], padding=1), "block1/batch_norm_1")
        short = self.bn(F.conv2d(h, self["block1/shortcut/kernel"], stride=2), "block1/batch_norm_2")
        h = F.relu(out + short)
        return self.linear(h.mean(dim=(2, 3)), "head")


class TorchRNN(torch.nn.Module):
    """``torch.nn.RNN`` (tanh) given the cell's weights; its second bias is zero and frozen (the
    workbench cell has one)."""

    def __init__(self, params: dict):
        super().__init__()
        hidden = params["cell/w_h"].shape[0]
        self.rnn = torch.nn.RNN(8, hidden)
        self.head = torch.nn.Linear(hidden, CLASSES)
        with torch.no_grad():
            self.rnn.weight_ih_l0.copy_(torch.from_numpy(params["cell/w_x"].T.copy()))
            self.rnn.weight_hh_l0.copy_(torch.from_numpy(params["cell/w_h"].T.copy()))
            self.rnn.bias_ih_l0.copy_(torch.from_numpy(params["cell/b"]))
            self.rnn.bias_hh_l0.zero_()
            self.head.weight.copy_(torch.from_numpy(params["head/kernel"].T.copy()))
            self.head.bias.copy_(torch.from_numpy(params["head/bias"]))
        self.rnn.bias_hh_l0.requires_grad_(False)

    def forward(self, x):
        _, last = self.rnn(x.reshape(-1, 8, 8).transpose(0, 1))  # time first, as the scan
        return self.head(last[0])


TORCH_MODELS = {"transformer": (TorchTransformer, 3e-3), "resnet": (TorchResNet, 3e-3), "rnn": (TorchRNN, 5e-3)}


# -- measuring ------------------------------------------------------------------------------------


def init(shapes: dict, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in shapes.items():
        if len(shape) == 1:
            out[name] = (np.ones if name.startswith("g") else np.zeros)(shape, np.float32)
        else:
            fan_in = int(np.prod(shape[1:])) if len(shape) == 4 else shape[0]
            out[name] = (rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)).astype(np.float32)
    return out


def torch_step(model, adam: float | None = None):
    trainable = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.SGD(trainable, lr=LR) if adam is None else torch.optim.Adam(trainable, lr=adam, eps=1e-8)

    def step(xb, yb):
        loss = F.cross_entropy(model(xb), yb)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss.detach()

    return step


def setup(name: str, batch: int):
    """(workbench step, torch step, NumPy batches, torch batches) of model ``name``."""
    if name in TORCH_MODELS:
        cls, learning_rate = TORCH_MODELS[name]
        wb_step, params = builder_workbench(name)
        t_step = torch_step(cls(params), adam=learning_rate)
        rng = np.random.default_rng(1)
        xs = [rng.standard_normal((batch, 64), dtype=np.float32) for _ in range(4)]
        ys = [rng.integers(0, CLASSES, batch).astype(np.int64) for _ in range(4)]
        batches = list(zip(xs, ys, strict=True))
        return wb_step, t_step, batches, [(torch.from_numpy(x), torch.from_numpy(y)) for x, y in batches]
    if name == "attention":
        params = init(attention_shapes())
        wb_step, model = attention_workbench(params), TorchAttention(params)
        shape = (batch, TOKENS, D)
    else:
        channels, size = (1, 8) if name == "cnn" else (3, 32)
        params = init(cnn_shapes(channels, size))
        wb_step, model = cnn_workbench(params, channels, size), TorchCNN(params)
        shape = (batch, channels, size, size)
    rng = np.random.default_rng(1)
    xs = [rng.standard_normal(shape, dtype=np.float32) for _ in range(4)]
    ys = [rng.integers(0, CLASSES, batch).astype(np.int64) for _ in range(4)]
    batches = list(zip(xs, ys, strict=True))
    torch_batches = [(torch.from_numpy(x), torch.from_numpy(y)) for x, y in batches]
    return wb_step, torch_step(model), batches, torch_batches


def same_losses(wb_step, t_step, batches, torch_batches) -> float:
    """Largest relative difference of the loss over three steps (both start from the same weights)."""
    worst = 0.0
    for (x, y), (tx, ty) in list(zip(batches, torch_batches, strict=True))[:3]:
        a, b = float(wb_step(x, y)), float(t_step(tx, ty))
        worst = max(worst, abs(a - b) / abs(b))
    return worst


def window(step, batches, seconds: float) -> float:
    """Steps per second of CPU time over a window of about ``seconds`` (one thread each: the CPU
    time is the step's own, not what other processes on a shared machine take from it)."""
    count, started = 0, time.process_time()
    while True:
        step(*batches[count % len(batches)])
        count += 1
        elapsed = time.process_time() - started
        if elapsed >= seconds and count >= 3:
            return count / elapsed


def measure(name: str, batch: int, rounds: int, seconds: float) -> dict:
    wb_step, t_step, batches, torch_batches = setup(name, batch)
    difference = same_losses(wb_step, t_step, batches, torch_batches)
    for _ in range(2):  # warm up: plans compiled, caches filled
        window(wb_step, batches, 0.05)
        window(t_step, torch_batches, 0.05)
    rates = {"workbench": [], "torch": []}
    for r in range(rounds):
        order = [("workbench", wb_step, batches), ("torch", t_step, torch_batches)]
        for label, step, data in order if r % 2 == 0 else order[::-1]:
            rates[label].append(window(step, data, seconds))
    ours, theirs = statistics.median(rates["workbench"]), statistics.median(rates["torch"])
    return {"model": name, "batch": batch, "workbench": ours, "torch": theirs, "ratio": ours / theirs,
            "loss_difference": difference}  # fmt: skip


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="cnn,cnn32,attention,transformer,resnet,rnn")
    parser.add_argument("--batches", default="64,256")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--seconds", type=float, default=0.5, help="length of each timed window")
    args = parser.parse_args(argv)
    print(f"torch {torch.__version__}, numpy {np.__version__}, one thread each; medians of {args.rounds} rounds")
    print("| model | batch | workbench steps/s | PyTorch eager steps/s | ratio | loss difference (3 steps) |")
    print("|:---|---:|---:|---:|---:|---:|")
    with threadpool_limits(limits=1):
        for name in args.models.split(","):
            for batch in map(int, args.batches.split(",")):
                m = measure(name, batch, args.rounds, args.seconds)
                print(f"| {name} | {batch} | {m['workbench']:.1f} | {m['torch']:.1f} | {m['ratio']:.2f}x | "
                      f"{m['loss_difference']:.1e} |", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
