"""The 1B and 8B decoders on one accelerator: time per unit in gradients, peak memory, compiles.

One command, on the machine with the accelerator (the checkout on ``PYTHONPATH``; after the
kernel tests, ``python bench/accelerator.py --only tests --budget 240``, as docs/gpu.md says)::

    python bench/llm_gpu.py                            # 1b then 8b, batch 8 x 1024
    python bench/llm_gpu.py --configs 1b --budget 240  # at most 240 s of wall clock
    python bench/llm_gpu.py --configs tiny --out DIR   # seconds on a CPU (the tests' smoke run)

The programs are :func:`bench.llm_plan.programs` on one device, nothing placed, at the batch of
the memory plan (8 x 1024 predicted tokens; 8 x 32 for the tiny decoder):

- ``gradient``: the float32 loss's value and gradient at the bfloat16 weights, each weight cast
  to float32 inside the program; the unit every ratio is taken against;
- ``hessian_trace``: 2 Hutchinson probes, ``chunk_size=1``; time per probe;
- ``top_eigenvalues``: ``--lanczos-steps`` Lanczos steps (10); time per step;
- ``average_sharpness``: 2 Gaussian pairs, ``chunk_size=1``; time per pair;
- ``worst_case_sharpness``: the l2 ball, 2 ascent steps, so 3 values and gradients; time per
  value and gradient.

Each kernel is called on the bfloat16 weights as a user calls it (its default evaluates the
loss at float32 parameters, each weight cast where it is used).

Each decoder and program runs in a fresh process (``--child``), so the device's peak memory
(``memory_stats()["peak_bytes_in_use"]``, where the device reports it) is that program's,
weights included. The process draws the weights on the device in bfloat16 (standard deviation
0.02, the norms' scales 1; no float32 copy) and random tokens, compiles the program (compile
seconds, and XLA's plan: arguments + temporaries + outputs), and where the plan fits the
device's memory (``--memory-limit-gib``, else ``bytes_limit`` of ``memory_stats()``, else on a
CPU the host's available memory) runs it once
(the first run, timed apart) and then ``--reps`` times (their median). Where the plan does not
fit, the record gives both numbers and the program is not run: at 8B a float32 Lanczos basis
is 32 GB a vector. A program that fails at run time (out of memory, a runtime check) is a
record with its error.

``--budget`` seconds of wall clock for the whole run: a program whose turn comes after them is
recorded as not run, so the run ends within the device time it was given (plus the program
running when the budget ran out).

Records: ``<out>/llm_gpu.json`` (one object per decoder and program, with the device and JAX's
version; a run of some decoders or programs replaces those records and keeps the others) and
the table ``<out>/llm_gpu.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import llm_plan  # noqa: E402
from bench.llm_cpu_run import _available_gib, _timed  # noqa: E402
from bench.scale import _device_stats  # noqa: E402

CONFIGS = ("1b", "8b")
# per program: (what one unit is, how many units one call of llm_plan.programs' runs given
# the Lanczos steps)
UNITS = {
    "gradient": ("gradient", lambda steps: 1),
    "hessian_trace": ("probe", lambda steps: llm_plan.SAMPLES),
    "top_eigenvalues": ("Lanczos step", lambda steps: steps),
    "average_sharpness": ("pair", lambda steps: llm_plan.SAMPLES),
    "worst_case_sharpness": ("value and gradient", lambda steps: llm_plan.ASCENT_STEPS + 1),
}


def random_weights(shapes, seed: int):
    """bfloat16 weights shaped like ``shapes``, drawn on the device: norms' scales 1, others
    normal with standard deviation 0.02 (each leaf drawn in bfloat16: no float32 copy)."""
    import jax
    import jax.numpy as jnp

    leaves = jax.tree_util.tree_flatten_with_path(shapes)[0]
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    out = []
    for (path, leaf), key in zip(leaves, keys, strict=True):
        shape = tuple(leaf.shape)
        if "norm" in jax.tree_util.keystr(path):
            out.append(jnp.ones(shape, jnp.bfloat16))
            continue
        draw = jax.jit(lambda k, shape=shape: jax.random.normal(k, shape, jnp.bfloat16) * 0.02)
        out.append(draw(key))
    return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(shapes), out)


def _value(out) -> float | None:
    """The number a program returns first (the loss, the estimate, the top eigenvalue)."""
    import jax
    import numpy as np

    if not isinstance(out, jax.Array | tuple):
        out = out.value if hasattr(out, "value") else out.mean  # a WorstCase, an Estimate
    first = jax.tree_util.tree_leaves(out)[0]
    return float(np.ravel(np.asarray(first, np.float64))[0])


def measure(name: str, program: str, args: argparse.Namespace) -> dict:
    """One program of one decoder in this process (see the module docstring)."""
    import jax
    import jax.numpy as jnp

    n, loss, _, _, shapes_of, batch, seq = llm_plan.placed_decoder(name, 1)
    unit, count = UNITS[program]
    units = count(args.lanczos_steps)
    device = jax.devices()[0]
    record = {
        "decoder": name,
        "num_params": n,
        "program": program,
        "unit": unit,
        "units_per_call": units,
        "batch": [llm_plan.BATCH, seq],
        "platform": device.platform,
        "device": getattr(device, "device_kind", str(device)),
        "jax": jax.__version__,
    }
    if program == "top_eigenvalues":
        record["num_steps"] = args.lanczos_steps
    fn = llm_plan.programs(loss, args.lanczos_steps, None)[program]
    if program == "gradient":
        fn = lambda p, b, k, fn=fn: fn(llm_plan._to_f32(p), b, k)  # noqa: E731
    shapes = shapes_of(jnp.bfloat16)
    start = time.perf_counter()
    compiled = jax.jit(fn).lower(shapes, batch, jax.random.key(0)).compile()
    record["compile_s"] = round(time.perf_counter() - start, 2)
    mem = compiled.memory_analysis()
    plan = mem.argument_size_in_bytes + mem.temp_size_in_bytes + mem.output_size_in_bytes
    record["xla_plan_gib"] = round(plan / 2**30, 4)
    limit = _memory_limit(args)
    if limit is not None:
        record["memory_limit_gib"] = round(limit / 2**30, 2)
        if plan > limit:
            record["not_run"] = (
                f"XLA plans {plan / 2**30:.2f} GiB, over the {limit / 2**30:.2f} GiB available"
            )
            return record
    try:
        params = random_weights(shapes, args.seed)
        tokens = jax.random.randint(
            jax.random.key(args.seed + 1), batch.shape, 0, _vocab(name), jnp.int32
        )
        key = jax.random.key(args.seed + 2)
        out, first = _timed(compiled, params, tokens, key)
        runs = [_timed(compiled, params, tokens, key)[1] for _ in range(args.reps)]
    except Exception as err:  # out of memory at run time, a failed runtime check: a result
        record["error"] = f"{type(err).__name__}: {str(err)[:400]}"
        return record
    seconds = statistics.median(runs)
    stats = _device_stats()
    record.update(
        first_run_s=round(first, 6),
        run_s=[round(s, 6) for s in runs],
        per_unit_s=round(seconds / units, 6),
        value=_value(out),
    )
    if stats is not None and "peak_bytes_in_use" in stats:
        record["peak_gib"] = round(stats["peak_bytes_in_use"] / 2**30, 2)
    return record


def _memory_limit(args: argparse.Namespace) -> float | None:
    """Bytes a program may plan: ``--memory-limit-gib``, else the device's ``bytes_limit``, else
    (a CPU) the host's memory available now; None where none is known."""
    if args.memory_limit_gib:
        return args.memory_limit_gib * 2**30
    stats = _device_stats()
    if stats is not None and "bytes_limit" in stats:
        return stats["bytes_limit"]
    free = _available_gib()
    return None if free is None else free * 2**30


