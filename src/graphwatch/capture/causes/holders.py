"""Name the Python values that keep earlier steps' graphs alive.

Autograd holds nodes from C++, so Python's ``gc`` cannot say who keeps a
graph.  But the keepers users write are few and visible: a local such as
``total_loss`` (``total_loss += loss``), a list of losses, an attribute of a
module (``self.cache = self.weight * 2``), a module-level global.  At a step
end graphwatch looks at the user's frames on the stack, their locals and
globals (a module's at the module's line that adds to them), into lists, tuples, dicts, ``nn.Module``
attributes and objects of the user's classes, and at the closures of the hooks registered on the modules
there (:mod:`~graphwatch.capture.causes.held_values` names each tensor by its path); each tensor with a ``grad_fn`` is
walked and kept as a :class:`~graphwatch.model.Holder` when it reaches nodes of earlier steps.

Example::

    >>> import sys, torch
    >>> from graphwatch.capture.causes.holders import tensors_in_frame
    >>> total = torch.ones(1, requires_grad=True) * 2
    >>> [name for name, _ in tensors_in_frame(sys._getframe(), include_globals=False) if name == "total"]
    ['total']
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace
from types import CodeType, FrameType
from typing import TYPE_CHECKING, Any

import torch

from ...model import GLOBALS_SCOPE, Holder, NodeRecord, StepSpans
from ...model.records import held_value
from ..graph.graph_walk import Reach, reach
from ..lines.callsite import display_path
from ..lines.frames import drop_locals_snapshot, resolve, user_frames
from ..lines.source import assigned_names, assignments, function_node, inplace_updates, module_node
from .attribute_stores import update_site
from .held_values import _INERT as _INERT  # (re-exported: the names callers and tests import from here)
from .held_values import _of_a_user_class as _of_a_user_class
from .held_values import hook_closures, tensors_among, value_at
from .held_values import tensors_in as _tensors_in  # noqa: F401 (re-exported, as the two above)

if TYPE_CHECKING:
    from ..recorder import Recorder

def tensors_in_frame(
    frame: FrameType, include_globals: bool = True, seen_globals: set[int] | None = None
) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) for every tensor with a grad_fn a frame can reach by name.

    ``seen_globals``: the ids of the globals of the frames looked at before in one look at the stack, whose
    tensors that look has named already: not looked at again (this frame's are added)."""
    local_items, global_items = _frame_names(frame, include_globals, seen_globals)
    return iter(tensors_among(local_items + global_items))


def _frame_names(
    frame: FrameType, include_globals: bool = True, seen_globals: set[int] | None = None
) -> tuple[list[tuple[str, Any]], list[tuple[str, Any]]]:
    """(the frame's own names and values, those of its module's globals when they are not its own; see
    :func:`tensors_in_frame` for ``seen_globals``)."""
    local_names = frame.f_locals
    own = local_names is frame.f_globals  # a module's frame: its globals are its locals
    global_items = list(frame.f_globals.items()) if include_globals and not own else []
    local_items = list(local_names.items())
    if seen_globals is not None and (own or include_globals):
        if id(frame.f_globals) in seen_globals:
            global_items = []
            local_items = [] if own else local_items
        seen_globals.add(id(frame.f_globals))  # (alive while the frames looked at are: the id is not reused)
    drop_locals_snapshot(frame, local_names)
    del local_names
    return local_items, global_items


