"""The session: what ``graphwatch.watch()`` returns and ``@graphwatch.step`` uses.

A session installs, for its lifetime, saved-tensor hooks (in the thread that
enters it), a wrapper around the autograd engine's entry point, and global
optimizer hooks; it removes every one of them on exit, whatever the exit.

How steps are counted: explicit ``gw.step()`` blocks (or ``@graphwatch.step``)
where used; otherwise one pass of the training loop, read from the source of
the loop that runs the backwards and optimizer steps (see
:mod:`graphwatch.capture.steps.loop_steps`).

Example::

    >>> import torch, graphwatch
    >>> model = torch.nn.Linear(4, 1)
    >>> opt = torch.optim.SGD(model.parameters(), lr=0.1)
    >>> with graphwatch.watch(summary=False) as gw:
    ...     for _ in range(3):
    ...         opt.zero_grad()
    ...         model(torch.randn(8, 4)).pow(2).mean().backward()
    ...         opt.step()
    >>> len(gw.trace.steps), gw.findings
    (3, [])
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from .analysis import (
    LEAK_KINDS,
    FindingLog,
    add_patches,
    is_backward_twice,
    session_findings,
)
from .analysis.torch_errors import is_no_graph_error, is_unused_input_error
from .backwards import BackwardWatch
from .capture import EnginePatch, Recorder, parse_engine_args
from .capture.causes.light_errors import explain_inplace, lines_from_frames, name_freeing_roots
from .capture.causes.parameters import ParameterLedger
from .capture.graph.stack_limit import claim_stack
from .capture.hooks.call_mode import CallSiteMode
from .capture.hooks.eval_mode import EvalModePatch
from .capture.hooks.hook_switch import HookSwitch
from .capture.hooks.optimizer import GradResetTracker, OptimizerHooks
from .capture.hooks.own_time import OwnTime
from .capture.hooks.saved import make_chained_hooks, make_hooks
from .capture.hooks.transforms import hide_from_compiler, step_aside_for_disable, transforming
from .capture.lines.callsite import outer_frame
from .capture.lines.line_templates import LineTemplates
from .capture.lines.source import cited_lines
from .capture.ranks import rank_and_world_size
from .capture.steps.detail import DetailPlan
from .capture.steps.light_signals import LightSignals
from .capture.steps.loop_steps import LoopSteps
from .capture.steps.step_limit import StepLimitReached
from .errors import ExplainedError, GraphLeakError, GraphwatchError, UsageError, notify, without_own_frames
from .model import BackwardRecord, Finding, NodeRecord, StepRecord, Trace, save_trace
from .model.trace_io import save_trace_elsewhere
from .options import SessionOptions
from .signals import SignalGuard, end_sigterm_guard, sigterm_guard
from .step_ends import StepEnds

# What a step's end says about graphs still held: not said of a step an exception cut short.
_HOLDING_KINDS = frozenset({"graph-kept-alive", "memory-growth"})
_lock = threading.Lock()
_active: Session | None = None


def active_session() -> Session | None:
    """The session that is watching now, if any."""
    return _active


class Session:
    """Watches autograd graphs while it is entered.  Create it with :func:`graphwatch.watch`.

    Options (keyword only):
      strict: raise :class:`~graphwatch.GraphLeakError` at the end of the first step with a leak finding.
      level: ``"default"`` (the first steps, sampled steps and every step where something looks new or
        wrong in full detail: saved tensors, graph walks, call sites, holders; the other steps at the light
        level's cost; see :mod:`graphwatch.capture.steps.detail`), ``"full"`` (every step in full detail),
        ``"light"`` (backward calls and steps only; errors are still explained, from the graph alive when
        they are raised) or ``"precise"`` (full plus a TorchFunctionMode: the exact line of every node, and
        every node's and saved tensor's record, at a higher cost).
      summary: print the terminal summary when the session ends.
      out: folder to write the HTML report, trace.json and SVG snapshots to when the session ends, named
        relative to the current folder when the session is made (a later ``os.chdir()`` does not move it);
        None or ``""``: no report (as ``GRAPHWATCH_OUT=""`` for ``@graphwatch.step``).
      keep_steps: per-node records are kept for this many recent steps (plus steps with findings).
      snapshots: ``"auto"`` (the first backward, the first graph that crosses steps, each error),
        ``"off"``, or step numbers.
      max_snapshots: at most this many graph snapshots per session.
    """

    def __init__(
        self,
        *,
        strict: bool = False,
        level: str = "default",
        summary: bool = True,
        out: str | Path | None = None,
        keep_steps: int = 20,
        snapshots: str | Iterable[int] = "auto",
        max_snapshots: int = 12,
        **unknown: Any,
    ) -> None:
        options = SessionOptions.checked(
            strict=strict, level=level, summary=summary, out=out, keep_steps=keep_steps, snapshots=snapshots,
            max_snapshots=max_snapshots, **unknown,
        )  # fmt: skip
        self.strict = options.strict
        self.level = level
        self.print_summary = options.summary
        self.out = options.out
        self.snapshots = options.snapshots
        self.max_snapshots = max_snapshots
        self._recorder = Recorder(keep_steps)
        self._recorder.trace.options = {
            "strict": self.strict, "level": level, "keep_steps": keep_steps, "snapshots": str(snapshots),
            "cwd": os.getcwd(),  # cited files are named relative to it
        }
        self._log = FindingLog(self._recorder.trace.findings)
        self._grads = GradResetTracker()
        # what each optimizer steps and which parameters get gradients (trace.optimizers, trace.parameters)
        self.ledger = ParameterLedger(
            step=lambda: self._recorder.step, site=self._recorder.sites.from_frame, reached=self._grads.reached
        )
        self._recorder.trace.optimizers = self.ledger.stepped  # (until the session's end: ledger.records())
        self._installed: list[Callable[[], None]] = []
        self._explicit = False
        self._loop = LoopSteps()
        self._backwards = BackwardWatch(self._recorder, self._log, self._grads, self.snapshots, max_snapshots)
        self._plan = DetailPlan(self._recorder.trace.full_detail)
        self._signals = LightSignals(self._recorder.trace.where)
        self._hooks: HookSwitch | None = None  # graphwatch's saved-tensor hooks (not at the light level)
        self._begun = -1  # the last step whose detail was decided
        self._optimizer_at: tuple[int, ...] | None = None  # where the running optimizer.step() was called
        self._step_ends = StepEnds(self._recorder, self._log, self._backwards, self.strict, self._plan, self._signals)
        self._entered_at = ""
        self._own = OwnTime()  # the session's clocks, and graphwatch's own CPU time by part
        self._finished = False
        self._pid = os.getpid()  # a forked child that leaves the session writes and prints nothing
        self._sigterm: SignalGuard | None = None  # stops the user's code at SIGTERM (see signals.sigterm_guard)
        self.script_globals: dict[str, Any] | None = None  # a finished script's globals (graphwatch run), searched last
        self.stop_after: int | None = None  # end the run after this many steps (graphwatch run --stop-after)
        self._stop_due = False
        self._patches_due = False  # the session ended showing and writing nothing: patches wait for gw.trace

    # ---------------------------------------------------------------- public
    @property
    def trace(self) -> Trace:
        """The records so far (plain data; see :mod:`graphwatch.model`)."""
        if self._patches_due:  # (a session that showed and wrote nothing makes its patches when first asked)
            self._patches_due = False
            add_patches(self._recorder.trace)
        return self._recorder.trace

    @property
    def findings(self) -> list[Finding]:
        """What graphwatch diagnosed so far, in the order first seen."""
        return self.trace.findings

    @property
    def active(self) -> bool:
        return _active is self

    def save(self, path: str | Path) -> Path:
        """Write the JSON trace to ``path`` atomically; read it back with :func:`graphwatch.load`."""
        path = Path(path)
        save_trace(self.trace, path)
        return path

    def report(self, out_dir: str | Path) -> Path:
        """Write ``out_dir/index.html`` (with trace.json and SVG snapshots); return the HTML path."""
        from .rendering.html import write_report

        self.trace.sources = cited_lines(self.trace)  # the report shows them from the trace alone
        return write_report(self.trace, Path(out_dir))

    def summary(self, console: Any = None) -> None:
        """Print the terminal summary (rich; plain text when not a TTY or NO_COLOR is set)."""
        from .rendering.terminal import print_summary

        if console is not None and not callable(getattr(console, "print", None)):
            raise TypeError(f"gw.summary(console=...) takes a rich Console or None, got {type(console).__name__}")
        print_summary(self.trace, console=console, report=None)

    def end_step(self) -> None:
        """End the current step now: for a training framework's callback, at its own step boundary.

        Once called (or after :meth:`follow_explicit_steps`), only these calls
        and ``gw.step()`` blocks end steps.

        Example::

            >>> import torch, graphwatch
            >>> with graphwatch.watch(summary=False) as gw:
            ...     gw.follow_explicit_steps()
            ...     for _ in range(2):
            ...         (torch.ones(2, requires_grad=True) * 2).sum().backward()
            ...         gw.end_step()
            >>> len(gw.trace.steps)
            2
        """
        __tracebackhide__ = True  # pytest: a strict-mode GraphLeakError points at the caller
        self._require_active("gw.end_step()")
        self._explicit = True
        self._end_step("explicit", sys._getframe(1))

    def follow_explicit_steps(self) -> None:
        """From now on only :meth:`end_step` calls and ``gw.step()`` blocks end steps (nothing is inferred
        from the loop, its optimizer or its backwards)."""
        self._require_active("gw.follow_explicit_steps()")
        self._explicit = True

    def _repr_html_(self) -> str:
        """The summary as HTML (Jupyter shows a session this way), in the report's look."""
        from .rendering.notebook import summary_html

        self.trace.sources = cited_lines(self.trace)
        return summary_html(self.trace)

    def __repr__(self) -> str:
        """One line: watching or ended, steps, and the problems found (``repr(gw)``, a debugger's view)."""
        from .rendering.wording import session_line

        return session_line(self.trace, self._state())

    def __str__(self) -> str:
        """``print(gw)``: the verdict, each finding with its fix and patch, and where to read more."""
        from .rendering.wording import session_text

        return session_text(self.trace, self._state())

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        """IPython's text view (a notebook's text/plain, the ``IPython`` prompt): as ``print(gw)``."""
        printer.text(repr(self) if cycle else str(self))

    def _state(self) -> str:
        return "watching" if self.active else "ended" if self._finished else "not entered"

    @contextmanager
    def step(self) -> Iterator[Session]:
        """Mark one iteration: ``with gw.step(): ...``.  Once used, only these blocks end steps."""
        self._require_active("gw.step()")
        recorder = self._recorder
        if not self._explicit:
            self._explicit = True
            if recorder.boundary_pending or recorder.current.saved_packed or recorder.current.backwards:
                source = recorder.pending_source if not self._loop.optimizer_seen else "optimizer"
                self._end_step(source, sys._getframe(2))
        try:
            yield self
        finally:
            if self.active:
                self._end_step("explicit", sys._getframe(2))

    # ------------------------------------------------------------- lifecycle
    def __enter__(self) -> Session:
        global _active
        with _lock:
            if _active is not None:
                raise UsageError(
                    f"a graphwatch session is already active (entered at {_active._entered_at}); one session "
                    "watches a process: use its gw.step() for iterations, or exit it before entering another"
                )
            _active = self
        try:
            self._install()
        except BaseException:
            self._uninstall()
            self._end_sigterm_guard()
            raise
        self.trace.rank, self.trace.world_size = rank_and_world_size()
        site = self._recorder.sites.here(2)
        self._loop.stop_at(sys._getframe(1))
        self._entered_at = self.trace.where(site) if site is not None else "graphwatch run (or @graphwatch.step)"
        self._own.start()
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        leak: GraphLeakError | None = None
        if self._sigterm is not None:
            self._sigterm.disarm()  # the user's block is over: a SIGTERM from now on waits for the report
        try:
            if exc_type is not None:
                self.trace.ended_early = f"{exc_type.__name__}: {exc}" if str(exc) else exc_type.__name__
                self._backwards.explain_escaped(exc, tb)  # torch's error of the user's own call, explained
            if isinstance(exc, (GraphwatchError, ExplainedError)):  # its traceback ends at the user's call
                exc.__traceback__ = without_own_frames(tb)
            found = len(self.findings)
            try:
                self._finish_steps(sys._getframe(1), cut_short=exc_type is not None)
            except GraphLeakError as error:
                leak = error  # raised below, unless the user's own exception is propagating
            if exc_type is not None:  # a step cut short: the graphs it still holds are not kept-alive leaks
                self.findings[found:] = [f for f in self.findings[found:] if f.kind not in _HOLDING_KINDS]
        finally:
            self._uninstall()
            try:
                self._finalize(raise_leaks=exc_type is None and leak is None, failing=exc_type is not None)
            finally:
                self._end_sigterm_guard()
        if leak is not None and exc_type is None:
            raise leak

    def _end_sigterm_guard(self) -> None:
        guard, self._sigterm = self._sigterm, None
        if guard is not None:
            end_sigterm_guard(guard, self._pid)  # (ends the process, when SIGTERM arrived: the report is written)

    def _install(self) -> None:
        recorder = self._recorder
        self.level, give_back_stack = claim_stack(self.level)  # "light" where deep frees could overflow the stack
        recorder.trace.options["level"] = self.level
        self._installed.append(give_back_stack)
        recorder.boundary_hook = self._pending_boundary
        hide_from_compiler()
        self._plan.always = self.level in ("full", "precise")
        self._plan.never = self.level == "light"
        if self.level == "precise":
            recorder.precise = recorder.detail_always = True
            mode: Any = CallSiteMode(recorder)  # (TorchFunctionMode's __enter__ is untyped)
            mode.__enter__()
            self._installed.append(lambda: mode.__exit__(None, None, None))
        if self.level != "light":
            outer = torch._C._autograd._top_saved_tensors_default_hooks(False)
            hooks = make_chained_hooks(recorder, *outer) if outer is not None else make_hooks(recorder)
            self._hooks = HookSwitch(hooks)
            self._installed.append(self._hooks.remove)
            self._installed.append(step_aside_for_disable(hooks))
        recorder.is_full_step = self._plan.is_full
        if not (self._plan.always or self._plan.never):
            recorder.templates = LineTemplates()  # full steps lend their lines to light steps that ran the same code
        self._begin_step(0)
        patch = EnginePatch(self._on_engine).install()
        self._installed.append(patch.remove)
        optimizer_hooks = OptimizerHooks(self._before_optimizer, self._after_optimizer)
        self._installed.append(optimizer_hooks.remove)
        if recorder.templates is not None:  # the default level: a first validation pass is seen in full detail
            evaluations = EvalModePatch(self._on_evaluation).install()
            self._installed.append(evaluations.remove)
        interrupts = SignalGuard(signals=(signal.SIGINT,)).__enter__()  # a Ctrl-C in a finalizer is not lost
        interrupts.arm()
        self._installed.append(lambda: interrupts.__exit__(None, None, None))
        if self.print_summary or self.out is not None:  # stopped by SIGTERM, the session still writes them
            self._sigterm = sigterm_guard()

    def _uninstall(self) -> None:
        global _active
        while self._installed:
            self._installed.pop()()
        with _lock:
            if _active is self:
                _active = None

    def _finish_steps(self, frame: Any, cut_short: bool = False) -> None:
        """End the last step; its holders are searched in ``frame`` (the ``with`` block's) and the script
        (``cut_short``: an exception ends the session)."""
        script, self.script_globals = self.script_globals, None
        own = time.perf_counter()
        try:
            self._step_ends.finish(frame, not self._plan.is_full(self._recorder.step), script, cut_short)
        finally:
            self._own.add("step ends", own)

    def _finalize(self, raise_leaks: bool = False, failing: bool = False) -> None:
        """Close the trace, add session findings, write ``out`` and print the summary.

        ``failing``: the user's own exception is propagating; a report that cannot be written is then
        a warning, so that the user sees their exception rather than graphwatch's.
        """
        if self._finished:
            return
        self._finished = True
        if os.getpid() != self._pid:
            return
        self._recorder.close()
        self._own.record(self.trace, saved_hooks=self.level != "light")  # (light: no saved-tensor hooks)
        self.trace.optimizers, self.trace.parameters = self.ledger.records()
        new = [f for f in session_findings(self.trace) if self._log.add(f)]
        trace = self._recorder.trace
        # A patch parses the user's file (seconds for a file of thousands of lines, as the sessions of a test suite
        # meet): made now when the session shows or writes its findings, else when gw.trace is first read.
        if self.print_summary or self.out is not None or self.strict:
            add_patches(trace)
        else:
            self._patches_due = True
        trace.sources = cited_lines(trace)
        trace.rank, trace.world_size = rank_and_world_size(trace.rank, trace.world_size)
        from .rendering.ranks import rank_folder  # (rich loads with it: not at import)

        out = None if self.out is None else rank_folder(self.out, trace)  # no two ranks write one file
        if out is not None:
            try:
                self.report(out)
            except UsageError as error:
                kept = save_trace_elsewhere(trace)  # a run's trace is never lost with its report folder
                where = f"the trace was saved to {kept} instead" if kept else "the trace is still in gw.trace"
                if not failing:
                    raise UsageError(f"{error}; {where} (graphwatch report TRACE --out DIR makes the report)") from None
                notify(f"graphwatch: {error}; {where} (graphwatch report TRACE --out DIR makes the report)", stacklevel=3)
                out = None
        if self.print_summary and not trace.rank:  # rank 0 (or no distributed job) prints
            from .rendering.terminal import print_summary

            print_summary(trace, report=_from_start(out, trace))
        leaks = [f for f in new if f.kind in LEAK_KINDS]
        if self.strict and leaks and raise_leaks:
            listed = "\n".join(map(str, leaks))
            raise GraphLeakError(f"graphwatch strict mode: the session leaks a graph:\n{listed}", leaks)

    def _require_active(self, what: str) -> None:
        if not self.active:
            raise UsageError(f"{what} needs an active session: use it inside `with graphwatch.watch() as gw:`")

    # ----------------------------------------------------------------- steps
    def _pending_boundary(self, source: str) -> None:
        self._end_step(source, outer_frame(3))

    def _end_step(self, source: str, frame: Any) -> StepRecord:
        __tracebackhide__ = True  # pytest: a strict-mode GraphLeakError points at the user's line
        recorder = self._recorder
        own = time.perf_counter()
        try:
            record = self._step_ends.end(source, frame, not self._plan.is_full(recorder.step))
        finally:
            if not recorder.boundary_pending:  # (a pending boundary decided the next step's detail already)
                self._begin_step(recorder.step)
            self._own.parts["step ends"] += time.perf_counter() - own
        if self.stop_after is not None and record.index + 1 >= self.stop_after:
            if source != "optimizer":  # the next forward began (or the user marked the end): stop here
                raise StepLimitReached(self.stop_after)
            self._stop_due = True  # the loop's pass runs on (logging, a scheduler): stop at its next backward or step
        return record

    def _begin_step(self, index: int) -> None:
        """Step ``index`` starts (its first node is the next one numbered): full detail or light, as the plan
        says (:mod:`graphwatch.capture.steps.detail`), with graphwatch's saved-tensor hooks pushed or popped to match."""
        if index == self._begun:
            return
        self._begun = index
        plan, hooks = self._plan, self._hooks
        full, reason = plan.decide(index)
        if hooks is not None and hooks.on != full and hooks.set(full) != full:  # a user's hooks are on top: wait
            full, reason = hooks.on, "saved-tensor hooks the user entered stayed on top of graphwatch's"
        plan.begin(index, full, reason)
        if full:
            self._recorder.cpu_clock_from_here()  # (a step seen light reads no CPU clock: a system call)
        else:
            self._recorder.clock.note_unknown()  # no pack hook runs: the nodes made from here have no line

    def _before_optimizer(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if _active is not self or threading.get_ident() != self._recorder.thread:  # (_owns_thread, inlined)
            return
        if self._stop_due:
            raise StepLimitReached(self.stop_after or 0)
        own = time.perf_counter()
        self.ledger.before_step(optimizer, args, kwargs)  # (what trains: trace.optimizers, trace.parameters)
        loop = self._loop
        loop.in_optimizer_step += 1  # backwards from here to the post hook are its closure's
        recorder = self._recorder
        frame = outer_frame(1)
        self._optimizer_at = positions = loop.positions(frame)  # (the post hook's are the same)
        if self._hooks is not None:  # (the light level has nothing to compare gradients with, no line to watch)
            current = recorder.current
            current.optimizer_site = site = recorder.sites.at(positions, frame)
            reason = self._signals.optimizer(site)
            if self._plan.is_full(recorder.step):  # a light step walks no graph, so it cannot tell accumulations
                stale = self._grads.before_step(optimizer)
                if stale and not current.stale_grads:  # (the first optimizer whose step found them: the one named)
                    current.stale_site = site
                current.stale_grads += stale
            elif reason is not None:
                self._plan.suspect(recorder.step, reason)
        self._own.parts["optimizer hooks"] += time.perf_counter() - own  # (OwnTime.add, inlined: the hot path)

    def _after_optimizer(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        __tracebackhide__ = True
        if _active is not self or threading.get_ident() != self._recorder.thread:  # (_owns_thread, inlined)
            return
        own = time.perf_counter()
        loop = self._loop
        loop.in_optimizer_step = max(0, loop.in_optimizer_step - 1)
        recorder = self._recorder
        full = self._plan.is_full(recorder.step)
        recorder.current.optimizer_steps += 1
        recorder.optimizer_steps.stepped(optimizer, recorder.current.optimizer_site, recorder.step)  # (pre-step hook)
        self._backwards.optimizer_stepped(optimizer)
        positions, self._optimizer_at = self._optimizer_at, None
        ends = not self._explicit and not loop.in_optimizer_step and loop.ends_step(outer_frame(1), "step", positions=positions)
        self._own.parts["optimizer hooks"] += time.perf_counter() - own  # (a step it ends: with the step ends)
        try:
            if ends:
                self._end_step("optimizer", outer_frame(2))
        finally:  # the gradients as this step leaves them, for a step seen in full detail to compare with
            if full or (ends and self._plan.is_full(recorder.step)):  # (the step it ended, or the next one)
                self._grads.after_step(optimizer)

    def _on_evaluation(self, module: torch.nn.Module) -> None:
        """A module switched to evaluation mode: at a line not seen before, a new code path (a first validation
        pass), seen in full detail from here when its step has made nothing yet (the switch opens the pass),
        and in the steps after it."""
        recorder, hooks = self._recorder, self._hooks
        if _active is not self or threading.get_ident() != recorder.thread or hooks is None:
            return
        frame = outer_frame(1)
        reason = self._signals.evaluation(recorder.sites.at(self._loop.positions(frame), frame))
        step = self._begun
        if reason is None or self._plan.is_full(step):
            return
        if recorder.made_nothing_yet() and hooks.set(True):
            self._plan.upgrade(step, reason)
            recorder.cpu_clock_from_here()
        self._plan.suspect(step, reason)  # (and the steps that judge what it keeps)

    # -------------------------------------------------------------- backward
    def _on_engine(self, run: Callable[..., Any], t_outputs: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        __tracebackhide__ = True  # pytest: the user's frames end at their backward call
        recorder = self._recorder
        if _active is not self or threading.get_ident() != recorder.thread or recorder.backward is not None or transforming():
            return run(t_outputs, *args, **kwargs)
        if self._stop_due:
            raise StepLimitReached(self.stop_after or 0)
        own = time.perf_counter()
        roots, retain_graph, create_graph, accumulate = parse_engine_args(t_outputs, args, kwargs)
        frame = sys._getframe(1)
        if recorder.boundary_pending and recorder.made_since_boundary(roots):
            # a new graph, though its forward saved nothing: a new step (recorder.commit_boundary, called here)
            self._end_step(recorder.pending_source, frame)
        positions = self._loop.positions(frame)
        site = recorder.sites.users_own(recorder.sites.at(positions, frame), frame)  # (not a framework's line)
        record = BackwardRecord(  # (recorder.trace: the session's property makes patches, not needed here)
            len(recorder.trace.backwards), recorder.step, site, "backward" if accumulate else "grad", retain_graph,
            create_graph,
        )  # fmt: skip
        freed: list[NodeRecord] | None = None
        full = self._plan.is_full(recorder.step)
        if full:
            reason = self._signals.learn_backward(record.site, retain_graph, create_graph)
            if reason is not None:
                self._plan.suspect(recorder.step, reason)
            freed = self._backwards.walk_before(record, roots, accumulate)
        elif self._hooks is not None:  # a light step: a closer look only where the cheap path finds one due
            reason = self._signals.backward(record.site, retain_graph, create_graph, roots, recorder.step_seq)
            if reason is not None:
                self._plan.suspect(recorder.step, reason)
                freed = self._backwards.walk_before(record, roots, accumulate, full=True)
            else:
                recorder.light_backwards.started(record.id, roots)
        self._backwards.started(record, t_outputs)
        recorder.begin_backward(record)
        parts = self._own.parts
        started = time.perf_counter()  # (one clock read ends graphwatch's part and starts the backward's)
        parts["around backwards"] += started - own
        # the CPU clock is a system call (1-2 us, more on a loaded machine): read on steps seen in full detail only
        started_cpu = time.process_time() if full else 0.0
        try:
            result = run(t_outputs, *args, **kwargs)
        except RuntimeError as exc:
            record.error = str(exc)
            light = not full and self._hooks is not None  # (the light level touches no node)
            if is_backward_twice(exc):
                if light:  # a step seen light: the records from the graph still alive, lines from the frames
                    if freed is None:
                        freed = self._backwards.walk_before(record, roots, False, full=True)
                    lines_from_frames(recorder, sys._getframe(1))
                    name_freeing_roots(recorder, freed)
                raise self._backwards.explain(record, roots, freed, exc) from None
            if is_no_graph_error(exc):
                raise self._backwards.explain_no_graph(record, exc) from None
            if is_unused_input_error(exc):
                raise self._backwards.explain_unused_input(record, t_outputs, args, kwargs, exc) from None
            if light:
                explain_inplace(recorder, exc, roots, sys._getframe(1))
            raise
        finally:
            ended = time.perf_counter()  # (and graphwatch's part after the backward starts here)
            recorder.end_backward(record, ended - started, time.process_time() - started_cpu if full else 0.0)
        loop = self._loop
        consumes = accumulate or not (retain_graph or create_graph)  # a freeing autograd.grad counts too
        if consumes and not self._explicit and not loop.in_optimizer_step:
            if loop.ends_step(frame, "backward", frees_graph=not retain_graph, positions=positions):
                recorder.request_boundary("backward")
                self._begin_step(recorder.step + 1)
        parts["around backwards"] += time.perf_counter() - ended
        return result


def _from_start(folder: Path | None, trace: Trace) -> Path | None:
    """The report ``folder`` (absolute) as the user named it: relative to the folder the session started in,
    when it is inside it."""
    start = Path(str(trace.options.get("cwd") or "/"))
    return folder.relative_to(start) if folder is not None and folder.is_relative_to(start) else folder


def watch(
    *,
    strict: bool = False,
    level: str = "default",
    summary: bool = True,
    out: str | Path | None = None,
    keep_steps: int = 20,
    snapshots: str | Iterable[int] = "auto",
    max_snapshots: int = 12,
    **unknown: Any,
) -> Session:
    """A new :class:`Session` (its options are documented there); enter it with ``with``.

    Example::

        >>> import graphwatch
        >>> with graphwatch.watch(summary=False) as gw:
        ...     pass
        >>> gw.findings
        []
    """
    return Session(
        strict=strict, level=level, summary=summary, out=out, keep_steps=keep_steps, snapshots=snapshots,
        max_snapshots=max_snapshots, **unknown,
    )  # fmt: skip
