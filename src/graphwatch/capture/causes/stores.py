"""The line that stores a carried state on the object that holds it: ``self.state = ...`` in a method of the
object's class, where a graph carried from step to step is kept (a user object's running value, a spiking
neuron's membrane ``self.mem``, a module's running statistic kept in a buffer), found from a frame that names the
object.

Example::

    >>> import torch
    >>> class Neuron(torch.nn.Module):
    ...     def forward(self, x):
    ...         self.mem = self.mem * 0.9 + x
    >>> net = torch.nn.Sequential(Neuron())
    >>> net[0].mem = torch.zeros(1)
    >>> import sys
    >>> _submodule_holding(sys._getframe(), "mem", net[0].mem) is net[0]
    True
"""

from __future__ import annotations

from types import FrameType
from typing import TYPE_CHECKING, Any

import torch

from ..lines.frames import local_value, named_values
from .attribute_stores import self_stores
from .held_values import _of_a_user_class

if TYPE_CHECKING:
    from ..recorder import Recorder


def renewing_site(recorder: Recorder, frame: FrameType, name: str, value: Any) -> int | None:
    """For ``obj.state`` of an object of the user's own class that is not a module (a module's state is
    named by the line that made its graph, unless it is a registered buffer): the line of a method of that
    class, other than ``__init__``, that assigns ``self.state``.  Also for ``self.state`` of a submodule of a
    module the frame holds (a spiking neuron's ``self.mem``, stored in its ``forward`` at every time step), whose
    graph's line may not be known (an op that saves no tensor: ``self.mem = self.beta * self.mem + x``): the
    store on the object.  A registered buffer counts (a running statistic renewed outside ``no_grad``), and so
    does a framework's method whose ``self`` is the module above that submodule (Lightning's ``backward``)."""
    head, _, attr = name.partition(".")
    if "." in attr:
        return None
    local = head in frame.f_code.co_varnames
    owner = local_value(frame, head) if local else frame.f_globals.get(head)
    if head == "self" and (not local or (isinstance(owner, torch.nn.Module) and not holds(owner, attr, value))):
        found = _submodule_holding(frame, attr, value)  # (a framework's method: its `self` holds the submodule)
        return _storing_site(recorder, found, attr) if found is not None else None
    if isinstance(owner, torch.nn.Module):
        return _storing_site(recorder, owner, attr) if owner._buffers.get(attr) is value else None
    return _storing_site(recorder, owner, attr) if _of_a_user_class(owner) else None


def _submodule_holding(frame: FrameType, attr: str, value: Any) -> torch.nn.Module | None:
    """The submodule, of a module the frame names, whose attribute ``attr`` is ``value`` (not the module itself:
    the carriers name its attributes through the frame's name)."""
    for _, top in named_values(frame):
        if isinstance(top, torch.nn.Module):
            held = (m for m in top.modules() if m is not top and holds(m, attr, value))
            found = next(held, None)
            if found is not None:
                return found
    return None


def a_buffer(frame: FrameType, tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` is a registered buffer of a module the frame names (or of one of its submodules)."""
    return any(
        buffer is tensor
        for _, value in named_values(frame) if issubclass(type(value), torch.nn.Module)
        for module in value.modules() for buffer in module._buffers.values()
    )  # fmt: skip


def holds(module: torch.nn.Module, attr: str, value: Any) -> bool:
    """Whether ``module``'s own attribute or registered buffer ``attr`` is ``value`` (the very object)."""
    return vars(module).get(attr) is value or module._buffers.get(attr) is value


def _storing_site(recorder: Recorder, owner: object, attr: str) -> int | None:
    """The last line of the first method of ``owner``'s classes, other than ``__init__``, that assigns
    ``self.<attr>``; None when none does."""
    stores = [(code, line) for code, line in self_stores(owner, attr) if code.co_name != "__init__"]
    if not stores:
        return None
    first = stores[0][0]
    return recorder.sites.from_code(first, max(line for code, line in stores if code is first))
