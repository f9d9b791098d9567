"""The persistent compilation cache: where it lives, how it is turned off, and that a second
process of the same job reads its program from disk instead of compiling it.

JAX reads the cache setting once per process, so everything that compiles runs in fresh
subprocesses with ``JAXBOUNDS_COMPILE_CACHE`` set to a temporary folder (the root conftest sets
it to ``off`` for every other test and process: no test writes to the user's cache).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from jaxbounds import _compile_cache

ROOT = Path(__file__).resolve().parents[2]


def test_default_folder_follows_xdg_then_home(monkeypatch, tmp_path):
    monkeypatch.delenv(_compile_cache.ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert _compile_cache.cache_path() == tmp_path / "xdg" / "jaxbounds" / "xla"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert _compile_cache.cache_path() == tmp_path / "home" / ".cache" / "jaxbounds" / "xla"
    assert _compile_cache.cache_path("") == tmp_path / "home" / ".cache" / "jaxbounds" / "xla"


@pytest.mark.parametrize("value", ["off", "OFF", "0", "false", "no", "none", " off "])
def test_off_values_turn_it_off(monkeypatch, value):
    monkeypatch.setenv(_compile_cache.ENV, value)
    assert _compile_cache.cache_path() is None
    assert _compile_cache.enable() is None  # and sets nothing


def test_a_path_moves_it(monkeypatch, tmp_path):
    monkeypatch.setenv(_compile_cache.ENV, str(tmp_path / "c"))
    assert _compile_cache.cache_path() == tmp_path / "c"
    monkeypatch.setenv("HOME", str(tmp_path))
    assert _compile_cache.cache_path("~/d") == tmp_path / "d"


# One program compiled in a fresh process: the tiny decoder's gradient. JAX writes an entry only
# for programs whose compilation took MIN_COMPILE_SECONDS; the script lowers the threshold after
# reading the one `enable` set, so that the entry is written on a machine of any speed.
SCRIPT = r"""
import json, sys
import jax, jax.numpy as jnp
from flax import nnx
from jaxbounds import _compile_cache
from jaxbounds.models import Decoder, as_pure, decoder_config, next_token_loss

counts = {"hits": 0, "misses": 0}
compile_s = []
def on_event(name, **kwargs):
    if name == "/jax/compilation_cache/cache_hits":
        counts["hits"] += 1
    if name == "/jax/compilation_cache/cache_misses":
        counts["misses"] += 1
def on_duration(name, secs, **kwargs):
    if name == "/jax/core/compile/backend_compile_duration":
        compile_s.append(secs)
jax.monitoring.register_event_listener(on_event)
jax.monitoring.register_event_duration_secs_listener(on_duration)

path = _compile_cache.enable()
settings = {
    "dir": jax.config.jax_compilation_cache_dir,
    "min_compile_time": jax.config.jax_persistent_cache_min_compile_time_secs,
    "min_entry_size": jax.config.jax_persistent_cache_min_entry_size_bytes,
}
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
config = decoder_config("tiny")
shapes = jax.eval_shape(lambda: as_pure(Decoder(config, rngs=nnx.Rngs(0)))[1])
apply_fn = as_pure(nnx.eval_shape(lambda: Decoder(config, rngs=nnx.Rngs(0))))[0]
loss = next_token_loss(apply_fn)
tokens = jax.ShapeDtypeStruct((4, 17), jnp.int32)
compile_s.clear()
jax.jit(jax.value_and_grad(loss)).lower(shapes, tokens).compile()
print("RESULT " + json.dumps({"path": str(path), "settings": settings, "counts": counts,
                              "compile_s": sum(compile_s)}))
"""


def _run(script: str, cache: str, *args: str) -> dict:
    env = dict(os.environ)
    env[_compile_cache.ENV] = cache
    env["JAX_PLATFORMS"] = "cpu"
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    env["PYTHONPATH"] = f"{ROOT}{os.pathsep}{env.get('PYTHONPATH', '')}"
    proc = subprocess.run(
        [sys.executable, "-c", script, *args],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT ") :])


def test_second_process_reads_the_program_from_disk(tmp_path):
    cache = tmp_path / "xla"
    first = _run(SCRIPT, str(cache))
    assert first["path"] == str(cache)
    assert first["settings"] == {
        "dir": str(cache),
        "min_compile_time": _compile_cache.MIN_COMPILE_SECONDS,
        "min_entry_size": -1,
    }
    assert first["counts"] == {"hits": 0, "misses": 1}
    entries = [p for p in cache.iterdir() if p.is_file()]
    assert entries
    second = _run(SCRIPT, str(cache))
    # a hit and no miss: XLA's compiler did not run, the program came from the folder
    assert second["counts"] == {"hits": 1, "misses": 0}
    print(f"compile {first['compile_s']:.3f} s, then {second['compile_s']:.3f} s from the cache")
    off = _run(SCRIPT, "off")
    assert off["path"] == "None"
    assert off["settings"]["dir"] is None
    assert off["counts"] == {"hits": 0, "misses": 0}


CLI_SCRIPT = r"""
import json, sys
import jax
from jaxbounds.cli import main
code = main(["rademacher", sys.argv[1], "--norm", "2", "--radius", "1", "--quiet",
             "--max-samples", "64"])
print("RESULT " + json.dumps({"code": code, "dir": jax.config.jax_compilation_cache_dir}))
"""


def test_the_command_turns_it_on(tmp_path):
    np.save(tmp_path / "X.npy", np.random.default_rng(0).normal(size=(6, 3)).astype(np.float32))
    got = _run(CLI_SCRIPT, str(tmp_path / "cli"), str(tmp_path / "X.npy"))
    assert got == {"code": 0, "dir": str(tmp_path / "cli")}
