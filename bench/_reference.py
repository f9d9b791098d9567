"""The reference Transformer of the curvature benchmark, written identically in JAX and PyTorch.

One pre-LayerNorm decoder block (d=64, 2 heads, causal, hand-written attention, tanh-GELU MLP
of width 4d), learned token and position embeddings, a final LayerNorm and a linear readout;
next-token cross-entropy over a vocabulary of 16 on a batch of 256 sequences of length 32.
53,968 parameters. The weights are drawn once with numpy and copied into both frameworks, so
both compute the same function (up to float rounding). PyTorch's fused attention kernels fail
on double backward on CPU, hence the hand-written attention in both.
"""

from __future__ import annotations

import math

import numpy as np

VOCAB, DIM, HEADS, SEQ, BATCH = 16, 64, 2, 32, 256
HIDDEN = 4 * DIM
LN_EPS = 1e-5

# (name, shape) in a fixed order: the order of torch's parameters and of the JAX dict.
SHAPES = [
    ("embed", (VOCAB, DIM)),
    ("pos", (SEQ, DIM)),
    ("ln1_g", (DIM,)),
    ("ln1_b", (DIM,)),
    ("wq", (DIM, DIM)),
    ("wk", (DIM, DIM)),
    ("wv", (DIM, DIM)),
    ("wo", (DIM, DIM)),
    ("ln2_g", (DIM,)),
    ("ln2_b", (DIM,)),
    ("w1", (DIM, HIDDEN)),
    ("b1", (HIDDEN,)),
    ("w2", (HIDDEN, DIM)),
    ("b2", (DIM,)),
    ("lnf_g", (DIM,)),
    ("lnf_b", (DIM,)),
    ("wout", (DIM, VOCAB)),
    ("bout", (VOCAB,)),
]


def init_params(seed: int = 0) -> dict[str, np.ndarray]:
    """Numpy float32 weights (LayerNorm gains near 1, small random biases so no term vanishes)."""
    rng = np.random.default_rng(seed)
    params = {}
    for name, shape in SHAPES:
        if name.endswith("_g"):
            value = 1.0 + 0.1 * rng.standard_normal(shape)
        elif len(shape) == 1:
            value = 0.1 * rng.standard_normal(shape)
        else:
            value = rng.standard_normal(shape) / math.sqrt(shape[0])
        params[name] = value.astype(np.float32)
    return params


