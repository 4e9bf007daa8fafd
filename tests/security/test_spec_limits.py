"""Spec and values files -> the daemon's memory and CPU (issue 14, item 8): `forkd serve --watch DIR` renders
whatever lands in DIR inside the daemon, so a spec, a values file and the template in it are bounded: input size,
YAML nodes with aliases expanded (billion laughs), the rendered text, render time, and the template operations that
make a large value in one step. Every refusal is an error naming the file."""

from __future__ import annotations

import pytest

from forkd.base.errors import InvalidInput
from forkd.spec.limits import MAX_FILE_BYTES, MAX_RENDERED_CHARS
from forkd.spec.loader import SpecLoadError, build_values, load_paths, load_values

HEAD = "apiVersion: forkd.dev/v1alpha1\n"
PARENT = HEAD + "kind: ForkParent\nmetadata:\n  name: py\nspec:\n  warmup:\n    imports: [json]\n"


def _laughs(levels: int = 9) -> str:
    """A YAML mapping of 9 nested aliases, 9 wide: ~300 bytes that expand to 9**9 (387 M) strings."""
    lines = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i in range(1, levels):
        prev, cur = chr(ord("a") + i - 1), chr(ord("a") + i)
        lines.append(f"{cur}: &{cur} [" + ",".join(f"*{prev}" for _ in range(9)) + "]")
    return "\n".join(lines) + "\n"


def test_a_billion_laughs_values_file_is_refused_naming_the_file(tmp_path):
    values = tmp_path / "values.yaml"
    values.write_text(_laughs())
    assert values.stat().st_size < 400
    with pytest.raises(InvalidInput, match=f"values file {values}.*expands to more than"):
        load_values([values])


def test_a_billion_laughs_spec_is_refused_naming_the_file(tmp_path):
    spec = tmp_path / "laughs.yaml"
    spec.write_text(PARENT + "  labels:\n" + "".join(f"    {line}\n" for line in _laughs().splitlines()))
    with pytest.raises(SpecLoadError, match=f"{spec}:.*expands to more than"):
        load_paths([spec])


def test_a_recursive_alias_is_refused(tmp_path):
    values = tmp_path / "values.yaml"
    values.write_text("a: &a [1, *a]\n")
    with pytest.raises(InvalidInput, match="recursive"):
        load_values([values])


def test_a_set_value_is_bounded_too():
    with pytest.raises(InvalidInput, match="--set x"):
        build_values([], ["x=" + "a" * (MAX_FILE_BYTES + 1)])


def test_an_oversized_spec_or_values_file_is_refused_naming_it(tmp_path):
    big = tmp_path / "big.yaml"
    big.write_text(PARENT + "# " + "x" * MAX_FILE_BYTES + "\n")
    with pytest.raises(SpecLoadError, match=f"{big}: .*larger than {MAX_FILE_BYTES} bytes"):
        load_paths([big])
    with pytest.raises(InvalidInput, match=f"{big} is larger than"):
        load_values([big])


def test_the_rendered_text_is_bounded(tmp_path):
    spec = tmp_path / "out.yaml.j2"
    spec.write_text('{% for i in range(100000) %}# {{ "x" * 1000 }}\n{% endfor %}' + PARENT)
    with pytest.raises(SpecLoadError, match=f"{spec}:.*rendered text is longer than {MAX_RENDERED_CHARS}"):
        load_paths([spec])


def test_a_values_file_cannot_expand_through_the_template(tmp_path):
    """The reported attack: a tiny values file printed whole by the template (52 M characters before)."""
    values = tmp_path / "values.yaml"
    values.write_text(_laughs(7))  # 9**7 = 4.8 M strings: under the node limit? no: refused when loaded
    spec = tmp_path / "dump.yaml.j2"
    spec.write_text(PARENT.replace("imports: [json]", "imports: [json]\n# {{ values }}"))
    with pytest.raises(InvalidInput, match=str(values)):
        load_paths([spec], values=build_values([values], []))


def test_a_loop_that_never_ends_is_stopped_by_the_deadline(tmp_path):
    spec = tmp_path / "loop.yaml.j2"
    spec.write_text("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}" + PARENT)
    with pytest.raises(SpecLoadError, match=f"{spec}:.*rendering took longer than"):
        load_paths([spec])


BOMBS = {
    "repeat": '{{ "x" * 10**9 }}',
    "power": "{{ 10 ** 100000000 }}",
    "list repeat": '{% set l = ["x" * 1000000] * 100000 %}{{ l|join }}',
    "nested literals": '{% set a = "x" * 1000000 %}' + "{% set a = [a, a] %}" * 40 + "{{ a }}",
    "concat doubling": '{% set a = "x" * 1000000 %}' + "{% set a = a ~ a %}" * 40 + "{{ a }}",
    "namespace doubling": '{% set ns = namespace(s="x") %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}'
                          "{% endfor %}",
    "plus doubling": '{% set a = "x" * 3000000 %}{{ a + a }}',
    "replace filter": '{{ ("x" * 100000)|replace("", "y" * 100000) }}',
    "replace method": '{{ ("x" * 100000).replace("", "y" * 100000) }}',
    "join method": '{{ ("y" * 100000).join("x" * 100000) }}',
    "padding": '{{ "x".ljust(10**10) }}',
    "percent width": '{{ "%099999999d" % 1 }}',
    "format width": '{{ "{:>999999999}".format(1) }}',
    "center filter": '{{ "x"|center(10**10) }}',
    "indent filter": '{{ ("x\n" * 1000000)|indent(1000) }}',
}


@pytest.mark.parametrize("case", list(BOMBS))
def test_template_operations_cannot_make_huge_values(tmp_path, case):
    spec = tmp_path / "bomb.yaml.j2"
    spec.write_text("# " + BOMBS[case] + "\n" + PARENT)
    with pytest.raises(SpecLoadError, match=f"{spec}:.*(would make a value|format width)"):
        load_paths([spec])


def test_ordinary_templates_still_render(tmp_path):
    """Control: the same operations at ordinary sizes are allowed."""
    spec = tmp_path / "ok.yaml.j2"
    spec.write_text('{% set n = "py" ~ "-" ~ (2 ** 3) %}' + PARENT.replace("name: py", "name: {{ n }}")
                    .replace("[json]", '[{{ ["json", "os"]|join(", ") }}, {{ "%s" % "re" }}, {{ "{}".format("io") }}]'))
    (obj,) = load_paths([spec])
    assert obj.obj.metadata.name == "py-8" and obj.obj.spec.warmup.imports == ["json", "os", "re", "io"]
