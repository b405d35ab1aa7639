"""The trainer matrix's self-sizing arm: its policy is the default with two layers self-sizing."""

import sys
from dataclasses import replace
from pathlib import Path

from hostd.policy import load_default, parse_policy

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench" / "trainer"))
import matrix


def test_sizing_policy_differs_from_the_default_only_in_trainer_and_data():
    sized = parse_policy(matrix.sizing_policy().encode(), "<sizing>")
    default = load_default()
    assert [ly.name for ly in sized.layers] == [ly.name for ly in default.layers]
    for mine, theirs in zip(sized.layers, default.layers, strict=True):
        if mine.name == "trainer":
            assert (mine.util_low, mine.util_high) == (0.5, 0.8)
            mine = replace(mine, util_low=None, util_high=None)
        elif mine.name == "data":
            assert (mine.kind, mine.util_low, mine.util_high) == ("grouped", 0.5, 0.8)
            assert (mine.cpus_min.count, mine.cpus_max.fraction) == (1, 0.25)
            mine = replace(
                mine, kind=theirs.kind, cpus_min=theirs.cpus_min, cpus_max=theirs.cpus_max,
                util_low=None, util_high=None,
            )  # fmt: skip
        assert mine == theirs  # nothing else changed
