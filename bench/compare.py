#!/usr/bin/env python3
"""Two commits, the same quick benchmarks, interleaved: per figure the ratio B/A, any move over 10 % flagged.

    python3 bench/compare.py A B [--rounds 2] [--only plan,cli_start,pool,fork,api,branch] [--out bench/reports]
                                 [--debs DIR] [--no-structure] [--keep]

Each commit gets a throwaway worktree (`git worktree add --detach`) with its own virtualenv (its forkd and SDK on
PYTHONPATH, its own `forkd` entry point as its pyproject declares it; the third-party packages are the ones of the
interpreter running this script, shared, so run it with the project's venv) and its own private home on
/dev/shm, kept for the whole run: the guest image is built once per commit, before the first round, from one
shared Debian package cache (--debs, copied into each home). Then, round after round, each benchmark runs on A
and on B one right after the other (the order swapped every round: A B, B A, ...), each from its own tree's
bench/ script (so a script keeps calling the API of the code it measures) with the same flags and environment
(BENCH_ENV: the api benchmark's daemon allows 20 guest calls per child on both sides). Per figure
(bench/lib/figures.py says what each measures): p50 and p90 of each commit over every round's samples, the ratios
B/A, and the spread between rounds of one commit (max - min over median of the rounds' p50s): a move larger than
10 % is flagged, and called within noise when the same commit moved as much between its own rounds.
With structure (the default): lines of Python per package of forkd/ in each tree, and the files a request crosses
(bench/crossings.py of this checkout, run by each commit's interpreter in its home): `forkd apply` of a ForkParent
down to QEMU, and `forkd branch` of a running child to a snapshot.
Writes bench/reports/<date>-compare-<a>-<b>.md and .json; prints the table. Worktrees, homes and virtualenvs are
removed at the end unless --keep. Exit status: 0 when every run succeeded, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(BENCH))

from lib import dated  # noqa: E402
from lib.compare_render import page  # noqa: E402
from lib.compare_stats import combine, rows  # noqa: E402
from lib.compare_structure import RT, crossings, lines_per_package, test_modules  # noqa: E402
from lib.figures import plan_result  # noqa: E402

HOME = "{home}"
QUICK: dict[str, list[str]] = {
    "plan": ["--runs", "5"],
    "cli_start": ["--runs", "5", "--verbs", "python -c pass,--version,--help,ls", "-o", "json"],
    "pool": ["--claims", "3", "--rounds", "5", "--home", HOME, "-o", "json"],
    "fork": ["--cold", "1", "--forks", "3", "--fanout", "4", "--home", HOME, "-o", "json"],
    "api": ["--calls", "10", "--home", HOME, "-o", "json"],
    "branch": ["--sizes", "512", "--reps", "2", "--modes", "live", "-o", "json"],
}
BOOTS_VMS = {"pool", "fork", "api", "branch"}
# Set for a benchmark's runs on both sides, so both commits do the same work: api's 100 evals over 10 children on
# 20 threads can put more calls on one slow child than the daemon's per-child cap (8 since the cap came in), and a
# refused eval fails the run. bench/api.py sets the same for the daemon it starts; an older commit's api.py does not.
BENCH_ENV: dict[str, dict[str, str]] = {"api": {"FORKD_GUEST_IO_PER_CHILD": "20"}}
DEBS = Path("/var/lib/forkd/cache/debs")


@dataclass
class Side:
    """One commit's tree, interpreter and home."""

    label: str
    commit: str
    src: Path
    python: Path
    home: Path

    @property
    def short(self) -> str:
        return self.commit[:7]

    def env(self, **extra: str) -> dict:
        path = os.pathsep.join([str(self.src), str(self.src / "sdk" / "python")])
        return dict(os.environ, FORKD_HOME=str(self.home), PYTHONPATH=path, **extra)


