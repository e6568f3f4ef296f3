"""Griffe extension for the docs build: renders the reStructuredText idioms of the source
docstrings as Markdown, so mkdocstrings shows them properly.

The docstrings use Sphinx field lists (``:param x:``), which mkdocstrings parses itself
(``docstring_style: sphinx``). Everything else is rewritten here, before parsing:

* roles (``:class:`~pkg.Cls```, ``:meth:`Cls.m <pkg.Cls.m>```, ``:mod:`.sibling```) become code
  spans, linked (optional autorefs: never a broken-link warning) when the target is in the package;
* ``text::`` + an indented literal block becomes ``text:`` + a fenced code block;
* ```text <url>`_`` links become Markdown links;
* simple tables (``====  ====``) become Markdown tables, or a list for two columns without header;
* definition lists (a term, then its definition indented on the next line) use ``def_list``.

It also documents each object once, where it is defined: a name a module imports and re-exports
through ``__all__`` is dropped from that module's exports, so its page does not repeat it.

Only the rendered documentation changes; the sources are untouched.
"""

from __future__ import annotations

import ast
import json
import re
import textwrap
from typing import Any

import griffe

ROLE = re.compile(r":(?:py:)?(?P<role>class|meth|func|mod|attr|data|exc|obj|const):`(?P<body>[^`]+)`")
RST_LINK = re.compile(r"`(?P<text>[^`<]+?)\s*<(?P<url>https?://[^>]+)>`_{1,2}")
TABLE_BORDER = re.compile(r"^\s*=+(?:\s+=+)+\s*$")
FENCE = "```"


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


