"""Memory plan of the kernels on 1B and 8B decoders, FSDP over 8 devices, compiled without running.

One command (8 forced CPU devices; nothing parameter-sized is allocated)::

    python bench/llm_plan.py             # tiny, 1B and 8B decoders (Llama 3.2 1B / 3.1 8B shapes)
    python bench/llm_plan.py --quick     # the tiny and 1B decoders only
    python bench/llm_plan.py --configs 8b --programs gradient,hessian_trace

The decoder is :class:`jaxbounds.models.Decoder` with bfloat16 weights placed by
:func:`jaxbounds.models.decoder_shardings` on an ``("fsdp",)`` mesh of 8 devices, the batch
(8 x 1024 predicted tokens) split over the same axis. Each program is lowered from
``jax.ShapeDtypeStruct`` arguments carrying their shardings and compiled
(``jax.jit(f).lower(...).compile()``); XLA's ``memory_analysis()`` gives the per-device bytes
(arguments + temporaries + outputs) and ``cost_analysis()`` the FLOPs of one device's program.

Programs, and how each one evaluates the loss (the ``variant`` field of a record):

- ``gradient`` / ``f32_in_program``: the bfloat16 shards are the arguments; the program casts
  each shard to float32 and differentiates the float32 loss (the evaluation the kernels' default
  is to use, and the reference every ratio is taken against);
- ``gradient`` / ``bf16``: the loss and its gradient in bfloat16, the model's own dtype;
- the kernels, ``bf16_args``: the kernel called on the bfloat16 shards, as a user calls it (its
  default evaluates the loss at float32 parameters, each shard cast inside the kernel where it
  is used); compared with the ``f32_in_program`` gradient, the same evaluation;
- the kernels, ``f32_in_program``: the same bfloat16 shards cast to float32 by the program
  before the kernel is called on the float32 pytree (a float32 copy of each shard is an
  argument of the kernel);
- the kernels measured: ``hessian_trace`` (Hutchinson, 2 samples, ``chunk_size=1``),
  ``top_eigenvalues`` (Lanczos, ``--lanczos-steps``, 10 by default; ``linearize="auto"``,
  which recomputes each product at these sizes), ``average_sharpness`` (Gaussian, 2 samples,
  ``chunk_size=1``), ``worst_case_sharpness`` (l2 ball, 2 ascent steps);
- with ``--f32-args``, the same programs again with float32 arguments of the same shardings
  (``f32_args``): the kernel as a user calls it on a float32 copy of the model.

Goals (issue 40): a Hutchinson sample, average and worst-case sharpness at most 1.5x the
gradient's per-device memory; ``top_eigenvalues`` at most 1.5x plus its basis's per-device share
(``num_steps`` float32 vectors split over the 8 devices). Parameter-shaped outputs (the
gradient, the worst-case perturbation) are constrained to the parameters' sharding. The
persistent compilation cache is off here unless ``JAXBOUNDS_COMPILE_CACHE`` names a folder: the
compile seconds are a result.

Records: one JSON object per (decoder, program, variant) in ``bench/results/llm_plan.json``
(a run of some decoders or programs replaces those records and keeps the others) and the table
``bench/results/llm_plan.md``. Every record carries the machine's load average at its start and
end: compile seconds on a shared machine grow with its load.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NUM_DEVICES = 8
BATCH, SEQ = 8, 1024
PROGRAMS = ("gradient", "hessian_trace", "top_eigenvalues", "average_sharpness",
            "worst_case_sharpness")  # fmt: skip
GOAL = 1.5
SAMPLES = 2  # Hutchinson probes of hessian_trace, Gaussian pairs of average_sharpness
ASCENT_STEPS = 2  # worst_case_sharpness's ascent steps (so ASCENT_STEPS + 1 values and gradients)
DECODERS = ("tiny", "124m", "1b", "8b")  # the names of jaxbounds.models.decoder_config


def _setup() -> str | None:
    """8 forced host devices before JAX starts; the compilation cache only where a path is set.

    Compile seconds are this script's product, so JAX's persistent cache (which the other
    benchmarks and the command use by default) is on only when ``JAXBOUNDS_COMPILE_CACHE``
    names a folder; the records then say so (``compile_cache``).
    """
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_force_host_platform_device_count" not in flags:
        flags = f"{flags} --xla_force_host_platform_device_count={NUM_DEVICES}".strip()
        os.environ["XLA_FLAGS"] = flags
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    from jaxbounds import _compile_cache

    value = os.environ.get(_compile_cache.ENV, "")
    if not value.strip():
        return None
    path = _compile_cache.enable()
    return None if path is None else str(path)


def programs(loss, lanczos_steps: int, shardings) -> dict:
    """name -> (params, batch, key) -> outputs, each on the parameters it is given.

    Parameter-shaped outputs (the gradient, the worst-case perturbation) keep the parameters'
    sharding, as a training step's do: left to the partitioner, it replicates them. With
    ``shardings`` None (one device) they are left as they are.
    """
    import dataclasses

    import jax

    import kernels

    gaussian = kernels.Perturbation("gaussian", 1e-3)
    ball = kernels.Perturbation("l2_ball", 0.05)

    def placed(tree):
        if shardings is None:
            return tree
        return jax.lax.with_sharding_constraint(tree, shardings)

    def gradient(p, b, k):
        value, grad = jax.value_and_grad(loss)(p, b)
        return value, placed(grad)

    def worst_case(p, b, k):
        out = kernels.worst_case_sharpness(loss, p, b, k, perturbation=ball, num_steps=ASCENT_STEPS)
        return dataclasses.replace(out, u=placed(out.u))

    return {
        "gradient": gradient,
        "hessian_trace": lambda p, b, k: kernels.hessian_trace(
            loss, p, b, k, num_samples=SAMPLES, chunk_size=1
        ),
        "top_eigenvalues": lambda p, b, k: kernels.top_eigenvalues(
            kernels.hvp(loss, p, b), p, k, num_steps=lanczos_steps
        ),
        "average_sharpness": lambda p, b, k: kernels.average_sharpness(
            loss, p, b, k, perturbation=gaussian, num_samples=SAMPLES, chunk_size=1
        ),
        "worst_case_sharpness": worst_case,
    }


def _to_f32(params):
    import jax
    import jax.numpy as jnp

    return jax.tree_util.tree_map(lambda a: a.astype(jnp.float32), params)


def placed_decoder(name: str, num_devices: int = NUM_DEVICES):
    """The abstract decoder ``name`` placed FSDP on the first ``num_devices`` devices.

    Returns ``(num_params, loss, mesh, shardings, args, batch, seq)``: ``args(dtype)`` gives the
    parameters as ``jax.ShapeDtypeStruct`` leaves of ``dtype`` carrying their shardings, and
    ``batch`` the token batch (``BATCH`` x ``seq + 1``, ``seq`` 32 for the tiny decoder). With
    ``num_devices=1`` nothing is placed: ``mesh`` and ``shardings`` are None and the arguments
    carry no sharding (a program on one device, as a user without a mesh compiles it).
    """
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh

    from jaxbounds.models import (
        abstract_decoder,
        decoder_batch_sharding,
        decoder_config,
        decoder_num_params,
        decoder_shardings,
        next_token_loss,
    )

    config = decoder_config(name)
    apply_fn, shapes = abstract_decoder(config)
    seq = SEQ if name != "tiny" else 32
    if num_devices == 1:
        mesh = shardings = None

        def args(dtype):
            return jax.tree_util.tree_map(lambda s: jax.ShapeDtypeStruct(s.shape, dtype), shapes)

        batch = jax.ShapeDtypeStruct((BATCH, seq + 1), jnp.int32)
    else:
        mesh = Mesh(np.asarray(jax.devices()[:num_devices]), ("fsdp",))
        shardings = decoder_shardings(shapes, mesh)

        def args(dtype):
            return jax.tree_util.tree_map(
                lambda s, sh: jax.ShapeDtypeStruct(s.shape, dtype, sharding=sh), shapes, shardings
            )

        batch = jax.ShapeDtypeStruct(
            (BATCH, seq + 1), jnp.int32, sharding=decoder_batch_sharding(mesh)
        )
    loss = next_token_loss(apply_fn)
    return decoder_num_params(config), loss, mesh, shardings, args, batch, seq


def measure(
    name: str, only: list[str], lanczos_steps: int, f32_args: bool, cache: str | None = None
) -> list[dict]:
    import jax
    import jax.numpy as jnp

    n, loss, mesh, shardings, args, batch, seq = placed_decoder(name)
    key = jax.random.key(0)
    fns = programs(loss, lanczos_steps, shardings)
    plan = []
    for program in PROGRAMS:
        if program not in only:
            continue
        fn = fns[program]
        how = {  # variant -> (argument dtype, program); the variants in variants()' order
            "f32_in_program": (jnp.bfloat16, lambda p, b, k, fn=fn: fn(_to_f32(p), b, k)),
            "bf16": (jnp.bfloat16, fn),  # the gradient in the model's own dtype
            "bf16_args": (jnp.bfloat16, fn),  # a kernel as a user calls it (its own cast)
            "f32_args": (jnp.float32, fn),
        }
        plan.extend((program, v, *how[v]) for v in variants(program, f32_args))
    records = []
    for program, variant, dtype, fn in plan:
        record = {
            "decoder": name,
            "num_params": n,
            "program": program,
            "variant": variant,
            "argument_dtype": jnp.dtype(dtype).name,
            "mesh": dict(mesh.shape),
            "batch": [BATCH, seq],
            "platform": jax.devices()[0].platform,
            "load_start": [round(x, 2) for x in os.getloadavg()],
            "cpu_count": os.cpu_count(),
            "compile_cache": cache,
        }
        if program == "top_eigenvalues":
            record["num_steps"] = lanczos_steps
        start = time.perf_counter()
        try:
            lowered = jax.jit(fn).lower(args(dtype), batch, key)
            record["lower_s"] = round(time.perf_counter() - start, 2)
            start = time.perf_counter()
            compiled = lowered.compile()
        except Exception as err:  # a program that does not compile is a result
            record["error"] = f"{type(err).__name__}: {str(err)[:400]}"
            frames = traceback.extract_tb(err.__traceback__)
            ours = [f for f in frames if f"{os.sep}kernels{os.sep}" in f.filename]
            if ours:  # where in the kernels it was raised
                record["error_at"] = f"kernels/{Path(ours[-1].filename).name}:{ours[-1].lineno}"
            records.append(record)
            continue
        record["compile_s"] = round(time.perf_counter() - start, 2)
        mem = compiled.memory_analysis()
        record["argument_gib"] = mem.argument_size_in_bytes / 2**30
        record["temp_gib"] = mem.temp_size_in_bytes / 2**30
        record["output_gib"] = mem.output_size_in_bytes / 2**30
        record["per_device_gib"] = (
            record["argument_gib"] + record["temp_gib"] + record["output_gib"]
        )
        cost = compiled.cost_analysis()
        cost = cost[0] if isinstance(cost, list | tuple) else cost
        record["xla_flops_per_device"] = float(cost.get("flops", float("nan"))) if cost else None
        record["load_end"] = [round(x, 2) for x in os.getloadavg()]
        records.append(record)
        del compiled, lowered
        jax.clear_caches()
    return records


def summarize(records: list[dict]) -> list[dict]:
    """Ratios against the gradient of the same decoder; the goals.

    A kernel's row is compared with the gradient evaluated the same way (its variant); the
    gradient's rows with the float32-in-the-program gradient, the reference.
    """
    grads = {(r["decoder"], r["variant"]): r for r in records
             if r["program"] == "gradient" and "per_device_gib" in r}  # fmt: skip
    for r in records:
        # a gradient's row, and a kernel given the bfloat16 shards (its own cast to float32),
        # against the gradient with float32 parameters cast inside the program
        same = r["program"] == "gradient" or r["variant"] == "bf16_args"
        variant = "f32_in_program" if same else r["variant"]
        g = grads.get((r["decoder"], variant))
        if g is None or "per_device_gib" not in r:
            continue
        r["memory_vs_gradient"] = round(r["per_device_gib"] / g["per_device_gib"], 3)
        r["compile_vs_gradient"] = round(r["compile_s"] / g["compile_s"], 2)
        if r["program"] == "gradient":
            continue
        allowance = 0.0
        if r["program"] == "top_eigenvalues":
            # the basis's per-device share: num_steps float32 vectors split over the devices
            allowance = r["num_steps"] * 4 * r["num_params"] / NUM_DEVICES / 2**30
            r["basis_share_gib"] = round(allowance, 3)
        goal = GOAL * g["per_device_gib"] + allowance
        r["goal_gib"] = goal
        r["meets_goal"] = r["per_device_gib"] <= goal
    return records


def _gib(x: float | None) -> str:
    if x is None:
        return ""
    return f"{x:.2f}" if x >= 0.1 else f"{x:.2e}"


def markdown(records: list[dict]) -> str:
    lines = [
        "Llama-style decoders, bfloat16 weights, FSDP over 8 forced CPU devices, batch 8 x 1024,"
        " compiled without running. Per-device XLA memory = arguments + temporaries + outputs;"
        " a kernel's ratios against the gradient evaluated the same way (its variant), a"
        " gradient's against the gradient with float32 parameters cast inside the program."
        " Goal: 1.5x the gradient (plus the basis's per-device share for Lanczos).",
        "",
        "| decoder | program | variant | GiB per device | vs gradient | goal (GiB) | meets |"
        " compile (s) | vs gradient | XLA GFLOP per device | load (1 min) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in records:
        prog = r["program"] + (f" ({r['num_steps']} steps)" if "num_steps" in r else "")
        load = r.get("load_start", [None])[0]
        if "error" in r:
            where = f" ({r['error_at']})" if "error_at" in r else ""
            error = re.sub(r"[FEW]\d{4} [\d:.]+ +\d+ \S+\] ", "", r["error"])  # glog prefix
            error = error.replace("|", "/")[:240]
            lines.append(f"| {r['decoder']} | {prog} | {r['variant']} | {error}{where} "
                         f"| | | | | | | {load} |")  # fmt: skip
            continue
        meets = {True: "yes", False: "**no**"}.get(r.get("meets_goal"), "")
        flops = r.get("xla_flops_per_device")
        lines.append(
            f"| {r['decoder']} ({r['num_params'] / 1e9:.2f}B) | {prog} | {r['variant']} | "
            f"{_gib(r['per_device_gib'])} | {r.get('memory_vs_gradient', '')} | "
            f"{_gib(r.get('goal_gib'))} | {meets} | {r['compile_s']:.1f} | "
            f"{r.get('compile_vs_gradient', '')} | "
            f"{'' if flops is None else f'{flops / 1e9:.4g}'} | {load} |"
        )
    return "\n".join(lines) + "\n"


def decoder_names(parser: argparse.ArgumentParser, value: str) -> list[str]:
    """The comma-separated ``--configs`` as a list; exit 2 naming the flag on an unknown name."""
    names = [c for c in value.split(",") if c]
    unknown = sorted(set(names) - set(DECODERS))
    if unknown or not names:
        parser.error(f"--configs: unknown {unknown or [value]}; expected some of {DECODERS}")
    return names


def records_file(parser: argparse.ArgumentParser, out: Path, render: bool) -> None:
    """Exit 2 naming ``--out`` unless ``out`` can take a run's records (a ``.json`` file).

    Checked before any compile: a ``--render`` needs the file, and a run's folder is created here
    so that an unwritable place fails now, not after the compiles.
    """
    if out.is_dir() or out.suffix != ".json":
        parser.error(f"--out: expected a .json file (the table goes beside it), got {out}")
    if render:
        if not out.is_file():
            parser.error(f"--out: no records to render at {out}")
        return
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        parser.error(f"--out: cannot create the folder {out.parent} ({err.strerror})")


def write_records(out: Path, records: list[dict], table: str) -> None:
    """The records in ``out`` (JSON) and their table beside it (``.md``), the table printed."""
    out.write_text(json.dumps(records, indent=1) + "\n")
    out.with_suffix(".md").write_text(table)
    print(table)


def variants(program: str, f32_args: bool) -> list[str]:
    """The variants measured for a program (see the module docstring)."""
    out = ["f32_in_program", "bf16" if program == "gradient" else "bf16_args"]
    return out + (["f32_args"] if f32_args else [])


def _child(name: str, program: str, args: argparse.Namespace) -> list[dict]:
    """One program of one decoder in a fresh process.

    XLA's compiler can abort the process (a failed check) or exhaust the host's memory; a record
    then says so instead of losing the others. ``--host-memory-gib`` caps the child's address
    space, so that a compilation that needs more fails alone instead of starving the machine.
    Each record carries the child's peak resident memory (``compile_host_rss_gib``).
    """
    import resource
    import tempfile

    cmd = [sys.executable, __file__, "--child", "--configs", name, "--programs", program,
           "--lanczos-steps", str(args.lanczos_steps)]  # fmt: skip
    if args.f32_args:
        cmd.append("--f32-args")
    limit = None if args.host_memory_gib is None else int(args.host_memory_gib * 2**30)

    def cap() -> None:
        if limit is not None:
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, preexec_fn=cap)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = code = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    rss_gib = round(usage.ru_maxrss * 1024 / 2**30, 2)  # ru_maxrss is in KiB on Linux
    records = [json.loads(line[len("RECORD ") :]) for line in stdout.splitlines()
               if line.startswith("RECORD ")]  # fmt: skip
    for r in records:
        r["compile_host_rss_gib"] = rss_gib
    if code != 0:
        lines = [ln for ln in stderr.splitlines() if ln.strip()] or [""]
        why = next((ln for ln in lines if "Check failed" in ln or "Error" in ln
                    or "bad_alloc" in ln), lines[-1])  # fmt: skip
        if code == -9:
            why = "killed (SIGKILL: the system's out-of-memory killer when the host ran out)"
        done = {r["variant"] for r in records}
        for variant in variants(program, args.f32_args):
            if variant not in done:
                records.append({"decoder": name, "program": program, "variant": variant,
                                "load_start": [round(x, 2) for x in os.getloadavg()],
                                "compile_host_rss_gib": rss_gib,
                                "host_memory_limit_gib": args.host_memory_gib,
                                "error": f"compilation failed, exit {code}: "
                                         f"{why.strip()[:300]}"})  # fmt: skip
    for r in records:
        print(json.dumps(r), flush=True)
    return records


def _check_flags(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Exit 2 naming the flag on a bad flag; a run's ``--out`` folder made before any compile."""
    for p in args.programs.split(","):
        if p not in PROGRAMS:
            parser.error(f"--programs: unknown program {p!r} (known: {', '.join(PROGRAMS)})")
    if args.lanczos_steps < 1:
        parser.error(f"--lanczos-steps: expected an int >= 1, got {args.lanczos_steps}")
    if args.host_memory_gib is not None and not args.host_memory_gib > 0:
        parser.error(f"--host-memory-gib: expected a number > 0, got {args.host_memory_gib}")
    if Path(args.out).exists() and not Path(args.out).is_dir():
        parser.error(f"--out: expected a folder, got the file {args.out}")
    if args.render and not (Path(args.out) / "llm_plan.json").is_file():
        parser.error(f"--out: no llm_plan.json to render in {args.out}")
    if not (args.render or args.child):
        try:
            Path(args.out).mkdir(parents=True, exist_ok=True)
        except OSError as err:
            parser.error(f"--out: cannot create the folder {args.out} ({err.strerror})")


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the tiny and 1B decoders only")
    parser.add_argument("--configs", default=None, help="comma-separated: tiny,1b,8b")
    parser.add_argument("--programs", default=",".join(PROGRAMS))
    parser.add_argument("--lanczos-steps", type=int, default=10)
    parser.add_argument("--f32-args", action="store_true", help="also float32 arguments")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results"))
    parser.add_argument("--host-memory-gib", type=float, default=None,
                        help="cap each compiling process's address space (GiB)")  # fmt: skip
    parser.add_argument("--render", action="store_true", help="rewrite the table from the JSON")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    configs = args.configs or ("tiny,1b" if args.quick else "tiny,1b,8b")
    only = args.programs.split(",")
    configs = ",".join(decoder_names(parser, configs))
    _check_flags(parser, args)
    sys.path.insert(0, str(ROOT))
    cache = _setup()
    records: list[dict] = []
    if args.render:
        path = Path(args.out) / "llm_plan.json"
        merged = summarize(json.loads(path.read_text()))
        (Path(args.out) / "llm_plan.md").write_text(markdown(merged))
        return merged
    if args.child:
        import jax

        if len(jax.devices()) < NUM_DEVICES:
            parser.error(f"needs {NUM_DEVICES} devices, found {len(jax.devices())}")
        for name in configs.split(","):
            for r in measure(name, only, args.lanczos_steps, args.f32_args, cache):
                print("RECORD " + json.dumps(r), flush=True)
        return []
    for name in configs.split(","):
        for program in PROGRAMS:
            if program in only:
                records.extend(_child(name, program, args))
    return _merge(Path(args.out) / "llm_plan.json", records)


def _merge(path: Path, records: list[dict]) -> list[dict]:
    """``records`` in place of the same (decoder, program, variant) in ``path``; written."""
    kept = []
    if path.exists():
        new = {(r["decoder"], r["program"], r["variant"]) for r in records}
        kept = [r for r in json.loads(path.read_text())
                if (r["decoder"], r["program"], r["variant"]) not in new]  # fmt: skip
    order = {n: i for i, n in enumerate(DECODERS)}
    merged = sorted(
        kept + records,
        key=lambda r: (order.get(r["decoder"], 9), PROGRAMS.index(r["program"]), r["variant"]),
    )
    merged = summarize(merged)
    write_records(path, merged, markdown(merged))
    return merged


if __name__ == "__main__":
    main()
