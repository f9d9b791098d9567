"""The shared argument checks: what a kernel says for inputs it cannot use."""

from __future__ import annotations

import re
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import kernels


class _Model:
    """Stands for a model object passed whole (an equinox module, a flax module)."""


def _quadratic(params, batch):
    del batch
    return jnp.sum(params["w"] ** 2)


_BAD_LEAVES = [("relu", jax.nn.relu), ("model", _Model()), ("text", "relu")]


@pytest.mark.parametrize(("what", "leaf"), _BAD_LEAVES, ids=[w for w, _ in _BAD_LEAVES])
@pytest.mark.parametrize("kernel", ["hessian_trace", "average_sharpness", "hutchinson_like"])
def test_non_array_leaves_are_refused_naming_the_argument(kernel, what, leaf):
    params = {"w": jnp.ones(3), "extra": leaf}
    key = jax.random.key(0)
    calls = {
        "hessian_trace": lambda: kernels.hessian_trace(_quadratic, params, (), key, num_samples=2),
        "average_sharpness": lambda: kernels.average_sharpness(
            _quadratic,
            params,
            (),
            key,
            perturbation=kernels.Perturbation("gaussian", 0.1),
            num_samples=2,
        ),
        "hutchinson_like": lambda: kernels.hutchinson_trace(
            lambda v: v, params, key, num_samples=2
        ),
    }
    name = "like" if kernel == "hutchinson_like" else "params"
    with pytest.raises(ValueError, match=rf"^{name}: leaf \['extra'\] is a .*eqx\.partition"):
        calls[kernel]()


def test_rademacher_refuses_non_array_parameters():
    inputs = jnp.ones((4, 2))
    with pytest.raises(ValueError, match=r"^params: leaf \['act'\] is a str"):
        kernels.search_sup(
            lambda p, x: x @ p["w"],
            {"w": jnp.ones(2), "act": "relu"},
            inputs,
            jax.random.key(0),
            project=lambda p: p,
            num_steps=1,
            step_size=0.1,
        )


def test_numbers_and_arrays_are_accepted():
    kernels._checks.check_array_leaves({"a": 1.0, "b": np.ones(2), "c": jnp.ones(2), "d": 3}, "x")


# ---------------------------------------------------------------------------------------------
# Runtime checks: eagerly, under the user's jit / vmap / grad, and without host callbacks

from kernels import _checks  # noqa: E402
from kernels._jit import compile_once  # noqa: E402


@compile_once
def _two_checks(x, y):
    """A kernel with two top-level checks and one inside a loop (a scan body)."""
    _checks.check_finite(x, "x")
    _checks.check_that(y > 0, "y: expected > 0, got {}", y)

    def body(carry, v):  # as the kernels' own checks in loops do: guard the value used
        v = _checks.ensure_that(v, v < 100.0, "loop: value {} >= 100", v)
        return carry + v, None

    total, _ = jax.lax.scan(body, jnp.zeros((), x.dtype), x)
    return total * y


_GOOD = (jnp.asarray([1.0, 2.0]), jnp.asarray(3.0))


def test_checked_kernel_passes_eagerly_and_under_jit_vmap_grad():
    assert float(_two_checks(*_GOOD)) == 9.0
    assert float(jax.jit(_two_checks)(*_GOOD)) == 9.0
    batched = jax.vmap(_two_checks)(jnp.stack([_GOOD[0]] * 3), jnp.asarray([1.0, 2.0, 3.0]))
    np.testing.assert_array_equal(batched, [3.0, 6.0, 9.0])
    np.testing.assert_array_equal(jax.grad(_two_checks)(*_GOOD), [3.0, 3.0])


_X_NAN = "x: expected finite values, found NaN or inf"
_Y_NEG = "y: expected > 0, got -2.0"


