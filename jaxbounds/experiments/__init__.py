"""The reproductions of ``jaxbounds reproduce``: one module per reproduced paper result.

Empty for now; the NTK-regime comparison that lived here is
:func:`jaxbounds.training.ntk_regime.ntk_regime`.
"""
