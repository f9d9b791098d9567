"""The design of the tt-sequence-length reproduction: its grids, claims and budget verdicts.

The scales (grids of sequence lengths, widths and epochs), the paper's claims and numbers, the
epoch choice, the units of a grid, and how the report words a budget far below the paper's
(:mod:`jaxbounds.experiments.tt_sequence_length` runs it, :mod:`._tt_report` reports it).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from jaxbounds.experiments import runner

_COMMON = {
    "sparsity": 9,
    "num_train": 300,
    "batch_size": 128,
    "optimizer": "adam",
    "activation": "relu",
    "dtype": "float32",
    "delta": 0.05,
    "edelman_ref_T": 20,
}

#: Config grid per scale. ``seq_len`` is the axis; every other value is fixed per scale, except
#: ``width_check``: a second grid (the same keys overridden), a wider model trained longer, still
#: far below the paper's width and epoch budget (see :func:`tt_units`).
SCALES: dict[str, dict[str, Any]] = {
    "smoke": {
        **_COMMON,
        "seq_len": [10, 20],
        "num_val": 256,
        "embed_dim": 8,
        "num_heads": 2,
        "learning_rate": 0.01,
        "num_epochs": 12,
        "eval_every": 3,
        "rad_draws": 2,
        "rad_steps": 3,
        "edelman_ref_T": 10,
        "lanes": 2,
        "width_check": {"num_epochs": 24, "seq_len": [20]},
    },
    "cpu": {
        **_COMMON,
        "seq_len": [20, 60, 100, 140, 200],
        "num_val": 1000,
        "embed_dim": 16,
        "num_heads": 2,
        "learning_rate": 0.01,
        "num_epochs": 200,
        "eval_every": 5,
        "rad_draws": 8,
        "rad_steps": 20,
        "lanes": 5,
        "width_check": {"embed_dim": 32, "num_epochs": 400, "seq_len": [20, 100, 200]},
    },
    "paper": {
        **_COMMON,
        "seq_len": list(range(20, 201, 20)),
        "num_val": 10000,
        "embed_dim": 64,
        "num_heads": 2,
        "learning_rate": 0.001,
        "num_epochs": 200000,
        "eval_every": 100,
        "rad_draws": 64,
        "rad_steps": 100,
        "lanes": 5,
    },
}

CLAIMS = (
    "The maximum generalization gap over runs shows no increasing trend in T (Figure 2)",
    "The maximum total l1 norm of the weights over runs shows no increasing trend in T (Figure 1)",
    "The validation accuracy plateaus as T grows (Figure 3)",
    "The Edelman et al. bound grows with T through its log(d m T) factor, while the Trauger & "
    "Tewari bound has no explicit T",
)

PAPER_NUMBERS = {
    "setting": {
        "sparsity": 9, "num_train": 300, "num_val": 10000, "seq_len": "20, 40, ..., 200",
        "embed_dim": 64, "num_heads": 2, "batch_size": 128, "num_epochs": 200000,
        "runs_per_T": 5, "model": "TensorFlow MultiHeadAttention + [CLS] dense to 2 logits",
    },
    "figure1_max_l1_norm": "no increasing trend in T (values only in the figure)",
    "figure2_max_gen_gap": "no discernible trend in T (values only in the figure)",
    "figure3_max_val_accuracy": "plateaus as T grows (values only in the figure)",
}  # fmt: skip

#: How the number of epochs of each scale was chosen (printed in ``report.md``).
EPOCH_CHOICE = {
    "smoke": "Smoke scale: a few epochs, only to exercise the code (no claim is meaningful).",
    "cpu": (
        "Epochs at cpu scale were chosen by a pilot (seed 0, d = 16, 2000 validation "
        "sequences, learning rate 0.01, 300 epochs): at T = 200 the validation loss was lowest "
        "at epoch 40 and rose from 0.60 to 0.98 by epoch 285 while the training loss kept "
        "falling (overfitting); at T = 20 it kept improving slowly up to about epoch 185. 200 "
        "epochs let the longer sequences overfit within the CPU budget (see the column 'val. "
        "loss rise after best': the validation loss at the last epoch minus the best one)."
    ),
    "paper": "Paper scale: the paper's 200000 epochs (not run here; meant for a GPU).",
}

_PLATEAU_BAND = 0.05  # accuracy plateau: the longer half of the grid within 5 points


def _budget(embed_dim: int, num_epochs: int) -> tuple[bool, str]:
    """Whether a run has the paper's width and epoch budget, and the two side by side.

    Below it, the plateau claim (about trained models at the paper's budget) can be seen at
    ours but not refuted: its verdict is "inconclusive at our budget" unless a plateau shows.

    >>> _budget(16, 200)
    (False, "the paper's budget d = 64, 200,000 epochs; ours d = 16, 200 epochs (1000x fewer)")
    """
    paper = SCALES["paper"]
    full = embed_dim >= paper["embed_dim"] and num_epochs >= paper["num_epochs"]
    ratio = paper["num_epochs"] / num_epochs
    text = (f"the paper's budget d = {paper['embed_dim']}, {paper['num_epochs']:,} epochs; "
            f"ours d = {embed_dim}, {num_epochs:,} epochs ({ratio:.0f}x fewer)")  # fmt: skip
    return full, text


def _plateau_line(claim: str, ok: bool, full: bool, budget: str, evidence: str) -> str:
    """The plateau verdict: below the paper's budget a missing plateau is inconclusive."""
    if ok or full:
        return runner.claim_line(claim, ok, f"{evidence}; {budget}")
    return (f"- **inconclusive at our budget**: {claim.rstrip('.')} ({evidence}; {budget}: a "
            "plateau that the paper reached after 200,000 epochs at d = 64 is not refuted by "
            "its absence at this budget)")  # fmt: skip


_ALPHA = 0.05  # significance level of the trend tests


def tt_units(grid: Mapping[str, Any], seeds: Sequence[int]) -> list[runner.Unit]:
    """The main grid's units, then those of its ``width_check`` grid (if any).

    The check grid is the main grid with the keys of ``width_check`` replaced (a wider model
    trained longer on some T), so its rows sit in the same table and are told apart by their
    ``embed_dim`` and ``num_epochs``.

    >>> grid = {"T": [20, 60], "d": 16, "width_check": {"d": 32, "T": [20]}}
    >>> [u.label() for u in tt_units(grid, [0])]
    ['T=20 d=16 seed=0', 'T=60 d=16 seed=0', 'T=20 d=32 seed=0']
    """
    main = {k: v for k, v in grid.items() if k != "width_check"}
    units = runner.grid_units(main, seeds)
    if grid.get("width_check"):
        units += runner.grid_units({**main, **grid["width_check"]}, seeds)
    return units


def _split_rows(rows: Sequence[Mapping[str, Any]], grid: Mapping[str, Any]) -> tuple[list, list]:
    """(main-grid rows, width-check rows): the main ones have the grid's width and epochs."""
    key = ("embed_dim", "num_epochs")
    main = [r for r in rows if all(r[k] == grid[k] for k in key)]
    return main, [r for r in rows if not all(r[k] == grid[k] for k in key)]