def test_kernel_inside_jit_on_arrays_the_function_closes_over():
    # every argument concrete, the call inside a user's jit: the kernel is traced into that
    # program and its checks run there (it once ran eagerly and read its checks' tracers)
    x, y = _GOOD
    assert float(jax.jit(lambda: _two_checks(x, y))()) == 9.0
    bad = jnp.asarray(-2.0)
    with pytest.raises(jax.errors.JaxRuntimeError, match=re.escape(_checks._MARKER)) as err:
        jax.block_until_ready(jax.jit(lambda: _two_checks(x, bad))())
    assert _checks.failed_check_message(err.value) == _Y_NEG
    np.testing.assert_array_equal(jax.grad(lambda y: jax.jit(lambda: _two_checks(x, y))())(y), 3.0)


@pytest.mark.parametrize(
    ("x", "y", "message", "under_jit"),
    [
        ([jnp.nan, 1.0], 3.0, _X_NAN, {_X_NAN, "loop: value nan >= 100"}),
        ([1.0, 2.0], -2.0, _Y_NEG, {_Y_NEG}),
        ([1.0, 200.0], 3.0, "loop: value 200.0 >= 100", {"loop: value 200.0 >= 100"}),
        # several fail at once: eagerly the first in the kernel's order is named on every
        # backend; inside jit the backend runs the failing callbacks in an order of its own
        ([jnp.nan, 200.0], -2.0, _X_NAN, {_X_NAN, _Y_NEG, "loop: value nan >= 100"}),
        ([1.0, 200.0], -2.0, _Y_NEG, {_Y_NEG, "loop: value 200.0 >= 100"}),
    ],
)
def test_the_first_failed_check_is_named_eagerly(x, y, message, under_jit):
    x, y = jnp.asarray(x), jnp.asarray(y)
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$") as eager:
        _two_checks(x, y)
    assert _checks.failed_check_message(eager.value) == message
    with pytest.raises(jax.errors.JaxRuntimeError, match=re.escape(_checks._MARKER)) as err:
        jax.block_until_ready(jax.jit(_two_checks)(x, y))
    assert _checks.failed_check_message(err.value) in under_jit


def test_under_vmap_one_failing_element_fails_the_batch_once():
    xs = jnp.asarray([[1.0, 2.0], [1.0, 2.0], [1.0, 2.0]])
    ys = jnp.asarray([1.0, -5.0, -7.0])
    with pytest.raises(jax.errors.JaxRuntimeError) as err:
        jax.block_until_ready(jax.jit(jax.vmap(_two_checks))(xs, ys))
    # the batch is checked once; the first failing element is reported with its own value
    assert _checks.failed_check_message(err.value) == "y: expected > 0, got -5.0"


def _earlier_failure():
    """What jax.effects_barrier() raises on a GPU while an earlier program's failed check is
    unread (simulated on the CPU): a GPU reports a program's failure after its dispatch, and JAX
    keeps it in that program's runtime token until a barrier (a CPU raises during the dispatch).
    """
    raise jax.errors.JaxRuntimeError(
        "INTERNAL: CpuCallback error calling callback: Traceback (most recent call last):\n"
        f"ValueError: {_checks._MARKER}earlier: a check of another program"
    )


def test_an_earlier_programs_failure_is_never_this_calls_check(monkeypatch):
    # an eager call with in-place checks waits with the public jax.effects_barrier(); its own
    # callbacks record and never raise, so what the barrier raises is an earlier program's
    # failure: raised as that JaxRuntimeError with a note saying so, after the call's own check
    calls = []

    def barrier():
        calls.append(1)
        _earlier_failure()

    monkeypatch.setattr(jax, "effects_barrier", barrier)
    with pytest.raises(jax.errors.JaxRuntimeError, match="earlier: a check") as err:
        _two_checks(*_GOOD)
    assert any("failure of an earlier program" in note for note in err.value.__notes__)
    assert not isinstance(err.value, ValueError)
    with pytest.raises(ValueError, match=r"^loop: value 200.0 >= 100$"):
        _two_checks(jnp.asarray([1.0, 200.0]), jnp.asarray(3.0))  # its own callback's failure
    assert len(calls) == 2


