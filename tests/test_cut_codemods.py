"""The codemods of the error fixes (detach-use, create-graph, retain-graph, remove-statement, enable-grad,
out-of-place):
each edit keeps the file's formatting and comments, and refuses (None) where the line is not what it expects."""

from __future__ import annotations

import ast

import pytest

from graphwatch.analysis.codemods import apply_edits
from graphwatch.model import Edit

LOOP = """\
import torch
for x, target in data:
    fake = netG(x)
    output = netD(fake)  # D on fakes
    loss = crit(netD(fake), one) + fake.pow(2).mean()
    forces = -torch.autograd.grad(energy.sum(), pos)[0]  # forces
    grads = torch.autograd.grad(
        loss, params,
    )
    loss.backward()
    if ok:
        loss.backward()
    with torch.no_grad():
        out = model(x)  # evaluate
        adv = attack(out)

        adv_loss = crit(model(adv), target)
    y = self.fake + fake.detach()
"""


def changed(source: str, edit: Edit) -> list[str] | None:
    """The lines ``edit`` changes, as they read after it (None: refused)."""
    edited = apply_edits(source, [edit])
    if edited is None:
        return None
    ast.parse(edited)  # every patch is Python
    before = source.splitlines()
    return [line for line in edited.splitlines() if line not in before]


def test_detach_use_detaches_the_one_use_and_keeps_the_comment():
    assert changed(LOOP, Edit("detach-use", "t.py", 4, "fake")) == ["    output = netD(fake.detach())  # D on fakes"]


@pytest.mark.parametrize(("line", "target"), [(5, "fake"), (3, "fake"), (18, "fake"), (4, "real")])
def test_detach_use_refuses_two_uses_a_store_an_already_detached_use_and_an_absent_name(line, target):
    assert changed(LOOP, Edit("detach-use", "t.py", line, target)) is None


def test_detach_use_of_an_attribute_leaves_the_plain_name_alone():
    assert changed(LOOP, Edit("detach-use", "t.py", 18, "self.fake")) == ["    y = self.fake.detach() + fake.detach()"]


def test_create_graph_is_added_to_the_grad_call_also_over_several_lines():
    assert changed(LOOP, Edit("create-graph", "t.py", 6)) == [
        "    forces = -torch.autograd.grad(energy.sum(), pos, create_graph=True)[0]  # forces"
    ]
    assert changed(LOOP, Edit("create-graph", "t.py", 8)) == ["        loss, params, create_graph=True,"]
    assert changed("g = torch.autograd.grad(y, x, create_graph=False)\n", Edit("create-graph", "t.py", 1)) == [
        "g = torch.autograd.grad(y, x, create_graph=True)"
    ]


@pytest.mark.parametrize("source", ["loss.backward()\n", "g = torch.autograd.grad(y, x, **options)\n"])
def test_create_graph_refuses_a_line_without_grad_and_a_mapping_that_may_hold_it(source):
    assert changed(source, Edit("create-graph", "t.py", 1)) is None


def test_retain_graph_is_added_to_a_backward_or_a_grad_call_and_set_where_it_is_false():
    assert changed(LOOP, Edit("retain-graph", "t.py", 10)) == ["    loss.backward(retain_graph=True)"]
    assert changed(LOOP, Edit("retain-graph", "t.py", 6)) == [
        "    forces = -torch.autograd.grad(energy.sum(), pos, retain_graph=True)[0]  # forces"
    ]
    assert changed("loss.backward(retain_graph=False)  # x\n", Edit("retain-graph", "t.py", 1)) == [
        "loss.backward(retain_graph=True)  # x"
    ]


@pytest.mark.parametrize("source", ["y = model(x)\n", "loss.backward(**options)\n", "a.backward(); b.backward()\n"])
def test_retain_graph_refuses_a_line_without_one_backward_and_a_mapping_that_may_hold_it(source):
    assert changed(source, Edit("retain-graph", "t.py", 1)) is None


def test_remove_statement_removes_a_backward_and_leaves_pass_in_a_block_it_empties():
    assert apply_edits(LOOP, [Edit("remove-statement", "t.py", 10)]) == LOOP.replace("    loss.backward()\n    if", "    if")
    assert changed(LOOP, Edit("remove-statement", "t.py", 12)) == ["        pass"]


@pytest.mark.parametrize("line", [3, 2, 11])  # an assignment, a loop header, an if
def test_remove_statement_removes_only_a_backward(line):
    assert changed(LOOP, Edit("remove-statement", "t.py", line)) is None


@pytest.mark.parametrize(
    ("line", "after"),
    [
        ("cur = total / n; loss.backward()  # log", "cur = total / n  # log"),
        ("loss.backward(); cur = total / n", "cur = total / n"),
        ("a = 1; loss.backward(); b = 2", "a = 1; b = 2"),
    ],
)
def test_remove_statement_removes_the_backward_beside_other_statements_on_its_line(line, after):
    source = f"for x in data:\n    loss = f(x)\n    {line}\n"
    assert changed(source, Edit("remove-statement", "t.py", 3)) == [f"    {after}"]


@pytest.mark.parametrize("line", ["a.backward(); b.backward()", "cur = total / n; log(loss)"])
def test_remove_statement_refuses_a_line_with_two_backwards_or_none(line):
    assert changed(f"{line}\n", Edit("remove-statement", "t.py", 1)) is None


def test_enable_grad_wraps_whole_statements_of_one_block_and_reindents_them():
    edited = apply_edits(LOOP, [Edit("enable-grad", "t.py", 15, until=17)])
    assert edited is not None and (
        "        out = model(x)  # evaluate\n"
        "        with torch.enable_grad():\n"
        "            adv = attack(out)\n\n"
        "            adv_loss = crit(model(adv), target)\n"
    ) in edited


@pytest.mark.parametrize(("source", "line", "until"), [
    (LOOP, 14, 18),  # the last line is in the outer block
    (LOOP.replace("import torch\n", "import numpy\n"), 15, 17),  # no torch to name
])
def test_enable_grad_refuses_lines_across_blocks_and_a_file_without_torch(source, line, until):
    assert changed(source, Edit("enable-grad", "t.py", line, until=until)) is None


MODULE = """\
class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.drop = nn.Dropout(0.1, inplace=True)  # regularise
        self.net = nn.Sequential(
            nn.Sigmoid(),
            nn.ReLU(inplace=True),
        )

    def forward(self, att, x):
        att[:, :, 0, :] = 0  # mask the first key
        x.relu_()
        x *= 1 if self.training else 2
        y = F.relu(x, inplace=True)
        F.relu(x, inplace=True)
        x.requires_grad_()
        return att
"""


@pytest.mark.parametrize(("line", "target", "after"), [
    (4, "", ["        self.drop = nn.Dropout(0.1, inplace=False)  # regularise"]),
    (7, "", ["            nn.ReLU(inplace=False),"]),
    (11, "att", ["        att = att.clone()"]),
    (12, "x", ["        x = x.relu()"]),
    (13, "x", ["        x = x * (1 if self.training else 2)"]),
    (14, "x", ["        y = F.relu(x, inplace=False)"]),
])
def test_out_of_place_forms(line, target, after):
    assert changed(MODULE, Edit("out-of-place", "t.py", line, target)) == after


@pytest.mark.parametrize(("line", "target"), [(15, "x"), (16, "x"), (12, "y"), (17, "att")])
def test_out_of_place_refuses_a_bare_inplace_call_a_method_with_no_out_of_place_twin_and_other_names(line, target):
    assert changed(MODULE, Edit("out-of-place", "t.py", line, target)) is None
