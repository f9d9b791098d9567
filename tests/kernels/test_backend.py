"""What depends on the backend: matmul precision, chunk-size defaults (accelerators simulated)."""

from __future__ import annotations

import jax
import numpy as np
import pytest

import kernels
from kernels import _backend


class _FakeDevice:
    """Stands for a GPU: its platform and the memory statistics it reports."""

    def __init__(self, platform="gpu", bytes_limit=80 * 2**30):
        self.platform = platform
        self._limit = bytes_limit

    def memory_stats(self):
        return None if self._limit is None else {"bytes_limit": self._limit, "bytes_in_use": 0}


@pytest.fixture
def on_device(monkeypatch):
    """Make the kernels' devices look like ``_FakeDevice(...)``."""

    def use(**kw):
        device = _FakeDevice(**kw)
        monkeypatch.setattr(_backend, "sample_devices", lambda: [device])
        return device

    return use


def _default_platform():
    """JAX's default backend, a GPU's named "gpu" whatever its runtime (CUDA, ROCm)."""
    backend = jax.default_backend()
    return "gpu" if backend in ("cuda", "rocm") else backend


def test_the_platform_is_the_default_backends():
    assert _backend.sample_platform() == _default_platform()
    assert _backend.is_accelerator() == (_default_platform() != "cpu")


def test_cpu_defaults():
    # the process's CPU device, whatever the default backend (on a GPU machine too)
    with kernels.using_devices(jax.devices("cpu")):
        assert _backend.sample_platform() == "cpu"
        assert not _backend.is_accelerator()
        assert _backend.default_chunk_size("signs", size=4096 + 512) == 256
        assert _backend.default_chunk_size("probes", size=54_000) is None
        assert _backend.auto_chunk_size(8, "probes", size=1000) == 8
        assert _backend.chunk_memory_budget() == 2**30  # the CPU reports no memory statistics
        assert not _backend.reduced_precision_matmuls(np.float32)


def test_accelerator_chunks_fill_the_memory_budget(on_device):
    on_device(platform="cuda", bytes_limit=80 * 2**30)  # an H100: 1 GiB per chunk
    assert _backend.sample_platform() == "gpu"
    assert _backend.chunk_memory_budget() == 2**30
    # n = 4096, d = 512 float32: 4096 draws take 75 MB, the cap
    assert _backend.default_chunk_size("signs", size=4096 + 512) == 4096
    # a million examples: 4 MB per draw, the largest power of two within 1 GiB is 256
    assert _backend.default_chunk_size("signs", size=10**6) == 256
    assert _backend.default_chunk_size("signs", size=10**6, dtype=np.float64) == 128
    # probes: 4 parameter-sized copies each; the 54k reference model takes 16, a 124M-parameter
    # decoder not even two (one at a time)
    assert _backend.default_chunk_size("probes", size=53_968) == 16
    assert _backend.default_chunk_size("probes", size=123_751_680) is None
    assert _backend.default_chunk_size("probes", size=30_000_000) == 2


def test_a_small_device_gets_a_smaller_budget(on_device):
    on_device(bytes_limit=8 * 2**30)
    assert _backend.chunk_memory_budget() == 2**29  # a sixteenth of 8 GiB
    assert _backend.default_chunk_size("signs", size=10**6) == 128
    on_device(bytes_limit=None)  # a device that reports nothing: 1 GiB
    assert _backend.chunk_memory_budget() == 2**30


def test_reduced_precision_follows_the_default_matmul_precision(on_device):
    on_device(platform="gpu")
    assert _backend.reduced_precision_matmuls(np.float32)  # TF32 at JAX's default
    assert not _backend.reduced_precision_matmuls(np.float64)
    with jax.default_matmul_precision("highest"):
        assert not _backend.reduced_precision_matmuls(np.float32)
    with jax.default_matmul_precision("tensorfloat32"):
        assert _backend.reduced_precision_matmuls(np.float32)


@pytest.mark.parametrize(
    ("kind", "size", "match"),
    [
        ("draws", 10, "kind: expected one of"),
        ("signs", 0, "size: expected an int >= 1"),
        ("signs", -3, "size: expected an int >= 1"),
        ("signs", 2.5, "size: expected an int >= 1"),
        ("probes", True, "size: expected an int >= 1"),
    ],
)
def test_bad_arguments_raise(kind, size, match):
    with pytest.raises(ValueError, match=match):
        _backend.default_chunk_size(kind, size=size)
