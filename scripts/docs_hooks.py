"""MkDocs hooks (mkdocs.yml `hooks:`): pages generated from the code at build time, and the repository files the
docs link to served beside them."""

from __future__ import annotations

import posixpath
import re
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

MARKER = "<!-- generated: cli -->"
REPO = Path(__file__).resolve().parent.parent
# a file outside docs/ that a page links to (README.md, SECURITY.md, a report under bench/reports/, ...) is served
# under this folder of the site, at its repository path
OUTSIDE = "repository"
FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)
LINK = re.compile(r"(\]\()([^)\s#]+)((?:#[^)\s]*)?\))")


def _relative(target: str) -> bool:
    return "://" not in target and not target.startswith(("/", "mailto:"))


def _repo_path(src_uri: str, docs_dir: Path) -> Path:
    """Where a page of the site lives in the repository."""
    if src_uri.startswith(f"{OUTSIDE}/"):
        return REPO / src_uri.removeprefix(f"{OUTSIDE}/")
    return docs_dir / src_uri


def _site_uri(target: Path, docs_dir: Path) -> str | None:
    """The site path of a repository file (None: not a file of the repository)."""
    if target.is_relative_to(docs_dir):
        return target.relative_to(docs_dir).as_posix()
    if target.is_relative_to(REPO) and target.is_file():
        return f"{OUTSIDE}/{target.relative_to(REPO).as_posix()}"
    return None


def _rewrite(markdown: str, src_uri: str, docs_dir: Path, found: set[str] | None = None) -> str:
    """Each relative link of a page (outside code blocks) pointed at the site path of the file it names in the
    repository; `found` collects those outside docs/."""
    here = _repo_path(src_uri, docs_dir).parent

    def one(m: re.Match) -> str:
        if not _relative(m[2]):
            return m[0]
        uri = _site_uri(Path(posixpath.normpath((here / m[2]).as_posix())), docs_dir)
        if uri is None:
            return m[0]
        if found is not None and uri.startswith(f"{OUTSIDE}/"):
            found.add(uri)
        return m[1] + posixpath.relpath(uri, posixpath.dirname(src_uri) or ".") + m[3]

    out, last = [], 0
    for fence in FENCE.finditer(markdown):
        out += [LINK.sub(one, markdown[last:fence.start()]), fence[0]]
        last = fence.end()
    return "".join([*out, LINK.sub(one, markdown[last:])])


def on_files(files: Files, config: Any, **_: Any) -> Files:
    """Add the repository files outside docs/ that the pages link to, and those they link to in turn."""
    docs_dir = Path(config["docs_dir"]).resolve()
    todo = [f.src_uri for f in files if f.src_uri.endswith(".md")]
    seen: set[str] = set()
    while todo:
        uri = todo.pop()
        found: set[str] = set()
        _rewrite(_repo_path(uri, docs_dir).read_text(), uri, docs_dir, found)
        for new in sorted(found - seen):
            seen.add(new)
            files.append(File.generated(config, new, abs_src_path=str(_repo_path(new, docs_dir))))
            if new.endswith(".md"):
                todo.append(new)
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, **_: Any) -> str:
    """Point links at repository files to their place in the site, and put the CLI reference
    (forkd.cli.reference, from the command tree) where a page holds MARKER."""
    markdown = _rewrite(markdown, page.file.src_uri, Path(config["docs_dir"]).resolve())
    if MARKER not in markdown:
        return markdown
    from forkd.cli.reference import markdown as cli_reference

    body = cli_reference().split("\n", 1)[1]  # the page keeps its own title
    return markdown.replace(MARKER, body)