class SphinxMarkup(griffe.Extension):
    """Rewrites every docstring of a loaded package (see the module docstring)."""

    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader, **kwargs: Any) -> None:
        self._collection = loader.modules_collection
        self._walk(pkg)

    def _walk(self, obj: griffe.Object) -> None:
        if obj.is_module and not obj.is_package and obj.exports:
            own = {name for name, member in obj.members.items() if not member.is_alias}
            obj.exports = [name for name in obj.exports if str(name) in own]
        if obj.docstring is not None:
            obj.docstring.value = self.convert(obj.docstring.value, obj)
        for member in obj.members.values():
            if not member.is_alias:
                self._walk(member)  # type: ignore[arg-type]

    # ------------------------------------------------------------------ the conversion

    def convert(self, text: str, obj: griffe.Object | None = None) -> str:
        lines = text.splitlines()
        lines = self._literal_blocks(lines)
        lines = self._tables(lines)
        lines = self._definition_lists(lines)
        converted = []
        in_fence = False
        for line in lines:
            if line.lstrip().startswith(FENCE):
                in_fence = not in_fence
            if not in_fence:
                line = RST_LINK.sub(lambda m: f"[{m['text'].strip()}]({m['url']})", line)
                line = ROLE.sub(lambda m: self._role(m, obj), line)
            converted.append(line)
        return "\n".join(converted)

    def _role(self, match: re.Match[str], obj: griffe.Object | None) -> str:
        body = match["body"].strip()
        explicit = re.fullmatch(r"(?P<title>.+?)\s*<(?P<target>[^>]+)>", body)
        if explicit:
            title, target = explicit["title"], explicit["target"]
        else:
            target = body.lstrip("~")
            title = target.rsplit(".", 1)[-1] if body.startswith("~") else target.lstrip(".")
        if match["role"] in ("meth", "func") and not title.endswith(")"):
            title += "()"
        path = self._resolve(target.lstrip("~"), obj)
        if path is None:
            return f"`{title}`"
        return f'<autoref identifier="{path}" optional>`{title}`</autoref>'

    def _resolve(self, target: str, obj: griffe.Object | None) -> str | None:
        candidates = []
        if target.startswith("."):
            module = obj.module if obj is not None else None
            if module is not None:
                package = module if module.is_package else module.parent
                base = package.path if package is not None else module.path
                candidates.append(base + target)
                candidates.append(module.path + target)
        else:
            candidates.append(target)
            scope: Any = obj
            while scope is not None:
                candidates.append(f"{scope.path}.{target}")
                scope = scope.parent
        for path in candidates:
            try:
                found = self._collection.get_member(path)
            except (
                KeyError,
                ValueError,
                AttributeError,
                griffe.AliasResolutionError,
                griffe.CyclicAliasError,
            ):
                continue
            try:
                return found.canonical_path if found.is_alias else found.path
            except (griffe.AliasResolutionError, griffe.CyclicAliasError):
                continue
        return None

    @staticmethod
    def _language(code: str) -> str:
        try:
            json.loads(code)
            return "json"
        except ValueError:
            pass
        try:
            ast.parse(code)
            return "python"
        except SyntaxError:
            pass
        first = code.lstrip().split(None, 1)[0] if code.strip() else ""
        if first in ("systemzero-emulator", "websocat", "curl", "airflow", "make", "pip", "python"):
            return "bash"
        return "text"

    def _literal_blocks(self, lines: list[str]) -> list[str]:
        out: list[str] = []
        i = 0
        while i < len(lines):
            line = lines[i]
            if line.rstrip().endswith("::") and not re.match(r"\s*:[A-Za-z]", line):
                base = _indent(line)
                j = i + 1
                while j < len(lines) and not lines[j].strip():
                    j += 1
                k = j
                while k < len(lines) and (not lines[k].strip() or _indent(lines[k]) > base):
                    k += 1
                while k > j and not lines[k - 1].strip():
                    k -= 1
                if k > j:
                    head = line.rstrip()[:-2].rstrip()
                    if head:
                        out.append(head + ":" if not head.endswith(":") else head)
                    code = textwrap.dedent("\n".join(lines[j:k]))
                    pad = " " * base
                    out.append("")
                    out.append(f"{pad}{FENCE}{self._language(code)}")
                    out.extend(pad + c if c else "" for c in code.splitlines())
                    out.append(pad + FENCE)
                    out.append("")
                    i = k
                    continue
            out.append(line)
            i += 1
        return out

    @staticmethod
    def _tables(lines: list[str]) -> list[str]:
        out: list[str] = []
        i = 0
        while i < len(lines):
            if not TABLE_BORDER.match(lines[i]):
                out.append(lines[i])
                i += 1
                continue
            border = lines[i]
            spans = [(m.start(), m.end()) for m in re.finditer(r"=+", border)]
            borders = [i]
            j = i + 1
            while j < len(lines) and len(borders) < 3:
                if TABLE_BORDER.match(lines[j]):
                    borders.append(j)
                    # a second border closes the table unless body rows and a third border follow
                    k = j + 1
                    while k < len(lines) and lines[k].strip() and not TABLE_BORDER.match(lines[k]):
                        k += 1
                    if not (k > j + 1 and k < len(lines) and TABLE_BORDER.match(lines[k])):
                        break
                j += 1
            if len(borders) < 2:
                out.append(lines[i])
                i += 1
                continue
            end = borders[-1]
            rows: list[list[str]] = []
            header_rows = 0
            for n in range(i + 1, end):
                if n in borders:
                    header_rows = len(rows)
                    continue
                cells = []
                for index, (start, stop) in enumerate(spans):
                    stop = len(lines[n]) if index == len(spans) - 1 else spans[index + 1][0]
                    cells.append(lines[n][start:stop].strip())
                if rows and not cells[0]:
                    rows[-1] = [f"{a} {b}".strip() for a, b in zip(rows[-1], cells, strict=True)]
                else:
                    rows.append(cells)
            if len(borders) == 3 and header_rows:
                header, body = rows[:header_rows], rows[header_rows:]
                out.append("| " + " | ".join(header[0]) + " |")
                out.append("|" + "---|" * len(spans))
                out.extend("| " + " | ".join(r) + " |" for r in body)
            elif len(spans) == 2:
                out.extend(f"* {r[0]} — {r[1]}" for r in rows)
            else:
                out.append("| " + " | ".join(rows[0]) + " |")
                out.append("|" + "---|" * len(spans))
                out.extend("| " + " | ".join(r) + " |" for r in rows[1:])
            i = end + 1
        return out

    @staticmethod
    def _definition_lists(lines: list[str]) -> list[str]:
        out: list[str] = []
        in_fence = False
        after_definition = False
        i = 0
        while i < len(lines):
            line = lines[i]
            stripped = line.strip()
            if stripped.startswith(FENCE):
                in_fence = not in_fence
            is_term = (
                not in_fence
                and stripped
                and _indent(line) == 0
                and not re.match(r"^([:*#|>-]|\d+\.|```)", stripped)
                and (i == 0 or not lines[i - 1].strip() or after_definition)
                and i + 1 < len(lines)
                and lines[i + 1].strip()
                and _indent(lines[i + 1]) >= 4
                and not lines[i + 1].strip().startswith(FENCE)
            )
            if not is_term:
                out.append(line)
                after_definition = False
                i += 1
                continue
            if out and out[-1].strip():
                out.append("")  # def_list needs a blank line between items
            out.append(line)
            j = i + 1
            first = True
            while j < len(lines) and (not lines[j].strip() or _indent(lines[j]) >= 4):
                body = lines[j][4:] if lines[j].strip() else ""
                if first:
                    out.append(":   " + body)
                    first = False
                else:
                    out.append("    " + body if body else "")
                j += 1
            after_definition = True
            i = j
        return out
