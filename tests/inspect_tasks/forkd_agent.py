"""An agent loop on sandbox="forkd": Inspect's own bash() and python() tools, driven by a scripted mock model
(`python forkd_agent.py TEMPLATE LOG_DIR` runs it; tests/test_inspect_provider.py does). The default guest image
has busybox's sh but no bash, which bash() and python() call (`bash --login -c`): the task's setup puts a `bash`
that runs busybox's sh."""

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


def run(template: str, log_dir: str) -> None:
    """The eval with the mock model scripted to call bash(), then python(), then answer."""
    from inspect_ai import eval as inspect_eval
    from inspect_ai.model import ModelOutput, ModelUsage, get_model

    script = [ModelOutput.for_tool_call("mockllm/model", "bash", {"command": "echo $((6*7)) > bash.txt; id -un"}),
              ModelOutput.for_tool_call("mockllm/model", "python",
                                        {"code": "n = open('bash.txt').read().strip()\n"
                                                 "open('answer.txt', 'w').write(n)\nprint('wrote', n)"}),
              ModelOutput.from_content("mockllm/model", "done")]
    for out in script:  # given usage, the mock model counts no tokens (tiktoken would download its table)
        out.usage = ModelUsage(input_tokens=1, output_tokens=1, total_tokens=2)
    inspect_eval(forkd_agent(template), model=get_model("mockllm/model", custom_outputs=script), log_dir=log_dir,
                 log_format="json", display="plain")


if __name__ == "__main__":
    import sys

    run(sys.argv[1], sys.argv[2])
