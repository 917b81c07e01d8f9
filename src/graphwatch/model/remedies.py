"""What a finding tells the user to do, as data: the edits, the lines that ran, and why it is safe.

A :class:`Remedy` is made by the analysis from what the session saw (which
line made a tensor, which backward consumed it, which optimizer owns the
parameters each backward reached).  Everything the user reads or applies is
made *from* it: the fix sentence (``Remedy.text``), the patch (a syntax-tree
edit of each :class:`Edit`, ``analysis.patches``) and the re-run check
(``graphwatch run --check-fixes``).  Nothing parses the sentence back.

A remedy with ``edits`` and ``mechanical=True`` is the whole fix: a patch is
made from it.  A remedy without edits, or not mechanical, is advice that needs
the user's judgement (which of two backwards to drop, whether both losses are
meant to reach a shared part); it gets no patch.

Example::

    >>> from graphwatch.model.remedies import Edit, Remedy
    >>> edit = Edit("detach-use", "main.py", 243, target="fake")
    >>> remedy = Remedy("detach `fake` where D's loss uses it", [edit], why="optimizerD owns none of netG's parameters",
    ...                 mechanical=True)
    >>> remedy.edits[0].where, remedy.patchable
    ('main.py:243', True)
"""

from __future__ import annotations

from dataclasses import dataclass, field

# Each kind of edit, and what it does to the line it names (``target`` is the expression, in the user's words).
EDIT_KINDS: dict[str, str] = {
    "detach-state": "insert `target = target.detach()` first in the training loop's body, before the statement "
    "holding `line` (a tuple or nested state is detached element by element; a state that may be None is kept)",
    "detach-use": "`target` -> `target.detach()` where the expression on `line` uses it (the loss that must not "
    "reach what made it)",
    "detach-made": "the value `line` assigns to `target` is detached where it is made",
    "own-copy": "the loss the backward on `line` backwards gets its own copy of the expression the line `until` "
    "assigns (two losses shared it), with `target` detached in that copy",
    "item": "`target` -> `target.item()` on `line` (only for a tensor of one element)",
    "no-grad": "the statement on `line` (or the evaluation loop holding it) runs under `with torch.no_grad():`",
    "enable-grad": "the statements from `line` to `until` run under `with torch.enable_grad():` (a loss computed "
    "inside a `no_grad` block that must be backwarded)",
    "create-graph": "`create_graph=True` added to the `torch.autograd.grad` call on `line`",
    "drop-retain": "`retain_graph=True` dropped from the backward on `line`",
    "retain-graph": "`retain_graph=True` added to the backward or `torch.autograd.grad` call on `line` (the earlier "
    "of two backwards that one optimizer's step needs both of)",
    "remove-statement": "the statement on `line` removed (a second backward of the same tensor)",
    "insert-before": "the statement `target` inserted before `line` (e.g. `optimizer.zero_grad()`)",
    "insert-after": "the statement `target` inserted after `line`, in the same block (e.g. `optimizer.zero_grad()` "
    "after the `optimizer.step()` of a step that accumulates several backwards)",
    "out-of-place": "the in-place operation on `line` made out of place (`x.relu_()` -> `x = x.relu()`, "
    "`inplace=True` -> `inplace=False`)",
}


# How an edit names the type a value had when it ran (``Edit.value_type``, ``NodeRecord.carried_type``):
# "Tensor"; "tuple[T]" / "list[T]" for a tuple or list whose items are all of type T (an LSTM's ``(h, c)`` is
# "tuple[Tensor]", a list of per-layer states "list[tuple[Tensor]]"); "Optional[T]" for a value of type T that
# the code that ran also sets to None (a state that starts as None); "other" for anything else.
VALUE_TYPES = ("Tensor", "tuple[...]", "list[...]", "Optional[...]", "other")


@dataclass(slots=True)
class Edit:
    """One change of one line of the user's code, named by the line that ran."""

    kind: str  # one of EDIT_KINDS
    file: str  # as the trace cites it (a CallSite's file)
    line: int  # the line that ran: the one the edit changes, or the one it is placed against
    target: str = ""  # the expression it applies to, as the user's code spells it: "fake", "hidden", "self.target"
    # "detach-state": the backward's line (the detach goes first in the loop holding both); "enable-grad": the
    # last line of the block; "own-copy": the line that assigns the shared expression
    until: int | None = None
    value_type: str = ""  # "detach-state", "detach-made": the value's type as it ran (see VALUE_TYPES)
    # "no-grad": the lines of the file where a backward or an optimizer step ran, or a call leading to one:
    # what holds one of them trains and is never put under no_grad
    training: list[int] = field(default_factory=list)

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}"


@dataclass(slots=True)
class Remedy:
    """One way to fix a finding: the sentence, the edits that make it, and the evidence that it is safe."""

    text: str  # the fix as the user reads it, in their own names (made from the edits, never parsed back)
    edits: list[Edit] = field(default_factory=list)  # [] for advice that needs the user's judgement
    why: str = ""  # what graphwatch saw that makes this safe (or the condition under which it is)
    mechanical: bool = False  # True: the edits are the whole fix, so a patch is made from them

    @property
    def patchable(self) -> bool:
        return self.mechanical and bool(self.edits)