def tensors_in_user_frames(start: FrameType | None, limit: int = 8) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) for the tensors with a graph the innermost ``limit`` user frames reach by name, each
    tensor once (see :func:`tensors_in_frame`)."""
    seen: set[int] = set()
    seen_globals: set[int] = set()
    for frame in list(user_frames(start))[:limit]:
        for name, tensor in tensors_in_frame(frame, seen_globals=seen_globals):
            if id(tensor) not in seen:
                seen.add(id(tensor))
                yield name, tensor


def parameter_names(start: FrameType | None, limit: int = 8) -> dict[str, torch.Tensor]:
    """``{"model.0.weight": tensor, ...}``: the parameters of the modules the user's frames hold (the
    innermost ``limit`` frames, their locals before their globals), named as the frame spells the module;
    a parameter two modules share keeps its first name.

    Example::

        >>> import sys, torch
        >>> cell = torch.nn.Linear(2, 1)
        >>> sorted(parameter_names(sys._getframe()))
        ['cell.bias', 'cell.weight']
    """
    names: dict[str, torch.Tensor] = {}
    seen: set[int] = set()
    for frame in list(user_frames(start))[:limit]:
        local_names = frame.f_locals
        items = list(local_names.items())
        if frame.f_globals is not local_names:
            items += frame.f_globals.items()
        drop_locals_snapshot(frame, local_names)  # (the values seen must not outlive this look)
        del local_names
        for var, value in items:
            if issubclass(type(value), torch.nn.Module) and not var.startswith("_"):
                for name, param in value.named_parameters(prefix=var):
                    if id(param) not in seen:
                        seen.add(id(param))
                        names[name] = param
    return names


def assignment_line(code: CodeType, name: str) -> int | None:
    """The line of ``code``'s function that makes ``name`` hold a graph.

    A line that adds to it (``name += ...``, ``name.append(...)``) wins over a
    plain assignment (``name = []``); the whole function is read, since in a loop
    that line may lie below the current one (``total += loss`` after ``optimizer.step()``).
    """
    return _making_line(name, lambda path: _assignment(code, path))


def _making_line(name: str, found_for: Callable[[str], tuple[int, bool] | None]) -> int | None:
    """The line that makes the holder ``name`` hold a graph, ``found_for`` each path: a line that assigns or
    adds to the innermost container its path names by literal keys (``history['loss'].append(loss)`` for
    ``history['loss'][3]``, ``running['loss'] += loss`` for ``running['loss']``), else the best of its name's."""
    head = name.split("[")[0]
    for end in (i + 1 for i in range(len(name) - 1, len(head) - 1, -1) if name[i] == "]"):
        found = found_for(name[:end])
        if found is not None:
            return found[0]
    found = found_for(head)
    return found[0] if found else None


@functools.lru_cache(maxsize=1024)
def _assignment(code: CodeType, name: str) -> tuple[int, bool] | None:
    """(line, whether it adds to the value), read once per code object and name (not per holder per step)."""
    node = function_node(code)
    return _best(node, name) if node is not None else None


def _best(node: ast.AST, name: str) -> tuple[int, bool] | None:
    """(line, whether it adds to the value) of the statement under ``node`` that best says where ``name`` holds
    a graph: the last line that adds to it, else the last that assigns it."""
    found = sorted(assignments(node, name), key=lambda pair: (pair[1], pair[0]))
    return found[-1] if found else None


def _attribute_site(recorder: Recorder, frame: FrameType | None, name: str, names: dict | None = None) -> int | None:
    """For ``obj.attr`` (``model.outputs``, ``meters['loss'].sum``): the line of ``obj``'s class that assigns or
    adds to ``self.attr`` (``obj`` as ``frame`` names it, or else as ``names``, a finished script's globals, does)."""
    owner_path, _, attr = held_value(name).rpartition(".")
    if not owner_path or not attr.isidentifier():
        return None
    best = _class_line(value_at(frame, owner_path, names), f"self.{attr}")
    parent_path, _, link = owner_path.rpartition(".")
    if (best is None or not best[0][0]) and parent_path and link.isidentifier():
        # nothing of the owner's class adds to it (``self.td_errors = []`` only): the object that holds the owner
        # may (``self.agent.td_errors.append(loss)`` in a training_step)
        added = _class_line(value_at(frame, parent_path, names), f"self.{link}.{attr}")
        best = added if added is not None and added[0][0] else best
    if best is None:  # nothing assigns it: a buffer updated in place (an EMA's ``self.ema_w.mul_(0.99).add_(w)``)
        return update_site(recorder.sites, value_at(frame, owner_path, names), attr)
    return recorder.sites.from_code(best[2], best[1])


