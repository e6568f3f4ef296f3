"""Give each name one meaning: renames across protocol/, stream/ and what uses them.

Four names meant two or three things:

* ``DecisionFailed`` — the client core's event (``protocol/client_events.py``) and the stream's
  exception (``stream/exceptions.py``). The event becomes ``DecisionFailedEvent`` (the name the
  stream already imported it as); the exception keeps its public name.
* ``Decision`` — the ``decision`` wire message (``protocol/messages.py``) and the stream's alias of
  :class:`~airflow_provider_systemzero.protocol.reply.DecisionResult`. The alias goes: the stream
  speaks of ``DecisionResult``.
* "gate" — the policy gate of ``utils/review.py`` (``Gate``, ``PolicyGateMixin``) and the budget's
  check before a dispatch. The check becomes an *admission*: ``ClientSession.dispatch_gate`` →
  ``dispatch_admission``, ``DispatchAccounting.gate`` → ``admit``, ``DecisionStream._gate`` →
  ``_admit``.
* "refusal" — a protocol refusal (WIRE.md §7), an upgrade refusal (WIRE.md §1) and the budget
  stopping a dispatch. The protocol's keeps its qualified name (``RemoteProtocolError.refusal`` →
  ``protocol_refusal``; ``refusal_error`` → ``upgrade_refusal_error``); the budget's becomes
  *exceeded* (``DecisionBudget.refuse``/``refusal`` → ``record_exceeded``/``exceeded``, likewise
  in ``DispatchAccounting`` and ``DecisionStream``). Public outputs keep their names: the metric
  ``systemzero.budget.refusals``, the ``usage`` XCom's ``refused_by`` and the trigger event's
  ``"refusal"`` key.

Each rename is an explicit old → new identifier pair matched on word boundaries, applied only
where the old name has the meaning being renamed: in the module that defines it, in the files
that import it from there (an ``import … as`` alias keeps its alias), or — for attributes and
methods — in the files listed with the rule. Running it again changes nothing.

Usage: ``python scripts/rename_names.py [--check] [ROOT]`` (default: the repository holding this
script). ``--check`` lists what would change and exits 1 if anything would.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

PACKAGE = "airflow_provider_systemzero"
#: Where names are renamed: the package, its tests, docs, examples and benchmarks.
TREES = (PACKAGE, "tests", "docs", "example_dags", "benchmarks")
SUFFIXES = (".py", ".md")


@dataclass(frozen=True)
class ImportedName:
    """A module-level name renamed where it is defined and wherever it is imported from there.

    :param old: the name today.
    :param new: the name it gets.
    :param modules: the modules that define or re-export it (dotted, under the package).
    :param defined_in: the files (relative to the root) whose own uses of ``old`` all mean it.
    """

    old: str
    new: str
    modules: tuple[str, ...]
    defined_in: tuple[str, ...]


@dataclass(frozen=True)
class Pattern:
    """An explicit replacement (a regular expression) in the listed files or trees.

    :param pattern: what to find.
    :param replacement: what it becomes (``re.sub`` syntax).
    :param paths: files or folders (relative to the root) it applies to.
    """

    pattern: str
    replacement: str
    paths: tuple[str, ...]


IMPORTED_NAMES = (
    ImportedName(
        "DecisionFailed",
        "DecisionFailedEvent",
        (f"{PACKAGE}.protocol.client_events", f"{PACKAGE}.protocol.client"),
        (f"{PACKAGE}/protocol/client_events.py", f"{PACKAGE}/protocol/client.py"),
    ),
    ImportedName(
        "Decision",
        "DecisionResult",
        (f"{PACKAGE}.stream", f"{PACKAGE}.stream.decision_stream"),
        (f"{PACKAGE}/stream/decision_stream.py", f"{PACKAGE}/stream/__init__.py"),
    ),
)

_STREAM = f"{PACKAGE}/stream"
_PROTOCOL = f"{PACKAGE}/protocol"
_DECISION_STREAM = tuple(
    f"{_STREAM}/{name}.py" for name in ("decision_stream", "core_events", "run_loop", "serving")
)
_BUDGET_FILES = (f"{PACKAGE}/decisions/budget.py", f"{PACKAGE}/budget.py", f"{_STREAM}/accounting.py")

PATTERNS = (
    # the alias DecisionResult = DecisionResult left by the rename above, and its comment
    Pattern(
        r"\n#: The typed decision a stream yields: [^\n]*\nDecisionResult: TypeAlias = DecisionResult\n",
        "\n",
        (f"{_STREAM}/decision_stream.py",),
    ),
    Pattern(r"DecisionResult: TypeAlias = DecisionResult\n", "", (f"{_STREAM}/decision_stream.py",)),
    Pattern(r"\bstream\.Decision\b(?!\w)", "stream.DecisionResult", ("docs",)),
    # a test that checked the alias is DecisionResult (which it now imports once, from protocol)
    Pattern(r" and DecisionResult is DecisionResult\b", "", ("tests/hooks/test_systemzero_hook.py",)),
    Pattern(
        r"(from airflow_provider_systemzero\.stream import \([^)]*?)\n    DecisionResult,",
        r"\1",
        ("tests/hooks/test_systemzero_hook.py",),
    ),
    Pattern(r"\bclient_events\.DecisionFailed\b", "client_events.DecisionFailedEvent", TREES),
    # "gate" means the policy gate only; the budget's check before a dispatch is an admission
    Pattern(r"\bdispatch_gate\b", "dispatch_admission", TREES),
    Pattern(r"\bgate = self\.dispatch_admission\b", "admit = self.dispatch_admission", (_PROTOCOL,)),
    Pattern(r"\bif gate is None or gate\(message\)", "if admit is None or admit(message)", (_PROTOCOL,)),
    Pattern(r"\bWhether the gate refused\b", "Whether admission was refused", (_PROTOCOL,)),
    Pattern(r"\(the gate decides anew\)", "(admission is decided anew)", (_PROTOCOL,)),
    Pattern(r"\bdef gate\(", "def admit(", (f"{_STREAM}/accounting.py",)),
    Pattern(r"\bDispatchAccounting\.gate\b", "DispatchAccounting.admit", TREES),
    Pattern(r"\b_accounting\.gate\(", "_accounting.admit(", (_STREAM, "tests")),
    Pattern(r"\b_gate\b", "_admit", _DECISION_STREAM),
    # the stream's observer interface lives with the stream (observability.py names it for the docs)
    Pattern(
        r"from airflow_provider_systemzero\.observability import GOODBYE_REASONS, StreamObserver",
        "from airflow_provider_systemzero.stream.observer import GOODBYE_REASONS, StreamObserver",
        (_STREAM,),
    ),
    Pattern(
        r"~airflow_provider_systemzero\.observability\.StreamObserver",
        "~airflow_provider_systemzero.stream.observer.StreamObserver",
        (_STREAM,),
    ),
    # budget.py is Airflow glue, now utils/usage.py: the stream imports the arithmetic it needs
    # from decisions/budget.py, everyone else the task's ledger from utils/usage.py
    Pattern(
        r"\bfrom airflow_provider_systemzero\.budget import\b",
        "from airflow_provider_systemzero.decisions.budget import",
        (_STREAM,),
    ),
    Pattern(
        r"\bfrom airflow_provider_systemzero\.budget import (TaskUsageLedger|UsageBudgetMixin)\b",
        r"from airflow_provider_systemzero.utils.usage import \1",
        TREES,
    ),
    Pattern(
        r"\bairflow_provider_systemzero\.budget\.(DecisionBudget|BudgetExceeded|Usage|connection_window|parse_limit)\b",
        r"airflow_provider_systemzero.decisions.budget.\1",
        TREES,
    ),
    Pattern(
        r":mod:`~?airflow_provider_systemzero\.budget`",
        ":mod:`~airflow_provider_systemzero.decisions.budget`",
        (_STREAM,),
    ),
    Pattern(r"\bairflow_provider_systemzero\.checks\b", "airflow_provider_systemzero.utils.checks", TREES),
    # "refusal": the protocol's is qualified; the budget's is "exceeded"
    Pattern(r"(?<!systemzero\.)\bbudget_refused\b", "budget_exceeded", TREES),  # not the span event's name
    Pattern(r"\brefusal=(True|False)\b", r"protocol_refusal=\1", (_PROTOCOL, f"{PACKAGE}/emulator", "tests")),
    Pattern(r"\brefusal=refusal\b", "protocol_refusal=protocol_refusal", (f"{_PROTOCOL}/errors.py",)),
    Pattern(r"\brefusal: bool = False\b", "protocol_refusal: bool = False", (f"{_PROTOCOL}/errors.py",)),
    Pattern(
        r"\bself\.refusal = refusal\b",
        "self.protocol_refusal = protocol_refusal",
        (f"{_PROTOCOL}/errors.py",),
    ),
    Pattern(r":param refusal:", ":param protocol_refusal:", (f"{_PROTOCOL}/errors.py",)),
    Pattern(r"``refusal`` false", "``protocol_refusal`` false", (_PROTOCOL,)),
    Pattern(r"\bexc\.refusal\b", "exc.protocol_refusal", (_PROTOCOL, f"{PACKAGE}/emulator")),
    Pattern(
        r"\b(value|error|exc)\.refusal\b",
        r"\1.protocol_refusal",
        ("tests/protocol", "tests/fuzz", "tests/emulator"),
    ),
    Pattern(r"\brefusal_error\b", "upgrade_refusal_error", (_STREAM, "tests", "docs")),
    Pattern(r"\bdef refuse\(self, exc: (\w+)\)", r"def record_exceeded(self, exc: \1)", _BUDGET_FILES),
    Pattern(
        r"\bbudget\.refuse\(", "budget.record_exceeded(", (*_BUDGET_FILES, _STREAM, "tests", "benchmarks")
    ),
    Pattern(
        r"\b(self|budget|accounting|self\._accounting)\.refusal\b",
        r"\1.exceeded",
        (*_BUDGET_FILES, _STREAM, "tests", "benchmarks"),
    ),
    Pattern(r"\bself\._refuse\(", "self._budget_exceeded(", _DECISION_STREAM),
    Pattern(r"\bdef _refuse\(", "def _budget_exceeded(", _DECISION_STREAM),
    Pattern(r"\b_settle_refusal\b", "_settle_exceeded", _DECISION_STREAM),
    Pattern(
        r"\bthe budget's refusal that holds this stream\b",
        "what the budget refused, holding this stream",
        (_STREAM,),
    ),
    Pattern(
        r"#: The refusal that holds this stream, once the budget refused\.",
        "#: What the budget refused, holding this stream (once it refused).",
        (_STREAM,),
    ),
)


def _files(root: Path, paths: Iterable[str]) -> Iterator[Path]:
    for name in paths:
        path = root / name
        if path.is_file():
            yield path
        elif path.is_dir():
            yield from sorted(p for p in path.rglob("*") if p.suffix in SUFFIXES and ".venv" not in p.parts)


def _import_lines(module: str) -> re.Pattern[str]:
    """``from <module> import …`` statements (one line, or parenthesised over several)."""
    return re.compile(rf"^from {re.escape(module)} import (\([^)]*\)|[^\n]*)", re.MULTILINE)


def _rename_imported(text: str, rule: ImportedName, defining: bool) -> tuple[str, str | None]:
    """Rename ``rule.old`` in one file's text; returns the text and, when it cannot, why not."""
    word = re.compile(rf"\b{re.escape(rule.old)}\b")
    whole_file = defining
    new_text = text
    for module in rule.modules:
        for match in _import_lines(module).finditer(text):
            names = match.group(1)
            aliased = re.search(rf"\b{re.escape(rule.old)} as (\w+)", names)
            if aliased:
                renamed = names.replace(aliased.group(0), f"{rule.new} as {aliased.group(1)}")
                renamed = renamed.replace(f"{rule.new} as {rule.new}", rule.new)
                new_text = new_text.replace(match.group(0), match.group(0).replace(names, renamed))
            elif word.search(names):
                whole_file = True
    if not whole_file:
        return new_text, None
    others = [
        m.group(0)
        for m in re.finditer(
            rf"^from ([\w.]+) import [^\n]*\b{re.escape(rule.old)}\b(?! as)", new_text, re.MULTILINE
        )
        if m.group(1) not in rule.modules
    ]
    if others:
        return text, f"{rule.old} is also imported from elsewhere ({others[0]!r}): rename it by hand"
    return word.sub(rule.new, new_text), None


