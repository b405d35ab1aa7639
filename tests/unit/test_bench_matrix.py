"""The trainer matrix's self-sizing arm: its policy is the default with two layers self-sizing."""

import sys
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
            assert mine.kind == theirs.kind == "grouped"
        elif mine.name == "data":
            assert (mine.kind, theirs.kind) == ("grouped", "open")
            assert mine.self_sizing and mine.cpus_max.fraction == 0.25
        else:
            assert mine == theirs
