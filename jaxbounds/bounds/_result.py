r"""The result type of every bound calculator, its three-state status, and input validation.

A :class:`Bound` is host-side float64 data (numpy arrays, whatever the global JAX x64 setting):
bounds are scalar work, and float32 loses digits that matter (a kl-inverse at N = 1e6 is off by
0.6% in float32). Its :attr:`Bound.status` has three states (:class:`Status`), after lineax's
``RESULTS``:

- ``NON_VACUOUS``: every checkable hypothesis holds and the value is below the trivial bound;
- ``VACUOUS``: valid, but at or above the trivial bound (it says nothing);
- ``NOT_VALID``: a hypothesis of the theorem fails on this run, an input lies outside the
  formula's domain (only when computed with ``strict=False``; by default a bad input raises), or
  the value is NaN. A not-valid bound never renders as a usable number: ``str(bound)`` is
  ``"not valid: <reasons>"``; its ``value`` is kept for inspection.

A log cover, a complexity proxy or a risk bound on an unbounded loss has no trivial bound
(``trivial`` is None): it can never be vacuous, so its status code is ``NON_VACUOUS``, but it is
*shown* as ``"valid, no trivial bound"`` (:attr:`Bound.label`), never as "non-vacuous", which
would claim a comparison that was not made.

Calculators validate their inputs with :class:`Inputs` (norms and Lipschitz constants finite and
>= 0, counts integers >= 1, delta in (0, 1), risks in their range) and raise ``ValueError`` naming
the argument; with ``strict=False`` the failure is recorded as a failed hypothesis instead.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import functools
import numbers
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import jax
import numpy as np

__all__ = ["NO_TRIVIAL_LABEL", "Bound", "Check", "Inputs", "Status"]

#: How a valid bound without a trivial bound (log cover, proxy, unbounded loss) is shown.
NO_TRIVIAL_LABEL = "valid, no trivial bound"


class Status(enum.IntEnum):
    """The three states of a bound (the codes of :attr:`Bound.status`)."""

    NON_VACUOUS = 0
    VACUOUS = 1
    NOT_VALID = 2

    def __str__(self) -> str:
        return {0: "valid, non-vacuous", 1: "valid, vacuous", 2: "not valid"}[int(self)]


def _show(x: Any) -> str:
    """A short rendering of a number or array for messages."""
    a = np.asarray(x)
    if a.ndim == 0:
        return f"{a.item():.6g}" if a.dtype.kind in "fc" else str(a.item())
    return np.array2string(a, precision=6, threshold=6, separator=", ")


@dataclasses.dataclass(frozen=True)
class Check:
    """One checkable hypothesis: where it holds (a bool array) and the numbers it was checked on.

    ``bool(check)`` is True when it holds everywhere; ``np.asarray(check)`` is ``holds``.

    Attributes:
      holds: bool array (broadcast against the bound's value).
      detail: the measured numbers, e.g. ``"d_m = 64, N^3 = 6.4e+07"``.
    """

    holds: np.ndarray
    detail: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "holds", np.asarray(self.holds, dtype=bool))

    def __bool__(self) -> bool:
        return bool(np.all(self.holds))

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        return self.holds if dtype is None else self.holds.astype(dtype)

    @classmethod
    def of(cls, holds: Any, **numbers: Any) -> Check:
        """A check with its numbers: ``Check.of(dm >= N**3, d_m=dm, **{"N^3": N**3})``."""
        return cls(holds, ", ".join(f"{k} = {_show(v)}" for k, v in numbers.items()))


@dataclasses.dataclass(frozen=True)
class Bound:
    """A closed-form bound (or log cover, or complexity proxy) with every term kept apart.

    Terms are also readable as attributes: ``result.sigma`` is ``result.terms["sigma"]``.
    Host-side float64 data (numpy), not a JAX pytree; ``value`` broadcasts over array inputs, and
    so do :attr:`status`, :attr:`is_valid` and :attr:`is_vacuous`.

    Attributes:
      value: the total (the bound itself), a float64 array (0-d for scalar inputs).
      terms: every intermediate term by name (the formula's pieces).
      hypotheses: each checkable hypothesis of the theorem -> :class:`Check` (plain bool arrays are
        accepted and wrapped). Inputs outside the domain (``strict=False``) appear here too.
      trivial: the trivial bound (the loss range for a risk bound, 1 for a probability, half the
        loss range for a Rademacher complexity): the bound is vacuous where ``value >= trivial``.
        ``None`` for log covers and proxies (never vacuous).
      name: which result this is (``"Trauger & Tewari Theorem 4.1"``).
      kind: ``"log_cover"`` (coefficient of 1/eps^2 or log N at eps), ``"rademacher"``,
        ``"risk"`` (a bound on the population risk), ``"probability"`` or ``"proxy"``.
      provenance: ``"paper"``, ``"checked"`` or ``"rebuilt"`` as in SPEC.md; rebuilt formulas are
        reconstructions, not the authors' statement.
      assumed: hypotheses taken on trust (not checkable from the numbers given).

    >>> fails = {"m > d": Check.of(False, m=8, d=16)}
    >>> b = Bound(value=0.3, terms={}, hypotheses=fails, trivial=1.0)
    >>> b.status, b.is_valid, str(b)
    (<Status.NOT_VALID: 2>, False, 'not valid: m > d fails (m = 8, d = 16)')
    >>> str(Bound(value=0.3, terms={}, hypotheses={}, trivial=1.0))
    '0.3 (valid, non-vacuous)'
    >>> str(Bound(value=7.5, terms={}, hypotheses={}, kind="proxy"))
    '7.5 (valid, no trivial bound)'
    """

    value: np.ndarray
    terms: dict[str, Any]
    hypotheses: dict[str, Check]
    trivial: Any = None
    name: str = ""
    kind: str = ""
    provenance: str = "paper"
    assumed: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "value", np.asarray(self.value, dtype=np.float64))
        hyp = {k: v if isinstance(v, Check) else Check(v) for k, v in self.hypotheses.items()}
        object.__setattr__(self, "hypotheses", hyp)
        if self.trivial is not None:
            object.__setattr__(self, "trivial", np.asarray(self.trivial, dtype=np.float64))

    def __getattr__(self, item: str) -> Any:
        """Terms as attributes (``result.sigma``)."""
        if item.startswith("__"):
            raise AttributeError(item)
        terms = object.__getattribute__(self, "terms")
        if item in terms:
            return terms[item]
        raise AttributeError(f"{type(self).__name__} has no attribute or term {item!r}")

    def _valid(self) -> np.ndarray:
        ok = ~np.isnan(self.value)
        for check in self.hypotheses.values():
            ok = ok & check.holds
        return ok

    @property
    def is_valid(self) -> Any:
        """True where every checkable hypothesis holds, every input is in range, value not NaN."""
        ok = self._valid()
        return bool(ok) if ok.ndim == 0 else ok

    @property
    def is_vacuous(self) -> Any:
        """True where the bound is valid but at or above its trivial bound (says nothing)."""
        vac = self._valid() & (False if self.trivial is None else self.value >= self.trivial)
        return bool(vac) if vac.ndim == 0 else vac

    @property
    def status(self) -> Any:
        """:class:`Status` of a scalar bound; an int8 array of its codes for an array bound."""
        code = np.where(
            ~self._valid(), Status.NOT_VALID, np.where(self.is_vacuous, Status.VACUOUS, 0)
        ).astype(np.int8)
        return Status(int(code)) if code.ndim == 0 else code

    @property
    def label(self) -> str:
        """The status as shown to a user (scalar bounds only).

        ``str(status)``, except that a valid bound without a trivial bound (log cover, proxy)
        reads ``"valid, no trivial bound"``.

        >>> Bound(value=12.0, terms={}, hypotheses={}, kind="proxy").label
        'valid, no trivial bound'
        """
        status = self.status
        if not isinstance(status, Status):
            shape = self.value.shape
            raise ValueError(f"label: defined for a scalar bound, got value shape {shape}")
        if status == Status.NON_VACUOUS and self.trivial is None:
            return NO_TRIVIAL_LABEL
        return str(status)

    @property
    def hypotheses_hold(self) -> Any:
        """True where every checkable hypothesis holds (the NaN check aside)."""
        ok = np.asarray(True)
        for check in self.hypotheses.values():
            ok = ok & check.holds
        return bool(ok) if ok.ndim == 0 else ok

    @property
    def failed(self) -> tuple[str, ...]:
        """Each failed hypothesis (anywhere in an array bound) with the numbers it failed on."""
        out = [
            f"{k} fails ({c.detail})" if c.detail else f"{k} fails"
            for k, c in self.hypotheses.items()
            if not c
        ]
        if np.any(np.isnan(self.value)):
            out.append("the value is NaN")
        return tuple(out)

    def format(self, spec: str = ".4g") -> str:
        """The value with its status, or ``"not valid: <reasons>"``; never a bare number."""
        if self.value.ndim == 0:
            if not self.is_valid:
                return "not valid: " + "; ".join(self.failed)
            return f"{format(float(self.value), spec)} ({self.label})"
        codes = np.broadcast_to(self.status, self.value.shape)
        cells = [
            "not valid" if c == Status.NOT_VALID else format(float(v), spec)
            for v, c in zip(self.value.ravel(), codes.ravel(), strict=True)
        ]
        text = "[" + ", ".join(cells) + "]"
        failed = self.failed
        return text + (" (not valid where: " + "; ".join(failed) + ")" if failed else "")

    def __format__(self, spec: str) -> str:
        return self.format(spec or ".4g")

    def __str__(self) -> str:
        return self.format()


class _Refused(ValueError):
    """An input that is not a real number (a string, None, a complex number, an object)."""


def _short(x: Any) -> str:
    text = repr(x)
    return text if len(text) <= 80 else text[:77] + "..."


def _refuse_kind(name: str, x: Any, raw: np.ndarray) -> None:
    """Raise :class:`_Refused` unless ``raw`` (not of an int or float dtype) holds real numbers.

    Object arrays of Python numbers (``Fraction``, integers beyond int64) pass; everything else
    (strings, bytes, None, complex, arbitrary objects) is refused, saying what it was.
    """
    kind = raw.dtype.kind
    if kind == "O":
        items = raw.ravel().tolist() if raw.ndim else [raw.item()]
        bad = [v for v in items if isinstance(v, bool) or not isinstance(v, numbers.Real)]
        if not bad:
            return
        what = "None" if bad[0] is None else f"a {type(bad[0]).__name__}"
    else:
        what = "a " + {"U": "str", "S": "bytes", "c": "complex"}.get(kind, str(raw.dtype))
    where = "" if raw.ndim == 0 else " inside"
    raise _Refused(f"{name}: expected a real number or an array of real numbers, got "
                   f"{_short(x)} ({what}{where})")  # fmt: skip


class Inputs:
    """Validate a calculator's inputs and convert them to float64 numpy arrays.

    Each method returns the input as a float64 array. With ``strict=True`` a bad input raises
    ``ValueError`` naming the argument; with ``strict=False`` it is recorded in :attr:`failures`
    (a hypothesis ``"<name>: <requirement>"`` that fails where the input is bad), and the bound
    built from it comes out not valid.

    >>> Inputs(strict=True).nonneg("B_w", -1.0)
    Traceback (most recent call last):
    ...
    ValueError: B_w: expected a finite number >= 0, got -1
    """

    def __init__(self, strict: bool) -> None:
        if not isinstance(strict, bool):
            raise ValueError(f"strict: expected a bool, got {strict!r}")
        self.strict = strict
        self.failures: dict[str, Check] = {}

    @staticmethod
    def array(name: str, x: Any) -> np.ndarray:
        """``x`` as a float64 array of real numbers.

        Refused with a ``ValueError`` naming the argument: bools, strings and bytes (``"5"`` is
        not read as 5), ``None``, complex numbers, and objects that are not numbers; integers
        too large for float64 (``10**400``). A traced value (inside ``jax.jit``) is a
        ``TypeError`` saying to call the calculator eagerly.
        """
        if isinstance(x, bool | np.bool_) or getattr(x, "dtype", None) == np.bool_:
            raise ValueError(f"{name}: expected a number, got a bool {x!r}")
        try:
            raw = np.asarray(x)
            if raw.dtype.kind not in "iuf":
                _refuse_kind(name, x, raw)
            return np.asarray(raw, dtype=np.float64)
        except (TypeError, ValueError, OverflowError) as err:
            if "Tracer" in type(err).__name__ or "Tracer" in str(err):
                raise TypeError(
                    f"{name}: bounds are computed eagerly in float64 numpy; got a traced value "
                    "(call the calculator outside jax.jit / vmap / grad)"
                ) from err
            if isinstance(err, _Refused):
                raise ValueError(str(err)) from None
            if isinstance(err, OverflowError):
                raise ValueError(
                    f"{name}: expected a number within float64's range (|x| < 1.8e308), got "
                    f"{_short(x)}"
                ) from None
            raise ValueError(
                f"{name}: expected a number or an array of numbers, got {_short(x)}"
            ) from err

    def require(self, name: str, a: np.ndarray, ok: Any, requirement: str) -> np.ndarray:
        """Record (or raise) unless ``ok`` holds everywhere; returns ``a``."""
        ok = np.asarray(ok, dtype=bool)
        if np.all(ok):
            return a
        bad = np.broadcast_to(a, np.broadcast_shapes(a.shape, ok.shape))[~ok]
        got = _show(bad[0]) if a.ndim == 0 or bad.size == 1 else f"{_show(bad)} (among others)"
        if self.strict:
            raise ValueError(f"{name}: expected {requirement}, got {got}")
        self.failures[f"{name}: {requirement}"] = Check(ok, f"{name} = {got}")
        return a

    def real(self, name: str, x: Any) -> np.ndarray:
        """A finite number."""
        a = self.array(name, x)
        return self.require(name, a, np.isfinite(a), "a finite number")

    def nonneg(self, name: str, x: Any) -> np.ndarray:
        """A finite number >= 0 (norms, Lipschitz constants, complexities, KL)."""
        a = self.array(name, x)
        return self.require(name, a, np.isfinite(a) & (a >= 0), "a finite number >= 0")

    def positive(self, name: str, x: Any) -> np.ndarray:
        """A finite number > 0 (radii, scales, ranges)."""
        a = self.array(name, x)
        return self.require(name, a, np.isfinite(a) & (a > 0), "a finite number > 0")

    def count(self, name: str, x: Any, minimum: int = 1) -> np.ndarray:
        """An integer >= ``minimum`` (integer-valued floats and arrays accepted)."""
        a = self.array(name, x)
        ok = np.isfinite(a) & (a == np.floor(a)) & (a >= minimum)
        return self.require(name, a, ok, f"an integer >= {minimum}")

    def probability(self, name: str, x: Any) -> np.ndarray:
        """A confidence level delta in the open interval (0, 1)."""
        a = self.array(name, x)
        return self.require(name, a, (a > 0) & (a < 1), "a number in (0, 1)")

    def within(self, name: str, x: Any, low: Any, high: Any, range_text: str) -> np.ndarray:
        """A number in ``[low, high]`` (a risk in its loss range), ``range_text`` saying which."""
        a = self.array(name, x)
        return self.require(name, a, (a >= low) & (a <= high), f"a number in {range_text}")

    def bound(self, **fields: Any) -> Bound:
        """A :class:`Bound` whose hypotheses include the recorded input failures."""
        hypotheses = {**self.failures, **fields.pop("hypotheses", {})}
        return Bound(hypotheses=hypotheses, **fields)


def int_option(name: str, x: Any, minimum: int = 1) -> int:
    """A static integer option (it shapes the computation): a Python int >= ``minimum``."""
    if isinstance(x, bool) or not isinstance(x, int | np.integer) or x < minimum:
        raise ValueError(f"{name}: expected an int >= {minimum}, got {x!r}")
    return int(x)


def log_2x_plus_1(*factors: Any) -> np.ndarray:
    """ln(2x + 1) for x = the product of ``factors`` (each >= 1), without overflow (float64).

    ln 2 + sum of ln f + ln(1 + 1/(2x)): finite even where the product x overflows.

    >>> round(float(log_2x_plus_1(2.0, 2.0)), 12)  # ln 9
    2.197224577336
    """
    logs = [np.log(np.asarray(f, dtype=np.float64)) for f in factors]
    x = np.prod(np.broadcast_arrays(*[np.asarray(f, dtype=np.float64) for f in factors]), axis=0)
    return np.log(2.0) + sum(logs[1:], logs[0]) + np.log1p(0.5 / x)


def quiet(fn: Callable) -> Callable:
    """Run a calculator with numpy's floating-point warnings off (bad values are flagged)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with np.errstate(all="ignore"):
            return fn(*args, **kwargs)

    return wrapper


def merge_hypotheses(*bounds: Bound) -> Mapping[str, Check]:
    """The hypotheses of several bounds together (later ones win on equal names)."""
    out: dict[str, Check] = {}
    for b in bounds:
        out.update(b.hypotheses)
    return out


@contextlib.contextmanager
def float64_scope() -> Iterator[None]:
    """JAX in float64 inside the block, whatever the global ``jax_enable_x64`` (restored after)."""
    scope = getattr(jax, "enable_x64", None)
    if scope is None:  # jax < 0.7
        from jax.experimental import enable_x64 as scope  # type: ignore[no-redef]
    with scope(True):
        yield


def in_float64(fn: Callable, *args: Any, **kwargs: Any) -> np.ndarray:
    """``fn(*args, **kwargs)`` (a JAX kernel) run in float64, as a float64 numpy array."""
    with float64_scope():
        return np.asarray(fn(*args, **kwargs), dtype=np.float64)
