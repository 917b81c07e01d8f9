"""What the user's frames say about DistributedDataParallel's two reducer errors, read once DDP has raised.

- "Expected to mark a variable ready only once": a parameter's gradient hook fired twice in one iteration (a
  block run under two reentrant ``checkpoint`` calls with ``find_unused_parameters=True``, a parameter used
  in two backwards of one iteration).  torch names the parameter (index and name).
- "Expected to have finished reduction in the prior iteration": parameters got no gradient in the previous
  iteration (a branch that leaves them unused on this rank).  torch names their indices (their names only
  under ``TORCH_DISTRIBUTED_DEBUG``); the names come from the DDP wrapper, in the reducer's own order.

Nothing here runs on a step where nothing goes wrong: :func:`find_ddp_cause` is called with the error in hand,
from the frames its traceback keeps.  The lines cited are the forward's lines that use (or choose) the module
holding the parameters, read from the source of the user's ``forward``, and the line that builds the wrapper.

Example::

    >>> from graphwatch.capture.causes.ddp_frames import owner_of
    >>> owner_of(["heads.1.weight", "heads.1.bias"]), owner_of(["weight"])
    ('heads.1', None)
"""

from __future__ import annotations

import ast
import inspect
import re
from types import CodeType, FrameType, TracebackType
from typing import TYPE_CHECKING

import torch

from ...model.error_causes import DDPCause
from ..lines.callsite import is_user_file
from ..lines.frames import local_value, named_values
from ..lines.source import dotted_name, function_node
from .error_frames import traceback_frames

if TYPE_CHECKING:
    from ..recorder import Recorder

_READY_TWICE = "Expected to mark a variable ready only once"
_UNFINISHED = "Expected to have finished reduction in the prior iteration"
_TWICE_PARAMETER = re.compile(r"Parameter at index (\d+)(?: with name (\S+))? has been marked as ready twice")
_UNUSED_INDICES = re.compile(r"Parameter indices which did not receive grad for rank (\d+): ([\d ]+)")
_UNUSED_NAMES = re.compile(r"Parameters which did not receive grad for rank (\d+): ([^\n]+)")
_WRAPPERS = ("DistributedDataParallel", "DDP")


def ddp_error(exc: BaseException) -> str | None:
    """``"ready-twice"`` or ``"unused"`` for DDP's two reducer errors, else None.

    >>> ddp_error(RuntimeError("Expected to mark a variable ready only once. This error is caused by ..."))
    'ready-twice'
    """
    if not isinstance(exc, RuntimeError):
        return None
    text = str(exc)
    return "ready-twice" if _READY_TWICE in text else "unused" if _UNFINISHED in text else None


def owner_of(parameters: list[str]) -> str | None:
    """The dotted path of the deepest module that holds every one of ``parameters`` (None: the root)."""
    paths = [name.split(".")[:-1] for name in parameters]
    common: list[str] = []
    for parts in zip(*paths):
        if len(set(parts)) > 1:
            break
        common.append(parts[0])
    return ".".join(common) or None


def reducer_names(ddp: torch.nn.parallel.DistributedDataParallel) -> list[str]:
    """The names of the parameters DDP reduces, in its reducer's order (``_build_params_for_reducer``: the
    parameters that require grad, module by module, shared ones once, ignored ones left out)."""
    ignored: set[str] = getattr(ddp, "parameters_to_ignore", set())
    names: list[str] = []
    seen: set[int] = set()
    for module_name, module in ddp.module.named_modules():
        for name, parameter in module.named_parameters(recurse=False):
            full = f"{module_name}.{name}" if module_name else name
            if parameter.requires_grad and f"{module_name}.{name}" not in ignored and id(parameter) not in seen:
                seen.add(id(parameter))
                names.append(full)
    return names


def _message_parameters(error: str, text: str, names: list[str]) -> tuple[list[str], int | None]:
    """The parameters torch's message names (by name when it gives them, else by index into ``names``), and
    the rank it names."""
    def by_index(index: str) -> str:
        return names[int(index)] if int(index) < len(names) else f"parameter {index}"

    if error == "ready-twice":
        found = _TWICE_PARAMETER.search(text)
        return ([found.group(2) or by_index(found.group(1))] if found else []), None
    named = _UNUSED_NAMES.search(text)
    if named:
        return [n.strip() for n in named.group(2).split(",") if n.strip()], int(named.group(1))
    indices = _UNUSED_INDICES.search(text)
    if indices is None:
        return [], None
    return [by_index(i) for i in indices.group(2).split()], int(indices.group(1))


