"""What graphwatch saw, from the user's frames, about some of torch's errors, as plain data.

The capture side (``capture/causes/error_frames.py``) looks at the frames once torch has raised (never before), and
the analysis (``analysis/torch_errors.py``) makes the finding from what it hands over:

- :class:`NonScalarCause`: "grad can be implicitly created only for scalar outputs";
- :class:`UnusedInputCause`: "... appears to not have been used in the graph" (``torch.autograd.grad``);
- :class:`LeafInplaceCause`: "a leaf Variable that requires grad is being used in an in-place operation";
- :class:`DDPCause`: DistributedDataParallel's "Expected to mark a variable ready only once" and "Expected to
  have finished reduction in the prior iteration" (``capture/causes/ddp_frames.py``, ``analysis/ddp_errors.py``).

Site fields are CallSite ids of the trace.

Example::

    >>> from graphwatch.model.error_causes import SeenTensor, UnusedInputCause
    >>> cause = UnusedInputCause(call_at=3, index=0, name="x_copy", seen=[SeenTensor("x", made_at=1)])
    >>> cause.seen[0].name, cause.seen[0].requires_grad
    ('x', False)
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class NonScalarCause:
    """A backward without a gradient from a tensor of more than one element."""

    backward_at: int | None  # the failing backward's line
    name: str | None = None  # the backwarded tensor as the user's frames name it ("loss")
    shape: tuple[int, ...] = ()
    made_at: int | None = None  # the line that made it (its grad_fn's, else the assignment of ``name``)
    unreduced_op: str | None = None  # the loss node of its graph that ran with reduction='none' ("MseLossBackward0")
    criterion: str | None = None  # the module built with reduction='none' that made it, as the frames name it
    criterion_type: str | None = None  # its class ("MSELoss")
    criterion_only: bool = False  # named as the only such module the frames hold (not from the loss's line)
    built_at: int | None = None  # the line that assigns the criterion


@dataclass(slots=True)
class SeenTensor:
    """A tensor the outputs of a ``torch.autograd.grad`` were computed from, that looks like the unused input."""

    name: str  # as the user's frames name it
    made_at: int | None = None  # the line that assigns it
    used_at: int | None = None  # the line whose op of the outputs' graph saved it (the model ran on it there)
    requires_grad: bool = False


@dataclass(slots=True)
class UnusedInputCause:
    """An input of ``torch.autograd.grad`` that the outputs' graph does not reach."""

    call_at: int | None  # the ``torch.autograd.grad`` line
    index: int  # the input's position among the inputs
    count: int = 1  # how many inputs were given
    name: str | None = None  # the input as the user's frames name it
    shape: tuple[int, ...] = ()
    made_at: int | None = None  # the line that made it
    seen: list[SeenTensor] = field(default_factory=list)  # what the outputs were computed from instead


@dataclass(slots=True)
class LeafInplaceCause:
    """A leaf tensor that requires grad changed in place outside ``torch.no_grad()``."""

    changed_at: int | None  # the line of the statement that changed it
    target: str | None = None  # the tensor as that line spells it ("p")
    parameter: str | None = None  # the module parameter it is, as the frames name it ("model.fc.weight")
    is_parameter: bool = False  # an ``nn.Parameter`` or a module's parameter: an update of what trains
    shape: tuple[int, ...] = ()


@dataclass(slots=True)
class DDPCause:
    """One of DistributedDataParallel's two reducer errors, at its cause (``capture/causes/ddp_frames.py``)."""

    error: str  # "ready-twice" (a gradient hook fired twice) or "unused" (parameters got no gradient)
    call_at: int | None  # the user's line the error left: the backward, or the next forward
    rank: int | None = None
    model: str | None = None  # the DDP wrapper as the user's frames name it ("model")
    parameters: list[str] = field(default_factory=list)  # as DDP names them, relative to its module
    owner: str | None = None  # the submodule that holds them all ("heads.1")
    uses: list[int] = field(default_factory=list)  # the forward's lines that use (or choose) the owner
    used_as: str | None = None  # how those lines name it ("self.heads")
    reentrant: bool = False  # a use is a reentrant ``checkpoint`` (one backward of its own per call)
    built_at: int | None = None  # the line that builds the DistributedDataParallel
    find_unused: bool = False  # built with find_unused_parameters=True
