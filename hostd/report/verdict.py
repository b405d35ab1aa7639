"""The verdict of ``hostd report``: one job's comparison (from ``hostd.report.stats``) said in
one paragraph of plain words, for someone who is not a statistician: faster, slower or no
difference, with the interval, the noise among attempts (A/A), a drift over time, and the
attempts left out. Pure; called by ``hostd.report.stats`` as it builds a comparison.
"""

from __future__ import annotations

ARM = {True: "protected", False: "unprotected"}  # each arm, in words


def _x(ratio: float) -> str:
    return f"{ratio:.2f}x"


def _pct(fraction: float) -> str:
    return f"{fraction * 100:.1f} %" if fraction < 0.01 else f"{fraction * 100:.0f} %"


def _attempts(n: int) -> str:
    return f"{n} attempt" + ("" if n == 1 else "s")


def _verdict(c: dict, summaries: list[dict]) -> str:
    """One paragraph, in plain words, for someone who is not a statistician."""
    measure, ab = c["measure"], c["ab"]
    by_flag = {arm["protected"]: arm for arm in c["arms"]}
    p, u = by_flag.get(True), by_flag.get(False)
    duration = measure["name"] == "duration"
    what = "; measured by how long they ran, assuming each attempt did the same work"
    what = what if duration else ""
    said = []
    if not c["arms"]:
        said.append(
            f"Nothing to compare: none of the {_attempts(len(summaries))} says whether hostd "
            "protected it."
        )
    elif measure["name"] is None:
        said.append(
            f"Nothing to compare yet: none of the {_attempts(len(summaries))} reported a "
            "throughput and none has ended, so neither speed nor duration is known."
        )
    elif not p or not u:
        said.append(
            "No A/B: every attempt was protected; run some with HOSTD_PROTECT=0 in their "
            "environment to compare."
            if p
            else "No A/B: no attempt was protected; run some with hostd protecting them "
            "(without HOSTD_PROTECT=0) to compare."
        )
    elif ab is None:
        missing = "protected" if not p["n"] else "unprotected"
        said.append(
            f"No A/B yet: no {missing} attempt has a {measure['name']} yet (they are still "
            "running)."
        )
    else:
        r, n_p, n_u = ab["ratio"], ab["n_protected"], ab["n_unprotected"]
        counts = (
            f"{_attempts(n_p)} each"
            if n_p == n_u
            else f"{n_p} protected and {n_u} unprotected attempt{'' if n_u == 1 else 's'}"
        )
        speed = f"ran at {_x(r)} the speed of unprotected ones"
        worst = (
            f"the worst protected attempt was {_x(ab['worst_protected_vs_unprotected_median'])} "
            "the unprotected median"
        )
        if ab["low"] is None:
            said.append(
                f"Protected attempts {speed} ({counts}{what}), but with a single attempt in an arm "
                "there is no confidence interval and this may be noise: run at least 3 of "
                "each before trusting it."
            )
        else:
            ci = f"95 % confidence {_x(ab['low'])} to {_x(ab['high'])}, {counts}{what}"
            if ab["finding"] == "faster":
                said.append(f"Protected attempts were faster: they {speed} ({ci}); {worst}.")
            elif ab["finding"] == "slower":
                said.append(f"Protected attempts were slower: they {speed} ({ci}); {worst}.")
            else:
                said.append(
                    f"No difference we can tell: protected attempts {speed} ({ci}), and "
                    "that interval includes 1x (no change)."
                )
    spreads = [arm["spread"] for arm in c["arms"] if arm["spread"] is not None]
    if spreads:
        noise = max(spreads) - 1
        if ab is not None and ab["ratio"]:
            effect = max(ab["ratio"], 1 / ab["ratio"]) - 1
            said.append(
                f"Attempts without a change differed by up to {_pct(noise)} among themselves, "
                + (
                    "so the difference is larger than the noise."
                    if effect > noise
                    else "so the difference is within the noise: run more attempts of each."
                )
            )
        else:
            said.append(
                f"Attempts without a change differed by up to {_pct(noise)} among themselves "
                "(the noise any effect must exceed)."
            )
    for arm in c["arms"]:
        h = arm["halves"]
        if h and h["low"] is not None and (h["low"] > 1 or h["high"] < 1):
            said.append(
                f"The later {ARM[arm['protected']]} attempts ran at {_x(h['ratio'])} the speed "
                f"of the earlier ones (95 % confidence {_x(h['low'])} to {_x(h['high'])}): "
                "something besides protection changed over time."
            )
    if c["unassigned"]:
        said.append(
            f"{_attempts(len(c['unassigned']))} did not say whether hostd protected them and "
            "are left out."
        )
    waiting = sum(arm["recorded"] - arm["n"] for arm in c["arms"])
    if measure["name"] and waiting and (ab is not None or not (p and u)):
        said.append(
            f"Left out: {_attempts(waiting)} with no {measure['name']} yet (still running)."
        )
    return " ".join(said)
