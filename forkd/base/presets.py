"""Named Debian package sets for guest images: `forkd image build --preset NAME`, `image: {debian: {preset: NAME}}`.

    full        what an E2B-style sandbox user expects to find: bash (commands then run under `bash -l -c`), git,
                curl, CA certificates, pip and venv
    full-build  full plus build-essential (gcc, make, libc headers) for pip packages that compile

The default image stays small (busybox + Python); a preset is a Debian image like any other (forkd.image.debian),
built once and cached by content.
"""

from __future__ import annotations

FULL = ("bash", "git", "curl", "ca-certificates", "python3-pip", "python3-venv")
PRESETS: dict[str, tuple[str, ...]] = {
    "full": FULL,
    "full-build": (*FULL, "build-essential"),
}


def preset_packages(name: str | None, packages: list[str] | tuple[str, ...] = ()) -> list[str]:
    """The preset's packages followed by `packages` (no preset: `packages`); ValueError names the known ones."""
    if name is None:
        return list(packages)
    if name not in PRESETS:
        raise ValueError(f"unknown image preset {name!r} (known: {', '.join(PRESETS)})")
    return [*PRESETS[name], *(p for p in packages if p not in PRESETS[name])]
