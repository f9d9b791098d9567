"""Claims at the smoke scale say "not tested at this scale" (issue 26 item 8)."""

import pytest

from jaxbounds.experiments._claims import NOT_TESTED, claims_at_scale, scale_tests_claims
from jaxbounds.experiments._stats import claim_line


@pytest.mark.parametrize("verdict", [True, False, None])
def test_every_verdict_becomes_not_tested_at_smoke_scale(verdict):
    line = claim_line("The gap shrinks with T (Figure 2)", verdict, "tau = -0.4 (p = 0.3)")
    (smoke,) = claims_at_scale([line], "smoke")
    assert smoke == f"- **{NOT_TESTED}**: The gap shrinks with T (Figure 2) (tau = -0.4 (p = 0.3))"
    assert claims_at_scale([line], "cpu") == [line]
    assert claims_at_scale([line], "paper") == [line]


def test_other_lines_are_kept():
    lines = ["", "Some text with **reproduced** inside", "- a bullet"]
    assert claims_at_scale(lines, "smoke") == lines
    assert not scale_tests_claims("smoke")
    assert scale_tests_claims("cpu")