def progress(msg: str) -> None:
    print(f"[compare {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()


def sh(argv: list, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([str(a) for a in argv], capture_output=True, text=True, **kw)


def interpreter(src: Path, venv: Path) -> None:
    """A venv whose third-party packages are this interpreter's (a path in a .pth file: no install, no download)
    and whose `forkd` command is the entry point `src`'s pyproject declares; forkd itself comes from PYTHONPATH."""
    sh([sys.executable, "-m", "venv", "--without-pip", venv], check=True)
    site = next((venv / "lib").glob("python*/site-packages"))
    (site / "_forkd_compare_shared.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    entry = tomllib.loads((src / "pyproject.toml").read_text())["project"]["scripts"]["forkd"]
    module, func = entry.split(":")
    script = venv / "bin" / "forkd"
    script.write_text(f"#!{venv / 'bin' / 'python'}\nimport sys\nfrom {module} import {func}\nsys.exit({func}())\n")
    script.chmod(0o755)


def prepare(label: str, commit: str, work: Path, debs: Path, sides: list[Side], image: bool = True) -> None:
    """A worktree of `commit`, its own venv, a private home on tmpfs with the deb cache, the guest image built;
    the side joins `sides` as soon as there is something to clean up."""
    src = work / f"{label}-{commit[:7]}"
    shm = Path("/dev/shm") if Path("/dev/shm").is_dir() else None
    home = Path(tempfile.mkdtemp(prefix=f"fkcmp-{label}-", dir=shm))
    venv = src / ".venv"
    side = Side(label, commit, src, venv / "bin" / "python", home)
    git("worktree", "add", "--detach", str(src), commit)
    sides.append(side)
    interpreter(src, venv)
    if debs.is_dir():
        (home / "cache").mkdir(mode=0o700)
        shutil.copytree(debs, home / "cache" / "debs")
    if not image:
        return
    build = RT + "rt.build_image()"
    res = sh([side.python, "-c", build], env=side.env(), cwd=src, timeout=1800)
    if res.returncode != 0:
        raise SystemExit(f"building {commit[:7]}'s guest image failed:\n{res.stderr[-2000:]}")


def run_bench(side: Side, name: str, timeout: float) -> dict:
    """One benchmark from the side's own bench/, on its home: exit code, wall seconds, the parsed result."""
    argv = [side.python, side.src / "bench" / f"{name}.py", *(a.replace(HOME, str(side.home)) for a in QUICK[name])]
    t0 = time.perf_counter()
    try:
        res = sh(argv, env=side.env(**BENCH_ENV.get(name, {})), cwd=side.src, timeout=timeout)
        code, out, err = res.returncode, res.stdout, res.stderr
    except subprocess.TimeoutExpired as exc:
        code, out, err = -1, exc.stdout or "", f"(stopped after {timeout:.0f} s)"
        out, err = out if isinstance(out, str) else out.decode(errors="replace"), str(err)
    took = time.perf_counter() - t0
    result = plan_result(out) if name == "plan" else _json(out)
    entry = {"commit": side.short, "exit_code": code, "seconds": round(took, 1), "result": result}
    if code != 0 or result is None:
        entry["stderr_tail"] = err[-3000:]
    progress(f"{name} on {side.label} ({side.short}): exit {code} in {took:.0f} s")
    return entry


def _json(text: str) -> dict | None:
    start = text.find("{")
    while start >= 0:
        try:
            return json.loads(text[start:])
        except json.JSONDecodeError:
            start = text.find("\n{", start + 1)
            start = start + 1 if start >= 0 else -1
    return None


def interleave(sides: tuple[Side, Side], names: list[str], rounds: int, timeout: float) -> list[dict]:
    """Every benchmark on both sides, round after round; who goes first alternates (A B, then B A)."""
    runs = []
    for r in range(rounds):
        for name in names:
            for side in (sides if r % 2 == 0 else sides[::-1]):
                runs.append({"round": r + 1, "bench": name, "side": side.label, **run_bench(side, name, timeout)})
    return runs


def cleanup(side: Side, keep: bool) -> None:
    """Stop what the side's home runs, then remove its home, tmpfs directory and worktree (unless keep)."""
    shm_dir = ""
    if side.python.exists():
        sh([side.python, "-m", "forkd.cli.main", "kill", "--all"], env=side.env(FORKD_NO_DAEMON="1"),
           cwd=side.src, timeout=300)
        shm_dir = sh([side.python, "-c", RT + "print(rt.layout.shm_dir or '')"], env=side.env(), cwd=side.src).stdout
    if keep:
        return
    for d in (side.home, Path(shm_dir.strip()) if shm_dir.strip() else None):
        if d is not None:
            shutil.rmtree(d, ignore_errors=True)
    sh(["git", "worktree", "remove", "--force", side.src], cwd=ROOT)


def options(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] + " (see the module doc)",
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("a", nargs="?", help="the commit to compare against (any git revision)")
    ap.add_argument("b", nargs="?", help="the commit compared (any git revision)")
    ap.add_argument("--rerender", type=Path, metavar="JSON", help="only recompute the figures and the page of a "
                    "report this script wrote (e.g. after a figure's description changed)")
    ap.add_argument("--rounds", type=int, default=2, help="rounds of A and B each (default 2)")
    ap.add_argument("--only", help=f"comma-separated subset of: {', '.join(QUICK)}")
    ap.add_argument("--out", default=str(BENCH / "reports"), help="where the report pair goes")
    ap.add_argument("--debs", default=str(DEBS), help="Debian package cache copied into each home")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per benchmark run (default 900)")
    ap.add_argument("--no-structure", action="store_true", help="skip lines per package and the crossings")
    ap.add_argument("--keep", action="store_true", help="keep the worktrees, venvs and homes")
    ap.add_argument("--notes", type=Path, help="a Markdown file appended to the report (e.g. what CI time is known)")
    args = ap.parse_args(argv)
    if not args.rerender and not (args.a and args.b):
        ap.error("name two commits, A and B (or --rerender a report)")
    args.names = args.only.split(",") if args.only else list(QUICK)
    if unknown := [n for n in args.names if n not in QUICK]:
        ap.error(f"unknown benchmark(s) {', '.join(unknown)}; known: {', '.join(QUICK)}")
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")
    return args


def measure(args: argparse.Namespace, commits: tuple[str, str], report: dict) -> None:
    """Prepare both sides, run the rounds, then the structure; everything made is removed whatever happens."""
    work = Path(tempfile.mkdtemp(prefix="forkd-compare-"))
    sides: list[Side] = []
    load = dated.LoadSampler().start()
    try:
        for label, commit in zip(("A", "B"), commits, strict=True):
            progress(f"preparing {label} = {commit[:7]} (worktree, venv, guest image)")
            prepare(label, commit, work, Path(args.debs), sides, image=bool(set(args.names) & BOOTS_VMS)
                    or not args.no_structure)
        report["runs"] = interleave((sides[0], sides[1]), args.names, args.rounds, args.timeout)
        report["load_benchmarks"] = load.stop()
        if not args.no_structure:
            progress("structure: lines per package, crossings (both commits at once: counts, not times)")
            report["structure"] = {"lines": {s.label: lines_per_package(s.src) for s in sides},
                                   "tests": {s.label: test_modules(s.src) for s in sides},
                                   "crossings": crossings(sides, BENCH / "crossings.py")}
    finally:
        if "load_benchmarks" not in report:
            report["load_benchmarks"] = load.stop()
        for s in sides:
            cleanup(s, args.keep)
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    args = options(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwind: the running benchmark stopped, all removed
    try:
        import pydantic  # noqa: F401 - the commits' venvs share this interpreter's third-party packages
        import typer  # noqa: F401
    except ImportError:
        sys.exit("run this with an interpreter that has forkd's dependencies: .venv/bin/python bench/compare.py")
    if args.rerender:
        report = json.loads(args.rerender.read_text())
        report["figures"] = rows(combine(report["runs"]))
        args.rerender.write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
        args.rerender.with_suffix(".md").write_text(page(report))
        print(page(report))
        return 0
    commits = (git("rev-parse", "--verify", f"{args.a}^{{commit}}"),
               git("rev-parse", "--verify", f"{args.b}^{{commit}}"))
    t0 = time.perf_counter()
    report = {"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "host": dated.host_facts(ROOT),
              "command": " ".join(["python3 bench/compare.py", *(argv if argv is not None else sys.argv[1:])]),
              "commits": {"A": commits[0], "B": commits[1]}, "flags": {n: QUICK[n] for n in args.names},
              "env": {n: BENCH_ENV[n] for n in args.names if n in BENCH_ENV}}
    measure(args, commits, report)
    report["wall_s"] = round(time.perf_counter() - t0, 1)
    report["accel"] = dated.accel_of({f"{r['side']}{i}": r for i, r in enumerate(report["runs"])}, None)
    report["figures"] = rows(combine(report["runs"]))
    report["notes"] = ["", *args.notes.read_text().splitlines()] if args.notes else []
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"{report['started'][:10]}-compare-{commits[0][:7]}-{commits[1][:7]}"
    (out / f"{stem}.json").write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    text = page(report)
    (out / f"{stem}.md").write_text(text)
    print(text)
    return 0 if all(r["exit_code"] == 0 for r in report["runs"]) else 1


if __name__ == "__main__":
    sys.exit(main())
