"""Resource limits on spec files, values files and their templates: a spec is untrusted input (`forkd serve --watch`
renders whatever lands in the watched directory, inside the daemon).

- Text: a spec or values file is at most MAX_FILE_BYTES.
- YAML: a document's nodes, counted with every alias expanded (a "billion laughs" of nested aliases), are at most
  MAX_YAML_NODES, and a recursive alias is refused; checked on the composed node graph, before constructing.
- Templates (jinja2 sandbox): the rendered text is at most MAX_RENDERED_CHARS (counted as it is generated), the
  render stops after MAX_RENDER_SECONDS (checked at every loop iteration, call, attribute and item lookup and output
  chunk), and the operations that make a large value from small ones in one step (`*`, `**`, `%` / format widths,
  padding, replace, join, indent, center) are checked before they run against MAX_VALUE_CHARS.

Each limit is a constant: a spec that needs more is better split into several files (values and templates are
meant to be small). Errors are LimitExceeded (InvalidInput) naming what exceeded which limit.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Iterable, Iterator
from typing import Any

from jinja2 import nodes
from jinja2.compiler import CodeGenerator
from jinja2.ext import Extension
from jinja2.sandbox import SandboxedEnvironment
from yaml.nodes import MappingNode, Node, SequenceNode

from forkd.base.errors import InvalidInput

MAX_FILE_BYTES = 1 << 20
MAX_YAML_NODES = 100_000
MAX_RENDERED_CHARS = 4 << 20
MAX_VALUE_CHARS = 4 << 20
MAX_RENDER_SECONDS = 5.0
# a width or precision of a million and more, or one taken from an argument (%*d, %.*s, {:{}})
_WIDTH_RE = re.compile(r"\d{7,}|%[-+ #0-9]*\.?\*|\{[^{}]*:[^{}]*\{")
_PADDING = {"ljust", "rjust", "center", "zfill"}


class LimitExceeded(InvalidInput):
    """A spec, values file or template went past one of the limits above."""


def check_text(text: str, what: str) -> str:
    if len(text) > MAX_FILE_BYTES:
        raise LimitExceeded(f"{what} is larger than {MAX_FILE_BYTES} bytes", hint="split it into several files")
    return text


def check_yaml(node: Node, what: str) -> None:
    """LimitExceeded if the document, with every alias expanded, has more than MAX_YAML_NODES nodes (or an alias
    refers to a node that contains it)."""
    sizes: dict[int, int] = {}
    open_: set[int] = set()
    stack: list[tuple[Node, bool]] = [(node, False)]
    while stack:
        n, done = stack.pop()
        if id(n) in sizes and not done:
            continue
        kids = ([x for kv in n.value for x in kv] if isinstance(n, MappingNode) else
                list(n.value) if isinstance(n, SequenceNode) else [])
        if done:
            open_.discard(id(n))
            sizes[id(n)] = min(1 + sum(sizes[id(k)] for k in kids), MAX_YAML_NODES + 1)
            continue
        if id(n) in open_:
            raise LimitExceeded(f"{what}: a YAML alias refers to a node that contains it (a recursive structure)")
        open_.add(id(n))
        stack.append((n, True))
        stack += [(k, False) for k in kids if id(k) not in sizes or id(k) in open_]
    if sizes[id(node)] > MAX_YAML_NODES:
        raise LimitExceeded(f"{what}: a YAML document expands to more than {MAX_YAML_NODES} nodes (aliases counted "
                            "once per use)", hint="write it without so many aliases, or split it")


class _Limits(Extension):
    """Holds the deadline of one render; `each` wraps every for-loop's iterable (see _Generator)."""

    def __init__(self, environment: Any):
        super().__init__(environment)
        self.deadline = time.monotonic() + MAX_RENDER_SECONDS

    def tick(self) -> None:
        if time.monotonic() > self.deadline:
            raise LimitExceeded(f"rendering took longer than {MAX_RENDER_SECONDS:g} s",
                                hint="a loop runs too long: make the template do less")

    def concat(self, parts: tuple) -> str:
        self.tick()
        check_weight("'~'", *parts)
        return "".join(map(str, parts))

    def each(self, iterable: Iterable) -> Iterator:
        for item in iterable:
            self.tick()
            yield item