def _class_line(owner: Any, target: str) -> tuple[tuple[bool, bool], int, CodeType] | None:
    """((adds, not in __init__), line, code) of the statement of ``owner``'s classes that best makes ``target``
    (``self.attr``) hold a graph: a method that adds to it wins over one that assigns it, and one that assigns it
    each step over ``__init__``."""
    best: tuple[tuple[bool, bool], int, CodeType] | None = None
    for cls in type(owner).__mro__:
        if cls.__module__.startswith(("torch.", "builtins")):
            break
        for method, function in vars(cls).items():
            code = getattr(function, "__code__", None)
            if not isinstance(code, CodeType):
                continue
            found = _assignment(code, target)
            rank = (found[1], method != "__init__") if found is not None else (False, False)
            if found is not None and (best is None or rank > best[0]):
                best = (rank, found[0], code)
    return best


class HolderSearch:
    """Decides at each step end whether to search for holders again, or to keep the last answer.

    A search walks the graph of every tensor the user's frames can reach.
    While no earlier step came alive since the last search (a list that keeps
    a loss every thousand steps, between two of them), that search's holders
    are kept, less the steps whose graphs died meanwhile; an earlier step alive
    that the last search did not see calls for a new one.  Deciding costs
    O(steps that came alive or died since the last step end), however many
    graphs are kept.  (A search may not name every graph: it looks at the last
    items of long lists; it is not repeated for those.)
    """

    def __init__(self) -> None:
        self._holders: list[Holder] = []
        self._unsearched: set[int] = set()  # steps alive that no search saw as earlier steps yet
        self._reaches: dict[int, Reach] = {}  # what the last search's tensors reach, by their node's record id

    def at_step_end(
        self, recorder: Recorder, start: FrameType | None, census: bool = False, script: dict | None = None,
        step: int | None = None,
    ) -> list[Holder]:
        """The holders of the graphs of the earlier steps alive (searched now, or kept from the last search).

        ``census``: search whatever is alive, walking every graph the frames reach; that also counts the
        nodes of graphs no backward walks (a chain an in-place update of a parameter grows each step).
        ``step``: the step whose end it is (default: the current one; the last one ended, at the session's end).
        """
        appeared, vanished = recorder.live.changes()
        self._unsearched.update(appeared)
        self._unsearched = {s for s in self._unsearched if recorder.live.is_alive(s)}
        # this step's graphs (and the next one's, after a pending end) are not earlier yet: they stay unsearched
        new = {s for s in self._unsearched if s < recorder.step}
        if census or new:
            self._holders = find_holders(recorder, start, script if census else None, self._reaches, step)
            self._unsearched -= new
            return list(self._holders)
        dead = [s for s in vanished if not recorder.live.is_alive(s)]
        if dead:
            kept = []
            for holder in self._holders:
                steps = StepSpans.of(holder.steps).without(dead)
                if steps:
                    kept.append(holder if len(steps) == len(holder.steps) else replace(holder, steps=steps))
            self._holders = kept
        return list(self._holders)


def find_holders(
    recorder: Recorder, start: FrameType | None, script: dict | None = None, reaches: dict[int, Reach] | None = None,
    step: int | None = None,
) -> list[Holder]:
    """Holders of graphs of steps before ``step`` (default: the current one) among the values user frames can
    reach (and a finished script's globals, ``script``, which ``graphwatch run`` hands over when the session
    ends).

    ``reaches``: what an earlier search found below the tensors it looked at; used where the same
    nodes are met again, and replaced by what this search looked at (see :func:`reach`).
    """
    with recorder.light_backwards.looking():  # (the graphs below light backwards walked once for every node)
        return _find_holders(recorder, start, script, reaches, recorder.step if step is None else step)


