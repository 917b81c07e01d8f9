"""Name the Python values that keep earlier steps' graphs alive.

Autograd holds nodes from C++, so Python's ``gc`` cannot say who keeps a
graph.  But the keepers users write are few and visible: a local such as
``total_loss`` (``total_loss += loss``), a list of losses, an attribute of a
module (``self.cache = self.weight * 2``), a module-level global.  At a step
end graphwatch looks at the user's frames on the stack, their locals and
globals, one level into lists, tuples and dicts, and the tensors held by
``nn.Module`` attributes; each tensor with a ``grad_fn`` is walked and kept as a
:class:`~graphwatch.model.Holder` when it reaches nodes of earlier steps.

Example::

    >>> import sys, torch
    >>> from graphwatch.capture.holders import tensors_in_frame
    >>> total = torch.ones(1, requires_grad=True) * 2
    >>> [name for name, _ in tensors_in_frame(sys._getframe(), include_globals=False) if name == "total"]
    ['total']
"""

from __future__ import annotations

import functools
from dataclasses import replace
import inspect
import linecache
import re
import sys
from collections.abc import Iterator
from types import CodeType, FrameType
from typing import TYPE_CHECKING, Any

import torch

from ..model import Holder
from .callsite import is_user_file
from .graph_walk import walk

if TYPE_CHECKING:
    from .recorder import Recorder

_SNAPSHOT_LOCALS = sys.version_info < (3, 13)
_CONTAINER_LIMIT = 64  # items looked at per list/tuple/dict
_ASSIGNMENT = r"^\s*{name}\s*(?:[-+*/]?=[^=]|\.(?:add_|append|extend)\()"
_GROWING = r"^\s*{name}\s*(?:[-+*/]=|\.(?:add_|append|extend)\()"


def _tensors_in(name: str, value: Any, depth: int = 0) -> Iterator[tuple[str, torch.Tensor]]:
    if isinstance(value, torch.Tensor):
        if value.grad_fn is not None:
            yield name, value
    elif depth > 0:
        return
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value[-_CONTAINER_LIMIT:]):
            yield from _tensors_in(f"{name}[{i}]", item, depth + 1)
    elif isinstance(value, dict):
        for i, (key, item) in enumerate(value.items()):
            if i == _CONTAINER_LIMIT:
                break
            yield from _tensors_in(f"{name}[{key!r}]", item, depth + 1)
    elif isinstance(value, torch.nn.Module):
        for module_name, module in value.named_modules(prefix=name):
            for attr, item in vars(module).items():
                if not attr.startswith("_"):
                    yield from _tensors_in(f"{module_name}.{attr}", item, depth + 1)
            for attr, param in module._parameters.items():  # a parameter updated in place outside no_grad
                if param is not None and param.grad_fn is not None:
                    yield f"{name}.parameters()[{f'{module_name}.{attr}'[len(name) + 1:]}]", param


def tensors_in_frame(frame: FrameType, include_globals: bool = True) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) for every tensor with a grad_fn a frame can reach by name."""
    local_names = frame.f_locals
    items = list(local_names.items())
    if include_globals and frame.f_globals is not local_names:
        items += frame.f_globals.items()
    _drop_locals_snapshot(frame, local_names)
    del local_names
    pairs = [pair for name, value in items if not name.startswith("__") for pair in _tensors_in(name, value)]
    del items
    return iter(pairs)


def _drop_locals_snapshot(frame: FrameType, local_names: dict) -> None:
    """Before 3.13 a function frame's f_locals is a snapshot dict kept on the frame: it would keep the
    values it saw alive after the function rebinds them.  Empty it, unless someone else holds it: it is
    also what ``locals()`` returned to the user's code (or what a debugger shows), and theirs to keep."""
    if not (_SNAPSHOT_LOCALS and frame.f_code.co_flags & inspect.CO_OPTIMIZED and type(local_names) is dict):
        return
    # the references: the frame's, the caller's variable, this parameter, getrefcount's argument
    if sys.getrefcount(local_names) <= 4:
        local_names.clear()  # the next f_locals or locals() fills it again from the frame


