"""The codemods of the leak fixes (detach-state, detach-made, item, no-grad) on source text: each edit is made
where the fix belongs, keeps the user's formatting, comments and strings, is valid Python in the user's
names, and is refused (None) wherever it could be wrong."""

from __future__ import annotations

import pytest

from graphwatch.analysis.codemods import apply_edits
from graphwatch.analysis.codemods.detach import detach_statement
from graphwatch.analysis.codemods.expressions import edited_statement
from graphwatch.model import Edit


def detach_state(source: str, line: int, target: str, value_type: str, until: int | None) -> str | None:
    return apply_edits(source, [Edit("detach-state", "t.py", line, target, until=until, value_type=value_type)])


# ------------------------------------------------------------------ detach-state
@pytest.mark.parametrize(
    ("target", "value_type", "statement"),
    [
        ("h", "Tensor", "h = h.detach()"),
        ("hidden", "tuple[Tensor]", "hidden = tuple(h.detach() for h in hidden)"),
        ("h", "tuple[Tensor]", "h = tuple(t.detach() for t in h)"),  # the element's name is not the state's
        ("hidden", "list[Tensor]", "hidden = [h.detach() for h in hidden]"),
        ("states", "list[tuple[Tensor]]", "states = [tuple(h.detach() for h in layer) for layer in states]"),
        ("h, c", "Tensor", "h, c = h.detach(), c.detach()"),
        ("self.hidden", "Optional[Tensor]", "if self.hidden is not None: self.hidden = self.hidden.detach()"),
        ("x", "other", None),  # a dict, a namedtuple, mixed items: no statement graphwatch can vouch for
        ("h, c", "Optional[Tensor]", None),
        ("f(x)", "Tensor", None),  # not a name
    ],
)
def test_the_detach_statement_follows_the_type_the_value_had_when_it_ran(
    target: str, value_type: str, statement: str | None
) -> None:
    assert detach_statement(target, value_type) == statement


TBPTT = """\
h = torch.zeros(2, 8)
for step in range(4):  # the training loop
    opt.zero_grad()
    for t in range(3):
        x = torch.randn(2, 4)
        h = cell(x, h)  # carried
    loss = head(h).pow(2).mean()
    loss.backward()
"""


def test_a_state_made_in_an_inner_time_loop_is_detached_above_that_loop() -> None:
    """The whole sequence of a step still backpropagates: the detach goes before the loop over time steps."""
    edited = detach_state(TBPTT, 6, "h", "Tensor", until=8)
    assert edited == TBPTT.replace("    for t in range(3):", "    h = h.detach()\n    for t in range(3):")


def test_a_state_read_earlier_in_the_step_is_detached_before_that_read() -> None:
    source = TBPTT.replace("    opt.zero_grad()\n", "    opt.zero_grad()\n    logits = head(h)\n")
    edited = detach_state(source, 7, "h", "Tensor", until=9)
    assert edited == source.replace("    logits = head(h)\n", "    h = h.detach()\n    logits = head(h)\n")


WLM = """\
for batch, i in enumerate(range(0, n, bptt)):
    data, targets = get_batch(train_data, i)
    if args.model == 'Transformer':
        output = model(data)
    else:
        output, hidden = model(data, hidden)
    loss = criterion(output, targets)
    loss.backward()
"""


def test_a_state_used_in_one_branch_is_detached_in_that_branch() -> None:
    """Not before the ``if``: with the other model the name is never bound."""
    edited = detach_state(WLM, 6, "hidden", "tuple[Tensor]", until=8)
    assert edited == WLM.replace(
        "    else:\n", "    else:\n        hidden = tuple(h.detach() for h in hidden)\n"
    )


def test_a_state_returned_by_the_step_function_is_detached_in_the_loop_before_the_call() -> None:
    source = "for x in data:\n    loss, hidden = train_step(model, x, hidden)  # fed back\n    print(loss)\n"
    edited = detach_state(source, 2, "hidden", "tuple[Tensor]", until=2)
    assert edited == source.replace("    loss, hidden", "    hidden = tuple(h.detach() for h in hidden)\n    loss, hidden")


LIGHTNING = """\
class Model(LightningModule):
    def training_step(self, batch, batch_idx):
        x, y = batch
        out, self.hidden = self.lstm(x, self.hidden)  # the carried state
        return loss(out, y)
"""