def _find_holders(
    recorder: Recorder, start: FrameType | None, script: dict | None, reaches: dict[int, Reach] | None, step: int
) -> list[Holder]:
    holders: list[Holder] = []
    seen: set[int] = set()
    known = reaches if reaches is not None else {}
    found_now: dict[int, Reach] = {}
    seen_globals: set[int] = set()
    frames: list[tuple[FrameType | None, list[tuple[str, Any]], list[tuple[str, Any]]]] = [
        (frame, *_frame_names(frame, seen_globals=seen_globals)) for frame in user_frames(start)
    ]
    if script is not None:
        frames.append((None, [], list(script.items())))
    modules = [v for _, local_items, global_items in frames for _, v in local_items + global_items]
    for hook, pairs in hook_closures(modules):  # first: the list a hook appends to is named as the hook spells it
        code = hook.__code__
        scope = f"{display_path(code.co_filename)}:{code.co_firstlineno} in {hook.__name__}"
        for holder in _holders_among(recorder, pairs, seen, scope, known, found_now, step):
            line = assignment_line(code, holder.name) if holder.site is None else None
            holders.append(holder if line is None else replace(holder, site=recorder.sites.from_code(code, line)))
    del modules
    for frame, local_items, global_items in frames:
        if frame is not None:
            scope = f"{recorder.trace.where(recorder.sites.from_frame(frame))} in {frame.f_code.co_name}"
            found = _holders_among(recorder, tensors_among(local_items), seen, scope, known, found_now, step)
            holders += [h if h.site is not None else replace(h, site=_making_site(recorder, frame, h.name)) for h in found]
        names = dict(global_items)
        if global_items and isinstance(names.get("__file__"), str):  # a module's globals, seen from a function of it
            holders += _global_holders(recorder, frame, names, seen, (known, found_now), step)
    if reaches is not None:
        reaches.clear()
        reaches.update(found_now)
    return holders


def _global_holders(
    recorder: Recorder,
    frame: FrameType | None,
    names: dict,
    seen: set[int],
    reaches: tuple[dict[int, Reach], dict[int, Reach]],
    step: int,
) -> list[Holder]:
    """The holders among a module's globals ``names`` (a finished script's, or those of the module of the
    function ``frame`` runs), at the line of that function that adds to or assigns them, else at the module's
    (``current_loss += loss`` below the call of the ``train()`` that returned ``loss``).  ``reaches``: what an
    earlier search and this one found below the tensors looked at (see :func:`find_holders`)."""
    file = names["__file__"]
    holders = []
    scope = display_path(file) + GLOBALS_SCOPE
    for holder in _holders_among(recorder, tensors_among(list(names.items())), seen, scope, *reaches, step):
        in_function = assignment_line(frame.f_code, holder.name) if frame is not None and holder.site is None else None
        if holder.site is None and "[" in held_value(holder.name):  # an object kept in a container
            holder = replace(holder, site=_attribute_site(recorder, frame, holder.name, names))
        line = _script_line(file, holder.name) if holder.site is None and in_function is None else None
        site = recorder.sites.from_file(file, line) if line is not None else holder.site
        site = recorder.sites.from_frame(frame, in_function) if frame is not None and in_function is not None else site
        if site is None and _module_of(holder.name) is not None:
            site = parameter_update_site(recorder, holder.name, None, names)
        elif site is None:  # an object's attribute (``model.running``): the line of its class that assigns it
            site = _attribute_site(recorder, None, holder.name, names)
        holders.append(replace(holder, site=site))
    return holders


def _holders_among(
    recorder: Recorder,
    pairs: Iterable[tuple[str, torch.Tensor]],
    seen: set[int],
    scope: str,
    known: dict[int, Reach],
    found: dict[int, Reach],
    step: int,
) -> list[Holder]:
    """Holders (with no site yet) of graphs of steps before ``step`` among ``pairs`` of names and tensors, each
    tensor looked at once; what each reaches is added to ``found``."""
    holders = []
    for name, tensor in pairs:
        if id(tensor) in seen:
            continue
        seen.add(id(tensor))
        root, reached = reach(recorder, tensor.grad_fn, known)
        if root is not None:
            found[root] = reached
        earlier, nodes = reached.earlier(step)
        if earlier:
            record = recorder.trace.nodes.get(root) if root is not None else None
            backwarded = record is not None and (record.backward is not None or _light_backwarded(recorder, record, tensor))
            site = _running_site(recorder, record, name)
            holders.append(Holder(name, site, scope, earlier, nodes, tensor.numel(), backwarded))
    return holders


