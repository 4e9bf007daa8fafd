"""Per figure, two commits' runs combined: p50/p90 over every round's samples, the ratio B/A, and the spread between
one commit's own rounds, against which a move is judged."""

from __future__ import annotations

import statistics

from lib.figures import extract
from lib.reports import percentile

THRESHOLD = 0.10  # a move of more than this fraction is flagged


def combine(runs: list[dict]) -> dict[str, dict[str, dict[str, dict]]]:
    """bench -> figure -> side -> {round_p50s, round_p90s, samples}, from the runs that succeeded."""
    out: dict = {}
    for run in runs:
        if run["exit_code"] != 0:
            continue
        for label, s in extract(run["bench"], run.get("result")).items():
            acc = out.setdefault(run["bench"], {}).setdefault(label, {}).setdefault(
                run["side"], {"round_p50s": [], "round_p90s": [], "samples": []})
            acc["round_p50s"].append(s["p50"])
            if s["p90"] is not None:
                acc["round_p90s"].append(s["p90"])
            acc["samples"].extend(s["samples"] if len(s["samples"]) > 1 else [])
    return out


def side_stats(acc: dict) -> dict:
    """p50 and p90 of one side: over the pooled samples when the benchmark kept them, else the median of the
    rounds' own p50s and p90s; its spread: (max - min) / median of the rounds' p50s."""
    rounds = acc["round_p50s"]
    if acc["samples"]:
        p50, p90 = percentile(acc["samples"], 50), percentile(acc["samples"], 90)
    else:
        p50 = statistics.median(rounds)
        p90 = statistics.median(acc["round_p90s"]) if acc["round_p90s"] else None
    med = statistics.median(rounds)
    spread = (max(rounds) - min(rounds)) / med if len(rounds) > 1 and med else None
    return {"p50": p50, "p90": p90, "rounds": len(rounds), "spread": spread, "n_samples": len(acc["samples"])}


def verdict(r50: float | None, noise: float | None) -> str:
    """'same' within 10 %; a larger move is 'within noise' when one commit's own rounds spread as much."""
    if r50 is None:
        return "n/a"
    move = abs(r50 - 1.0)
    if move <= THRESHOLD:
        return "same (within 10 %)"
    if noise is None:
        return "MOVED > 10 % (one round: noise unknown)"
    return "moved > 10 %, within noise" if move <= noise else "MOVED > 10 %, beyond noise"


def rows(combined: dict) -> list[dict]:
    """One row per figure both sides measured: each side's p50/p90, the ratios B/A, noise and verdict."""
    out = []
    for bench, figs in combined.items():
        for label, sides in figs.items():
            if "A" not in sides or "B" not in sides:
                out.append({"bench": bench, "figure": label, "verdict": "only one side measured it"})
                continue
            a, b = side_stats(sides["A"]), side_stats(sides["B"])
            r50 = b["p50"] / a["p50"] if a["p50"] else None
            r90 = b["p90"] / a["p90"] if a["p90"] and b["p90"] is not None else None
            spreads = [s["spread"] for s in (a, b) if s["spread"] is not None]
            noise = max(spreads) if spreads else None
            out.append({"bench": bench, "figure": label, "A": a, "B": b, "ratio_p50": r50, "ratio_p90": r90,
                        "noise": noise, "verdict": verdict(r50, noise)})
    return out
