"""What graphwatch reads of an autograd node by its class: its op, whether it accumulates a leaf's gradient,
its saved-tensor slots (cached per class: ``dir()`` is slow), and what each slot holds now.

Example::

    >>> import torch
    >>> from graphwatch.capture.graph.node_types import node_type, saved_data
    >>> y = torch.ones(2, requires_grad=True).exp()
    >>> info = node_type(y.grad_fn)
    >>> info.op, info.is_accumulate_grad, info.saved_attrs
    ('ExpBackward0', False, ('_raw_saved_result',))
    >>> [type(data).__name__ for data in saved_data(y.grad_fn, info)]  # (no session: no handle of graphwatch's)
    ['Tensor']
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from ..hooks.saved import SavedHandle
from ..hooks.saved_views import SavedTensor, raw_data

ACCUMULATE_GRAD = "torch::autograd::AccumulateGrad"


@dataclass(slots=True)
class NodeType:
    """What is cached per autograd node class."""

    op: str
    is_accumulate_grad: bool
    saved_attrs: tuple[str, ...]


_TYPES: dict[type, NodeType] = {}


def node_type(node: Any) -> NodeType:
    """The :class:`NodeType` of ``node``'s class."""
    cls = type(node)
    info = _TYPES.get(cls)
    if info is None:
        op = node.name()
        saved = tuple(a for a in dir(node) if a.startswith("_raw_saved_"))
        info = _TYPES[cls] = NodeType(op, op == ACCUMULATE_GRAD, saved)
    return info


def saved_data(node: Any, info: NodeType) -> Iterator[Any]:
    """What each saved-tensor slot of a node holds: our handle, a user hook's object, a tensor, or None."""
    for attr in info.saved_attrs:
        try:
            value = getattr(node, attr)
        except RuntimeError:
            continue
        for saved in value if isinstance(value, tuple) else (value,):
            yield raw_data(saved) if type(saved) is SavedTensor else None


def saved_handles(node: Any, info: NodeType | None = None) -> Iterator[SavedHandle]:
    """The graphwatch handles among a node's saved tensors (none once they are freed)."""
    for data in saved_data(node, info or node_type(node)):
        if type(data) is SavedHandle:
            yield data
