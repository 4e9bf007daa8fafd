"""The Inspect task bench/inspect_eval.py runs on each provider: N samples, each doing the per-sample setup of
bench/lib/project.py in its own sandbox (check the project out, install its dependency wheels, run its tests) and
scored by reading back the result file the tests wrote. The solver never calls the model (Inspect's mock model is
named only to satisfy the eval), so nothing leaves the machine."""

from __future__ import annotations

import time

from inspect_ai import Task
from inspect_ai.dataset import Sample
from inspect_ai.scorer import CORRECT, INCORRECT, Score, Target, accuracy, scorer
from inspect_ai.solver import Generate, TaskState, solver
from inspect_ai.util import sandbox

from bench.lib.project import sample_argv

WORK = "work"  # relative: the sandbox's own working directory (the local provider's is a fresh temp dir per sample)


@solver
def setup_and_test(root: str):
    async def solve(state: TaskState, generate: Generate) -> TaskState:
        t0 = time.monotonic()
        res = await sandbox().exec(sample_argv(root, WORK), timeout=1800)
        state.metadata["exec_s"] = time.monotonic() - t0
        state.output.completion = res.stdout if res.success else f"exit {res.returncode}: {res.stderr[-500:]}"
        return state

    return solve


@scorer(metrics=[accuracy()])
def tests_passed():
    async def score(state: TaskState, target: Target) -> Score:
        try:
            got = (await sandbox().read_file(f"{WORK}/result.txt")).strip()
        except FileNotFoundError:
            got = f"no result: {state.output.completion}"
        return Score(value=CORRECT if got.startswith(target.text) else INCORRECT, answer=got,
                     metadata={"exec_s": state.metadata.get("exec_s")})

    return score


def eval_task(n: int, root: str, sandbox_spec) -> Task:
    return Task(dataset=[Sample(id=i, input=f"sample {i}", target="ok") for i in range(n)],
                solver=setup_and_test(root), scorer=tests_passed(), sandbox=sandbox_spec, name="forkd-bench-eval")
