"""A tensor kept as an attribute, made on another line than the one that stores it (issue 39's neural-style
content target: ``content = ContentLoss(features(content_img))``, kept by ``self.target = target`` in
``__init__``): the finding names the store, as the class spells it, and patches it with ``.detach()`` only
where that is provably safe (one store, in ``__init__``, of a value that reaches nothing an optimizer trains).
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
from test_error_remedies import HEAD, edits, line, patched_twin, printed, run_watched, write

from graphwatch.capture.causes.attribute_stores import attribute_store

pytestmark = pytest.mark.usefixtures("no_session_left")

CONTENT = HEAD + """\
class ContentLoss(nn.Module):
    def __init__(self, target):
        super().__init__()
        self.target = target  # at: store

    def forward(self, x):
        self.loss = (x - self.target).pow(2).mean()
        return x


features = nn.Sequential(nn.Linear(6, 6), nn.Tanh())
content_img = torch.randn(4, 6)
content = ContentLoss(features(content_img))  # at: made
image = content_img.clone().requires_grad_(True)
optimizer = torch.optim.Adam([image], lr=0.05)
for step in range(3):
    optimizer.zero_grad()
    content(features(image))
    content.loss.backward()
    optimizer.step()
print(f"{image.detach().sum().item():.6f}")
"""
CONTENT_FIXED = CONTENT.replace("self.target = target  # at: store", "self.target = target.detach()  # at: store")


def test_a_content_target_is_named_and_detached_at_the_store_in_init(tmp_path: Path) -> None:
    script = write(tmp_path, CONTENT)
    finding = run_watched(script)
    assert f"`self.target` made at {script}:{line(CONTENT, 'store')}" in finding.message
    assert finding.remedies[0].mechanical
    assert edits(finding)[0] == ("detach-made", line(CONTENT, "store"), "self.target")
    assert line(CONTENT, "made") not in [e.line for r in finding.remedies for e in r.edits]
    assert printed(patched_twin(tmp_path, CONTENT, finding)) == printed(write(tmp_path, CONTENT_FIXED, "fixed.py"))


def test_a_target_made_from_trained_parameters_is_named_at_its_store_but_not_patched(tmp_path: Path) -> None:
    """The optimizer trains ``features`` too: whether a gradient should flow through the kept target is the
    user's call, so the store is named with advice, never a patch."""
    source = CONTENT.replace("torch.optim.Adam([image], lr=0.05)", "torch.optim.Adam([image, *features.parameters()], lr=0.05)")
    finding = run_watched(write(tmp_path, source))
    assert f":{line(source, 'store')} (`self.target = target  # at: store`)" in finding.message
    assert not any(remedy.mechanical for remedy in finding.remedies)


def test_a_target_stored_by_two_methods_has_no_one_store(tmp_path: Path) -> None:
    source = CONTENT.replace("    def forward(self, x):", "    def retarget(self, target):\n        self.target = target\n\n"
                             "    def forward(self, x):")  # fmt: skip
    finding = run_watched(write(tmp_path, source))
    assert line(source, "store") not in [e.line for r in finding.remedies for e in r.edits]
    assert f":{line(source, 'store')} " not in finding.message


class Target:
    def __init__(self, value: object) -> None:
        self.value = value


class Subclass(Target):
    pass


class SetLater:
    def __init__(self) -> None:
        self.value = None

    def set(self, value: object) -> None:
        self.value = value


class SetOutsideInit:
    def set(self, value: object) -> None:
        self.value = value


class CachedByProperty:
    """Stores ``self.value`` in ``__init__`` (None) and again in a property that caches it."""

    def __init__(self) -> None:
        self.value = None

    @property
    def cached(self) -> int:
        if self.value is None:
            self.value = 1
        return self.value


class CachedByCachedProperty:
    def __init__(self) -> None:
        self.value = None

    @functools.cached_property
    def cached(self) -> int:
        self.value = 1
        return 1


def test_a_store_in_a_property_counts_so_an_init_none_is_not_the_one_store() -> None:
    """The cached tensor of ``examples/cached_param_tensor_bug.py`` is stored by a property: the ``= None`` of
    ``__init__`` is not where its graph went in."""
    assert attribute_store(CachedByProperty(), "value") is None
    assert attribute_store(CachedByCachedProperty(), "value") is None


def test_the_store_is_the_one_init_line_of_the_objects_classes() -> None:
    store = attribute_store(Subclass(1), "value")  # found in the user's base class
    assert store is not None and store[0] is Target.__init__.__code__
    assert store[1] == Target.__init__.__code__.co_firstlineno + 1
    assert attribute_store(SetLater(), "value") is None  # two statements store it
    assert attribute_store(SetOutsideInit(), "value") is None  # not in __init__: it may not have run
    assert attribute_store(Target(1), "other") is None