def _vocab(name: str) -> int:
    from jaxbounds.models import decoder_config

    return decoder_config(name).vocab_size


def _child(name: str, program: str, args: argparse.Namespace, left: float) -> dict:
    """One program in a fresh process, stopped after ``left`` seconds (a record either way)."""
    cmd = [sys.executable, __file__, "--child", "--configs", name, "--programs", program,
           "--lanczos-steps", str(args.lanczos_steps), "--reps", str(args.reps),
           "--seed", str(args.seed)]  # fmt: skip
    if args.memory_limit_gib:
        cmd += ["--memory-limit-gib", str(args.memory_limit_gib)]
    # allocate as needed (the peak is then the program's), up to 95% of the device (JAX's
    # default allows 75%: an 8B program that fits in 139 GiB would be refused at 104)
    env = {"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.95", **os.environ,
           "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}  # fmt: skip
    base = {"decoder": name, "program": program}
    try:
        stdout, stderr, code = _wait(cmd, env, left)
    except subprocess.TimeoutExpired:
        return {**base, "not_run": f"stopped: the budget's {left:.0f} s left ran out"}
    for line in stdout.splitlines():
        if line.startswith("RECORD "):
            return json.loads(line[len("RECORD ") :])
    lines = [ln for ln in stderr.splitlines() if ln.strip()] or [""]
    why = next((ln for ln in reversed(lines) if "Error" in ln or "error" in ln), lines[-1])
    return {**base, "error": f"exit {code}: {why.strip()[:400]}"}


_STOPS = {signal.SIGINT, signal.SIGTERM}


def _wait(cmd: list[str], env: dict, timeout: float) -> tuple[str, str, int]:
    """Run ``cmd`` to its end: ``(stdout, stderr, exit code)``; killed on a timeout or a stop.

    SIGINT and SIGTERM are held back while the process is started, so that a stop always finds
    it (one arriving inside ``subprocess.run`` while it started the process left an orphan
    compiling on); the process inherits them held back and lets them through first thing
    (``--child``), with no code run between its fork and its exec.
    """
    held = signal.pthread_sigmask(signal.SIG_BLOCK, _STOPS)
    proc = None
    try:
        proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
        )
        signal.pthread_sigmask(signal.SIG_SETMASK, held)  # a stop held back is raised here
        stdout, stderr = proc.communicate(timeout=timeout)
    except BaseException:  # the timeout, a stop
        signal.pthread_sigmask(signal.SIG_SETMASK, held)
        if proc is not None:
            proc.kill()
            proc.communicate()
        raise
    return stdout, stderr, proc.returncode