def make_batch(seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Random token sequences and their next tokens (int64, shape (BATCH, SEQ) each)."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, VOCAB, size=(BATCH, SEQ + 1))
    return tokens[:, :-1], tokens[:, 1:]


def num_params() -> int:
    return sum(math.prod(shape) for _, shape in SHAPES)


# --------------------------------------------------------------------------- JAX


def jax_loss(params, inputs, targets):
    """Mean next-token cross-entropy of the reference model (JAX)."""
    import jax
    import jax.numpy as jnp

    def layer_norm(x, g, b):
        mu = jnp.mean(x, axis=-1, keepdims=True)
        var = jnp.mean((x - mu) ** 2, axis=-1, keepdims=True)
        return (x - mu) / jnp.sqrt(var + LN_EPS) * g + b

    p = params
    x = p["embed"][inputs] + p["pos"][None]
    h = layer_norm(x, p["ln1_g"], p["ln1_b"])
    hd = DIM // HEADS
    batch = inputs.shape[0]

    def heads(w):
        return (h @ w).reshape(batch, SEQ, HEADS, hd).transpose(0, 2, 1, 3)

    q, k, v = heads(p["wq"]), heads(p["wk"]), heads(p["wv"])
    scores = q @ k.transpose(0, 1, 3, 2) / math.sqrt(hd)
    mask = jnp.tril(jnp.ones((SEQ, SEQ), dtype=bool))
    scores = jnp.where(mask, scores, jnp.asarray(-1e9, scores.dtype))
    attn = jax.nn.softmax(scores, axis=-1)
    out = (attn @ v).transpose(0, 2, 1, 3).reshape(batch, SEQ, DIM)
    x = x + out @ p["wo"]
    h = layer_norm(x, p["ln2_g"], p["ln2_b"])
    x = x + jax.nn.gelu(h @ p["w1"] + p["b1"], approximate=True) @ p["w2"] + p["b2"]
    logits = layer_norm(x, p["lnf_g"], p["lnf_b"]) @ p["wout"] + p["bout"]
    logp = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.mean(jnp.take_along_axis(logp, targets[..., None], axis=-1))


# --------------------------------------------------------------------------- PyTorch


def torch_model(params: dict[str, np.ndarray], dtype=None):
    """The same model as a ``torch.nn.Module`` taking ``inputs`` and returning logits."""
    import torch
    from torch import nn
    from torch.nn import functional as F

    dtype = dtype or torch.float32

    class Reference(nn.Module):
        def __init__(self):
            super().__init__()
            for name, _ in SHAPES:
                tensor = torch.tensor(params[name], dtype=dtype)
                self.register_parameter(name, nn.Parameter(tensor))
            self.register_buffer("mask", torch.tril(torch.ones(SEQ, SEQ, dtype=torch.bool)))

        def forward(self, inputs):
            def layer_norm(x, g, b):
                mu = x.mean(-1, keepdim=True)
                var = ((x - mu) ** 2).mean(-1, keepdim=True)
                return (x - mu) / torch.sqrt(var + LN_EPS) * g + b

            batch, hd = inputs.shape[0], DIM // HEADS
            x = self.embed[inputs] + self.pos[None]
            h = layer_norm(x, self.ln1_g, self.ln1_b)

            def heads(w):
                return (h @ w).reshape(batch, SEQ, HEADS, hd).transpose(1, 2)

            q, k, v = heads(self.wq), heads(self.wk), heads(self.wv)
            scores = q @ k.transpose(-1, -2) / math.sqrt(hd)
            scores = scores.masked_fill(~self.mask, -1e9)
            out = (torch.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(batch, SEQ, DIM)
            x = x + out @ self.wo
            h = layer_norm(x, self.ln2_g, self.ln2_b)
            x = x + F.gelu(h @ self.w1 + self.b1, approximate="tanh") @ self.w2 + self.b2
            return layer_norm(x, self.lnf_g, self.lnf_b) @ self.wout + self.bout

    return Reference()


def torch_criterion(logits, targets):
    """Mean next-token cross-entropy on (B, T, V) logits."""
    from torch.nn import functional as F

    return F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))


# --------------------------------------------------------------------------- devices


def torch_device() -> str:
    """``"cuda"`` when PyTorch sees a GPU, else ``"cpu"``: the PyTorch twins run there."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def torch_sync(device: str) -> None:
    """Wait for PyTorch's queued work on ``device`` (a no-op on the CPU), before a clock read."""
    if device == "cuda":
        import torch

        torch.cuda.synchronize()


def on_accelerator() -> bool:
    """Whether JAX's default devices are accelerators (memory then comes from the device)."""
    import jax

    return jax.default_backend() != "cpu"


def device_peak_mb() -> float | None:
    """Peak bytes in use on JAX's first device (``memory_stats()``), in MB; None on a CPU."""
    import jax

    stats = jax.devices()[0].memory_stats()
    if not stats or "peak_bytes_in_use" not in stats:
        return None
    return stats["peak_bytes_in_use"] / 2**20


def xla_costs(compiled) -> dict:
    """XLA's load-independent costs of a compiled program: GFLOP, GB accessed, MB temporaries.

    ``cost_analysis()`` counts a loop body once (not once per iteration) and counted a random
    draw split into leaves several times over on CPU (JAX 0.10); compare like with like.
    """
    out = {}
    costs = compiled.cost_analysis()
    costs = costs[0] if isinstance(costs, list) else costs
    if costs:
        out["gflop"] = costs.get("flops", 0.0) / 1e9
        out["gb_accessed"] = costs.get("bytes accessed", 0.0) / 1e9
    mem = compiled.memory_analysis()
    if mem is not None:
        out["xla_temp_mb"] = mem.temp_size_in_bytes / 2**20
    return out
