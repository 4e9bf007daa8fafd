"""The commit comparison as a Markdown page: commits, host, load, the ratio table, moves, then structure."""

from __future__ import annotations

from lib.figures import described
from lib.reports import fmt


def _load(load: dict) -> str:
    return (f"load average at start {', '.join(map(str, load['at_start']))}, at end "
            f"{', '.join(map(str, load['at_end']))} (1, 5, 15 min); 1-min over the benchmarks "
            f"{load['min_1m']} - {load['max_1m']}, mean {load['mean_1m']} ({len(load['samples'])} samples, every "
            f"{load['interval_s']:.0f} s)")


def head(report: dict) -> list[str]:
    h, a, b = report["host"], report["commits"]["A"], report["commits"]["B"]
    ok = sum(r["exit_code"] == 0 for r in report["runs"])
    return [f"# Benchmarks compared: {a[:7]} (A) and {b[:7]} (B)", "",
            f"`{report['command']}`, started {report['started']}, {report['wall_s']:.0f} s in all. A = `{a}`, "
            f"B = `{b}`. Each benchmark ran from its own commit's `bench/` with the same flags, on its own "
            f"commit's home, A and B one right after the other, the order swapped every round; {ok} of "
            f"{len(report['runs'])} runs succeeded.", "",
            f"Host: {h['cores']} cores ({h['cpu']}), accelerator {report['accel']}, kernel {h['kernel']}, "
            f"{h['qemu']}, Python {h['python']}; this checkout `{h['commit']}`.", "",
            f"Load: {_load(report['load_benchmarks'])}. The host is shared (other sessions' tests and a "
            "crash-harness run): above 2 a figure includes waiting for a core.", "",
            "Flags: " + "; ".join(f"`{n}.py {' '.join(f)}`" for n, f in report["flags"].items()) + ".", "",
            *_env_line(report.get("env") or {})]


def _env_line(env: dict[str, dict[str, str]]) -> list[str]:
    """The environment set for a benchmark's runs on both sides, if any."""
    if not env:
        return []
    told = "; ".join(f"{n}: " + ", ".join(f"`{k}={v}`" for k, v in e.items()) for n, e in env.items())
    return [f"Environment set for both sides' runs: {told}.", ""]


def summary(report: dict) -> list[str]:
    """One paragraph: how many figures stayed within 10 %, and which moved (within noise or beyond it)."""
    figs = [r for r in report["figures"] if "A" in r]
    same = [r for r in figs if r["verdict"].startswith("same")]
    noisy = [r for r in figs if r["verdict"] == "moved > 10 %, within noise"]
    beyond = [r for r in figs if r["verdict"] == "MOVED > 10 %, beyond noise"]
    unknown = [r for r in figs if r["verdict"].startswith("MOVED") and r not in beyond]
    control = next((r for r in figs if r["figure"] == "start-up: python -c pass"), None)

    def names(rs: list[dict]) -> str:
        return ", ".join(f"{r['bench']} {r['figure']} ({r['ratio_p50']:.2f}x)" for r in rs) or "none"
    return ["## Summary", "",
            f"{len(figs)} figures measured on both commits: {len(same)} within 10 % (B/A of p50). Moved more than "
            f"10 % but no more than one commit's own rounds moved (within noise): {names(noisy)}. Moved more than "
            f"10 % and more than the rounds' spread: {names(beyond)}."
            + (f" Moved more than 10 % with one round each (noise unknown): {names(unknown)}." if unknown else "")
            + (f" Control: `python -c pass`, the same command on both sides, measured {control['ratio_p50']:.2f}x."
               if control else "")
            + " With two rounds per commit the spread is a rough measure of noise: a move beyond it is a lead to "
            "re-measure, not yet a regression.", ""]