def summarize(records: list[dict]) -> list[dict]:
    """Each record with its time per unit over its decoder's gradient's (where both ran)."""
    grads = {r["decoder"]: r for r in records if r["program"] == "gradient" and "per_unit_s" in r}
    out = []
    for r in records:
        row = dict(r)
        g = grads.get(r["decoder"])
        if g is not None and "per_unit_s" in r:
            row["per_unit_in_grads"] = round(r["per_unit_s"] / g["per_unit_s"], 3)
            if "peak_gib" in r and "peak_gib" in g:
                row["peak_vs_gradient"] = round(r["peak_gib"] / g["peak_gib"], 3)
        if g is not None and "compile_s" in r:
            row["compile_vs_gradient"] = round(r["compile_s"] / g["compile_s"], 2)
        out.append(row)
    return out


def markdown(records: list[dict]) -> str:
    lines = [
        "Llama-style decoders with bfloat16 weights on one device, nothing placed, batch 8 x"
        " 1024 (8 x 32 for the tiny decoder); each program in a fresh process; the kernels"
        " called on the bfloat16 weights (loss at float32 parameters), the gradient of the"
        " float32 loss. Time per unit: the median of the timed runs over the units of one call,"
        " against the gradient's. Peak: the device's peak bytes in use (weights included).",
        "",
        "| decoder | program | unit | per unit (s) | in gradients | peak GiB | peak / gradient's"
        " | XLA plan GiB | compile s | compile / gradient's | note |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]

    def cell(row: dict, key: str, fmt: str = "{}") -> str:
        return fmt.format(row[key]) if row.get(key) is not None else ""

    for row in summarize(records):
        note = row.get("not_run") or row.get("error") or ""
        lines.append(
            f"| {row['decoder']} | `{row['program']}` | {row.get('unit', '')} | "
            f"{cell(row, 'per_unit_s', '{:.4g}')} | {cell(row, 'per_unit_in_grads')} | "
            f"{cell(row, 'peak_gib')} | {cell(row, 'peak_vs_gradient')} | "
            f"{cell(row, 'xla_plan_gib')} | {cell(row, 'compile_s')} | "
            f"{cell(row, 'compile_vs_gradient')} | {note[:160]} |"
        )
    return "\n".join(lines) + "\n"


def _names(parser: argparse.ArgumentParser, flag: str, value: str, known) -> list[str]:
    names = [v for v in value.split(",") if v]
    unknown = [v for v in names if v not in known]
    if unknown or not names:
        parser.error(f"{flag}: unknown {unknown or value!r}; expected some of {tuple(known)}")
    return names


def _positive(kind):
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}") from None
        if not value > 0 or value != value or value == float("inf"):
            raise argparse.ArgumentTypeError(f"expected a finite number > 0, got {text}")
        return value

    return parse


