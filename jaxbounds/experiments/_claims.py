"""Verdicts of claims at a scale too small to test them: "not tested at this scale".

A ``smoke`` scale exists to exercise the code in seconds (two seeds, a handful of steps): its
numbers can come out on either side of a claim by chance, so its reports never call a claim
reproduced or not. :func:`claims_at_scale` rewrites the verdict of every claim line of
:func:`jaxbounds.experiments._stats.claim_line` at such a scale and keeps the measurement, so
the smoke report still shows (and the tests still check) every number a claim rests on.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["NOT_TESTED", "UNTESTED_SCALES", "claims_at_scale", "scale_tests_claims"]

#: Scales whose sizes are chosen only to exercise the code.
UNTESTED_SCALES = ("smoke",)
#: The verdict of a claim at such a scale.
NOT_TESTED = "not tested at this scale"
_VERDICTS = ("reproduced", "not reproduced", "inconclusive")


def scale_tests_claims(scale: str) -> bool:
    """Whether claims are tested at ``scale`` (False for the smoke scale).

    >>> scale_tests_claims("smoke"), scale_tests_claims("cpu")
    (False, True)
    """
    return scale not in UNTESTED_SCALES


def claims_at_scale(lines: Sequence[str], scale: str) -> list[str]:
    """Claim lines as a report at ``scale`` shows them.

    At a scale in :data:`UNTESTED_SCALES` every ``- **<verdict>**: claim (evidence)`` line gets
    the verdict ``not tested at this scale`` (claim and evidence unchanged); other lines, and
    every line at other scales, are returned unchanged.

    >>> claims_at_scale(["- **reproduced**: The gap shrinks (tau = -0.5)", "text"], "smoke")
    ['- **not tested at this scale**: The gap shrinks (tau = -0.5)', 'text']
    >>> claims_at_scale(["- **reproduced**: The gap shrinks (tau = -0.5)"], "cpu")
    ['- **reproduced**: The gap shrinks (tau = -0.5)']
    """
    if scale_tests_claims(scale):
        return list(lines)
    out = []
    for line in lines:
        for verdict in _VERDICTS:
            head = f"- **{verdict}**: "
            if line.startswith(head):
                line = f"- **{NOT_TESTED}**: " + line[len(head) :]
                break
        out.append(line)
    return out
