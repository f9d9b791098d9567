"""Renamed keyword arguments: an old name keeps working for one release, with a warning.

Every Monte Carlo count of independent samples is called ``num_samples`` (the glossary,
``docs/guides/glossary.md``). :func:`renamed_kwargs` keeps an entry point's old keyword names
working: the call is forwarded with the new name, so the compilation cache of
:func:`kernels._jit.compile_once` is shared by both spellings, ``inspect.signature`` shows the
new names only, and the ``DeprecationWarning`` points at the caller's line (also when the call is
traced inside the caller's own ``jax.jit``). :func:`method_count` does the same for a count whose
name depends on ``method`` (``hessian_trace`` and ``ggn_trace``: Hutchinson's ``num_samples``,
Hutch++'s ``num_matvecs``).
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["REMOVED_IN", "method_count", "renamed_kwargs", "warn_renamed"]

REMOVED_IN = "0.3"
"""The release that drops the old names."""

F = TypeVar("F", bound=Callable[..., Any])


def warn_renamed(old: str, new: str, stacklevel: int, context: str = "") -> None:
    """Warn that keyword ``old`` is deprecated in favour of ``new`` (``stacklevel`` as warnings)."""
    warnings.warn(
        f"{old} is deprecated{context}; use {new} ({old} will be removed in {REMOVED_IN})",
        DeprecationWarning,
        stacklevel=stacklevel + 1,
    )


def renamed_kwargs(**renames: str) -> Callable[[F], F]:
    """Accept each old keyword name (``old=new`` pairs) with a ``DeprecationWarning``.

    Apply it above ``@compile_once`` so that both spellings reach the same compiled program.
    Passing an old name and its new name together is a ``ValueError`` naming both.

    >>> import warnings
    >>> @renamed_kwargs(num_draws="num_samples")
    ... def f(*, num_samples):
    ...     return num_samples
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     f(num_draws=3), str(caught[0].message)
    (3, 'num_draws is deprecated; use num_samples (num_draws will be removed in 0.3)')
    """

    def decorate(fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            for old, new in renames.items():
                if old in kwargs:
                    if new in kwargs:
                        raise ValueError(
                            f"{old} and {new}: {old} is the deprecated name of {new}; pass "
                            f"{new} alone"
                        )
                    warn_renamed(old, new, stacklevel=2)
                    kwargs[new] = kwargs.pop(old)
            return fn(*args, **kwargs)

        wrapper._renamed_kwargs = dict(renames)  # type: ignore[attr-defined]
        return wrapper  # type: ignore[return-value]

    return decorate


def method_count(
    method: Any, num_samples: Any, num_matvecs: Any, stacklevel: int
) -> tuple[str, Any]:
    """The count of a ``method="hutchinson" | "hutchpp"`` trace and the name it was passed as.

    Hutchinson counts independent probes (``num_samples``; ``num_matvecs`` is its deprecated
    name), Hutch++ a budget of products (``num_matvecs``). Exactly one of the two is passed.

    Raises:
      ValueError: for an unknown ``method``, both counts, neither, or ``num_samples`` with
        Hutch++.
    """
    if not isinstance(method, str) or method not in ("hutchinson", "hutchpp"):
        raise ValueError(f"method: expected 'hutchinson' or 'hutchpp', got {method!r}")
    given = num_samples is not None, num_matvecs is not None
    if method == "hutchinson":
        if all(given):
            raise ValueError(
                "num_samples and num_matvecs: pass num_samples alone with method='hutchinson' "
                "(num_matvecs is Hutch++'s budget of products)"
            )
        if given[1]:
            warn_renamed("num_matvecs", "num_samples", stacklevel + 1, " with method='hutchinson'")
            return "num_matvecs", num_matvecs
        if not given[0]:
            raise ValueError(
                "num_samples: required with method='hutchinson' (the number of probes; "
                "num_matvecs is the budget of method='hutchpp')"
            )
        return "num_samples", num_samples
    if given[0]:
        raise ValueError(
            "num_samples and num_matvecs: method='hutchpp' takes a budget of products, "
            f"num_matvecs, not num_samples (got num_samples={num_samples!r})"
        )
    if not given[1]:
        raise ValueError(
            "num_matvecs: required with method='hutchpp' (its budget of products; num_samples "
            "is the probe count of method='hutchinson')"
        )
    return "num_matvecs", num_matvecs
