"""Trace estimators: Hutchinson, Hutch++ and the Hessian trace of a loss."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Literal

import jax
import jax.numpy as jnp
import numpy as np

from kernels._checks import (
    check_key,
    check_positive_int,
)
from kernels._flat import (
    _MAX_KEPT,
    _Flat,
    _indices,
    _num_bad_rows,
    _setup,
    _setup_forms,
    leaf_shardings,
    tree_dot,
    tree_norm2,
)
from kernels._hessian import Matvec, hvp
from kernels._jit import compile_once
from kernels._lanczos import _Basis
from kernels._memory import hutchinson_chunk, probe_chunk
from kernels._names import method_count, renamed_kwargs
from kernels._precision import work_result_type
from kernels.estimate import Estimate
from kernels.parallel import (
    check_num_samples,
    map_samples,
    sample_key,
    sample_statistics,
    splits_user_mesh,
)

_MODES = ("auto", "forms", "products")


# --------------------------------------------------------------------------- trace estimators


def _hutchinson(
    matvec: Any,
    like: Any,
    key: Any,
    num_samples: int,
    chunk_size: Any,
    probe: str,
    mode: str = "auto",
) -> Estimate:
    check_key(key, "key")
    check_num_samples(num_samples, "num_samples", minimum=2)
    chunk = hutchinson_chunk(chunk_size, matvec)
    if probe not in ("rademacher", "gaussian"):
        raise ValueError(f"probe: expected 'rademacher' or 'gaussian', got {probe!r}")
    if not isinstance(mode, str) or mode not in _MODES:
        raise ValueError(f"mode: expected one of {_MODES}, got {mode!r}")
    flat = _setup_forms(matvec, like, mode, chunk)

    def one(k: jax.Array) -> jax.Array:
        if flat.leafwise(key, probe):  # a sharded model: the probe's leaves where they live
            return flat.tree_form(flat.leaf_probe(k))
        return flat.form(flat.probe(k, probe))

    stats = sample_statistics(one, key, num_samples=num_samples, chunk_size=chunk)
    flat, stats = flat.checked(stats)
    flat.check_products(stats.num_nonfinite, num_samples, "probes")
    return stats.estimate()


@renamed_kwargs(num_probes="num_samples")
@compile_once
def hutchinson_trace(
    matvec: Matvec,
    like: Any,
    key: jax.Array,
    *,
    num_samples: int,
    chunk_size: int | Literal["auto"] | None = "auto",
    probe: Literal["rademacher", "gaussian"] = "rademacher",
    mode: Literal["auto", "forms", "products"] = "auto",
) -> Estimate:
    r"""Estimate $\operatorname{tr}(A)$ from products $v \mapsto Av$ (Hutchinson).

    $$\hat t = \frac{1}{m}\sum_{i=1}^m v_i^\top A v_i,$$ unbiased for Rademacher or standard
    Gaussian probes; with Rademacher probes it is exact for diagonal $A$ and its variance is
    $2(\|A\|_F^2 - \sum_i A_{ii}^2)/m$ (Gaussian: $2\|A\|_F^2/m$). The standard error is the
    sample standard deviation of $v_i^\top A v_i$ over $\sqrt m$. Probe $i$ is drawn from
    ``jax.random.fold_in(key, i)`` inside the program and the mean and variance are streamed
    (:func:`kernels.parallel.sample_statistics`), so memory is that of ``chunk_size`` probes.
    For a :func:`hvp` / :func:`dataset_hvp` operator $v_i^\top A v_i$ is computed directly by
    forward over forward mode (module docstring), without the product $A v_i$.

    Args:
      matvec: ``v -> A v`` on pytrees shaped like ``like`` (A symmetric): a :func:`hvp` /
        :func:`dataset_hvp` operator or any traceable callable.
      like: pytree of floating arrays (or int n) fixing probe structure and dtype (float32
        probes for half-precision leaves); for a loss operator, shaped like its ``params``.
      key: PRNG key (``jax.random.key``).
      num_samples: probes, $2 \le m \le 2^{53}$ (``num_probes`` is its deprecated name). Static.
      chunk_size: probes per vectorised batch, an int >= 1; ``None`` runs probes one at a
        time (the least memory); ``"auto"`` (default) is ``None`` on a CPU, where one at a
        time is also fastest for Hessians; on a GPU or TPU, which wants vectorised chunks
        (:func:`kernels._backend.is_accelerator`), for a loss operator the largest power of
        two up to 16 whose probes' estimated memory stays within 1.5 gradients' temporaries
        of its loss (at least 128 MiB; :func:`kernels._memory.memory_budget`,
        :func:`kernels._memory.budgeted_chunk_size`), for a plain callable (no gradient to
        compare with) 16. An int is used as given. It never changes the result beyond float
        reassociation. Static.
      probe: ``"rademacher"`` or ``"gaussian"``.
      mode: how $v^\top A v$ is formed for a loss operator: ``"forms"`` (forward over forward
        mode: no linearisation, memory of about a forward pass), ``"products"``
        ($v \cdot Av$, the operator linearised once: its residuals stay in memory, each probe
        runs the tangent program) or ``"auto"`` (default): products for a one-batch
        :func:`hvp` probed one at a time whose estimated memory (1.6 times the
        linearisation's residuals) stays within 1.5 gradients' temporaries (at least
        128 MiB), else forms (module docstring). ``"products"`` and ``"forms"`` are used as
        given. The two agree to rounding. A plain callable always uses products;
        a loss without forward-mode derivatives (a ``jax.custom_vjp`` inside) falls back to
        products. Static.

    Returns:
      Estimate(mean, stderr, num_samples=m).

    Raises:
      ValueError: for num_samples < 2, a bad ``chunk_size``, ``key`` or ``probe``, a ``like``
        that is not floating or whose size differs from the operator's; (runtime check)
        non-finite ``params`` / loss of a loss operator, or non-finite $v_i^\top A v_i$
        (with how many of the m probes).

    References:
      Hutchinson 1989, doi:10.1080/03610918908812806.

    >>> import jax, jax.numpy as jnp
    >>> d = jnp.array([1.0, 2.0, 3.0])
    >>> hutchinson_trace(lambda v: d * v, 3, jax.random.key(0), num_samples=4).mean
    Array(6., dtype=float32)
    """
    return _hutchinson(matvec, like, key, num_samples, chunk_size, probe, mode)


def hutchpp_memory_bytes(num_matvecs: int, size: int, dtype: Any) -> int:
    r"""Memory of the Hutch++ sketch: $3\,s\,n\,b$ bytes with $s = \min(\lfloor m/3\rfloor, n)$.

    The sketch holds $s$ images $A s_j$ of the parameter size $n$ ($b$ bytes per element) and
    the orthonormal basis $Q$ built from them by Gram-Schmidt, both leaf by leaf in the
    parameters' layout; the bound keeps room for a third $s \times n$ array (a working copy,
    as the QR factorisation of earlier versions needed). This comes on top of what
    ``chunk_size`` products need, which Hutchinson needs too.

    Args:
      num_matvecs: the budget m of :func:`hutchpp_trace`.
      size: the number of parameters n.
      dtype: the parameters' dtype.

    Returns:
      The number of bytes, a Python int.

    >>> hutchpp_memory_bytes(300, 1_000_000, "float32")  # 100 vectors per copy: 1.2 GB
    1200000000
    """
    num_sketch = min(check_positive_int(num_matvecs, "num_matvecs") // 3, size)
    return 3 * num_sketch * int(size) * np.dtype(dtype).itemsize


def _sketch_basis(flat: _Flat, key: jax.Array, num_sketch: int, chunk: int):
    """Orthonormal basis Q of A S (S Rademacher, row j from fold_in(key, j)) and tr(Q'AQ) terms.

    Q is held leaf by leaf in the parameters' layout (a Lanczos :class:`_Basis`): column j is
    the image ``A s_j`` orthogonalised against columns ``0 .. j-1`` by Gram-Schmidt with a
    second pass where the first cancelled, and normalised. An image with less than sqrt(eps)
    of its norm left (in the span of the columns before it) is replaced by a Gaussian direction
    orthogonal to them (sample ``num_sketch + j`` of ``key``): Q stays orthonormal and spans
    the whole space when ``num_sketch`` is its dimension, as Householder QR's Q does.
    """
    flat = flat.for_bases()
    images = map_samples(
        lambda j: flat.tree_matvec(flat.probe_leaves(sample_key(key, j))),
        _indices(num_sketch),
        chunk_size=chunk,
        key=key,  # an rbg key's draws change under vmap: such a map runs one at a time
    )  # per leaf (s, *shape): rows A s_j
    shapes = [a.shape[1:] for a in images]
    dtype = flat.dtype
    shardings = leaf_shardings(flat.template)
    basis = _Basis.create(num_sketch, shapes, dtype, dtype, shardings, flat.anchors())

    tol = float(np.sqrt(np.finfo(dtype).eps))

    def unit(current: _Basis, y: list, j: jax.Array) -> tuple[list, jax.Array]:
        """``y`` orthogonalised and normalised, and whether it held a direction of its own."""
        w, norm = current.orthogonalize(y, j)
        keep = norm > tol * tree_norm2(y)
        return [jnp.where(keep, a / jnp.where(keep, norm, 1.0), 0) for a in w], keep

    def orthonormal(j: jax.Array, rows: list) -> list:
        current = basis.with_rows(rows)
        y = [jax.lax.dynamic_index_in_dim(a, j, keepdims=False) for a in images]
        # an image in the span of the columns before it (a repeated or opposite sign vector)
        # leaves only rounding, which normalised would be a column far from orthogonal: a
        # Gaussian direction orthogonal to the columns takes its place (as Householder QR
        # completes a basis), so a sketch of n vectors still spans the whole space
        q, keep = unit(current, y, j)
        gauss = flat.probe_leaves(jax.random.fold_in(key, num_sketch + j), "gaussian")
        fresh, _ = unit(current, gauss, j)  # independent of the columns almost surely
        return current.set(j, [jnp.where(keep, a, b) for a, b in zip(q, fresh, strict=True)]).rows

    basis = basis.with_rows(jax.lax.fori_loop(0, num_sketch, orthonormal, basis.rows))

    def column(j: jax.Array) -> jax.Array:
        q = basis.row(j)
        return tree_dot(q, flat.tree_matvec(q))

    quad = map_samples(column, _indices(num_sketch), chunk_size=chunk)
    return basis, quad, _num_bad_rows(*images) + _num_bad_rows(quad)


def _hutchpp(matvec: Any, like: Any, key: Any, num_matvecs: int, chunk_size: Any) -> Estimate:
    key = check_key(key, "key")
    check_num_samples(num_matvecs, "num_matvecs", minimum=4)
    chunk = probe_chunk(chunk_size)
    # on a user's mesh the products run inside shard_maps: recomputed there (splits_user_mesh)
    flat = _setup(matvec, like, linearize=not splits_user_mesh())
    num_sketch = min(num_matvecs // 3, flat.size)
    if num_sketch > _MAX_KEPT:
        raise ValueError(
            f"num_matvecs: Hutch++ keeps a sketch of min(num_matvecs // 3, n) vectors, at most "
            f"2**31 - 1; got num_matvecs={num_matvecs} ({num_sketch} sketch vectors)"
        )
    num_hutch = num_matvecs - 2 * num_sketch
    key_sketch, key_hutch = jax.random.split(key)
    # one program may not mix shard_maps over different device sets, and in a multi-process
    # program a subset such as jax.devices()[:k] may leave out every device of some process
    # (whose result would then not be addressable there): every map and statistic below uses
    # the kernel's one placement (all devices, or the parameters' mesh)
    basis, quad, bad = _sketch_basis(flat, key_sketch, num_sketch, chunk)

    space = flat.for_bases()

    def one(k: jax.Array) -> jax.Array:
        g = basis.project_out(space.probe_leaves(k), num_sketch)
        return tree_dot(g, space.tree_matvec(g))

    stats = sample_statistics(one, key_hutch, num_samples=num_hutch, chunk_size=chunk)
    flat.check_products(bad + stats.num_nonfinite, num_matvecs, "products")
    rest = stats.estimate(num_evaluations=num_matvecs)
    return dataclasses.replace(rest, mean=jnp.sum(quad) + rest.mean)


@compile_once
def hutchpp_trace(
    matvec: Matvec,
    like: Any,
    key: jax.Array,
    *,
    num_matvecs: int,
    chunk_size: int | Literal["auto"] | None = None,
) -> Estimate:
    r"""Estimate $\operatorname{tr}(A)$ with Hutch++ (low-rank deflation plus Hutchinson).

    With budget $m$ products: a Rademacher sketch $S$ with $s = \min(\lfloor m/3 \rfloor, n)$
    columns, $Q = \operatorname{orth}(AS)$, and
    $$\hat t = \operatorname{tr}(Q^\top A Q) + \frac{1}{g}\sum_{i=1}^{g}
    g_i^\top (I-QQ^\top) A (I-QQ^\top) g_i,\quad g = m - 2s.$$
    Unbiased; its error falls like $1/m$ instead of $1/\sqrt m$ when $A$ has a few dominant
    eigenvalues. ``stderr`` is the standard error of the Hutchinson part alone (the deflated
    term is treated as fixed given $S$), so it measures the residual variance, not the
    variability of the sketch.

    Memory: unlike Hutchinson, Hutch++ holds its sketch by design: about
    :func:`hutchpp_memory_bytes` $= 3\,s\,n\,b$ bytes ($n$ parameters of $b$ bytes: the $s$
    images $AS$ and $Q$, held leaf by leaf, and room for a working copy), i.e. $m/3$ vectors
    of the parameter size per copy, beside the memory of ``chunk_size`` products. The residual
    probes are streamed.

    Args:
      matvec: ``v -> A v`` on pytrees shaped like ``like`` (A symmetric); a loss operator is
        linearised once.
      like: pytree of floating arrays (or int n) fixing probe structure and dtype (float32
        probes for half-precision leaves).
      key: PRNG key.
      num_matvecs: total products m >= 4 (so s >= 1 and g >= 2). Static.
      chunk_size: products per vectorised batch, an int >= 1; ``None`` (default) runs them one
        at a time; ``"auto"``: ``None`` on a CPU, 16 on a GPU or TPU (as
        :func:`hutchinson_trace`). Static.

    Returns:
      Estimate(mean, stderr of the Hutchinson part, num_samples=g, num_evaluations=m).

    Raises:
      ValueError: as :func:`hutchinson_trace`, with num_matvecs < 4 in place of num_samples < 2.

    References:
      Meyer, Musco, Musco, Woodruff 2021, "Hutch++", arXiv:2010.09649.

    >>> import jax, jax.numpy as jnp
    >>> d = jnp.array([1.0, 2.0, 3.0])
    >>> round(float(hutchpp_trace(lambda v: d * v, 3, jax.random.key(0), num_matvecs=9).mean), 6)
    6.0
    """
    return _hutchpp(matvec, like, key, num_matvecs, chunk_size)


def hessian_trace(
    loss_fn: Callable[[Any, Any], jax.Array],
    params: Any,
    batch: Any,
    key: jax.Array,
    *,
    num_samples: int | None = None,
    num_matvecs: int | None = None,
    method: Literal["hutchinson", "hutchpp"] = "hutchinson",
    chunk_size: int | Literal["auto"] | None = "auto",
    max_memory_bytes: int | None = None,
    compute_dtype: Any = None,
) -> Estimate:
    r"""Estimate $\operatorname{tr}\nabla^2_\theta L(\theta, b)$ of a loss on one batch.

    Builds :func:`hvp` and runs :func:`hutchinson_trace` (``num_samples`` probes, each
    $v^\top H v$ formed as ``mode="auto"`` chooses: a linearised product or a quadratic form
    by forward over forward mode) or :func:`hutchpp_trace` (``num_matvecs`` products of the
    operator linearised once). For data that does not fit one
    batch use :func:`dataset_hvp` with :func:`hutchinson_trace` (module docstring).

    Args:
      loss_fn: ``(params, batch) -> scalar``; keep the same object across calls.
      params: pytree of float16/bfloat16/float32/float64 arrays; half precision is worked on
        in float32 (probes, products and sums), the Hessian that of the loss at the stored
        values.
      batch: data pytree passed to ``loss_fn`` (``()`` or ``None`` for none).
      key: PRNG key.
      num_samples: Hutchinson probes (>= 2), with ``method="hutchinson"``. Static.
      num_matvecs: Hutch++'s budget of Hessian-vector products (>= 4), with
        ``method="hutchpp"``. (With ``method="hutchinson"`` it is the deprecated name of
        ``num_samples``.) Static.
      method: ``"hutchinson"`` (memory of ``chunk_size`` probes) or ``"hutchpp"`` (holds a
        sketch of :func:`hutchpp_memory_bytes` bytes).
      chunk_size: products per vectorised batch, an int >= 1; ``None`` runs them one at a time;
        ``"auto"`` (default): one at a time on a CPU; on an accelerator Hutchinson's probes
        under the memory budget of :func:`hutchinson_trace` (the largest power of two up to 16
        within 1.5 gradients' temporaries, at least 128 MiB), Hutch++'s 16. An int is used
        as given.
      max_memory_bytes: refuse Hutch++ when its sketch would need more bytes than this (an
        int >= 1; ``None``: no limit). Hutchinson's memory does not grow with ``num_samples``.
      compute_dtype: the dtype the loss is evaluated in: ``None`` (default) float32 for
        half-precision leaves (each cast inside the program), float32/float64 as they are;
        ``"params"`` the model's own dtype (faster; its measured error is on the docs page
        "Large models"); or a floating dtype (:func:`hvp`). Static.

    Returns:
      Estimate of the trace (see the two estimators for its fields).

    Raises:
      ValueError: for an unknown method, the count of the other method (or both, or neither),
        too few probes or products, a Hutch++ sketch over
        ``max_memory_bytes``, a non-scalar loss, integer or empty ``params``, a bad ``key``,
        ``chunk_size`` or ``compute_dtype``; (runtime check) non-finite ``params``, loss at
        ``params`` or products at the probes.

    >>> import jax, jax.numpy as jnp
    >>> loss = lambda p, b: 0.5 * jnp.sum(b * p["w"] ** 2)
    >>> est = hessian_trace(
    ...     loss, {"w": jnp.zeros(2)}, jnp.array([1.0, 2.0]), jax.random.key(0), num_samples=8
    ... )
    >>> est.mean
    Array(3., dtype=float32)
    """
    name, count = method_count(method, num_samples, num_matvecs, stacklevel=2)
    return _hessian_trace(
        loss_fn,
        params,
        batch,
        key,
        count=count,
        count_name=name,
        method=method,
        chunk_size=chunk_size,
        max_memory_bytes=max_memory_bytes,
        compute_dtype=compute_dtype,
    )


@compile_once
def _hessian_trace(
    loss_fn: Callable[[Any, Any], jax.Array],
    params: Any,
    batch: Any,
    key: jax.Array,
    *,
    count: int,
    count_name: str,
    method: str,
    chunk_size: int | Literal["auto"] | None,
    max_memory_bytes: int | None,
    compute_dtype: Any = None,
) -> Estimate:
    """:func:`hessian_trace` once its count is named (``count``: probes or products)."""
    _check_method_count(count, count_name, method)
    if max_memory_bytes is not None:
        check_positive_int(max_memory_bytes, "max_memory_bytes")
    op = hvp(loss_fn, params, batch, compute_dtype=compute_dtype)
    if method == "hutchpp":
        _check_sketch_memory(params, count, max_memory_bytes)
    return operator_trace(op, params, key, method=method, count=count, chunk_size=chunk_size)


def _check_method_count(count: Any, count_name: str, method: str) -> int:
    """The count of ``method`` (named by :func:`kernels._names.method_count`), checked."""
    return check_positive_int(count, count_name, minimum=2 if method == "hutchinson" else 4)


def operator_trace(
    op: Any, like: Any, key: Any, *, method: str, count: int, chunk_size: Any
) -> Estimate:
    """The trace of a loss operator by ``method``: the one dispatch of the loss kernels.

    ``"hutchinson"``: :func:`hutchinson_trace` with ``count`` Rademacher probes;
    ``"hutchpp"``: :func:`hutchpp_trace` with a budget of ``count`` products.
    """
    if method == "hutchinson":
        return _hutchinson(op, like, key, count, chunk_size, "rademacher")
    return _hutchpp(op, like, key, count, probe_chunk(chunk_size))


def _check_sketch_memory(params: Any, num_matvecs: int, max_memory_bytes: int | None) -> None:
    """Refuse a Hutch++ sketch larger than ``max_memory_bytes`` (static)."""
    if max_memory_bytes is None:
        return
    leaves = jax.tree_util.tree_leaves(params)
    size = sum(int(np.prod(jnp.shape(leaf))) for leaf in leaves)
    need = hutchpp_memory_bytes(num_matvecs, size, work_result_type(params))
    if need > max_memory_bytes:
        raise ValueError(
            f"max_memory_bytes: Hutch++ with num_matvecs={num_matvecs} on {size} parameters "
            f"needs a sketch of {need} bytes (3 s n b), more than max_memory_bytes="
            f"{max_memory_bytes}: lower num_matvecs or use method='hutchinson'"
        )
