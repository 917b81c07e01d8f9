"""``graphwatch demo``: run the bundled bug examples and their fixed twins, print what was found, write one report.

The examples live in the repository's ``examples/`` folder, next to the
package: each ``NAME_bug.py`` reproduces a graph-lifecycle bug and
``NAME_fixed.py`` is its fix.  Each runs in this process, in its own session,
one after another, as ``graphwatch run`` would run it; an example that fails
(a bug example usually raises torch's "backward through the graph a second
time") does not stop the demo.  The demo then prints one combined summary
(each bug's findings, whether each fix is clean) and writes one HTML report.

Example::

    >>> from graphwatch.demo import find_examples
    >>> [e.name for e in find_examples()][:2]  # doctest: +SKIP
    ['backward_twice_bug', 'backward_twice_fixed']
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .analysis.evidence import counted
from .errors import UsageError
from .runner import EXIT_INTERRUPTED, EXIT_SIGTERM, ScriptRun, run_script, write_report
from .signals import SignalGuard

BUG_SUFFIX = "_bug"
FIXED_SUFFIX = "_fixed"


def examples_dir() -> Path:
    """The bundled ``examples/`` folder: the one beside the ``graphwatch`` package."""
    import graphwatch

    return Path(graphwatch.__file__).resolve().parents[2] / "examples"


@dataclass(frozen=True)
class Example:
    """One bundled example script."""

    path: Path

    @property
    def name(self) -> str:
        return self.path.stem

    @property
    def is_bug(self) -> bool:
        return self.name.endswith(BUG_SUFFIX)

    @property
    def topic(self) -> str:
        """The name shared by a bug and its fix: ``rnn_hidden`` for ``rnn_hidden_bug.py``."""
        return self.name.removesuffix(BUG_SUFFIX).removesuffix(FIXED_SUFFIX)


@dataclass
class ExampleResult:
    """An example and what running it under graphwatch gave."""

    example: Example
    run: ScriptRun

    @property
    def as_expected(self) -> bool:
        """A bug example must produce a finding; a fixed one must run cleanly and produce none."""
        findings = self.run.session.findings
        if self.example.is_bug:
            return bool(findings)
        return not findings and self.run.exit_code == 0

    @property
    def outcome(self) -> str:
        """How the script ended: ``ok``, ``exit N`` or the exception's class name."""
        if self.run.error is not None:
            return f"raised {type(self.run.error).__name__}"
        return "ok" if self.run.exit_code == 0 else f"exit {self.run.exit_code}"


def find_examples(folder: Path | None = None) -> list[Example]:
    """The ``*_bug.py`` and ``*_fixed.py`` scripts of ``folder``, each bug followed by its fix.

    Raises :class:`~graphwatch.UsageError`, naming the fix, when the folder is
    missing or holds no example.
    """
    folder = folder if folder is not None else examples_dir()
    if not folder.is_dir():
        raise UsageError(
            f"the bundled examples are missing: {folder} does not exist. `graphwatch demo` runs the examples/ folder "
            "of a graphwatch checkout: clone the repository and install it with `pip install -e .` "
            "(or run `bash scripts/demo.sh` there)"
        )
    scripts = [Example(p) for p in folder.glob("*.py") if p.stem.endswith((BUG_SUFFIX, FIXED_SUFFIX))]
    if not scripts:
        raise UsageError(f"{folder} holds no *_bug.py or *_fixed.py example; restore it from the repository (git checkout examples)")
    return sorted(scripts, key=lambda e: (e.topic, not e.is_bug))


def run_examples(examples: list[Example], progress: bool = True, guard: SignalGuard | None = None) -> list[ExampleResult]:
    """Run each example in its own session, one after another; their output is captured, not printed.

    Ctrl-C or SIGTERM (with ``guard``) stops the demo after the example it interrupted.
    """
    results = []
    for number, example in enumerate(examples, 1):
        label = f"demo {number}/{len(examples)}: {example.path.name}" if progress else None
        run = run_script(example.path, progress=label, guard=guard, capture_output=True)
        if run.error is not None:
            run.error.__traceback__ = None  # only its name is shown; let its frames (and graphs) go
        results.append(ExampleResult(example, run))
        if run.exit_code in (EXIT_INTERRUPTED, EXIT_SIGTERM):
            break
    return results


