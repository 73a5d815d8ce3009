"""The docs' pages hold together and read as user documentation.

(a) Every relative link of the README and of ``docs/**/*.md`` points to a file that exists, and
every ``#anchor`` (on the same page or on another Markdown page) names a heading of its target,
slugged as the site's ``toc`` extension slugs it (Python-Markdown's default ``slugify``: mkdocs.yml
configures no other), or an explicit ``{#id}`` / ``<a id=...>`` / ``<a name=...>``.

(b) The user pages (the README and ``docs/**/*.md`` except the generated ``docs/compat/``) carry
no development history: no dated runs, no "issue NN", no diary phrases. Figures and their dates
belong on the benchmarks page's generated tables and in ``benchmarks/archive/``.

Fast and without Spark: plain text, read from the checkout.
"""

from __future__ import annotations

import html
import re
import unicodedata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
GENERATED = DOCS / "compat"  # written by tests.compat_report, not by hand
README = ROOT / "README.md"
PAGES = [README, *sorted(DOCS.rglob("*.md"))]
USER_PAGES = [page for page in PAGES if GENERATED not in page.parents]

# Development history has no place on a user page: a page states what holds, in the present
# tense, and links the benchmarks page for figures (dated runs and before/after comparisons go
# to benchmarks/archive/). Each pattern is one kind of diary text, matched case-insensitively
# on every line, code blocks included (an example holds no dated run either).
HISTORY = {
    "a date (a dated run)": r"\b20\d\d-\d\d-\d\d\b",
    "an issue number": r"\bissues? #?\d+",
    "a sitting": r"\bsitting\b",
    "a target not met": r"\bnot met\b",
    "the calibration loop": r"\bcalibration loop\b",
    "a target of ours": r"\bour target\b|\bthe target (?:is|was|of)\b|\btarget \d",
    "an earlier run": r"\bthe run before\b|\bbefore this release\b",
    "a measurement no one can re-run": r"\boutside the repository\b",
}

_FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})")
_INLINE_CODE = re.compile(r"(`+)(.+?)\1")
_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_HREF = re.compile(r"""<a\s[^>]*href=["']([^"']+)["']""", re.I)
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_ATTR_ID = re.compile(r"\s*\{[^}]*#([\w-]+)[^}]*\}\s*$")
_HTML_ID = re.compile(r"""<a\s[^>]*(?:id|name)=["']([^"']+)["']""", re.I)
_EXTERNAL = re.compile(r"^(?:[a-z][a-z0-9+.-]*:|//)", re.I)  # http:, https:, mailto:, ...


def prose_lines(page: Path) -> list[tuple[int, str]]:
    """The page's lines outside fenced code blocks, numbered from 1."""
    lines, fence = [], None
    for number, line in enumerate(page.read_text().splitlines(), 1):
        opened = _FENCE.match(line)
        if fence is None and opened:
            fence = opened.group(2)[0] * len(opened.group(2))
        elif fence is not None and line.strip().startswith(fence):
            fence = None
        elif fence is None:
            lines.append((number, line))
    return lines


def slugify(text: str, separator: str = "-") -> str:
    """Python-Markdown's ``toc`` slugify (``markdown.extensions.toc.slugify``)."""
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(rf"[{separator}\s]+", separator, text)


def heading_text(markdown: str) -> str:
    """A heading's text as the rendered HTML shows it, tags dropped (what ``toc`` slugs)."""
    parts, last = [], 0
    for code in _INLINE_CODE.finditer(markdown):
        parts.append(_strip_inline(markdown[last : code.start()]))
        parts.append(code.group(2).strip())
        last = code.end()
    parts.append(_strip_inline(markdown[last:]))
    return html.unescape("".join(parts))


def _strip_inline(text: str) -> str:
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link: its text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML
    text = text.replace("*", "")
    return re.sub(r"(?<!\w)_(\S(?:.*?\S)?)_(?!\w)", r"\1", text)  # _emphasis_, not snake_case