def test_a_state_kept_on_the_module_that_starts_as_none_is_detached_first_in_its_step_only_when_set() -> None:
    edited = detach_state(LIGHTNING, 4, "self.hidden", "Optional[tuple[Tensor]]", until=None)
    assert edited == LIGHTNING.replace(
        "        out, self.hidden",
        "        if self.hidden is not None:\n            self.hidden = tuple(h.detach() for h in self.hidden)\n"
        "        out, self.hidden",
    )
    compile(edited or "", "t.py", "exec")


@pytest.mark.parametrize(
    ("line", "until", "value_type"),
    [
        (6, 12, "Tensor"),  # no loop holds both the state's line and the backward's
        (2, 8, "Tensor"),  # the state's line is the training loop's own header
        (6, 8, "other"),
    ],
)
def test_detach_state_is_refused_where_it_cannot_be_placed_or_built(line: int, until: int, value_type: str) -> None:
    assert detach_state(TBPTT, line, "h", value_type, until) is None


def test_detach_state_without_a_function_to_start_is_refused() -> None:
    assert detach_state("h = cell(x, h)\n", 1, "h", "Tensor", until=None) is None


# ------------------------------------------------------------------ detach-made
@pytest.mark.parametrize(
    ("source", "target", "made"),
    [
        ("self.target = gram_matrix(feature)  # the style target", "self.target",
         "self.target = gram_matrix(feature).detach()"),
        ("self.avg = 0.9 * self.avg + 0.1 * v.mean()", "self.avg", "self.avg = (0.9 * self.avg + 0.1 * v.mean()).detach()"),
        ("target: torch.Tensor = f(x)", "target", "target: torch.Tensor = f(x).detach()"),
        ("out, self.hidden = self.lstm(x)", "self.hidden", None),  # one element of a tuple: not this edit's
        ("self.target = f(x).detach()", "self.target", None),  # detached already
        ("self.other = f(x)", "self.target", None),
        # a line of several statements: the one that assigns the target, the others as they were
        ("global top, avg; avg = 0.9 * avg + 0.1 * loss", "avg", "global top, avg; avg = (0.9 * avg + 0.1 * loss).detach()"),
        ("n += 1; avg = f(x)  # smoothed", "avg", "n += 1; avg = f(x).detach()"),
        ("avg = f(x); avg = g(avg)", "avg", None),  # two statements assign it: which one keeps the graph is not told
    ],
)  # fmt: skip
def test_detach_made_detaches_the_value_the_line_assigns(source: str, target: str, made: str | None) -> None:
    assert edited_statement(Edit("detach-made", "t.py", 1, target, value_type="Tensor"), source) == made


def test_detach_made_keeps_the_comment_and_refuses_a_value_that_is_not_a_tensor() -> None:
    source = "class S:\n    def __init__(self, f):\n        self.target = gram(f)  # HERE\n"
    edited = apply_edits(source, [Edit("detach-made", "t.py", 3, "self.target", value_type="Tensor")])
    assert edited == source.replace("gram(f)  # HERE", "gram(f).detach()  # HERE")
    assert apply_edits(source, [Edit("detach-made", "t.py", 3, "self.target", value_type="tuple[Tensor]")]) is None


# ------------------------------------------------------------------ item
@pytest.mark.parametrize(
    ("source", "target", "kept"),
    [
        ("total_loss += loss", "loss", "total_loss += loss.item()"),
        ("losses.append(loss)  # keep (for plotting)", "loss", "losses.append(loss.item())"),
        ("hist.append(perte_ü * 2)", "perte_ü * 2", "hist.append((perte_ü * 2).item())"),
        ("total = total + loss", "loss", "total = total + loss.item()"),
        ("total = loss + total", "loss", "total = loss.item() + total"),
        ("self.outputs.append(out.mean())", "out.mean()", "self.outputs.append(out.mean().item())"),
        ("losses.append(loss)", "other", None),  # the line does not keep that
        ("x = f(loss)", "loss", None),  # assigns, does not add or append
        # a line of several statements is shown as written: each once, joined by one semicolon
        ("global top; curve.append(loss)", "loss", "global top; curve.append(loss.item())"),
    ],
)
def test_item_keeps_a_number_where_the_line_adds_or_appends(source: str, target: str, kept: str | None) -> None:
    assert edited_statement(Edit("item", "t.py", 1, target), source) == kept


SCRIPT = """\
import torch

losses = []  # every step's loss
total = 0.0
for step in range(8):
    loss = model(x).pow(2).mean()
    loss.backward()
    losses.append(loss)  # keep (for plotting)
    total = total + loss
print(f"last {losses[-1].item():.3f} of {len(losses)}, mean {sum(losses) / len(losses):.3f}")
print("total", total.item(), "# not a comment: total.item()")
"""


