"""A small Inspect task on sandbox="forkd" (tests/test_inspect_provider.py runs it with `inspect eval` and the
mock model, which it never calls: a scripted solver, so nothing goes to the network): each sample's solver runs
Python in the sample's own child, writing the square of the sample's number to a file; the scorer reads that file
back from the sandbox."""

from inspect_ai import Task, task
from inspect_ai.dataset import Sample
from inspect_ai.scorer import CORRECT, INCORRECT, Score, Target, accuracy, scorer
from inspect_ai.solver import Generate, TaskState, solver
from inspect_ai.util import sandbox


@solver
def square_in_sandbox():
    async def solve(state: TaskState, generate: Generate) -> TaskState:
        n = int(state.input_text)
        res = await sandbox().exec(["python3", "-c", f"open('square.txt', 'w').write(str({n} * {n}))"])
        assert res.success, res.stderr
        state.output.completion = res.stdout
        return state  # no generate(): the mock model would count tokens with tiktoken, which downloads its table

    return solve


@scorer(metrics=[accuracy()])
def wrote_square():
    async def score(state: TaskState, target: Target) -> Score:
        got = (await sandbox().read_file("square.txt")).strip()
        return Score(value=CORRECT if got == target.text else INCORRECT, answer=got)

    return score


@task
def forkd_squares():
    return Task(dataset=[Sample(input=str(n), target=str(n * n)) for n in (3, 7, 12)],
                solver=square_in_sandbox(), scorer=wrote_square(), sandbox="forkd")
