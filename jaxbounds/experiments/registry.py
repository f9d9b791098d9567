"""The experiments of ``jaxbounds reproduce``: an explicit, ordered table (lazy entries).

Each entry names the module attribute holding the :class:`~jaxbounds.experiments.runner.Experiment`;
the module is imported only when the experiment is run, so ``jaxbounds reproduce --list`` needs
none of them.

>>> REGISTRY.names()  # doctest: +NORMALIZE_WHITESPACE
('tt-sequence-length', 'shallow-gd-table1', 'pac-bayes-perturbation', 'property-testing',
 'pac-bayes-flatness', 'pac-bayes-gap', 'cot-parity', 'spectrum-adaptive', 'measures-vs-gap')
"""

from __future__ import annotations

from jaxbounds.experiments.runner import ExperimentRegistry

__all__ = ["REGISTRY"]

#: Every experiment of ``jaxbounds reproduce``, in listing order.
REGISTRY = ExperimentRegistry(
    [
        (
            "tt-sequence-length",
            "jaxbounds.experiments.tt_sequence_length:EXPERIMENT",
            "Trauger & Tewari 2024, Sec. 6, Figs 1-3",
        ),
        (
            "shallow-gd-table1",
            "jaxbounds.experiments.shallow_gd:EXPERIMENT",
            "Shallow Transformer by GD, Table 1, Figs 1-3",
        ),
        (
            "pac-bayes-perturbation",
            "jaxbounds.experiments.pac_bayes_perturbation:EXPERIMENT",
            "PAC-Bayes flat construction: perturbation term P, Sec. 2.3 and App. E.3",
        ),
        (
            "property-testing",
            "jaxbounds.experiments.property_testing:EXPERIMENT",
            "PAC-Bayes flat constructions, App. H, Fig. 8 (degree/sparsity testers)",
        ),
        (
            "pac-bayes-flatness",
            "jaxbounds.experiments.pac_bayes_flatness:EXPERIMENT",
            "PAC-Bayes flat construction vs learned: trace and norm, Sec. 2.2, Fig. 2",
        ),
        (
            "pac-bayes-gap",
            "jaxbounds.experiments.pac_bayes_gap:EXPERIMENT",
            "PAC-Bayes flat constructions: gap vs degree and sparsity, Sec. 2.1",
        ),
        (
            "cot-parity",
            "jaxbounds.experiments.cot_parity:EXPERIMENT",
            "PAC-Bayes flat constructions, App. G: CoT vs one-pass PARITY bounds, trained gaps",
        ),
        (
            "spectrum-adaptive",
            "jaxbounds.experiments.spectrum_adaptive:EXPERIMENT",
            "Sakai & Imaizumi 2026: spectrum-adaptive vs norm-based proxy, vs depth and N",
        ),
        (
            "measures-vs-gap",
            "jaxbounds.experiments.measures_vs_gap:EXPERIMENT",
            "Jiang et al. 2020 / Dziugaite et al. 2020 / Andriushchenko et al. 2023: which "
            "measure ranks the Transformers by their gap",
        ),
    ]
)