def _merge(path: Path, records: list[dict]) -> list[dict]:
    """The records in ``path`` with those of the same decoder and program replaced."""
    old = json.loads(path.read_text()) if path.is_file() else []
    new = {(r["decoder"], r["program"]) for r in records}
    return [r for r in old if (r["decoder"], r["program"]) not in new] + records


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", default=",".join(CONFIGS), help="decoders, comma-separated")
    parser.add_argument("--programs", default=",".join(UNITS), help="programs, comma-separated")
    parser.add_argument("--lanczos-steps", type=_positive(int), default=10)
    parser.add_argument("--reps", type=_positive(int), default=3, help="timed runs (median)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--budget", type=_positive(float), default=480.0,
                        help="wall-clock seconds for the whole run")  # fmt: skip
    parser.add_argument("--memory-limit-gib", type=_positive(float), default=None,
                        help="run only the programs whose XLA plan fits in this (default: the"
                             " device's bytes_limit)")  # fmt: skip
    parser.add_argument("--out", default=str(ROOT / "bench" / "results"), help="output folder")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    configs = _names(parser, "--configs", args.configs, llm_plan.DECODERS)
    programs = _names(parser, "--programs", args.programs, tuple(UNITS))
    if args.child:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOPS)  # held back by _wait while starting
        print("RECORD " + json.dumps(measure(configs[0], programs[0], args)), flush=True)
        return []
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        parser.error(f"--out: expected a folder, got the file {out}")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        parser.error(f"--out: cannot create the folder {out} ({err.strerror})")
    if not os.access(out, os.W_OK):
        parser.error(f"--out: cannot write in {out}")
    if "gradient" not in programs:  # every ratio is taken against it
        programs = ["gradient", *programs]

    def stop(signum: int, frame: object) -> None:
        # a stopped run (SIGTERM) ends as an interrupted one: the running program's process is
        # killed with it, and the records written so far are kept
        raise KeyboardInterrupt(f"stopped by signal {signum}")

    signal.signal(signal.SIGTERM, stop)
    records: list[dict] = []
    try:
        _run_all(configs, programs, args, out, records)
    except KeyboardInterrupt:
        print(f"llm_gpu: interrupted; {len(records)} program(s) recorded in "
              f"{out / 'llm_gpu.json'}", file=sys.stderr)  # fmt: skip
        raise SystemExit(130) from None
    print(markdown(records))
    return records


def _run_all(configs, programs, args, out: Path, records: list[dict]) -> None:
    """Each decoder's programs in turn, within the budget, each record written as it comes."""
    deadline = time.monotonic() + args.budget
    for name in configs:
        for program in programs:
            left = deadline - time.monotonic()
            if left <= 0:
                record = {"decoder": name, "program": program,
                          "not_run": f"the budget of {args.budget:g} s was spent"}  # fmt: skip
            else:
                record = _child(name, program, args, left)
            records.append(record)
            # written after each program, then printed: an interrupted run keeps what it measured
            merged = _merge(out / "llm_gpu.json", records)
            (out / "llm_gpu.json").write_text(json.dumps(merged, indent=1) + "\n")
            (out / "llm_gpu.md").write_text(markdown(merged))
            print(json.dumps(record), flush=True)


if __name__ == "__main__":
    main()