def test_checks_are_outputs_of_an_eager_program_not_callbacks():
    from kernels._jit import _run

    def fn(x):
        _checks.check_finite(x, "x")
        return 2.0 * x

    leaves, treedef = jax.tree_util.tree_flatten(((jnp.ones(2),), {}))
    args = (fn, treedef, (True,), (), (True, True, None), True, leaves, _checks.new_call())
    jaxpr = str(jax.make_jaxpr(_run, static_argnums=(0, 1, 2, 3, 4, 5))(*args))
    assert "callback" not in jaxpr  # eagerly: one boolean output per check, no host callback
    _out, failures = _run(*args)
    assert failures.messages == ("x: expected finite values, found NaN or inf",)
    assert bool(failures.oks[0])
    assert not failures.in_place
    # a program without traced checks returns no flags, and its call is not waited for
    assert not jax.tree_util.tree_leaves(_checks.Failures((), None, ()))


# What JAX and the backends wrap around a failed check's message (simulated texts).
_CPU_TEXT = (
    "INTERNAL: CpuCallback error calling callback: Traceback (most recent call last):\n"
    '  File "/x/jax/_src/callback.py", line 816, in _wrapped_callback\n'
    '  File "/x/kernels/_checks.py", line 410, in _raise_first\n'
    "ValueError: kernels check failed: {msg}\n"
    "--------------------\n"
    "For simplicity, JAX has removed its internal frames from the traceback."
)
_WRAPPINGS = {
    "cpu": _CPU_TEXT,
    "gpu-suffix": "INTERNAL: CpuCallback error calling callback: Traceback …\n"
    "ValueError: kernels check failed: {msg} [executable_name='jit__run']",
    "gpu-suffix-next-line": "INTERNAL: CpuCallback error calling callback: Traceback …\n"
    "ValueError: kernels check failed: {msg}\n [executable_name='jit__run']",
    "repr-quoted": "JaxRuntimeError('INTERNAL: CpuCallback error calling callback: "
    "ValueError: kernels check failed: {msg}')",
    "tag-in-parens": "kernels check failed: {msg} (executable=jit__run)",
}
_MESSAGES = [
    "params: expected finite values, found NaN or inf",
    "v: expected ||v||_1 <= radius, got ||v||_1 = 3.0 > 1.0",
    "output_bound: exceeded for 3 of [0, 1] (see docs)",
]


@pytest.mark.parametrize("wrapping", sorted(_WRAPPINGS))
@pytest.mark.parametrize("message", _MESSAGES)
@pytest.mark.parametrize("remembered", [True, False])
def test_failed_check_message_finds_the_message_whatever_wraps_it(
    wrapping, message, remembered, monkeypatch
):
    monkeypatch.setattr(_checks, "_RECENT", type(_checks._RECENT)(maxlen=64))
    if remembered:  # this process raised it (the usual case): recovered exactly
        _checks._remember(message)
    text = _WRAPPINGS[wrapping].format(msg=message)
    assert _checks.failed_check_message(text) == message
    err = jax.errors.JaxRuntimeError(text)
    assert _checks.failed_check_message(err) == message
    chained = RuntimeError("while running the step")
    chained.__cause__ = err
    assert _checks.failed_check_message(chained) == message


def test_failed_check_message_is_none_without_a_check():
    oom = jax.errors.JaxRuntimeError("INTERNAL: out of memory")
    assert _checks.failed_check_message(oom) is None
    assert _checks.failed_check_message(ValueError("something else")) is None


