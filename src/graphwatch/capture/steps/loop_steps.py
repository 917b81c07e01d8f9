"""Where one pass of the user's training loop ends: the step boundaries graphwatch infers.

A step is one iteration of the loop that trains.  Without explicit steps,
graphwatch decides at each *training event* (a backward outside
``optimizer.step()``, or an ``optimizer.step()``) whether it is the last one of
its iteration, from the source of the function that runs it:

1. The training loop is the innermost ``for``/``while`` that holds every
   training event of the function's outermost loop around the event (so a
   critic loop nested in a GAN's batch loop is not the training loop).
2. The event ends the step when no other training event follows it in that
   loop's body (in source order, not in an exclusive ``else`` branch).  A later
   ``x.backward(...)`` always counts; a later ``x.step(...)`` counts when ``x``
   is an optimizer or a gradient scaler (not an LR scheduler).
3. An event in a function with no loop around it (a ``train_step`` called
   from the loop), or in a loop that more events follow, ends the step when it
   is that function's last event and the call into it is the loop's last
   event, one caller up at a time.  Lines that
   led to events before count as events too, so a shape that the source alone
   does not show is learnt after one iteration.
4. Backwards inside ``optimizer.step(closure)`` never end a step: they
   belong to that optimizer step.  ``torch.autograd.grad`` is an event only
   when it frees its graph (no ``retain_graph``/``create_graph``): a gradient
   penalty's ``grad(..., create_graph=True)`` is part of the step's forward.

When the source cannot be read, or no user frame has a loop around the event
(the loop is a framework's: ``trainer.fit(...)``), an optimizer step ends the
step, and a backward that frees its graph does so while no optimizer has
stepped (so the micro-batches of an accumulation are one step with their
optimizer step, after the first optimizer step).

Example::

    >>> import torch
    >>> from graphwatch.capture.steps.loop_steps import LoopSteps
    >>> def train(model, opt):
    ...     for _ in range(2):
    ...         model(torch.ones(1, 1)).sum().backward()
    ...         opt.step()
    >>> plan = LoopSteps().plan_of(train.__code__)
    >>> [(e.line - train.__code__.co_firstlineno, e.kind, e.receiver) for e in plan.events]
    [(2, 'backward', None), (3, 'step', 'opt')]
    >>> plan.loops == [(train.__code__.co_firstlineno + 1, train.__code__.co_firstlineno + 3)]
    True
"""

from __future__ import annotations

import ast
import functools
import inspect
import re
from dataclasses import dataclass, field
from types import CodeType, FrameType

import torch

from ..lines.callsite import is_user_file
from ..lines.frames import local_value
from ..lines.source import dotted_name, function_node, module_node

