"""Hugging Face ``Trainer`` under ``GraphwatchCallback``: a 2-layer GPT-2 built from a config (nothing is
downloaded), trained a few steps on CPU.

A plain run reports nothing; a ``compute_loss`` override that keeps each step's loss tensor on the
trainer is named with its line; steps are optimizer steps (gradient accumulation included); the
callback changes no parameter.
"""

from __future__ import annotations

import inspect
import os
from pathlib import Path

import pytest
import torch

os.environ["HF_HUB_OFFLINE"] = "1"  # nothing comes from a model hub (set before transformers is imported)
pytest.importorskip("transformers")
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

import graphwatch
from graphwatch.integrations.transformers import GraphwatchCallback


class Tokens(torch.utils.data.Dataset):
    def __init__(self, n: int = 16) -> None:
        self.ids = torch.randint(0, 100, (n, 12), generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


class KeepsLosses(Trainer):
    """Keeps every step's loss tensor on the trainer (for a plot later): the graphs stay alive."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self.losses: list[torch.Tensor] = []

    def compute_loss(self, model, inputs, return_outputs=False, **kwargs):  # type: ignore[no-untyped-def]
        loss = super().compute_loss(model, inputs, return_outputs=return_outputs, **kwargs)
        self.losses.append(loss)  # the kept losses
        return loss


class CarriesState(Trainer):
    """Feeds each step's loss into the next step's without detaching it: the second backward fails."""

    carried: torch.Tensor | None = None

    def compute_loss(self, model, inputs, return_outputs=False, **kwargs):  # type: ignore[no-untyped-def]
        loss = super().compute_loss(model, inputs, return_outputs=return_outputs, **kwargs)
        if self.carried is not None:
            loss = loss + 0.1 * self.carried
        self.carried = loss  # the carried loss
        return loss


def line_of(cls: type, text: str) -> str:
    lines, first = inspect.getsourcelines(cls)
    return f"{os.path.relpath(__file__)}:{next(first + i for i, line in enumerate(lines) if text in line)}"


def model() -> GPT2LMHeadModel:
    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100, n_positions=16))


def train(tmp_path: Path, callback: GraphwatchCallback | None, trainer: type[Trainer] = Trainer,
          accumulation: int = 1) -> Trainer:  # fmt: skip
    args = TrainingArguments(
        output_dir=str(tmp_path / "run"), max_steps=4, per_device_train_batch_size=2, learning_rate=1e-3,
        gradient_accumulation_steps=accumulation, save_strategy="no", report_to=[], logging_strategy="no",
        use_cpu=True, disable_tqdm=True, dataloader_num_workers=0, seed=0,
    )  # fmt: skip
    run = trainer(model=model(), args=args, train_dataset=Tokens(), callbacks=[callback] if callback else [])
    run.train()
    return run


@pytest.fixture(scope="module")
def plain_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, GraphwatchCallback, Trainer]:
    """One plain run under the callback, 2 micro-batches a step: its folder, its callback and its trainer."""
    folder, callback = tmp_path_factory.mktemp("plain"), GraphwatchCallback()
    return folder, callback, train(folder, callback, accumulation=2)


@pytest.fixture(scope="module")
def keeps_losses_run(tmp_path_factory: pytest.TempPathFactory) -> GraphwatchCallback:
    """One run of ``KeepsLosses`` under the callback; its callback."""
    callback = GraphwatchCallback()
    train(tmp_path_factory.mktemp("keeps"), callback, trainer=KeepsLosses)
    return callback


@pytest.mark.xdist_group("transformers-plain-run")  # (one worker makes the shared run)
def test_a_plain_trainer_run_reports_nothing_and_steps_are_optimizer_steps(
    plain_run: tuple[Path, GraphwatchCallback, Trainer],
) -> None:
    folder, callback, _ = plain_run
    assert callback.session is not None and not callback.session.active
    assert callback.session.findings == []
    assert len(callback.session.trace.steps) == 4  # max_steps optimizer steps of 2 micro-batches each
    assert all(len(step.backwards) == 2 for step in callback.session.trace.steps)
    assert (folder / "run" / "graphwatch" / "index.html").is_file()


@pytest.mark.xdist_group("transformers-keeps-losses-run")  # (one worker makes the shared run)
def test_losses_kept_on_the_trainer_are_named_with_their_line(keeps_losses_run: GraphwatchCallback) -> None:
    kept = next(f for f in keeps_losses_run.session.findings if f.kind == "graph-kept-alive")  # type: ignore[union-attr]
    assert kept.evidence["holder"].endswith("losses")
    assert line_of(KeepsLosses, "# the kept losses") in kept.evidence["sites"]


@pytest.mark.xdist_group("transformers-plain-run")  # (one worker makes the shared run)
def test_the_callback_changes_no_parameter(tmp_path: Path, plain_run: tuple[Path, GraphwatchCallback, Trainer]) -> None:
    bare = train(tmp_path / "bare", None, accumulation=2)
    pairs = zip(bare.model.parameters(), plain_run[2].model.parameters())
    assert all(torch.equal(a.detach(), b.detach()) for a, b in pairs)


def test_strict_fails_the_run_at_the_first_leaking_step_and_writes_the_report(tmp_path: Path) -> None:
    callback = GraphwatchCallback(strict=True)
    with pytest.raises(graphwatch.GraphLeakError, match="graph-kept-alive"):
        train(tmp_path, callback, trainer=KeepsLosses)
    assert callback.session is not None and not callback.session.active
    assert (tmp_path / "run" / "graphwatch" / "index.html").is_file()


def test_a_state_carried_on_the_trainer_is_named_and_the_next_run_closes_the_failed_ones_session(
    tmp_path: Path, no_session_left: None
) -> None:
    """The error names ``self.carried`` and its line in ``compute_loss`` (not the line inside transformers
    that made the loss). The Trainer tells callbacks nothing of an error: the next run closes the session
    the failed one left."""
    failed = GraphwatchCallback()
    with pytest.raises(graphwatch.BackwardTwiceError, match="backward through the graph a second time") as raised:
        train(tmp_path / "failed", failed, trainer=CarriesState)
    assert "carried into step 1 by `self.carried`" in str(raised.value)
    assert f"before {line_of(CarriesState, '# the carried loss')}" in str(raised.value)
    assert failed.session is not None and failed.session.active
    again = GraphwatchCallback()
    train(tmp_path / "again", again)
    assert not failed.session.active and failed.session.trace.ended_early
    assert (tmp_path / "failed" / "run" / "graphwatch" / "index.html").is_file()
    assert {f.kind for f in failed.session.findings} >= {"backward-through-freed-graph"}
    assert again.session is not None and again.session.findings == []


@pytest.mark.xdist_group("transformers-keeps-losses-run")  # (one worker makes the shared run)
def test_nodes_made_inside_transformers_are_cited_at_the_users_line_that_led_there(
    keeps_losses_run: GraphwatchCallback,
) -> None:
    """Every op of GPT-2's forward and loss runs in transformers' files: each node is cited at the user's
    ``super().compute_loss(...)`` that led there, never at a line inside the installed package."""
    trace = keeps_losses_run.session.trace  # type: ignore[union-attr]
    sites = {trace.where(node.site) for node in trace.nodes.values() if node.site is not None}
    assert line_of(KeepsLosses, "loss = super().compute_loss") in sites
    assert not [site for site in sites if site.startswith("transformers/")]