def _no_cpu_device(monkeypatch):
    """Simulate JAX_PLATFORMS=cuda alone: JAX finds no local CPU device for host callbacks."""
    from jax._src import xla_bridge

    real = xla_bridge.local_devices

    def local_devices(process_index=None, backend=None, host_id=None):
        if backend == "cpu":
            raise RuntimeError("Unknown backend cpu (simulated: JAX_PLATFORMS=cuda)")
        return real(process_index, backend, host_id)

    monkeypatch.setattr(xla_bridge, "local_devices", local_devices)  # what the callback uses
    monkeypatch.setattr(jax, "local_devices", local_devices)  # what the kernels read
    _checks._WARNED.discard("cannot-raise")


def test_the_simulation_reproduces_jaxs_crash(monkeypatch):
    _no_cpu_device(monkeypatch)
    assert not _checks.host_callbacks_raise()

    def f(x):
        jax.debug.callback(lambda v: None, x)
        return x + 1.0

    with pytest.raises(Exception, match="failed to find a local CPU device"):
        jax.block_until_ready(jax.jit(f)(jnp.asarray(1.5)))


def test_without_a_cpu_device_eager_checks_raise_and_jit_gives_nan(monkeypatch):
    _no_cpu_device(monkeypatch)
    loss = lambda p, b: jnp.sum(p["w"] ** 2) * b  # noqa: E731
    params, bad = {"w": jnp.asarray([1.0, 2.0])}, {"w": jnp.asarray([jnp.nan, 2.0])}
    key = jax.random.key(0)
    call = lambda p: kernels.hessian_trace(loss, p, jnp.asarray(1.5), key, num_samples=2)  # noqa: E731

    assert float(call(params).mean) == pytest.approx(6.0)  # exact: H = 3 I
    with pytest.raises(ValueError, match=r"^params: expected finite values, found NaN or inf$"):
        call(bad)
    # eagerly the checks need no callback; inside jit they cannot raise: a warning, then NaN
    jitted = jax.jit(lambda p: call(p).mean)
    with pytest.warns(_checks.KernelsCheckWarning, match="JAX_PLATFORMS=cuda,cpu"):
        bad_mean = jitted(bad)
    assert np.isnan(bad_mean)
    assert float(jitted(params)) == pytest.approx(6.0)


def test_without_a_cpu_device_a_check_in_a_loop_gives_nan_not_a_crash(monkeypatch):
    _no_cpu_device(monkeypatch)
    with pytest.warns(_checks.KernelsCheckWarning):  # a new function: traced afresh
        out = jax.jit(lambda x, y: _two_checks(x, y))(jnp.asarray([1.0, 200.0]), jnp.asarray(3.0))
    assert np.isnan(out)
    # eagerly, the top-level checks still raise; the loop's check can only give NaN
    with pytest.raises(ValueError, match=r"^y: expected > 0"):
        _two_checks(jnp.asarray([1.0, 200.0]), jnp.asarray(-1.0))


def test_on_a_tpu_checks_inside_jit_give_nan(monkeypatch):
    # a TPU's runtime does not raise from a host callback (simulated: the platform is "tpu")
    import kernels._backend

    monkeypatch.setattr(kernels._backend, "sample_platform", lambda: "tpu")
    _checks._WARNED.discard("cannot-raise")
    assert not _checks.host_callbacks_raise()
    with pytest.warns(_checks.KernelsCheckWarning):  # a new function: traced afresh
        out = jax.jit(lambda x, y: _two_checks(x, y))(jnp.asarray([1.0, 2.0]), jnp.asarray(-3.0))
    assert np.isnan(out)


def test_checks_off_compile_nothing_and_let_values_through():
    with kernels.runtime_checks(False):
        out = _two_checks(jnp.asarray([1.0, 200.0]), jnp.asarray(-1.0))
    assert float(out) == -201.0