_MAX_CALLERS = 8  # user frames walked up from an event to find the loop
_SCHEDULER = re.compile(r"sched|lr_?", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class Event:
    """A call in the source that may be a training event: ``x.backward(...)`` or ``x.step(...)``."""

    line: int
    end_line: int
    kind: str  # "backward" or "step"
    receiver: str | None  # the dotted name the method is called on, when it is one ("opt", "self.opt_g")


@dataclass(slots=True)
class LoopPlan:
    """The loops, candidate events and ``if``/``else`` branches of one function, read from its source."""

    loops: list[tuple[int, int]] = field(default_factory=list)  # (first line, last line), outer loops first
    events: list[Event] = field(default_factory=list)
    branches: list[tuple[tuple[int, int], tuple[int, int]]] = field(default_factory=list)  # (body, orelse)

    def loop_around(self, line: int, event_lines: list[int], called_in_loop: bool) -> tuple[int, int] | None:
        """The training loop for an event at ``line`` (rule 1), or None when ``line`` is in no loop, or when
        its outermost loop is followed by more events in a function that a loop calls (then that loop is an
        inner one: micro-batches in a ``train_step`` that steps the optimizer after it)."""
        around = [loop for loop in self.loops if loop[0] <= line <= loop[1]]
        if not around:
            return None
        outer = min(around, key=lambda loop: loop[0])
        if called_in_loop and any(n > outer[1] for n in event_lines):
            return None
        inside = [n for n in event_lines if outer[0] <= n <= outer[1]] + [line]
        first, last = min(inside), max(inside)
        holding = [loop for loop in around if loop[0] <= first and last <= loop[1]]
        return max(holding, key=lambda loop: loop[0])

    def in_loop(self, line: int) -> bool:
        return any(loop[0] <= line <= loop[1] for loop in self.loops)

    def exclusive(self, line: int, other: int) -> bool:
        """True when ``other`` lies in the ``else`` of an ``if`` whose body holds ``line``."""
        return any(b[0] <= line <= b[1] and e[0] <= other <= e[1] for b, e in self.branches)


class _PlanReader(ast.NodeVisitor):
    """Collects a function's loops, candidate events and branches, without entering nested functions."""

    def __init__(self) -> None:
        self.plan = LoopPlan()

    def read(self, node: ast.AST) -> LoopPlan:
        for child in ast.iter_child_nodes(node):
            self.visit(child)
        return self.plan

    def _nested(self, node: ast.AST) -> None:  # another code object: its events are its own
        return None

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = visit_Lambda = _nested

    def _loop(self, node: ast.For | ast.While | ast.AsyncFor) -> None:
        self.plan.loops.append((node.lineno, node.end_lineno or node.lineno))
        self.generic_visit(node)

    visit_For = visit_While = visit_AsyncFor = _loop

    def visit_If(self, node: ast.If) -> None:
        if node.orelse:
            body = (node.body[0].lineno, node.body[-1].end_lineno or node.body[-1].lineno)
            orelse = (node.orelse[0].lineno, node.orelse[-1].end_lineno or node.orelse[-1].lineno)
            self.plan.branches.append((body, orelse))
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        if isinstance(func, ast.Attribute):
            receiver = dotted_name(func.value)
            kind = func.attr if func.attr in ("backward", "step") else None
            if func.attr == "grad" and (receiver or "").endswith("autograd") and not _keeps_graph(node):
                kind = "backward"  # torch.autograd.grad that frees its graph consumes it as a backward does
            if kind is not None:
                self.plan.events.append(Event(node.lineno, node.end_lineno or node.lineno, kind, receiver))
        self.generic_visit(node)


@functools.lru_cache(maxsize=256)
def _read_plan(code: CodeType, tree: ast.Module | None) -> LoopPlan | None:
    """The plan of ``code``'s function, read once per syntax tree of its file (``tree``, a new one when the
    file changed), not once per session: each session of a script that runs several meets the same loops."""
    node = function_node(code)
    return _PlanReader().read(node) if node is not None else None


def _keeps_graph(call: ast.Call) -> bool:
    """A call passing ``retain_graph=`` or ``create_graph=`` (other than a literal False)."""
    return any(
        k.arg in ("retain_graph", "create_graph") and not (isinstance(k.value, ast.Constant) and k.value.value is False)
        for k in call.keywords
    )


class LoopSteps:
    """Decides, at each training event, whether it ends the step (see the module docstring)."""

    def __init__(self) -> None:
        self._plans: dict[CodeType, LoopPlan | None] = {}
        self._learnt: dict[CodeType, set[int]] = {}  # lines that led to training events
        self._learnt_lines: set[tuple[CodeType, int]] = set()
        self._answers: dict[tuple, tuple[int, bool | None]] = {}  # call positions -> (lines learnt, answer)
        self._user_code: dict[int, bool] = {}  # id(code) -> is it the user's code
        self._codes: list[CodeType] = []  # keeps the codes classified alive, so that their ids stay theirs
        self._receivers: dict[tuple[CodeType, str], bool] = {}  # is this receiver an optimizer?
        self.in_optimizer_step = 0  # depth of optimizer.step() calls running now
        self.optimizer_seen = False
        # The code of the frame the session was entered in, and the positions' length from which a walk may stop
        # there (:meth:`stop_at`): the frames above it are the same for every event while the session runs.
        self._stop_code: CodeType | None = None
        self._stop_length = 0

    # ------------------------------------------------------------ the plan
    def plan_of(self, code: CodeType) -> LoopPlan | None:
        """The loops and candidate events of ``code``'s function (None when its source cannot be read)."""
        if code not in self._plans:
            self._plans[code] = _read_plan(code, module_node(code.co_filename))
        return self._plans[code]

    # ------------------------------------------------------------ decisions
    def ends_step(
        self, frame: FrameType | None, kind: str, frees_graph: bool = True, positions: tuple[int, ...] | None = None
    ) -> bool:
        """Whether a training event of ``kind`` ("backward" or "step") that ``frame`` runs ends the step.

        The answer for one chain of user call positions is kept until a new line is learnt: after the
        first iteration an event costs a walk up its frames and a dict lookup (none when the event's
        ``positions`` were read already, :meth:`positions`).
        """
        key = self.positions(frame) if positions is None else positions
        if kind == "step":
            self.optimizer_seen = True
        known = self._answers.get(key)
        if known is not None and known[0] == len(self._learnt_lines):
            answer = known[1]
        else:
            frames = self._user_frames(frame)
            self._learn(frames)
            answer = self._from_source(frames)
            self._answers[key] = (len(self._learnt_lines), answer)
        if answer is None:  # no source: every optimizer step, or a freeing backward before any optimizer
            return kind == "step" or (frees_graph and not self.optimizer_seen)
        return answer

    def stop_at(self, entered: FrameType | None) -> None:
        """The session was entered in frame ``entered``: while it runs, the frames above that one are the same
        for every event, so that :meth:`positions` stops there.  Where a user frame is above it (a ``with``
        block in a function that ``main()`` calls), only once two user frames were found below: the first
        four numbers (a :class:`~graphwatch.capture.lines.callsite.SiteTable` position) stay the same.  A
        session entered in a frame that returns (a callback's ``on_fit_start``) meets no event below it: there
        the walks go on to the outermost frame, as without this."""
        if entered is None:
            return
        self._stop_code = entered.f_code
        above = entered.f_back
        while above is not None and not self._is_user(above.f_code):
            above = above.f_back
        self._stop_length = 4 if above is not None else 0

    def positions(self, frame: FrameType | None) -> tuple[int, ...]:
        """Where the innermost user frames from ``frame`` outwards are: (code id, instruction) of each, flat,
        up to the frame the session was entered in (:meth:`stop_at`).  (Its first four numbers are the
        innermost user frame's and its user caller's: a
        :class:`~graphwatch.capture.lines.callsite.SiteTable` position.)"""
        positions: list[int] = []
        add = positions.append
        user_code = self._user_code
        stop, stop_length = self._stop_code, self._stop_length
        left = _MAX_CALLERS
        while frame is not None:
            code = frame.f_code
            is_user = user_code.get(id(code))  # by id: hashing a code object costs a microsecond
            if is_user or (is_user is None and self._classify(code)):
                add(id(code))
                add(frame.f_lasti)
                left -= 1
                if not left:
                    break
            if code is stop and len(positions) >= stop_length:
                break
            frame = frame.f_back
        return tuple(positions)

    def _is_user(self, code: CodeType) -> bool:
        """Whether ``code`` is the user's, classified once (:meth:`positions` inlines this: the hot path)."""
        is_user = self._user_code.get(id(code))
        return self._classify(code) if is_user is None else is_user

    def _classify(self, code: CodeType) -> bool:
        self._codes.append(code)
        is_user = self._user_code[id(code)] = is_user_file(code.co_filename)
        return is_user

    def _user_frames(self, frame: FrameType | None) -> list[FrameType]:
        frames: list[FrameType] = []
        while frame is not None and len(frames) < _MAX_CALLERS:
            if self._is_user(frame.f_code):
                frames.append(frame)
            frame = frame.f_back
        return frames

    def _learn(self, frames: list[FrameType]) -> None:
        for f in frames:
            line = (f.f_code, f.f_lineno)
            if line not in self._learnt_lines:
                self._learnt_lines.add(line)
                self._learnt.setdefault(f.f_code, set()).add(f.f_lineno)

    def _from_source(self, frames: list[FrameType]) -> bool | None:
        plans = [self.plan_of(f.f_code) for f in frames]
        for i, (f, plan) in enumerate(zip(frames, plans)):
            if plan is None:
                return None
            line = f.f_lineno
            learnt = self._learnt.get(f.f_code, set())
            events = [n for n in learnt if n != line] + [
                e.line for e in plan.events if self._may_train(f, e) and not e.line <= line <= e.end_line
            ]
            caller = plans[i + 1] if i + 1 < len(plans) else None
            loop = plan.loop_around(line, events, caller is not None and caller.in_loop(frames[i + 1].f_lineno))
            last = loop[1] if loop is not None else 1 << 30
            if any(line < n <= last and not plan.exclusive(line, n) for n in events):
                return False
            if loop is not None:
                return True
        return None  # no loop of the user's around the event (``trainer.fit(...)``): the loop is not in their source

    def _may_train(self, frame: FrameType, event: Event) -> bool:
        """Is this candidate a training event?  Backwards are; ``x.step()`` when ``x`` is an optimizer."""
        if event.kind == "backward":
            return True
        receiver = event.receiver
        if receiver is None or _SCHEDULER.search(receiver.rsplit(".", 1)[-1]):
            return False
        key = (frame.f_code, receiver)
        if key not in self._receivers:
            self._receivers[key] = _is_optimizer(_resolve(frame, receiver), receiver)
        return self._receivers[key]


_UNRESOLVED = object()
_UNBOUND = object()


def _resolve(frame: FrameType, dotted: str) -> object:
    """The object a dotted name stands for in ``frame``, read without running any user code."""
    head, *rest = dotted.split(".")
    value = _UNBOUND  # a name bound nowhere now (an optimizer the script only makes with some flag)
    if head in frame.f_code.co_varnames or head in frame.f_code.co_cellvars or head in frame.f_code.co_freevars:
        value = local_value(frame, head, _UNBOUND)
    elif head in frame.f_globals:
        value = frame.f_globals[head]
    for attr in rest:
        if value is _UNRESOLVED or value is _UNBOUND:
            break
        try:
            value = inspect.getattr_static(value, attr)
        except AttributeError:
            value = _UNRESOLVED
    return value


def _is_optimizer(value: object, receiver: str) -> bool:
    if value is _UNBOUND:  # cannot run as it stands; if it ever steps, the optimizer hook teaches its line
        return False
    if value is _UNRESOLVED:  # not readable without running code: go by its name
        return "opt" in receiver.lower() or "scaler" in receiver.lower()
    if isinstance(value, torch.optim.Optimizer):
        return True
    step = getattr(type(value), "step", None)
    return callable(step) and (hasattr(value, "param_groups") or type(value).__name__.endswith("GradScaler"))
