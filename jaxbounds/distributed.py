r"""One program over many processes: a thin entry point to JAX's own multi-controller runtime.

JAX runs one program over many processes (one or more per host) when every process calls
``jax.distributed.initialize`` before its first computation: afterwards ``jax.devices()`` lists
the devices of all processes, and a program compiled over them (every Monte Carlo kernel of
:mod:`kernels`, which shard their samples over ``jax.devices()``) runs each process's share on
its own devices, with cross-process collectives (gloo on CPU) for the reductions. Call the
kernels inside ``jax.jit`` on every process with the same arguments (same key, same replicated
inputs): every process then receives the same, replicated, result, equal to a one-process run
up to floating-point reassociation.

:func:`initialize` makes a script or the CLI run unchanged on one process or many:

- the coordinator address, process count and process id come from the arguments, else from the
  environment variables ``JAXBOUNDS_COORDINATOR`` (``host:port`` of process 0),
  ``JAXBOUNDS_NUM_PROCESSES`` and ``JAXBOUNDS_PROCESS_ID``;
- when none of them is set, JAX detects a cluster launcher itself (SLURM, Open MPI, Kubernetes,
  Cloud TPU; or its own ``JAX_COORDINATOR_ADDRESS``); when there is none either, the process runs
  alone (process 0 of 1) without the distributed runtime;
- CPU collectives are set to gloo (unless the user chose another implementation), and
  ``local_device_count`` forces that many CPU devices per process (``jax_num_cpu_devices``).

Two processes on one machine (each with 2 CPU devices, 4 devices in all)::

    JAXBOUNDS_COORDINATOR=127.0.0.1:12355 JAXBOUNDS_NUM_PROCESSES=2 JAXBOUNDS_PROCESS_ID=0 \
        python script.py &
    JAXBOUNDS_COORDINATOR=127.0.0.1:12355 JAXBOUNDS_NUM_PROCESSES=2 JAXBOUNDS_PROCESS_ID=1 \
        python script.py

with ``script.py`` calling ``jaxbounds.distributed.initialize(local_device_count=2)`` first.

References:
  JAX documentation, "Introduction to multi-controller JAX"
  (https://docs.jax.dev/en/latest/multi_process.html).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Iterable
from typing import Any, TypeVar

import jax

__all__ = [
    "ENV_COORDINATOR",
    "ENV_NUM_PROCESSES",
    "ENV_PROCESS_ID",
    "ProcessInfo",
    "initialize",
    "is_initialized",
    "process_share",
    "shutdown",
]

ENV_COORDINATOR = "JAXBOUNDS_COORDINATOR"
ENV_NUM_PROCESSES = "JAXBOUNDS_NUM_PROCESSES"
ENV_PROCESS_ID = "JAXBOUNDS_PROCESS_ID"

T = TypeVar("T")

_alone: ProcessInfo | None = None  # set once this process has decided to run alone


@dataclasses.dataclass(frozen=True)
class ProcessInfo:
    """Where this process stands in a (possibly one-process) JAX program.

    Attributes:
      process_index: this process's index, ``0 <= process_index < process_count``.
      process_count: number of processes running the program.
      local_device_count: devices this process drives.
      global_device_count: devices of all processes together (what ``jax.devices()`` lists).
    """

    process_index: int
    process_count: int
    local_device_count: int
    global_device_count: int

    @property
    def is_main(self) -> bool:
        """Whether this is process 0 (the one that writes shared outputs)."""
        return self.process_index == 0


def _current() -> ProcessInfo:
    """The running program's :class:`ProcessInfo` (starts JAX's backend if it is not yet)."""
    return ProcessInfo(
        process_index=jax.process_index(),
        process_count=jax.process_count(),
        local_device_count=jax.local_device_count(),
        global_device_count=jax.device_count(),
    )


def _int_setting(value: Any, name: str, env: str, minimum: int) -> int | None:
    """``value`` (argument ``name``) or else environment variable ``env``, as an int >= minimum."""
    source = name
    if value is None:
        text = os.environ.get(env, "").strip()
        if not text:
            return None
        source = f"{name} (from {env}={text!r})"
        try:
            value = int(text)
        except ValueError:
            raise ValueError(f"{source}: expected an integer") from None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{source}: expected an int >= {minimum}, got {value!r}")
    if value < minimum:
        raise ValueError(f"{source}: expected an int >= {minimum}, got {value}")
    return value


def _address_setting(value: Any) -> str | None:
    """``coordinator_address`` or else ``JAXBOUNDS_COORDINATOR``, checked to read ``host:port``."""
    source = "coordinator_address"
    if value is None:
        value = os.environ.get(ENV_COORDINATOR, "").strip() or None
        if value is None:
            return None
        source = f"coordinator_address (from {ENV_COORDINATOR}={value!r})"
    if not isinstance(value, str):
        raise ValueError(f"{source}: expected a 'host:port' string, got {value!r}")
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(
            f"{source}: expected 'host:port' (the address of process 0 and a free port in"
            f" 1..65535, e.g. '127.0.0.1:12355'), got {value!r}"
        )
    return value


def _settings(
    coordinator_address: Any, num_processes: Any, process_id: Any
) -> tuple[str | None, int | None, int | None]:
    """The three settings from arguments or environment, each checked, and checked together."""
    address = _address_setting(coordinator_address)
    count = _int_setting(num_processes, "num_processes", ENV_NUM_PROCESSES, 1)
    index = _int_setting(process_id, "process_id", ENV_PROCESS_ID, 0)
    if count is not None and index is not None and index >= count:
        raise ValueError(
            f"process_id: must be < num_processes = {count} (ids run 0..{count - 1}), got {index}"
        )
    return address, count, index


def _configure_cpu(local_device_count: int | None) -> None:
    """Set gloo CPU collectives (unless another was chosen) and the forced CPU device count."""
    if jax.config.jax_cpu_collectives_implementation in (None, "", "none"):
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    if local_device_count is not None:
        jax.config.update("jax_num_cpu_devices", local_device_count)


def _check_local_count(info: ProcessInfo, local_device_count: int | None) -> ProcessInfo:
    """Refuse a ``local_device_count`` that the already running backend does not have."""
    if local_device_count is not None and info.local_device_count != local_device_count:
        raise ValueError(
            f"local_device_count: JAX already runs with {info.local_device_count} local devices;"
            f" {local_device_count} can only be set before its first computation"
        )
    return info


def _check_same(info: ProcessInfo, count: int | None, index: int | None) -> ProcessInfo:
    """A repeated call must not ask for another process layout than the running one."""
    if count is not None and count != info.process_count:
        raise ValueError(
            f"num_processes: this program already runs as {info.process_count} process(es)"
            f" (initialize was called before), got {count}"
        )
    if index is not None and index != info.process_index:
        raise ValueError(
            f"process_id: this process already runs as process {info.process_index}, got {index}"
        )
    return info


def _missing_message(address: str | None, count: int | None, index: int | None) -> str:
    """Which settings an explicit (partial) configuration lacks, with where to give them."""
    names = [
        f"{name} (argument or {env})"
        for name, env, value in [
            ("coordinator_address", ENV_COORDINATOR, address),
            ("num_processes", ENV_NUM_PROCESSES, count),
            ("process_id", ENV_PROCESS_ID, index),
        ]
        if value is None
    ]
    return ", ".join(names) + " not given and not detected from a cluster launcher"


def initialize(
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    *,
    local_device_count: int | None = None,
) -> ProcessInfo:
    """Join (or start) a multi-process JAX program, or run as one process; idempotent.

    Call it first in a script, before any JAX computation, with the same arguments on every
    process (only ``process_id`` differs). Each setting is the argument, else its environment
    variable (``JAXBOUNDS_COORDINATOR``, ``JAXBOUNDS_NUM_PROCESSES``,
    ``JAXBOUNDS_PROCESS_ID``). With none of them set, JAX's cluster detection decides (SLURM,
    Open MPI, Kubernetes, Cloud TPU, ``JAX_COORDINATOR_ADDRESS``); with no cluster either, the
    process runs alone without the distributed runtime. ``num_processes=1`` without a coordinator
    is also one process. A second call returns the running layout (it raises if asked for another).

    Args:
      coordinator_address: ``"host:port"`` of process 0, where it serves the coordinator; every
        process passes the same one. ``127.0.0.1:<port>`` for processes on one machine.
      num_processes: total number of processes, an int >= 1.
      process_id: this process's id, an int in ``[0, num_processes)``.
      local_device_count: CPU devices to create in this process (sets ``jax_num_cpu_devices``;
        must come before JAX's first computation). ``None``: JAX's default (one CPU device, or
        the accelerators of the host).

    Returns:
      :class:`ProcessInfo` (process_index, process_count, local_device_count,
      global_device_count).

    Raises:
      ValueError: naming the argument (and environment variable) that is malformed or out of
        range, missing from a partial configuration, or in conflict with the running layout.
      RuntimeError: if a multi-process configuration comes after JAX's first computation, or
        JAX's runtime fails to connect (e.g. the coordinator is unreachable).

    >>> info = initialize()  # no configuration and no cluster launcher: one process
    >>> info.process_index, info.process_count
    (0, 1)
    >>> initialize(num_processes=1) == info  # a second call returns the running layout
    True
    """
    address, count, index = _settings(coordinator_address, num_processes, process_id)
    if local_device_count is not None:
        _int_setting(local_device_count, "local_device_count", "", 1)
    if jax.distributed.is_initialized() or _alone is not None:
        running = _alone or _current()
        return _check_local_count(_check_same(running, count, index), local_device_count)
    explicit = any(value is not None for value in (address, count, index))
    if not explicit or (count == 1 and address is None):
        return _detect_or_alone(local_device_count, index, detect=not explicit)
    _configure_cpu(local_device_count)
    try:
        jax.distributed.initialize(address, count, index)
    except ValueError as err:
        raise ValueError(f"{_missing_message(address, count, index)} ({err})") from err
    except RuntimeError as err:
        raise RuntimeError(
            "initialize: could not start the distributed runtime; call it on every process"
            f" before any JAX computation, with a reachable coordinator ({err})"
        ) from err
    return _current()


def _detect_or_alone(
    local_device_count: int | None, index: int | None, *, detect: bool
) -> ProcessInfo:
    """No configuration: JAX's cluster detection (``detect``), else one process alone."""
    if index not in (None, 0):
        raise ValueError(f"process_id: a one-process run is process 0, got {index}")
    with contextlib.suppress(RuntimeError):  # JAX has started: keep its devices (checked below)
        _configure_cpu(local_device_count)
    global _alone
    if detect:
        try:
            jax.distributed.initialize()  # SLURM, Open MPI, Kubernetes, TPU, JAX_COORDINATOR_*
        except ValueError as err:  # no cluster launcher found
            if "coordinator_address" not in str(err):
                raise
        except RuntimeError:  # JAX has started already: it can only go on alone
            pass
    info = _check_local_count(_current(), local_device_count)
    if not jax.distributed.is_initialized():
        _alone = info
    return info


def is_initialized() -> bool:
    """Whether JAX's distributed runtime runs in this process (False for a lone process).

    >>> isinstance(is_initialized(), bool)
    True
    """
    return jax.distributed.is_initialized()


def shutdown() -> None:
    """Leave the distributed runtime (a barrier with the other processes); no-op when alone.

    JAX cannot be re-initialised in the same process afterwards; call it once, at the end.

    >>> shutdown()  # one process: nothing to do
    """
    if jax.distributed.is_initialized():
        jax.distributed.shutdown()


def process_share(
    items: Iterable[T], *, process_index: int | None = None, process_count: int | None = None
) -> list[T]:
    """This process's disjoint share of ``items``: positions ``i`` with ``i % count == index``.

    The shares of processes ``0..count-1`` partition ``items`` (round robin, so they differ in
    size by at most one) and do not depend on anything but the order of ``items``, so every
    process computes the same split without communicating.

    Args:
      items: the work units, in the same order on every process.
      process_index: default ``jax.process_index()``.
      process_count: default ``jax.process_count()``.

    Returns:
      A list of the items of this process, in their original order.

    Raises:
      ValueError: if ``process_count`` is not an int >= 1 or ``process_index`` is not in
        ``[0, process_count)``.

    >>> process_share(range(7), process_index=1, process_count=3)
    [1, 4]
    >>> process_share("abc")  # one process: everything
    ['a', 'b', 'c']
    """
    count = jax.process_count() if process_count is None else process_count
    index = jax.process_index() if process_index is None else process_index
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ValueError(f"process_count: expected an int >= 1, got {count!r}")
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < count:
        raise ValueError(f"process_index: expected an int in [0, {count}), got {index!r}")
    return [item for i, item in enumerate(items) if i % count == index]
