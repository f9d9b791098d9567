"""Compile time of each kernel against its gradient's, on the 124M and 1B decoders (CPU).

One command (8 forced CPU devices; nothing parameter-sized is allocated)::

    python bench/compile_times.py                 # 124m and 1b, every program, 1 repeat
    python bench/compile_times.py --configs tiny --programs gradient,average_sharpness
    python bench/compile_times.py --repeats 3     # each program compiled 3 times (fresh processes)
    python bench/compile_times.py --devices 1     # the same programs on one device, no mesh

The programs are :func:`bench.llm_plan.programs` (the gradient, ``hessian_trace`` with 2
Hutchinson probes, ``top_eigenvalues`` with ``--lanczos-steps`` Lanczos steps,
``average_sharpness`` with 2 Gaussian pairs, ``worst_case_sharpness`` with 2 ascent steps; and
``hessian_trace_rbg``, the same ``hessian_trace`` with a ``jax.random.key(0, impl="rbg")`` key:
every other program gets a threefry key, whose hash JAX lowers on a CPU as a loop per call), on
the decoder of :func:`jaxbounds.models.decoder_config` with bfloat16 weights placed by
:func:`jaxbounds.models.decoder_shardings` on an ``("fsdp",)`` mesh of 8 devices, each shard cast
to float32 inside the program (the ``f32_in_program`` variant of ``bench/llm_plan.py``);
with ``--devices 1``, on one device with nothing placed (as a user without a mesh compiles
them; 8 forced devices still exist, the program uses one). Each
program is lowered from ``jax.ShapeDtypeStruct`` arguments and compiled
(``jax.jit(f).lower(...).compile()``) in a fresh process, so no cache of an earlier program
helps it; JAX's persistent compilation cache is off unless ``JAXBOUNDS_COMPILE_CACHE`` names a
folder (the records say so).

Measured per compile: ``compile_cpu_s``, the process's CPU seconds (``time.process_time``: all
its threads) spent in ``.compile()``, which depends little on what else the machine runs, and
``compile_wall_s`` (``time.perf_counter``), which grows with the machine's load; and the size of
the compiled program (lines of its HLO text, fusions, while loops, conditionals,
collective-permutes). Goal (issue 40): each kernel's compile time at most 2x its gradient's.
The ratio is taken on the minimum CPU seconds over the repeats.

Records: ``bench/results/compile_times.json`` (one object per decoder, program and repeat; a
run of some decoders or programs replaces those records and keeps the others) and the table
``bench/results/compile_times.md``. Every record carries the load average at its start.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import llm_plan  # noqa: E402

OUT = ROOT / "bench" / "results"
CONFIGS = ("124m", "1b")
# hessian_trace with a jax.random "rbg" key: its Rademacher probe drawn by XLA's RngBitGenerator,
# where a threefry key's is JAX's Threefry hash, which JAX lowers on a CPU as a loop per call
KEY_IMPLS = {"hessian_trace_rbg": ("hessian_trace", "rbg")}
PROGRAMS = (*llm_plan.PROGRAMS, *KEY_IMPLS)
GOAL = 2.0


def measure(
    name: str, program: str, lanczos_steps: int, cache: str | None, devices: int = 8
) -> dict:
    """Lower and compile one program of one decoder in this process; its record."""
    import jax
    import jax.numpy as jnp

    n, loss, mesh, shardings, args, batch, seq = llm_plan.placed_decoder(name, devices)
    params = args(jnp.bfloat16)
    base, impl = KEY_IMPLS.get(program, (program, "threefry2x32"))
    fn = llm_plan.programs(loss, lanczos_steps, shardings)[base]
    record = {
        "decoder": name,
        "num_params": n,
        "program": program,
        "variant": "f32_in_program",
        "devices": devices,
        "mesh": dict(mesh.shape) if mesh is not None else {},
        "batch": [llm_plan.BATCH, seq],
        "platform": jax.devices()[0].platform,
        "cpu_count": os.cpu_count(),
        "compile_cache": cache,
        "key_impl": impl,
        "load_start": [round(x, 2) for x in os.getloadavg()],
    }
    if program == "top_eigenvalues":
        record["num_steps"] = lanczos_steps
    start = time.perf_counter()
    lowered = jax.jit(lambda p, b, k: fn(llm_plan._to_f32(p), b, k)).lower(
        params, batch, jax.random.key(0, impl=impl)
    )
    record["lower_wall_s"] = round(time.perf_counter() - start, 2)
    cpu, wall = time.process_time(), time.perf_counter()
    compiled = lowered.compile()
    record["compile_cpu_s"] = round(time.process_time() - cpu, 2)
    record["compile_wall_s"] = round(time.perf_counter() - wall, 2)
    hlo = compiled.as_text()
    record["hlo_lines"] = len(hlo.splitlines())
    for op in ("fusion", "while", "conditional", "collective-permute", "all-gather"):
        record[f"hlo_{op.replace('-', '_')}"] = hlo.count(f" {op}(")
    record["load_end"] = [round(x, 2) for x in os.getloadavg()]
    return record


def _child(name: str, program: str, args: argparse.Namespace) -> dict:
    """One program of one decoder in a fresh process (a failure is a record)."""
    cmd = [sys.executable, __file__, "--child", "--configs", name, "--programs", program,
           "--lanczos-steps", str(args.lanczos_steps), "--devices", str(args.devices)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True)
    for line in proc.stdout.splitlines():
        if line.startswith("RECORD "):
            return json.loads(line[len("RECORD ") :])
    return {
        "decoder": name,
        "program": program,
        "devices": args.devices,
        "error": f"exit {proc.returncode}: {proc.stderr.strip().splitlines()[-1:]}",
        "load_start": [round(x, 2) for x in os.getloadavg()],
    }


def _devices(record: dict) -> int:
    """The record's number of devices (records made before ``--devices`` used 8)."""
    return record.get("devices", llm_plan.NUM_DEVICES)


