"""MkDocs hooks of the documentation site (``hooks:`` in ``mkdocs.yml``).

A page line ``--8<-- "FILE.md"`` (pymdownx.snippets' syntax) shows a Markdown file of the
repository root, e.g. ``docs/benchmarks.md`` shows ``BENCHMARKS.md``, without a copy that could
drift. The hook puts the file's text in place before MkDocs converts the page, and rewrites the
file's links into ``docs/`` (written from the root, e.g. ``docs/experiments/x.png``) to be
relative to the page, so images and links resolve and ``mkdocs build --strict`` checks them.
Bracketed words separated by a space (``"[d007] [d076]"``) stay text, as on GitHub (GFM has no
reference link with a space in it; Python-Markdown would make one and look for its target).

    python scripts/mkdocs_hooks.py experiments.md    # print the Markdown MkDocs converts
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

INCLUDE = re.compile(r'^--8<-- "([^"/\\]+\.md)"[ \t]*$', re.M)


def _plain_brackets(text: str) -> str:
    """``[a] [b]`` outside code as text: the second bracket escaped."""
    out, fenced = [], False
    for line in text.split("\n"):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced:
            parts = line.split("`")  # even parts lie outside inline code
            line = "`".join(
                re.sub(r"\] \[", r"] \\[", p) if i % 2 == 0 else p for i, p in enumerate(parts)
            )
        out.append(line)
    return "\n".join(out)


def expand(markdown: str, root: Path, page_path: str) -> str:
    """``markdown`` with every root-file include replaced by the file's text (links rewritten
    for a page at ``page_path``, relative to ``docs/``)."""
    up = "../" * page_path.count("/")

    def text(m: re.Match) -> str:
        body = (root / m.group(1)).read_text(encoding="utf-8")
        return _plain_brackets(re.sub(r"(\]\(|src=\")docs/", rf"\g<1>{up}", body))

    return INCLUDE.sub(text, markdown)


def on_page_markdown(markdown, page, config, files):
    root = Path(config.config_file_path).resolve().parent
    return expand(markdown, root, page.file.src_uri)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("page", help="a page of docs/, e.g. experiments.md")
    args = p.parse_args(argv)
    root = Path(__file__).resolve().parents[1]
    print(expand((root / "docs" / args.page).read_text(encoding="utf-8"), root, args.page))


if __name__ == "__main__":
    main()