class _Generator(CodeGenerator):
    """Every for-loop iterates through _Limits.each, so even an empty loop body checks the deadline."""

    def visit_Template(self, node: nodes.Template, frame: Any = None) -> None:
        for loop in node.find_all(nodes.For):
            loop.iter = nodes.Call(nodes.ExtensionAttribute(_Limits.identifier, "each"), [loop.iter], [], None, None,
                                   lineno=loop.lineno)
        super().visit_Template(node, frame)

    def visit_Concat(self, node: nodes.Concat, frame: Any) -> None:
        """`a ~ b`: through _Limits.concat, which checks the parts before joining them."""
        self.write(f"environment.extensions[{_Limits.identifier!r}].concat((")
        for arg in node.nodes:
            self.visit(arg, frame)
            self.write(", ")
        self.write("))")


def weight(x: Any, limit: int = MAX_VALUE_CHARS) -> int:
    """Roughly the characters `str(x)` makes: a string's length, a container's items (shared ones counted once per
    use, as printing repeats them), each scalar 1; stops counting past `limit`."""
    memo: dict[int, int] = {}

    def w(v: Any, depth: int) -> int:
        if isinstance(v, str | bytes):
            return len(v)
        if not isinstance(v, list | tuple | dict | set | frozenset) or depth > 64:
            return 1
        if id(v) in memo:
            return memo[id(v)]
        memo[id(v)] = limit + 1  # a container that holds itself prints without end
        total = len(v)
        for item in (x for kv in v.items() for x in kv) if isinstance(v, dict) else v:
            total += w(item, depth + 1)
            if total > limit:
                break
        memo[id(v)] = total
        return total

    return w(x, 0)


def check_weight(what: str, *values: Any) -> None:
    total = 0
    for v in values:
        total += weight(v)
        _too_big(what, total)


def _too_big(what: str, n: float) -> None:
    if n > MAX_VALUE_CHARS:
        raise LimitExceeded(f"{what} would make a value of {int(n)} characters, more than {MAX_VALUE_CHARS}")


def _check_call(obj: Any, args: tuple, kwargs: dict) -> None:
    """Refuse, before it runs, a str method call that would make a value past MAX_VALUE_CHARS."""
    check_weight("a call's arguments", *args, *kwargs.values())
    name, target = getattr(obj, "__name__", ""), getattr(obj, "__self__", None)
    if not isinstance(target, str):
        return
    ints = [a for a in (*args, *kwargs.values()) if isinstance(a, int)]
    strs = [a for a in (*args, *kwargs.values()) if isinstance(a, str)]
    if name in _PADDING or name == "expandtabs":
        _too_big(f"str.{name}", max(ints, default=0) * (len(target) if name == "expandtabs" else 1))
    elif name == "replace" and strs:
        old, new = (strs + [""])[:2]
        _too_big("str.replace", len(target) + (target.count(old) if old else len(target) + 1) * len(new))
    elif name == "join" and args and hasattr(args[0], "__len__"):
        _too_big("str.join", len(target) * len(args[0]) + sum(len(x) for x in args[0] if isinstance(x, str)))