def _key(record: dict) -> tuple[int, str, str]:
    return (_devices(record), record["decoder"], record["program"])


def summarize(records: list[dict]) -> list[dict]:
    """Per placement, decoder and program: the minimum CPU seconds over repeats, and the ratio."""
    best: dict[tuple[int, str, str], dict] = {}
    for r in records:
        if "compile_cpu_s" not in r:
            continue
        k = _key(r)
        if k not in best or r["compile_cpu_s"] < best[k]["compile_cpu_s"]:
            best[k] = r
    rows = []
    for (devices, decoder, program), r in sorted(best.items(), key=lambda kv: -kv[0][0]):
        g = best.get((devices, decoder, "gradient"))
        reps = [x for x in records if _key(x) == (devices, decoder, program)]
        row = {
            "devices": devices,
            "decoder": decoder,
            "num_params": r["num_params"],
            "program": program + (f" ({r['num_steps']} steps)" if "num_steps" in r else ""),
            "compile_cpu_s": [x.get("compile_cpu_s") for x in reps],
            "compile_wall_s": [x.get("compile_wall_s") for x in reps],
            "hlo_lines": r["hlo_lines"],
            "hlo_fusion": r["hlo_fusion"],
            "hlo_while": r["hlo_while"],
            "load_start": r["load_start"][0],
        }
        if g is not None:
            row["vs_gradient"] = round(r["compile_cpu_s"] / g["compile_cpu_s"], 2)
            row["meets"] = program == "gradient" or row["vs_gradient"] <= GOAL
        rows.append(row)
    return rows


def _count(n: int) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.0f}M" if n >= 1e6 else f"{n:,}"


def markdown(records: list[dict]) -> str:
    lines = [
        "Compile time of each kernel against its gradient's (goal: at most 2x), Llama-style"
        " decoders, bfloat16 weights cast to float32 inside the program, FSDP over 8 forced CPU"
        " devices (placement `fsdp x 8`) or on one device with nothing placed (`one device`),"
        " batch 8 x 1024, each program compiled in a fresh process without the"
        " persistent cache. CPU seconds: `time.process_time` around `.compile()` (all the"
        " process's threads); the ratio uses the minimum over the repeats. Wall seconds grow"
        " with the machine's load (the 1-minute load average at the start is given).",
        "",
        "| placement | decoder | program | compile CPU s | vs gradient | meets |"
        " compile wall s | HLO lines | fusions | while loops | load (1 min) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in summarize(records):
        meets = {True: "yes", False: "**no**"}.get(row.get("meets"), "")
        cpu = ", ".join(f"{x:.1f}" for x in row["compile_cpu_s"])
        wall = ", ".join(f"{x:.1f}" for x in row["compile_wall_s"])
        place = "one device" if row["devices"] == 1 else f"fsdp x {row['devices']}"
        lines.append(
            f"| {place} | {row['decoder']} ({_count(row['num_params'])}) | {row['program']} | "
            f"{cpu} | {row.get('vs_gradient', '')} | {meets} | {wall} | {row['hlo_lines']} | "
            f"{row['hlo_fusion']} | {row['hlo_while']} | {row['load_start']} |"
        )
    for r in records:
        if "error" in r:
            lines.append(
                f"| {_devices(r)} | {r['decoder']} | {r['program']} | {r['error'][:200]} |||||||||"
            )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument("--programs", default=",".join(PROGRAMS))
    parser.add_argument("--lanczos-steps", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--devices", type=int, default=llm_plan.NUM_DEVICES,
                        choices=(1, llm_plan.NUM_DEVICES),
                        help="FSDP over 8 forced devices, or 1: one device")  # fmt: skip
    parser.add_argument("--out", default=str(OUT / "compile_times.json"))
    parser.add_argument("--render", action="store_true", help="rewrite the table from --out")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    configs = llm_plan.decoder_names(parser, args.configs)
    programs = [p for p in args.programs.split(",") if p]
    unknown = sorted(set(programs) - set(PROGRAMS))
    if unknown:
        parser.error(f"--programs: unknown {unknown}; expected some of {PROGRAMS}")
    if args.repeats < 1:
        parser.error(f"--repeats: expected an int >= 1, got {args.repeats}")
    if args.lanczos_steps < 1:
        parser.error(f"--lanczos-steps: expected an int >= 1, got {args.lanczos_steps}")
    if args.child:
        cache = llm_plan._setup()
        record = measure(configs[0], programs[0], args.lanczos_steps, cache, args.devices)
        print("RECORD " + json.dumps(record))
        return
    out = Path(args.out)
    llm_plan.records_file(parser, out, args.render)
    if args.render:
        out.with_suffix(".md").write_text(markdown(json.loads(out.read_text())))
        return
    records = []
    if out.exists():  # keep the records of other decoders and programs
        records = [r for r in json.loads(out.read_text())
                   if not (_devices(r) == args.devices and r["decoder"] in configs
                           and r["program"] in programs)]  # fmt: skip
    for name in configs:
        for program in programs:
            for _ in range(args.repeats):
                record = _child(name, program, args)
                print(json.dumps(record), flush=True)
                records.append(record)
    llm_plan.write_records(out, records, markdown(records))


if __name__ == "__main__":
    main()