def _wrapper(frames: list[FrameType]) -> tuple[torch.nn.parallel.DistributedDataParallel | None, str | None]:
    """The DDP wrapper that raised: ``self`` of DDP's own frame, else the first one a user frame holds; and its
    name in the user's frames."""
    own = (local_value(f, "self") for f in frames if not is_user_file(f.f_code.co_filename))
    held = (value for f in frames if is_user_file(f.f_code.co_filename) for _, value in named_values(f))
    found = (value for source in (own, held) for value in source)
    ddp = next((v for v in found if isinstance(v, torch.nn.parallel.DistributedDataParallel)), None)
    return ddp, _name_of(frames, ddp) if ddp is not None else None


def _name_of(frames: list[FrameType], value: object) -> str | None:
    for frame in frames:
        if is_user_file(frame.f_code.co_filename):
            for name, held in named_values(frame):
                if held is value and not name.startswith("_"):
                    return name
    return None


def _uses(recorder: Recorder, root: torch.nn.Module, owner: str | None) -> tuple[list[int], str | None, bool]:
    """The lines of a user ``forward`` that use the module at ``owner`` (``self.block``, ``self.heads[task]``),
    from the deepest module on its path whose forward names it; how they name it (``self.heads``); and whether
    one is a reentrant checkpoint."""
    found: list[tuple[int, str]] = []
    code, used_as = None, None
    module = root
    for part in owner.split(".") if owner else []:
        forward = getattr(type(module), "forward", None)
        forward_code = getattr(forward, "__code__", None)
        if not part.isdigit() and forward_code is not None and is_user_file(forward_code.co_filename):
            lines = _attribute_lines(forward_code, part)
            if lines:
                found, code, used_as = lines, forward_code, f"self.{part}"
        child = getattr(module, part, None) if not part.isdigit() else module._modules.get(part)
        if not isinstance(child, torch.nn.Module):
            break
        module = child
    if code is None:
        return [], None, False
    reentrant = any("checkpoint" in text and "use_reentrant=True" in text.replace(" ", "") for _, text in found)
    return [recorder.sites.from_code(code, line) for line, _ in found], used_as, reentrant


def _attribute_lines(code: CodeType, attribute: str) -> list[tuple[int, str]]:
    """(line, source) of each line of the function of ``code`` that reads ``self.<attribute>``."""
    tree = function_node(code)
    if tree is None:
        return []
    numbers = sorted({node.lineno for node in ast.walk(tree)
                      if isinstance(node, ast.Attribute) and dotted_name(node) == f"self.{attribute}"})  # fmt: skip
    try:
        source, first = inspect.getsourcelines(code)
    except (OSError, TypeError):
        return [(n, "") for n in numbers]
    return [(n, source[n - first] if 0 <= n - first < len(source) else "") for n in numbers]


def _built_at(recorder: Recorder, frames: list[FrameType]) -> int | None:
    """The line of a user frame's function that calls ``DistributedDataParallel(...)`` (or ``DDP(...)``)."""
    for frame in frames:
        code = frame.f_code
        tree = function_node(code) if is_user_file(code.co_filename) else None
        calls = [node.lineno for node in ast.walk(tree) if isinstance(node, ast.Call)
                 and (dotted_name(node.func) or "").split(".")[-1] in _WRAPPERS] if tree else []  # fmt: skip
        if calls:
            return recorder.sites.from_code(code, calls[0])
    return None


def find_ddp_cause(recorder: Recorder, exc: BaseException, tb: TracebackType | None) -> DDPCause | None:
    """What the frames kept by ``tb`` say about DDP's reducer error ``exc``; None for any other error."""
    error = ddp_error(exc)
    if error is None:
        return None
    entries = traceback_frames(tb)
    frames = [frame for frame, _ in entries]
    user = [(frame, line) for frame, line in entries if is_user_file(frame.f_code.co_filename)]
    ddp, model = _wrapper(frames)
    names = reducer_names(ddp) if ddp is not None else []
    parameters, rank = _message_parameters(error, str(exc), names)
    owner = owner_of(parameters) if parameters else None
    uses, used_as, reentrant = _uses(recorder, ddp.module, owner) if ddp is not None else ([], None, False)
    return DDPCause(
        error, recorder.sites.from_code(user[0][0].f_code, user[0][1]) if user else None,
        rank=rank if rank is not None else recorder.trace.rank, model=model, parameters=parameters, owner=owner,
        uses=uses, used_as=used_as, reentrant=reentrant,
        find_unused=bool(getattr(ddp, "find_unused_parameters", False)),
        built_at=_built_at(recorder, [frame for frame, _ in user][::-1]),
    )