class LimitedEnvironment(SandboxedEnvironment):
    """The jinja2 sandbox with the limits of this module (one environment per render: it holds the deadline)."""

    code_generator_class = _Generator
    intercepted_binops = frozenset({"*", "**", "%", "+"})

    def __init__(self, **kw: Any):
        super().__init__(extensions=[_Limits], finalize=self._finalize, **kw)
        self.limits: _Limits = self.extensions[_Limits.identifier]  # type: ignore[assignment]
        for name in list(self.filters):  # every filter: its inputs checked, and its result
            self.filters[name] = _limited_filter(self, name, self.filters[name])

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        self.limits.tick()
        check_weight(f"'{operator}'", left, right)
        if operator == "*":
            for seq, n in ((left, right), (right, left)):
                if hasattr(seq, "__len__") and isinstance(n, int):
                    _too_big("'*'", weight(seq) * n)
        elif operator == "**" and isinstance(left, int) and isinstance(right, int) and abs(left) > 1:
            _too_big("'**' (digits)", right * math.log10(abs(left)))
        elif operator == "%" and isinstance(left, str) and _WIDTH_RE.search(left):
            raise LimitExceeded("a format width of a million or more (or taken from an argument) is refused")
        return super().call_binop(context, operator, left, right)

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805 - jinja's signature
        __self.limits.tick()
        _check_call(__obj, args, kwargs)
        return super().call(__context, __obj, *args, **kwargs)

    def wrap_str_format(self, value: Any) -> Any:
        """str.format / format_map, reached as an attribute: refuse huge widths; check the arguments' size."""
        wrapped = super().wrap_str_format(value)
        if wrapped is None:
            return None
        if _WIDTH_RE.search(value.__self__):
            raise LimitExceeded("a format width of a million or more (or taken from an argument) is refused")

        def checked(*args: Any, **kwargs: Any) -> Any:
            check_weight("str.format", value.__self__, *args, *kwargs.values())
            return wrapped(*args, **kwargs)

        return checked

    def _finalize(self, value: Any) -> Any:
        """Every `{{ ... }}` value, before it is made text."""
        self.limits.tick()
        check_weight("an output value", value)
        return value

    def getattr(self, obj: Any, attribute: str) -> Any:
        self.limits.tick()
        return super().getattr(obj, attribute)

    def getitem(self, obj: Any, argument: Any) -> Any:
        self.limits.tick()
        return super().getitem(obj, argument)


def _limited_filter(env: LimitedEnvironment, name: str, f: Any) -> Any:
    """A filter checked against MAX_VALUE_CHARS before it runs (its arguments) and after (its result)."""

    first = 1 if getattr(f, "jinja_pass_arg", None) else 0  # the context / environment comes first

    def limited(*args: Any, **kwargs: Any) -> Any:
        env.limits.tick()
        check_weight(f"the {name} filter", *args[first:], *kwargs.values())
        value, rest = (args[first] if len(args) > first else None), [*args[first + 1:], *kwargs.values()]
        text = value if isinstance(value, str) else ""
        amount = max([a for a in rest if isinstance(a, int) and not isinstance(a, bool)]
                     + [len(a) for a in rest if isinstance(a, str)], default=0)
        if name in ("center", "indent", "wordwrap"):
            _too_big(f"the {name} filter", amount * (text.count("\n") + 1) + len(text))
        elif name == "format" and _WIDTH_RE.search(text):
            raise LimitExceeded("a format width of a million or more is refused")
        elif name == "replace" and len(rest) >= 2 and all(isinstance(a, str) for a in rest[:2]):
            old, new = rest[:2]
            _too_big("the replace filter", len(text) + (text.count(old) if old else len(text) + 1) * len(new))
        elif name == "join" and hasattr(value, "__len__"):
            _too_big("the join filter", len(value) * amount + weight(value))
        out = f(*args, **kwargs)
        check_weight(f"the {name} filter", out)
        return out

    for attr in ("jinja_pass_arg",):
        if hasattr(f, attr):
            setattr(limited, attr, getattr(f, attr))
    return limited


def render_limited(env: LimitedEnvironment, template: Any, context: dict) -> str:
    """Render through generate(), counting: past MAX_RENDERED_CHARS or the deadline, LimitExceeded."""
    out: list[str] = []
    n = 0
    for chunk in template.generate(context):
        n += len(chunk)
        if n > MAX_RENDERED_CHARS:
            raise LimitExceeded(f"the rendered text is longer than {MAX_RENDERED_CHARS} characters",
                                hint="make the template emit less, or split it into several files")
        env.limits.tick()
        out.append(chunk)
    return "".join(out)