def test_item_takes_the_holders_item_calls_out_and_leaves_comments_and_strings_alone() -> None:
    edited = apply_edits(SCRIPT, [Edit("item", "t.py", 8, "loss")])
    assert edited == SCRIPT.replace("losses.append(loss)  #", "losses.append(loss.item())  #").replace(
        "losses[-1].item():", "losses[-1]:"
    )
    both = apply_edits(SCRIPT, [Edit("item", "t.py", 8, "loss"), Edit("item", "t.py", 9, "loss")])
    assert both is not None and "total = total + loss.item()\n" in both
    assert 'print("total", total, "# not a comment: total.item()")' in both


@pytest.mark.parametrize(
    "use",
    [
        "torch.stack(losses)",  # a tensor function of the list
        "[v.item() for v in losses]",  # the items used as tensors
        "losses[0].backward()",
    ],
)
def test_item_is_refused_where_the_holder_is_used_as_tensors(use: str) -> None:
    assert apply_edits(SCRIPT + f"{use}\n", [Edit("item", "t.py", 8, "loss")]) is None


def test_item_reads_the_holders_uses_in_its_own_scope_only() -> None:
    """Another function's ``total`` is another variable: its ``.item()`` stays."""
    source = (
        "def train():\n    total = 0\n    for x in data:\n        total += f(x)\n    print(total / len(data))\n\n"
        "def other(total):\n    return total.item()\n"
    )
    edited = apply_edits(source, [Edit("item", "t.py", 4, "f(x)")])
    assert edited == source.replace("total += f(x)", "total += f(x).item()")


# ------------------------------------------------------------------ no-grad
EVALUATION = """\
import torch

for epoch in range(3):
    train_one_epoch()
    for xv, yv in val_batches:  # the evaluation loop
        out = model(xv)
        history.append(loss_fn(out, yv))
        note = \"\"\"a string
that spans lines\"\"\"
"""


def test_no_grad_wraps_a_loop_that_only_evaluates_and_keeps_its_comments_and_strings() -> None:
    """Line 4 led to a backward when it ran: the epoch loop trains, the validation loop inside it does not."""
    edited = apply_edits(EVALUATION, [Edit("no-grad", "t.py", 6, training=[4])])
    assert edited is not None
    assert "    with torch.no_grad():\n        for xv, yv in val_batches:  # the evaluation loop\n" in edited
    assert "            out = model(xv)\n" in edited
    assert 'note = """a string\nthat spans lines"""' in edited  # the string's text is unchanged


def test_no_grad_wraps_only_the_statement_when_the_loop_holds_a_line_that_trained() -> None:
    edited = apply_edits(EVALUATION, [Edit("no-grad", "t.py", 6, training=[4, 7])])
    assert edited is not None
    assert "        with torch.no_grad():\n            out = model(xv)\n        history.append" in edited


def test_no_grad_does_not_wrap_a_loop_that_calls_a_function_of_the_file() -> None:
    """A function the file defines could train: only the evaluation loop inside goes under no_grad."""
    source = EVALUATION.replace("import torch\n", "import torch\n\n\ndef train_one_epoch():\n    pass\n\n")
    edited = apply_edits(source, [Edit("no-grad", "t.py", 11)])
    assert edited is not None and "\n    with torch.no_grad():\n        for xv, yv in val_batches:" in edited


def test_no_grad_needs_the_name_torch_bound_by_the_file() -> None:
    source = EVALUATION.replace("import torch\n", "from torch import nn\n")
    assert apply_edits(source, [Edit("no-grad", "t.py", 6)]) is None
    assert apply_edits(EVALUATION.replace("import torch\n", "import torch.nn as nn\n"), [Edit("no-grad", "t.py", 6)]) is None



def test_detach_state_is_refused_for_a_name_each_step_assigns_before_using_it() -> None:
    """``x`` is made anew as each step starts: detaching it there cuts nothing the step carries."""
    source = "for step in range(4):\n    x = torch.randn(2, 4)\n    for cell in cells:\n        x = cell(x)\n    x.sum().backward()\n"
    assert detach_state(source, 4, "x", "Tensor", until=5) is None


def test_item_edits_the_statement_that_keeps_the_value_on_a_line_of_several() -> None:
    source = "for x in data:\n    g_loss = f(x)\n    g_loss.backward(); losses.append(g_loss)  # two on a line\n"
    edited = apply_edits(source, [Edit("item", "t.py", 3, "g_loss")])
    assert edited == source.replace("losses.append(g_loss)", "losses.append(g_loss.item())")
