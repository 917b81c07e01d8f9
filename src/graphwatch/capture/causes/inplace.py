"""Which line changed a saved tensor in place, found when torch's "modified by an inplace operation" error is
raised (graphwatch runs torch's version check itself under saved-tensor hooks: ``capture/hooks/saved.py``).

Sources, best first:

- the in-place op's node: a saved *input* is kept itself, so its ``grad_fn`` now is the node of the op that
  changed it; a saved *output*'s node has, among the nodes consuming that output, the in-place op's as the
  newest (every use after the change goes through it).  Its line is the one its own saved tensors were
  packed at (exact when the op saves any), read from the step clock by its sequence number;
- a later save of the same storage at a newer version (``relu_`` saves its result): the line of that pack;
- for an op that saves nothing (``att[:, :, 0, :] = 0`` makes a ``CopySlices``, ``out += residual`` an
  ``AddBackward0``), the in-place statements of the function between the last line that ran before the op and
  the line that used its result (else the function's end: its caller used it), all of them when several change
  the name the saving line spells (an attention map's border zeroed by four assignments).

An ``optimizer.step()`` of this step that updated a saved parameter is the cause itself (no line of the user's
changed it); any other change of a parameter (or of a view of one) is an update too, under ``torch.no_grad()``,
which no node records: its statement is read from the source (:mod:`.parameter_updates`).
``t[..., i + 1] = f(t[..., i])`` in a ``for`` loop over ``i`` is a recurrence written into one tensor, whose loop
is named (its fix is a list of states, stacked: never a ``.clone()`` before the loop).

A module built with ``inplace=True`` (``nn.Dropout(p, inplace=True)``, ``nn.ReLU(inplace=True)`` in a
``Sequential``) is found from the module objects the frames reach, through the class whose method ran the
line and the attribute it calls, and named with the line of ``__init__`` (or of the function) that built it.

Example::

    >>> import ast
    >>> from graphwatch.capture.causes.inplace import passes_inplace
    >>> [passes_inplace(s) for s in ast.parse("act = nn.ReLU(inplace=True)\\ny = torch.relu(x)").body]
    [True, False]
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from types import CodeType, FrameType, MethodType
from typing import TYPE_CHECKING, Any

import torch

from ...model import CallSite, Trace
from ...model.causes import InplaceCause
from ..graph.graph_walk import node_record
from ..graph.node_types import node_type, saved_data
from ..hooks.inplace_hints import optimizer_update
from ..lines.callsite import display_path
from ..lines.frames import named_values, resolve, user_frames
from ..lines.source import dotted_name, inplace_call, inplace_statement, module_node
from .inplace_source import Write, alias_roots, code_of, statement_start, unsafe_reason, writes
from .parameter_updates import update_writes
from .second_backward import _VIEWS

if TYPE_CHECKING:
    from ..hooks.saved import SavedHandle
    from ..recorder import Recorder

_LIMIT = 200_000


def _statement(site: CallSite) -> ast.stmt | None:
    try:
        body = ast.parse(site.source).body if site.source else []
    except SyntaxError:
        return None
    return body[0] if len(body) == 1 else None


def _graph(roots: list[Any]) -> tuple[dict[Any, list[Any]], list[Any]]:
    """(node -> [(parent, input number)] consuming it, every node) of the graph below ``roots``."""
    parents: dict[Any, list[Any]] = {}
    seen: list[Any] = []
    stack = [root for root in roots if root is not None]
    visited: set[Any] = set()
    while stack and len(visited) < _LIMIT:
        node = stack.pop()
        if node in visited:
            continue
        visited.add(node)
        seen.append(node)
        for child, number in node.next_functions:
            if child is not None:
                parents.setdefault(child, []).append((node, number))
                stack.append(child)
    return parents, seen


class InplaceFinder:
    """Finds the :class:`~graphwatch.model.causes.InplaceCause` of one failed version check."""

    def __init__(self, recorder: Recorder, roots: list[Any], start: FrameType | None) -> None:
        self.recorder = recorder
        self.trace = recorder.trace
        self.parents, self.nodes = _graph(roots)
        self.frames = list(user_frames(start))[:8]

    def cause(self, handle: SavedHandle, tensor: torch.Tensor) -> InplaceCause:
        cause = InplaceCause(handle.site, handle.step)
        backward = self.recorder.backward
        cause.backward_at = backward.site if backward is not None else None
        update = optimizer_update(self.recorder, handle)
        if update is not None:  # an optimizer step of this step updated the parameter: no line of the user's did
            cause.optimizer_at, cause.found_by = update[1], "optimizer"
            return cause
        saving = next((n for n in self.nodes if any(d is handle for d in saved_data(n, node_type(n)))), None)
        base = tensor if tensor._base is None else tensor._base  # (linear saves weight.t(): its base is the weight)
        cause.update = base.is_leaf and base.requires_grad  # a parameter (or a leaf trained as one)
        changer = None if cause.update else self._changing_node(handle, tensor, saving)
        found: list[Write] = []
        if cause.update:  # changed under no_grad (or through .data): an update, which no node records
            found = self._update_writes(handle, base)
        elif changer is not None:
            cause.op = changer.name()
            line, own = self._node_line(changer)
            # the clock's line of an op that saved nothing (`out.mul_(0.5)`) is the last op before it that saved
            # (`out = self.model(x)`, whose inplace=True module is not what changed the tensor): look between that
            # line and what used the result first, and at the line itself only when nothing there changes one
            found = [] if own else self._statements_between(line, self._users_lines(changer), handle.site)
            if not found and self._changes_here(line):
                cause.changed_at, cause.found_by = line, "node"
                cause.called_at = self._helper_call(line, handle.site)
            elif not found and own:
                found = self._statements_between(line, self._users_lines(changer), handle.site)
        elif handle.site is not None:  # (a leaf changed under no_grad: no node; after the line that saved it)
            found = self._statements_between(handle.site, [], handle.site)
        if found:
            lines = list(dict.fromkeys(self.recorder.sites.from_file(w.file, w.line) for w in found))
            cause.changed_at, cause.changed_also = lines[0], lines[1:]
            call = found[0].call
            cause.called_at = self.recorder.sites.from_file(*call) if call is not None else None
        cause.found_by = cause.found_by or ("source" if cause.changed_at is not None else "")
        if cause.changed_at is None:
            later = self.recorder.later_saves_of(handle)
            if self._changes_here(later):
                cause.changed_at, cause.found_by = later, "save"
        site = self.trace.site(cause.changed_at)
        if site is not None:
            self._what_changed(cause, site, tensor, handle)
            cause.loop_at = self._recurrence(site)
        return cause

    def _update_writes(self, handle: SavedHandle, parameter: torch.Tensor) -> list[Write]:
        """The statements that updated the saved parameter (:func:`.parameter_updates.update_writes`)."""
        backward = self.recorder.backward
        at = self.trace.site(backward.site) if backward is not None else None
        if at is None:
            return []
        earlier = handle.step < self.recorder.step
        return update_writes(self.trace, at, handle.site, earlier, self.frames, lambda c: self._callee(at, c), parameter)

    # ------------------------------------------------------------------ the node
    def _helper_call(self, changed_at: int | None, saved_at: int | None) -> int | None:
        """The caller's line that ran the function of ``changed_at`` when that function is none of the saving
        line's or its callers' (a helper that changed a tensor it was given), or when the saving line is the same
        line reached by another call (a helper called twice); else None."""
        changed, saved = self.trace.site(changed_at), self.trace.site(saved_at)
        saving = [(s.file, s.function) for s in _chain(self.trace, saved_at)]
        if changed is None or changed.caller is None:
            return None
        again = saved is not None and saved.caller != changed.caller and saved.where == changed.where
        return changed.caller if again or (changed.file, changed.function) not in saving else None

    def _changing_node(self, handle: SavedHandle, tensor: torch.Tensor, saving: Any) -> Any:
        first = saving._sequence_nr() if saving is not None else -1
        if handle.is_input:
            node = tensor.grad_fn
            kids = [c for c, _ in node.next_functions if c is not None] if node is not None else []
            if len(kids) == 1 and "CopySlices" in kids[0].name():  # a view changed in place: its grad_fn is made
                node = kids[0]  # when read; the change itself is its base's CopySlices
            return node if node is not None and node._sequence_nr() > first else None
        if saving is None or handle.output_of is None:
            return None
        number = handle.output_of[1]
        consumers = [p for p, n in self.parents.get(saving, []) if n == number and p._sequence_nr() > first]
        return max(consumers, key=lambda p: p._sequence_nr(), default=None)

    def _node_line(self, node: Any) -> tuple[int | None, bool]:
        """(the line that made ``node``, whether it is its own op's): its record's, else the clock's at its
        sequence number: its own line if it saved a tensor (or the precise level noted every call), else the last
        one before it that did."""
        record = node_record(node)
        if record is not None and record.site is not None and not record.site_inferred:
            return record.site, True
        seq = node._sequence_nr()
        return self.recorder.clock.site_of(seq), self.recorder.precise or self.recorder.clock.packed(seq)

    def _changes_here(self, site_id: int | None) -> bool:
        """Whether the statement at ``site_id`` changes a tensor in place: in-place syntax, or a call of a
        module the frames reach that is (or holds) one built with ``inplace=True``."""
        site = self.trace.site(site_id)
        statement = _statement(site) if site is not None else None
        if statement is None or site is None:
            return False
        if inplace_statement(statement) is not None or passes_inplace(statement):
            return True
        probe = InplaceCause(None, 0)
        self._module(probe, site, statement)
        return probe.module is not None

    def _users_lines(self, node: Any, limit: int = 64) -> list[int]:
        """The lines of the nearest nodes above ``node`` (using its result) whose line is their own."""
        queue, lines = [p for p, _ in self.parents.get(node, [])], []
        seen: set[Any] = set()
        while queue and len(seen) < limit:
            user = queue.pop(0)
            if user in seen:
                continue
            seen.add(user)
            site, _ = self._node_line(user)
            if site is not None and any(True for _ in saved_data(user, node_type(user))):
                lines.append(site)
            else:
                queue.extend(p for p, _ in self.parents.get(user, []))
        return lines

    def _statements_between(self, before: int | None, users: list[int], saved_at: int | None) -> list[Write]:
        """The in-place statements that ran after ``before`` (a line that ran before the change): those of its
        function (:meth:`_writes_after`), else of the function that called it, and so on outwards (a helper
        called from the loop, between the forward and the loss).  The names are those the saving line
        (``saved_at``) spells, then the caller's line that ran the function."""
        saving = self.trace.site(saved_at)
        statement = _statement(saving) if saving is not None else None
        scope, calling = self.trace.site(before), False
        while scope is not None:
            found = self._writes_after(scope, users, statement, calling)
            if found:
                return found
            statement, scope, calling = _statement(scope), self.trace.site(scope.caller), True
        return []

    def _writes_after(self, first: CallSite, users: list[int], statement: ast.stmt | None,
                      calling: bool = False) -> list[Write]:
        """The in-place statements of the function that ran ``first``, in source order: after that line (from
        it, when ``first`` is a caller's line, whose statement goes on after the call returns: ``x += f(x)``) and
        up to the first of ``users`` (lines that ran after it) in that function, else up to the running
        backward's line there, else to the function's end (what it returned was used by a caller); also
        those of the user functions it called there on a tensor it passed.  Of those, the ones changing a
        name ``statement`` spells, or a view of it or another name for it; else all of them if they change one
        tensor; else none (graphwatch cannot tell)."""
        tree = module_node(_filename(first))
        if tree is None:
            return []
        backward = self.recorder.backward
        after = [self.trace.site(s) for s in users] + [self.trace.site(backward.site) if backward else None]
        last = next((s.line for s in after if s is not None and s.file == first.file
                     and s.function == first.function and s.line >= first.line), None)  # fmt: skip
        function = _function_at(tree, first)
        last = function.end_lineno if last is None and function is not None else last
        if last is None:
            return []
        scope = function or tree
        start = statement_start(scope, first.line) - 1 if calling else first.line
        found = writes(scope, _filename(first), start, last, lambda call: self._callee(first, call))
        roots = alias_roots(scope, last + 1)
        spelled = {roots.get(n, n) for n in (dotted_name(n) for n in ast.walk(statement)
                   if isinstance(n, (ast.Name, ast.Attribute))) if n} if statement is not None else set()  # fmt: skip
        named = [w for w in found if roots.get(w.name, w.name) in spelled] or found
        return named if len({roots.get(w.name, w.name) for w in named}) == 1 else []

    def _callee(self, site: CallSite, call: ast.Call) -> CodeType | None:
        """The code of the user function ``call`` (on the line ``site`` of its caller) runs: its name in that
        caller's frame if it still runs, else a method of the module whose class holds the line (``self.f``),
        else a function of the file's globals."""
        name = dotted_name(call.func)
        if not name:
            return None
        frame = next((f for f in self.frames if f.f_code.co_name == site.function
                      and display_path(f.f_code.co_filename) == site.file), None)  # fmt: skip
        if frame is not None:
            return code_of(resolve(frame, name))
        if name.startswith("self."):
            owner, attr = self._owner(site, name, MethodType)
            return code_of(getattr(owner, attr, None)) if owner is not None and attr else None
        names = next((f.f_globals for f in self.frames if display_path(f.f_code.co_filename) == site.file), None)
        return code_of(resolve(None, name, names)) if names is not None else None

    def _recurrence(self, site: CallSite) -> int | None:
        """The ``for`` loop around ``t[..., i + 1] = f(t[..., i])`` at ``site`` (its variable indexes the slice
        written): each of its steps writes the tensor from its own earlier slices, which the step before
        saved.  The line of the ``for``; else None."""
        statement = _statement(site)
        if not isinstance(statement, ast.Assign) or not isinstance(target := statement.targets[0], ast.Subscript):
            return None
        name = inplace_statement(statement)
        reads = {dotted_name(n) for n in ast.walk(statement.value) if isinstance(n, (ast.Name, ast.Attribute))}
        indexes = {n.id for n in ast.walk(target.slice) if isinstance(n, ast.Name)}
        tree = module_node(_filename(site)) if name in reads else None
        loops = [n for n in ast.walk(tree) if isinstance(n, ast.For) and n.lineno < site.line <= (n.end_lineno or 0)
                 and {v.id for v in ast.walk(n.target) if isinstance(v, ast.Name)} & indexes] if tree else []  # fmt: skip
        innermost = max(loops, key=lambda n: n.lineno, default=None)
        return self.recorder.sites.from_file(_filename(site), innermost.lineno) if innermost is not None else None

    # ------------------------------------------------------------------ the statement
    def _what_changed(self, cause: InplaceCause, site: CallSite, tensor: torch.Tensor, handle: SavedHandle) -> None:
        """The tensor's name on the line, or the module built with inplace=True that ran there; and whether
        the out-of-place form is safe, else why not (:func:`.inplace_source.unsafe_reason`)."""
        statement = _statement(site)
        made_by_view = handle.output_of is not None and any(v in handle.output_of[0] for v in _VIEWS)
        is_view = tensor._base is not None if handle.is_input else made_by_view
        name = (inplace_statement(statement) or nested_inplace(statement)) if statement is not None else None
        if name is not None or (statement is not None and passes_inplace(statement)):
            cause.unsafe = unsafe_reason(site.file, site.line, name, is_view, handle.leaf, cause.called_at is not None)
            cause.target, cause.safe = name or "", not cause.unsafe
            return
        if statement is not None:
            self._module(cause, site, statement)

    def _module(self, cause: InplaceCause, site: CallSite, statement: ast.stmt) -> None:
        for call in (n for n in ast.walk(statement) if isinstance(n, ast.Call)):
            name = dotted_name(call.func)
            owner, attr = self._owner(site, name) if name else (None, None)
            module = getattr(owner, attr, None) if owner is not None and attr else self._resolve(site, name)
            if not isinstance(module, torch.nn.Module):
                continue
            candidates = [(path, m) for path, m in module.named_modules() if getattr(m, "inplace", False) is True]
            if not candidates:
                continue
            label = f"self.{attr}" if owner is not None else name
            if len(candidates) > 1:
                cause.module, cause.module_type = label, type(module).__name__
                cause.note = f"{len(candidates)} modules of `{label}` are built with inplace=True"
                return
            path, found = candidates[0]
            cause.module = f"{label}.{path}" if path else label
            cause.module_type = type(found).__name__
            cause.built_at = self._built_at(site, owner, attr, name, path)
            cause.safe = cause.built_at is not None
            if cause.built_at is None:
                cause.note = f"graphwatch could not tell which line built `{cause.module}`"
            return

    def _owner(self, site: CallSite, name: str, holds: type = torch.nn.Module) -> tuple[Any, str | None]:
        """For ``self.attr`` on a line of a method of class C: a module of class C the frames reach whose
        ``attr`` is a ``holds`` (a module; a method)."""
        head, _, attr = name.partition(".")
        if head != "self" or not attr or "." in attr:
            return None, None
        cls = _class_of(site)
        for module in self._modules():
            if type(module).__name__ == cls and isinstance(getattr(module, attr, None), holds):
                return module, attr
        return None, None

    def _modules(self) -> list[torch.nn.Module]:
        found: dict[int, torch.nn.Module] = {}
        for frame in self.frames:
            for _, value in named_values(frame):
                if isinstance(value, torch.nn.Module):
                    for module in value.modules():
                        found.setdefault(id(module), module)
        return list(found.values())

    def _resolve(self, site: CallSite, name: str | None) -> Any:
        for frame in self.frames:
            if name and frame.f_code.co_name == site.function:
                return resolve(frame, name)
        return None

    def _built_at(self, site: CallSite, owner: Any, attr: str | None, name: str | None, path: str) -> int | None:
        """The line that built the module: in the owner class's ``__init__``, ``self.attr = Module(...)`` (a
        ``Sequential``'s positional argument for a child); for a name of the function, its assignment."""
        tree = module_node(_filename(site))
        if tree is None:
            return None
        if owner is not None:
            cls = next((n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == type(owner).__name__), None)
            scope: ast.AST | None = next((f for f in cls.body if isinstance(f, ast.FunctionDef) and f.name == "__init__"),
                                         None) if cls else None  # fmt: skip
            target = f"self.{attr}"
        else:
            scope = _function_at(tree, site) or tree
            target = name or ""
        calls = [s.value for s in ast.walk(scope) if isinstance(s, ast.Assign) and isinstance(s.value, ast.Call)
                 and any(dotted_name(t) == target for t in s.targets)] if scope is not None else []  # fmt: skip
        if len(calls) != 1:
            return None
        call: ast.Call = calls[0]
        for index in (int(part) for part in path.split(".") if part) if path else ():
            args = [a for a in call.args if not isinstance(a, ast.Starred)]
            child = args[index] if len(args) == len(call.args) and index < len(args) else None
            if not isinstance(child, ast.Call):
                return None
            call = child
        if not any(k.arg == "inplace" for k in call.keywords):
            return None
        return self.recorder.sites.from_file(_filename(site), call.lineno)


def nested_inplace(statement: ast.stmt) -> str | None:
    """The name of the one tensor a statement changes in place inside another expression, read nowhere else in it
    (``x_reconst`` in ``loss = F.binary_cross_entropy(x_reconst.clamp_(1e-6, 1), x)``); else None.

    >>> [nested_inplace(s) for s in ast.parse("l = f(x.clamp_(0, 1), y)\\nl = f(x, x.clamp_(0, 1))").body]
    ['x', None]
    """
    calls = [n for n in ast.walk(statement) if isinstance(n, ast.Call) and inplace_call(n)]
    name = dotted_name(calls[0].func.value) if len(calls) == 1 and isinstance(calls[0].func, ast.Attribute) else None
    reads = [n for n in ast.walk(statement) if isinstance(n, (ast.Name, ast.Attribute)) and dotted_name(n) == name]
    return name if name is not None and len(reads) == 1 else None


def passes_inplace(statement: ast.stmt) -> bool:
    """Whether a statement passes ``inplace=...`` to a call (``nn.ReLU(inplace=True)``), or calls an in-place
    method inside another expression (``F.binary_cross_entropy(x.clamp_(1e-6, 1), y)``)."""
    return any(
        isinstance(n, ast.Call) and (any(k.arg == "inplace" for k in n.keywords) or inplace_call(n))
        for n in ast.walk(statement)
    )


def _filename(site: CallSite) -> str:
    return site.file


def _class_of(site: CallSite) -> str | None:
    tree = module_node(_filename(site))
    for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)) if tree else ():
        for function in cls.body:
            if isinstance(function, ast.FunctionDef) and function.name == site.function \
                    and function.lineno <= site.line <= (function.end_lineno or function.lineno):  # fmt: skip
                return cls.name
    return None


def _function_at(tree: ast.AST, site: CallSite) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
    for function in (n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))):
        if function.name == site.function and function.lineno <= site.line <= (function.end_lineno or function.lineno):
            return function
    return None


def _chain(trace: Trace, site_id: int | None) -> Iterator[CallSite]:
    """The site and the user lines that called it, innermost first."""
    site = trace.site(site_id)
    while site is not None:
        yield site
        site = trace.site(site.caller)