def table(report: dict) -> list[str]:
    out = ["## Ratios B/A", "",
           "p50 and p90 per commit over every round's samples (a benchmark that kept no samples: the median of "
           "its rounds' own p50 and p90); *noise* is the larger of the two commits' spread between their own "
           "rounds ((max - min) / median of the rounds' p50s). A move over 10 % is flagged, and called within "
           "noise when one commit moved as much between its own rounds.", "",
           "| benchmark | figure | unit | A p50 | B p50 | B/A p50 | A p90 | B p90 | B/A p90 | noise | verdict |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in report["figures"]:
        if "A" not in r:
            out.append(f"| {r['bench']} | {r['figure']} | | | | | | | | | {r['verdict']} |")
            continue
        unit = described(r["bench"], r["figure"]).unit
        a, b = r["A"], r["B"]
        out.append(f"| {r['bench']} | {r['figure']} | {unit} | {fmt(a['p50'], ',.1f')} | {fmt(b['p50'], ',.1f')} | "
                   f"{fmt(r['ratio_p50'], '.2f')} | {fmt(a['p90'], ',.1f')} | {fmt(b['p90'], ',.1f')} | "
                   f"{fmt(r['ratio_p90'], '.2f')} | {fmt(r['noise'] and r['noise'] * 100, '.0f', ' %')} | "
                   f"{r['verdict']} |")
    failed = [r for r in report["runs"] if r["exit_code"] != 0]
    if failed:
        out += ["", "Runs that failed (their figures are left out):", ""]
        out += [f"- round {r['round']}, {r['bench']} on {r['side']} ({r['commit']}): exit {r['exit_code']}, "
                f"`{(r.get('stderr_tail') or '').strip().splitlines()[-1:] or ['']}`" for r in failed]
    return out


def what_they_measure(report: dict) -> list[str]:
    seen, out = set(), ["", "What each figure measures:", ""]
    for r in report["figures"]:
        key = (r["bench"], r["figure"])
        if key not in seen and not r["figure"].startswith("start-up: "):
            seen.add(key)
            out.append(f"- {r['bench']}, {r['figure']}: {described(*key).measures}")
    out.append("- cli_start, start-up: VERB: wall time of `forkd VERB` from exec until it exited, no daemon "
               "running (verbs that need one ran in-process), the interpreter's start and imports included")
    return out


def structure(report: dict) -> list[str]:
    st = report.get("structure")
    if not st:
        return []
    la, lb = st["lines"]["A"], st["lines"]["B"]
    out = ["", "## Lines of Python per package (files / lines)", "", "| package | A | B | lines B - A |",
           "|---|---|---|---|"]
    for pkg in sorted(set(la) | set(lb)):
        a, b = la.get(pkg, {"files": 0, "lines": 0}), lb.get(pkg, {"files": 0, "lines": 0})
        out.append(f"| {pkg} | {a['files']} / {a['lines']:,} | {b['files']} / {b['lines']:,} | "
                   f"{b['lines'] - a['lines']:+,} |")
    ta, tb = (sum(v["lines"] for v in x.values()) for x in (la, lb))
    tests = st.get("tests") or {}
    out += [f"| **total** | {ta:,} | {tb:,} | {tb - ta:+,} |", ""]
    if tests:
        out += [f"Test modules with the `vm` marker (boot QEMU): A {tests['A']['with_vm_marker']} of "
                f"{tests['A']['modules']}, B {tests['B']['with_vm_marker']} of {tests['B']['modules']}.", ""]
    out += [
            "## Files a request crosses (`bench/crossings.py`: forkd files whose functions the command called, "
            "imports excluded; in-process, `FORKD_NO_DAEMON=1`, QEMU)", "",
            "| request | A | B | per package, A | per package, B |", "|---|---|---|---|---|"]
    cr = st["crossings"]
    for key, what in (("apply", "`forkd apply -f parent.yaml --wait` (a ForkParent built: QEMU booted, warmed, "
                                "snapshotted)"),
                      ("branch", "`forkd branch CHILD --tag T` (a running child to a snapshot)")):
        cells = []
        for side in ("A", "B"):
            c = (cr.get(side) or {}).get(key) or {}
            cells.append((str(c["files"]) if "files" in c and c.get("exit") == 0 else
                          f"failed: {str(c.get('error') or c.get('exit'))[-120:]!r}",
                          ", ".join(f"{k} {v}" for k, v in (c.get("per_package") or {}).items())))
        out.append(f"| {what} | {cells[0][0]} | {cells[1][0]} | {cells[0][1]} | {cells[1][1]} |")
    return out


def page(report: dict) -> str:
    lines = [*head(report), *summary(report), *table(report), *what_they_measure(report), *structure(report),
             *report.get("notes", [])]
    return "\n".join(lines).rstrip() + "\n"