def test_a_failure_recorded_in_a_loop_belongs_to_its_own_call():
    # threads that call a kernel at once: a check in a loop records its failure under the eager
    # call's number, so each call raises its own failure and a passing call returns (a record
    # shared by the process once gave one thread's failure to another, or lost it)
    rounds, inputs = 12, {0: 200.0, 1: 300.0, 2: 5.0}
    before = set(_checks._RECORDED)  # records an earlier test may have left (none expected)
    start = threading.Barrier(len(inputs))
    results: dict[int, list] = {i: [] for i in inputs}

    def run(i):
        for _ in range(rounds):
            start.wait(timeout=60)
            try:
                results[i].append(
                    float(_two_checks(jnp.asarray([1.0, inputs[i]]), jnp.asarray(1.0)))
                )
            except ValueError as err:
                results[i].append(str(err))

    threads = [threading.Thread(target=run, args=(i,)) for i in inputs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert results[0] == ["loop: value 200.0 >= 100"] * rounds
    assert results[1] == ["loop: value 300.0 >= 100"] * rounds
    assert results[2] == [6.0] * rounds
    assert set(_checks._RECORDED) <= before  # every call took its own record


def test_a_users_jitted_function_calling_a_kernel_passes_twice_to_an_eager_kernel():
    # a kernel traced inside another one gets no call number of the caller: a user's jax.jit
    # function that calls a kernel is traced once and cached by JAX, and a call number closed
    # over in that trace leaked into the next eager call (UnexpectedTracerError)
    params = {"w": jnp.ones((3, 2))}
    x = jax.random.normal(jax.random.key(1), (8, 3))

    def plain(p, b):
        return jnp.mean((b @ kernels.norms.project_lp_ball(p["w"], p=2, radius=10.0)) ** 2)

    jitted = jax.jit(plain)
    pert = kernels.Perturbation("gaussian", 0.01)
    key = jax.random.key(2)
    for n in (2, 4):
        got = kernels.average_sharpness(jitted, params, x, key, perturbation=pert, num_samples=n)
        want = kernels.average_sharpness(plain, params, x, key, perturbation=pert, num_samples=n)
        np.testing.assert_allclose(got.mean, want.mean, rtol=1e-6, atol=1e-9)
    traces = [kernels.hessian_trace(jitted, params, x, key, num_samples=n).mean for n in (3, 5)]
    assert all(np.isfinite(traces))


def test_no_module_level_jit_in_the_kernels_calls_a_runtime_check():
    # a runtime check traced inside a function whose trace JAX caches across calls (a
    # module-level jax.jit) would read the call number of one eager call and keep its tracer
    # (kernels._checks, _CALL): the kernels' module-level jitted functions stay free of checks
    import ast
    import pathlib

    checks = {"ensure_that", "check_that", "check_finite", "check_positive", "report"}
    found = []
    for path in pathlib.Path(kernels.__file__).parent.glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in tree.body:
            if not isinstance(node, ast.FunctionDef):
                continue
            if not any("jit" in ast.unparse(d) for d in node.decorator_list):
                continue
            called = {
                getattr(n.func, "attr", getattr(n.func, "id", None))
                for n in ast.walk(node)
                if isinstance(n, ast.Call)
            }
            found += [f"{path.name}:{node.name}" for name in called & checks]
    assert found == []


def test_runtime_checks_scopes_are_per_thread():
    # two threads hold opposite runtime_checks blocks at once: each traces with its own setting
    # (a ContextVar scope, like using_devices), and neither changes the caller's setting
    default = kernels.runtime_checks_enabled()
    both_open = threading.Barrier(2)
    results: dict[bool, tuple] = {}

    def run(enabled):
        with kernels.runtime_checks(enabled):
            both_open.wait(timeout=60)
            seen = kernels.runtime_checks_enabled()
            try:
                out = float(_two_checks(jnp.asarray([1.0, 200.0]), jnp.asarray(-1.0)))
                results[enabled] = (seen, "returned", out)
            except ValueError as err:
                results[enabled] = (seen, "raised", str(err))
            both_open.wait(timeout=60)

    threads = [threading.Thread(target=run, args=(enabled,)) for enabled in (True, False)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert results[True] == (True, "raised", "y: expected > 0, got -1.0")
    assert results[False] == (False, "returned", -201.0)
    assert kernels.runtime_checks_enabled() is default


def test_set_runtime_checks_is_the_default_a_block_overrides(monkeypatch):
    monkeypatch.setitem(_checks._DEFAULT, "enabled", True)
    kernels.set_runtime_checks(False)
    assert not kernels.runtime_checks_enabled()
    with kernels.runtime_checks(True):
        assert kernels.runtime_checks_enabled()
        kernels.set_runtime_checks(False)  # the default; the block's own setting still holds
        assert kernels.runtime_checks_enabled()
    assert not kernels.runtime_checks_enabled()
    seen = []
    worker = threading.Thread(target=lambda: seen.append(kernels.runtime_checks_enabled()))
    worker.start()
    worker.join(timeout=60)
    assert seen == [False]  # a new thread starts from the process default
    for bad in (0, "no", None):
        with pytest.raises(ValueError, match=r"^enabled: expected a bool"):
            kernels.set_runtime_checks(bad)
        with (
            pytest.raises(ValueError, match=r"^enabled: expected a bool"),
            kernels.runtime_checks(bad),
        ):
            pass


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16", "float64", "complex64"])
def test_the_traced_finiteness_test_agrees_with_numpy_entry_by_entry(dtype):
    # traced, all_finite is one sum of 0 * x over every leaf (NaN for an infinite or NaN entry):
    # every placement of inf, -inf or NaN in any leaf is caught, under jit and vmap alike, and
    # no finite value is taken for one, however large (a sum of zeros cannot overflow)
    big = float(jnp.finfo(dtype).max) if dtype != "complex64" else 3.0e38
    test = jax.jit(lambda tree: _checks.all_finite(tree, "p"))
    tree = {
        "a": jnp.full((3, 4), big, dtype),
        "b": jnp.ones((5,), "float32"),
        "e": jnp.zeros((0, 2), dtype),  # no entries
        "n": jnp.arange(3),  # not floating: not tested
    }
    assert bool(test(tree))
    for leaf, index in (("a", (0, 0)), ("a", (2, 3)), ("b", (4,))):
        for bad in (jnp.inf, -jnp.inf, jnp.nan):
            broken = dict(tree, **{leaf: tree[leaf].at[index].set(bad)})
            assert not bool(test(broken)), (leaf, index, bad)
    rows = jnp.ones((4, 6), dtype).at[1, 5].set(jnp.nan).at[3, 0].set(jnp.inf)
    per_row = jax.vmap(lambda r: _checks.all_finite([r], "p"))(rows)
    np.testing.assert_array_equal(per_row, np.all(np.isfinite(np.asarray(rows)), axis=1))


def test_one_finiteness_check_for_plain_and_ordered_checks():
    # kernels._checks.all_finite is the one finiteness test: check_finite and CheckChain.finite
    # raise the same message eagerly, and a chain's later check passes once it failed
    from kernels._ordered import CheckChain

    bad = {"a": jnp.asarray([1.0, jnp.inf]), "n": jnp.asarray([1, 2])}
    for check in (_checks.check_finite, CheckChain().finite):
        with pytest.raises(ValueError, match=f"^{re.escape(_checks.finite_message('p'))}$"):
            check(bad, "p")
    assert _checks.all_finite({"n": jnp.asarray([1, 2])}, "p") is None  # no floating leaf

    @compile_once
    def chained(x, y):
        chain = CheckChain()
        chain.finite(x, "x")
        chain.finite(y, "y")
        return jnp.sum(x) + jnp.sum(y)

    nan = jnp.asarray([jnp.nan])
    with pytest.raises(ValueError, match=r"^x: expected finite values, found NaN or inf$"):
        chained(nan, nan)
    with pytest.raises(ValueError, match=r"^y: expected finite values, found NaN or inf$"):
        chained(jnp.asarray([1.0]), nan)
    assert float(chained(jnp.asarray([1.0]), jnp.asarray([2.0]))) == 3.0
