"""An agent loop on sandbox="forkd": Inspect's own bash() and python() tools, driven by a scripted mock model
(tests/test_inspect_provider.py gives the script). The default guest image has busybox's sh but no bash, which
bash() and python() call (`bash --login -c`): the task's setup puts a `bash` that runs busybox's sh."""

from forkd_client.inspect_config import ForkdSandboxConfig
from inspect_ai import Task, task
from inspect_ai.dataset import Sample
from inspect_ai.scorer import CORRECT, INCORRECT, Score, Target, accuracy, scorer
from inspect_ai.solver import TaskState, generate, use_tools
from inspect_ai.tool import bash, python
from inspect_ai.util import SandboxEnvironmentSpec, sandbox

BASH = "printf '#!/bin/sh\\nexec /bin/sh \"$@\"\\n' > /usr/local/bin/bash && chmod 755 /usr/local/bin/bash"


@scorer(metrics=[accuracy()])
def answer_file():
    async def score(state: TaskState, target: Target) -> Score:
        got = (await sandbox().read_file("answer.txt")).strip()
        return Score(value=CORRECT if got == target.text else INCORRECT, answer=got)

    return score


@task
def forkd_agent(template: str = "base"):
    cfg = ForkdSandboxConfig(template=template, setup=("mkdir -p /usr/local/bin", BASH))
    return Task(dataset=[Sample(input="Write 6*7 to answer.txt", target="42")],
                solver=[use_tools([bash(timeout=60), python(timeout=60)]), generate()],
                scorer=answer_file(), sandbox=SandboxEnvironmentSpec("forkd", cfg))