def demo_headline(results: list[ExampleResult]) -> tuple[str, bool]:
    """What the demo showed, in one line, and whether every example came out as expected.

    >>> demo_headline([])
    ('graphwatch demo: 0 bug examples: 0 found; 0 fixed twins: clean', True)
    """
    bugs = [r for r in results if r.example.is_bug]
    fixed = [r for r in results if r.example.name.endswith(FIXED_SUFFIX)]
    correct = [r for r in results if not r.example.is_bug and r not in fixed]
    parts = [
        f"{counted(len(bugs), 'bug example')}: {sum(r.as_expected for r in bugs)} found",
        f"{counted(len(fixed), 'fixed twin')}: {_all_or_count(fixed, 'clean')}",
    ]
    if correct:
        parts.append(f"{counted(len(correct), 'correct loop')}: {_all_or_count(correct, 'silent')}")
    return "graphwatch demo: " + "; ".join(parts), all(r.as_expected for r in results)


def _all_or_count(results: list[ExampleResult], word: str) -> str:
    """``clean`` when each of ``results`` came out as expected, else how many did: ``12 clean``."""
    good = sum(r.as_expected for r in results)
    return word if good == len(results) else f"{good} {word}"


def print_demo_summary(results: list[ExampleResult], report: Path | None, console: Any = None) -> None:
    """One table (a row per bug and its fix), then each bug's findings with their fixes, then where the report is."""
    from rich import box
    from rich.rule import Rule
    from rich.table import Table
    from rich.text import Text

    from .rendering.finding_blocks import findings_lines
    from .rendering.terminal import make_console, print_blocks

    console = console if console is not None else make_console(sys.stdout)
    pairs: dict[str, dict[bool, ExampleResult]] = {}
    for result in results:
        pairs.setdefault(result.example.topic, {})[result.example.is_bug] = result
    table = Table(box=box.SIMPLE_HEAD)
    table.add_column("example", no_wrap=True)
    table.add_column("the bug: graphwatch found")
    table.add_column("the fix")
    for topic, pair in pairs.items():
        table.add_row(topic, _cell(pair.get(True)), _cell(pair.get(False)))
    text, good = demo_headline(results)
    console.print(Text(text, style="bold green" if good else "bold red"), soft_wrap=True)
    console.print(Text(f"{len(pairs)} bugs (examples/*_bug.py) and their fixes (*_fixed.py):", style="bold"), soft_wrap=True)
    console.print(table)
    for result in results:
        if result.example.is_bug and result.run.session.findings:
            # (a rule as wide as the line, but no wider than a terminal: a log's console is 1000 columns)
            console.print(Rule(Text(result.example.path.name, style="bold"), align="left"), width=min(console.width, 100))
            print_blocks(console, [*findings_lines(result.run.session.findings), Text("")])  # (patches as they are)
    failed = [r.example.path.name for r in results if not r.as_expected]
    if failed:
        console.print(Text(f"not as expected: {', '.join(failed)}", style="bold red"))
    if report is not None:
        console.print(Text.assemble(("report: ", "bold"), str(report)), soft_wrap=True)


def _cell(result: ExampleResult | None) -> Any:
    """What graphwatch found in one example: its finding kinds (or "clean"), marked ✓ when as expected."""
    from rich.text import Text

    if result is None:
        return Text("-", style="dim")
    findings = result.run.session.findings
    good = result.as_expected
    text = Text("✓ " if good else "✗ ", style="green" if good else "bold red")
    if findings:
        text.append("\n  ".join(dict.fromkeys(f.kind for f in findings)), style="yellow" if good else "bold red")
    else:
        text.append("clean" if good else "nothing found", style="green" if good else "bold red")
    if result.outcome != "ok":
        text.append(f"\n  ({result.outcome})", style="dim")
    return text


def run_demo(out: Path, progress: bool = True, folder: Path | None = None, console: Any = None) -> int:
    """Run every bundled example, print the combined summary, write one report to ``out``.

    Returns 0 when each bug was found and each fix is clean, else 1; 130 or
    143 when Ctrl-C or SIGTERM stopped it (the report then covers the examples run so far).
    """
    examples = find_examples(folder)
    with SignalGuard() as guard:
        results = run_examples(examples, progress=progress, guard=guard)
        report = write_report([(r.example.name, r.run.trace) for r in results], out, demo_headline(results))
        print_demo_summary(results, report, console)
    stopped = results[-1].run.exit_code if results[-1].run.exit_code in (EXIT_INTERRUPTED, EXIT_SIGTERM) else None
    if stopped is not None or guard.terminated:
        print(f"graphwatch demo: stopped after {len(results)} of {len(examples)} examples", file=sys.stderr)
        return stopped or EXIT_SIGTERM
    return 0 if all(r.as_expected for r in results) else 1


__all__ = ["Example", "ExampleResult", "examples_dir", "find_examples", "print_demo_summary", "run_demo", "run_examples"]