def anchors(page: Path) -> set[str]:
    """The ids a page's headings get (repeats numbered ``_1``, ``_2`` as ``toc`` does), and
    explicit ids."""
    found: set[str] = set()
    for _, line in prose_lines(page):
        found.update(_HTML_ID.findall(line))
        heading = _HEADING.match(line)
        if not heading:
            continue
        text = heading.group(2)
        explicit = _ATTR_ID.search(text)
        if explicit:
            found.add(explicit.group(1))
            continue
        slug = base = slugify(heading_text(text))
        while slug in found or not slug:
            numbered = re.match(r"^(.*)_(\d+)$", slug)
            slug = f"{numbered.group(1)}_{int(numbered.group(2)) + 1}" if numbered else f"{base}_1"
        found.add(slug)
    return found


def links(page: Path) -> list[tuple[int, str]]:
    """The page's link targets outside code, with their line numbers."""
    found = []
    for number, line in prose_lines(page):
        prose = _INLINE_CODE.sub("", line)
        for target in [*_LINK.findall(prose), *_HREF.findall(prose)]:
            found.append((number, target))
    return found


def _shown(page: Path) -> str:
    return page.relative_to(ROOT).as_posix() if page.is_relative_to(ROOT) else page.name


def _where(page: Path, number: int) -> str:
    return f"{_shown(page)}:{number}"


def broken_links(page: Path) -> list[str]:
    broken = []
    for number, target in links(page):
        if _EXTERNAL.match(target):
            continue
        path, _, anchor = target.partition("#")
        goal = (page.parent / path).resolve() if path else page
        if not goal.exists():
            broken.append(f"{_where(page, number)}: {target} (no such file)")
        elif anchor and goal.suffix == ".md" and anchor not in anchors(goal):
            broken.append(f"{_where(page, number)}: {target} (no heading #{anchor} on {_shown(goal)})")
    return broken


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_and_anchor_resolves(page: Path) -> None:
    broken = broken_links(page)
    assert not broken, "broken links:\n" + "\n".join(broken)


@pytest.mark.parametrize("page", USER_PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_user_pages_carry_no_development_history(page: Path) -> None:
    hits = []
    for number, line in enumerate(page.read_text().splitlines(), 1):
        for kind, pattern in HISTORY.items():
            for match in re.finditer(pattern, line, re.I):
                hits.append(f"{_where(page, number)}: {kind}: {match.group(0)!r} in {line.strip()[:100]!r}")
    assert not hits, "development history on a user page:\n" + "\n".join(hits)


def test_the_slugs_are_python_markdowns() -> None:
    """Where Python-Markdown is installed (the docs extra), its ``toc`` gives every heading of
    every page the id this test computes."""
    markdown = pytest.importorskip("markdown")
    for page in PAGES:
        rendered = markdown.Markdown(extensions=["toc", "tables", "admonition", "fenced_code"])
        rendered.convert(page.read_text())
        ids: set[str] = set()
        stack = list(rendered.toc_tokens)
        while stack:
            token = stack.pop()
            ids.add(token["id"])
            stack.extend(token["children"])
        only_markdown = sorted(ids - anchors(page))
        assert not only_markdown, f"{_shown(page)}: ids only Markdown gives: {only_markdown}"


def test_the_checks_catch_what_they_look_for(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "# Hot keys, skew and Spark's defaults\n\n## `key_ordered_stream`: parked *rows*\n\n"
        "## Figures\n\n## Figures\n\n[ok](#figures_1) [gone](#nothing) [missing](other.md)\n\n"
        "```text\n[in code](nowhere.md)\n```\n"
    )
    assert anchors(page) == {
        "hot-keys-skew-and-sparks-defaults",
        "key_ordered_stream-parked-rows",
        "figures",
        "figures_1",
    }
    assert broken_links(page) == [
        "page.md:9: #nothing (no heading #nothing on page.md)",
        "page.md:9: other.md (no such file)",
    ]