def rename(root: Path) -> tuple[dict[Path, str], list[str]]:
    """The new text of every file that changes, and the places left for a person."""
    changed: dict[Path, str] = {}
    notes: list[str] = []
    for path in _files(root, TREES):
        original = path.read_text(encoding="utf-8")
        text = original
        relative = path.relative_to(root).as_posix()
        if path.suffix == ".py":
            for rule in IMPORTED_NAMES:
                text, note = _rename_imported(text, rule, relative in rule.defined_in)
                if note:
                    notes.append(f"{relative}: {note}")
        for pattern in PATTERNS:
            if any(relative == p or relative.startswith(f"{p}/") for p in pattern.paths):
                text = re.sub(pattern.pattern, pattern.replacement, text)
        if text != original:
            changed[path] = text
    return changed, notes


def tidy(root: Path, paths: list[Path]) -> None:
    """Sort the imports and ``__all__`` lists the renames disturbed and reformat the changed files
    (with ruff, when it is installed; otherwise run ``ruff check --fix`` and ``ruff format`` on them)."""
    python = [str(p) for p in paths if p.suffix == ".py"]
    ruff = shutil.which("ruff") or str(Path(sys.executable).with_name("ruff"))
    if not python or not Path(ruff).exists():
        print(
            "ruff not found: run `ruff check --fix` and `ruff format` on the renamed files", file=sys.stderr
        )
        return
    subprocess.run(
        [ruff, "check", "--fix", "-q", "--select", "I001,RUF022,F401", *python], cwd=root, check=False
    )
    subprocess.run([ruff, "format", "-q", *python], cwd=root, check=False)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", nargs="?", type=Path, default=Path(__file__).resolve().parent.parent)
    parser.add_argument(
        "--check", action="store_true", help="list what would change; exit 1 if anything would"
    )
    args = parser.parse_args(argv)
    changed, notes = rename(args.root)
    for path in sorted(changed):
        print(f"{'would rename in' if args.check else 'renamed in'} {path.relative_to(args.root)}")
        if not args.check:
            path.write_text(changed[path], encoding="utf-8")
    if changed and not args.check:
        tidy(args.root, sorted(changed))
    for note in notes:
        print(f"left for a person: {note}", file=sys.stderr)
    return 1 if args.check and changed else 0


if __name__ == "__main__":
    sys.exit(main())
