"""The codemod engine: edits made on the syntax tree keep the file's formatting and comments, and an edit
that cannot be made safely leaves no patch (None), never a guess."""

from __future__ import annotations

import pytest

from graphwatch.analysis.codemods import CODEMODS, apply_edits, codemod
from graphwatch.model import EDIT_KINDS, Edit

LOOP = """\
for step, (x, y) in enumerate(loader):  # the loop
    loss = model(x).sub(y).pow(2).mean()
    loss.backward(retain_graph=True)   # a comment that stays
    opt.step()
"""


def test_dropping_retain_graph_keeps_spacing_and_the_trailing_comment():
    edited = apply_edits(LOOP, [Edit("drop-retain", "train.py", 3)])
    assert edited == LOOP.replace("loss.backward(retain_graph=True)", "loss.backward()")


@pytest.mark.parametrize("call", ["f(a, retain_graph=True, create_graph=False)", "f(a,\n  retain_graph=True)"])
def test_dropping_retain_graph_from_another_call_shape(call):
    edited = apply_edits(f"{call}\n", [Edit("drop-retain", "t.py", 1)])
    if "\n  " in call:  # a statement over two lines is not the simple statement the edit names: no patch
        assert edited is None
    else:
        assert edited == "f(a, create_graph=False)\n"


@pytest.mark.parametrize("line", [1, 2, 4])  # the loop's header, a line without retain_graph, another line
def test_an_edit_whose_line_does_not_hold_what_it_changes_is_refused(line):
    assert apply_edits(LOOP, [Edit("drop-retain", "train.py", line)]) is None


def test_edits_apply_from_the_last_line_up_so_each_names_the_line_that_ran():
    edited = apply_edits(LOOP, [Edit("insert-before", "train.py", 2, "opt.zero_grad()"), Edit("drop-retain", "train.py", 3)])
    assert edited == LOOP.replace("    loss = model", "    opt.zero_grad()\n    loss = model").replace(
        "backward(retain_graph=True)", "backward()"
    )


def test_an_inserted_statement_that_is_not_python_is_refused():
    assert apply_edits(LOOP, [Edit("insert-before", "train.py", 2, "opt.zero_grad(")]) is None


def test_a_file_that_does_not_parse_and_an_unknown_kind_leave_no_patch():
    assert apply_edits("def f(:\n    pass\n", [Edit("drop-retain", "t.py", 1)]) is None
    assert apply_edits(LOOP, [Edit("no-such-kind", "t.py", 1)]) is None


def test_only_known_kinds_can_be_registered():
    with pytest.raises(ValueError, match="unknown edit kind"):
        codemod("rewrite-everything")
    assert set(CODEMODS) <= set(EDIT_KINDS)


def test_a_carried_states_fix_derived_at_every_step_end_walks_the_file_once_and_finds_its_tree_kept(monkeypatch):
    """A carried graph's finding is refreshed at step ends, and its fix derived again each time: the file is
    walked once per kind of node asked for (a LibCST walk costs a second of CPU in a file of a few hundred lines,
    ten such derivations a run), and the tree kept for the file is found from its module without writing the
    file's code out again."""
    from graphwatch.analysis.codemods import detach, file_tree, module_tree

    source = (
        "import torch\n\ndef init_hidden(lstm):\n    return (torch.zeros(1), torch.zeros(1)) if lstm else torch.zeros(1)\n\n"
        "hidden = init_hidden(True)\nfor x in data:\n    hidden = model(x, hidden)\n    loss(hidden).backward()\n"
    )
    tree = file_tree(source)
    walked: list[type] = []
    walk = detach._walk

    def counted(root, kind):
        walked.append(kind)
        return walk(root, kind)

    monkeypatch.setattr(detach, "_walk", counted)
    detach._file_nodes.cache_clear()
    answers = {detach.state_statement(tree.module, "hidden", "Tensor") for _ in range(5)}
    assert len(answers) == 1 and next(iter(answers))[0] is not None  # (the same fix each time)
    assert sorted(kind.__name__ for kind in walked if kind is not detach.cst.Return) == ["Assign", "FunctionDef"]
    assert module_tree(tree.module) is tree and file_tree(source) is tree
