"""The settings reference (docs/settings.md), generated from forkd.base.settings: `python -m
forkd.base.settings_reference` prints it; tests/test_reference_pages.py checks the committed page is current."""

from __future__ import annotations

import json
from pathlib import Path

from forkd.base.mdtable import cell
from forkd.base.settings import Settings, _type_name, env_name

INTRO = """# Settings reference

<!-- generated: `python -m forkd.base.settings_reference > docs/settings.md`; tests/test_reference_pages.py -->

Every `FORKD_*` environment variable forkd reads, with its type, default and meaning, from the one settings model
(`forkd/base/settings.py`; nothing else reads a `FORKD_*` variable). `forkd config` shows the values in effect and
where each comes from; a value that does not parse is an error naming the variable. Types: `path`, `int`, `float`,
`bool` (1/0, true/false, yes/no, on/off), `a|b` (one of), `?` (may be unset), `secret` (never shown).
"""


def _default(value: object, secret: bool) -> str:
    if secret or value is None:
        return ""
    shown = str(value) if isinstance(value, Path) else json.dumps(value)
    return f"`{shown}`"


def page() -> str:
    rows = ["| variable | type | default | meaning |", "| --- | --- | --- | --- |"]
    for field, info in Settings.model_fields.items():
        secret = bool((info.json_schema_extra or {}).get("secret"))
        rows.append(f"| `{env_name(field)}` | {cell(_type_name(info.annotation))} | "
                    f"{_default(info.default, secret)} | {cell(info.description or '')} |")
    return INTRO + "\n" + "\n".join(rows) + "\n"


if __name__ == "__main__":
    print(page(), end="")
