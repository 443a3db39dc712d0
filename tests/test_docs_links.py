"""Every relative link in README.md and docs/**/*.md points at a file that exists (a moved page breaks no link),
and every #anchor into a Markdown page names one of its headings."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# [text](target) and ![alt](target); the target ends at whitespace or the closing parenthesis.
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
COMMENT = re.compile(r"<!--.*?-->", re.S)  # not rendered: a slot for a page still to be written


def pages() -> list[Path]:
    return [ROOT / "README.md"] + sorted((ROOT / "docs").rglob("*.md"))


def links(text: str) -> list[str]:
    """The relative link targets of a Markdown text, outside code blocks, inline code and HTML comments.

    >>> links("[a](b.md) `[x](no.md)` ![i](img/p.png) [w](https://x.org) [s](#top)\\n```\\n[c](no.md)\\n```\\n")
    ['b.md', 'img/p.png', '#top']
    >>> links("<!-- slot: [later](later.md) -->[now](now.md)")
    ['now.md']
    """
    text = re.sub(r"`[^`\n]*`", "", FENCE.sub("", COMMENT.sub("", text)))
    return [t for t in LINK.findall(text) if not re.match(r"[a-z][a-z0-9+.-]*:", t)]


def anchor(heading: str) -> str:
    """GitHub's anchor for a heading.

    >>> anchor("Length extrapolation: six position schemes read past their training length")
    'length-extrapolation-six-position-schemes-read-past-their-training-length'
    >>> anchor("GPU: NVIDIA H100 (80 GB), CUDA 13.0")
    'gpu-nvidia-h100-80-gb-cuda-130'
    """
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", ""))
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = FENCE.sub("", page.read_text(encoding="utf-8"))
    return {anchor(h) for h in re.findall(r"^#{1,6}\s+(.*)$", text, re.M)}


def test_the_link_finder_and_the_anchors():
    assert links("[a](x.md#y)") == ["x.md#y"]


def test_every_relative_link_resolves():
    broken = []
    for page in pages():
        for target in links(page.read_text(encoding="utf-8")):
            path, _, frag = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}")
            elif frag and dest.suffix == ".md" and frag not in anchors(dest):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, "\n".join(broken)


def test_every_docs_path_named_in_code_exists():
    """Docstrings, messages, scripts and the Makefile name docs pages by path (``docs/lab/performance.md``): each
    must exist, so a moved page is renamed everywhere."""
    named = re.compile(r"\bdocs/[\w./-]*\w\.(?:md|json|png)\b")
    placeholder = re.compile(r"\b[A-Z]{2,}(?:[-_][A-Z]{2,})+\b")  # docs/lab/experiments/GRID-SIZE.md: a pattern
    files = [ROOT / "Makefile", *(ROOT / "src" / "lmforge").rglob("*.py"), *(ROOT / "benchmarks").glob("*.py"),
             *(ROOT / "tests").glob("*.py")]
    missing = sorted({f"{f.relative_to(ROOT)}: {m}" for f in files
                      for m in named.findall(f.read_text(encoding="utf-8", errors="replace"))
                      if not (ROOT / m).exists() and not placeholder.search(m)})
    assert not missing, "\n".join(missing)