def _light_backwarded(recorder: Recorder, record: NodeRecord, tensor: torch.Tensor) -> bool:
    """Whether a backward with no walk (on a step seen light) ran, or may have run, through the node of a held
    tensor that a step seen light made (:meth:`~graphwatch.capture.graph.post_hoc.LightBackwards.ran_through`)."""
    if record.step < 0 or recorder.is_full_step(record.step):
        return False  # (made before the session, or a backward's walk would have noted it)
    return recorder.light_backwards.ran_through(recorder, tensor.grad_fn, record.seq) is not False


def _running_site(recorder: Recorder, record: NodeRecord | None, name: str) -> int | None:
    """The line that ran and made the held tensor, as seen when its node was made, for a holder reached through
    an object: a parameter updated in place (the node's own line), an attribute (the line of the node's call
    chain that assigns it: ``self.baseline = ...`` for ``policy.baseline``, however the frame spells the
    object; ``meters['loss'].sum``, an attribute of an object kept in a dict).  None for a name (its line is read
    from its frame's function) or an item of a container (the line that adds to it)."""
    if record is None or record.site is None or (record.site_inferred and not recorder.precise):
        return None  # (a line read off the last op that saved a tensor: not this node's own, but at the precise level)
    if _module_of(name) is not None:
        return record.site
    attr = name.rpartition(".")[2]
    if "." not in name or not attr.isidentifier():  # a variable, or an item of a container
        return None
    site_id: int | None = record.site
    while site_id is not None:
        site = recorder.trace.sites[site_id]
        if any(n.endswith(f".{attr}") for n in assigned_names(site.source)):
            return site_id
        site_id = site.caller
    return None


def parameter_update_site(
    recorder: Recorder, holder: str, frame: FrameType | None, script: dict | None = None
) -> int | None:
    """For a module's parameters holding graphs (``holder``: ``teacher.parameters()[0.weight]``) when their
    node's own line is not known (an in-place op that saves nothing packs no tensor): the one line of the
    frame's function (or of a finished ``script``) that changes in place, outside ``no_grad``, a name bound
    there to a parameter of that module (an EMA teacher's loop: ``tp.mul_(m).add_((1 - m) * sp)``); None when
    there is no such line or more than one."""
    module = resolve(frame, _module_of(holder) or "", script)
    file = (script or {}).get("__file__")
    if not issubclass(type(module), torch.nn.Module) or (frame is None and not isinstance(file, str)):
        return None
    parameters = {id(p) for p in module.parameters() if isinstance(p, torch.nn.Parameter)}  # (not fast weights)
    tree = function_node(frame.f_code) if frame is not None else module_node(str(file))
    lines = {line for line, changed in inplace_updates(tree) if id(resolve(frame, changed, script)) in parameters}
    if len(lines) != 1:
        return None
    line = lines.pop()
    return recorder.sites.from_frame(frame, line) if frame is not None else recorder.sites.from_file(str(file), line)


def _module_of(holder: str) -> str | None:
    """``teacher`` for the parameters holder ``teacher.parameters()[0.weight]``; None for any other holder."""
    base = holder.split("[")[0]
    return base[: -len(".parameters()")] if base.endswith(".parameters()") else None

def _script_line(filename: str, name: str) -> int | None:
    node = module_node(filename)
    return _making_line(name, lambda path: _best(node, path)) if node is not None else None


def _making_site(recorder: Recorder, frame: FrameType, name: str) -> int | None:
    if _module_of(name) is not None:
        return parameter_update_site(recorder, name, frame)
    if "[" in held_value(name):  # an object kept in a container (``meters['loss'].sum``): its class's line
        return _attribute_site(recorder, frame, name)
    line = assignment_line(frame.f_code, name)
    if line is not None:
        return recorder.sites.from_frame(frame, line)
    return _attribute_site(recorder, frame, name)