def local_value(frame: FrameType, name: str, default: Any = None) -> Any:
    """One local variable of ``frame``, read without leaving a snapshot of its locals behind."""
    local_names = frame.f_locals
    value = local_names.get(name, default)
    _drop_locals_snapshot(frame, local_names)
    return value


def user_frames(start: FrameType | None) -> Iterator[FrameType]:
    """The user frames on the stack, innermost first."""
    frame = start
    while frame is not None:
        if is_user_file(frame.f_code.co_filename):
            yield frame
        frame = frame.f_back


def assignment_line(frame: FrameType, name: str) -> int | None:
    """The line of the frame's function that makes ``name`` hold a graph.

    A line that adds to it (``name += ...``, ``name.append(...)``) wins over a
    plain assignment (``name = []``); the whole function is read, since in a loop
    that line may lie below the current one (``total += loss`` after ``optimizer.step()``).
    """
    return _assignment_line(frame.f_code, name.split("[")[0])


@functools.lru_cache(maxsize=1024)
def _assignment_line(code: CodeType, name: str) -> int | None:
    """assignment_line for a code object: the same at every step end (read once, not per holder per step)."""
    base = re.escape(name)
    pattern = re.compile(_ASSIGNMENT.format(name=base))
    growing = re.compile(_GROWING.format(name=base))
    last = max((line for _, _, line in code.co_lines() if line is not None), default=code.co_firstlineno)
    found = grown = None
    for line in range(code.co_firstlineno, last + 1):
        text = linecache.getline(code.co_filename, line)
        if pattern.match(text):
            found = line
            if growing.match(text):
                grown = line
    return grown or found


class HolderSearch:
    """Decides at each step end whether to search for holders again, or to keep the last answer.

    A search walks the graph of every tensor the user's frames can reach.
    While every earlier step still alive was alive at the last search (a list
    that keeps a loss every thousand steps, between two of them), that
    search's holders are kept, trimmed to the steps still alive; a step alive
    that was not calls for a new search.  (A search may not name every graph:
    it looks at the last items of long lists; it is not repeated for those.)
    """

    def __init__(self) -> None:
        self._holders: list[Holder] = []
        self._searched: set[int] = set()  # the earlier steps alive at the last search

    def at_step_end(self, recorder: Recorder, start: FrameType | None, census: bool = False) -> list[Holder]:
        """The holders of the graphs of the earlier steps alive (searched now, or kept from the last search).

        ``census``: search whatever is alive, walking every graph the frames reach; that also counts the
        nodes of graphs no backward walks (a chain an in-place update of a parameter grows each step).
        """
        alive = recorder.earlier_steps_alive()
        if census:
            self._holders = find_holders(recorder, start)
            self._searched = recorder.earlier_steps_alive()
            return list(self._holders)
        if alive == self._searched:
            return list(self._holders)
        if alive < self._searched:
            kept = []
            for holder in self._holders:
                steps = [s for s in holder.steps if s in alive]
                if steps:
                    kept.append(holder if len(steps) == len(holder.steps) else replace(holder, steps=steps))
            return kept
        self._holders, self._searched = find_holders(recorder, start), alive
        return list(self._holders)


def find_holders(recorder: Recorder, start: FrameType | None) -> list[Holder]:
    """Holders of earlier-step graphs among the values user frames can reach."""
    holders: list[Holder] = []
    seen: set[int] = set()
    step = recorder.step
    for frame in user_frames(start):
        scope = f"{recorder.sites.sites[recorder.sites.from_frame(frame)].where} in {frame.f_code.co_name}"
        for name, tensor in tensors_in_frame(frame):
            if id(tensor) in seen:
                continue
            seen.add(id(tensor))
            result = walk(recorder, [tensor.grad_fn])
            earlier = sorted(s for s in result.earlier_steps if s < step)
            if not earlier:
                continue
            holders.append(
                Holder(
                    name=name,
                    site=_making_site(recorder, frame, name),
                    scope=scope,
                    steps=earlier,
                    nodes=result.earlier_nodes_reached,
                )
            )
    return holders


def _making_site(recorder: Recorder, frame: FrameType, name: str) -> int | None:
    line = assignment_line(frame, name)
    return None if line is None else recorder.sites.from_frame(frame, line)
