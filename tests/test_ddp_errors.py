"""DistributedDataParallel's two reducer errors, explained at their cause, under torchrun with two gloo ranks.

Two real jobs, each started once (module fixtures) with ``launch`` of ``test_distributed.py``
(``python -m torch.distributed.run --nproc-per-node 2`` on loopback, each rank's output in its own log):

* ``twice_job``: ``-m graphwatch run ddp_jobs/ready_twice.py``: one block run under two reentrant
  ``checkpoint`` calls with ``find_unused_parameters=True``: "Expected to mark a variable ready only once".
* ``unused_job``: ``-m graphwatch run ddp_jobs/unused_branch.py``: each rank trains its own task head, without
  ``find_unused_parameters``: "Expected to have finished reduction in the prior iteration".

Before the explanation, both jobs ended with "no graph leaks in 2 ranks" and nothing else.  The message
parsing and the wording of the rest of the cases are tested in this process, which costs no launch.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from test_distributed import Job, launch, needs_gloo

from graphwatch.analysis import FINDING_KINDS
from graphwatch.analysis.ddp_errors import ddp_finding
from graphwatch.capture.causes.ddp_frames import _message_parameters, ddp_error, owner_of
from graphwatch.model import Trace, load_trace
from graphwatch.model.error_causes import DDPCause

JOBS = Path(__file__).parent / "ddp_jobs"
TWICE, UNUSED = JOBS / "ready_twice.py", JOBS / "unused_branch.py"
READY_TWICE = "Expected to mark a variable ready only once"
UNFINISHED = "Expected to have finished reduction in the prior iteration"


def _job(tmp: Path, script: Path) -> Job:
    """The job of ``script`` under ``graphwatch run``.  Each rank raises DDP's error by itself; the launcher looks
    at the ranks every 5 s instead of every 0.1 s, so that the first rank to fail does not have the other one
    stopped (SIGTERM) before it reached its own error on a busy machine."""
    job = launch(tmp, "--monitor-interval", "5", "-m", "graphwatch", "run", "--out", tmp / "out", script)
    assert job.returncode != 0, job.explain()  # the user's error still ends the job
    return job


@pytest.fixture(scope="module")
def twice_job(tmp_path_factory: pytest.TempPathFactory) -> Job:
    return _job(tmp_path_factory.mktemp("ddp-twice"), TWICE)


@pytest.fixture(scope="module")
def unused_job(tmp_path_factory: pytest.TempPathFactory) -> Job:
    return _job(tmp_path_factory.mktemp("ddp-unused"), UNUSED)


def _line(script: Path, marker: str) -> str:
    """``name.py:N`` of the first line of ``script`` that holds ``marker``."""
    number = next(i for i, text in enumerate(script.read_text().splitlines(), 1) if marker in text)
    return f"{script.name}:{number}"


def _printed(job: Job, rank: int) -> str:
    """What a rank printed: its summary goes to stderr when the run failed."""
    return job.stdout[rank] + job.stderr[rank]


def _finding(job: Job, rank: int, kind: str) -> dict:
    trace = load_trace(job.out / f"rank{rank}" / "trace.json")
    found = [f for f in trace.findings if f.kind == kind]
    assert len(found) == 1, [f.kind for f in trace.findings]
    return {"message": found[0].message, "fix": found[0].fix, **found[0].evidence}


# ------------------------------------------------------------------ "Expected to mark a variable ready only once"
@needs_gloo
def test_ready_twice_keeps_torchs_message_first_then_names_the_parameter_and_the_checkpoint_lines(
    twice_job: Job,
) -> None:
    for rank in (0, 1):
        stderr = twice_job.stderr[rank]
        assert READY_TWICE in stderr, twice_job.explain()
        explained = stderr.index(f"graphwatch: on rank {rank}, `block.0.bias` of `model`")
        assert stderr.index(READY_TWICE) < explained
        paragraph = stderr[explained:]
        first_use = _line(TWICE, "h = checkpoint(self.block")
        assert f"it belongs to `block.0`, and the forward uses `self.block` at {TWICE}" in paragraph
        assert first_use in paragraph and _line(TWICE, "# HERE") in paragraph
        assert _line(TWICE, "    model = DistributedDataParallel(") in paragraph
        assert "pass `use_reentrant=False` to the `checkpoint` calls" in paragraph


@needs_gloo
def test_ready_twice_is_a_finding_of_each_rank_and_in_the_rank_0_summary(twice_job: Job) -> None:
    for rank in (0, 1):
        finding = _finding(twice_job, rank, "ddp-ready-twice")
        assert finding["parameters"] == ["block.0.bias"] and finding["rank"] == rank
        assert finding["owner"] == "block.0" and finding["find_unused_parameters"] is True
        assert any(_line(TWICE, "# HERE") in site for site in finding["sites"])
    assert "ddp-ready-twice" in _printed(twice_job, 0) and "no graph leaks" not in _printed(twice_job, 0)


# ------------------------------------------------------------------ "Expected to have finished reduction ..."
@needs_gloo
def test_unused_parameters_names_each_ranks_unused_head_and_the_line_that_chose_it(unused_job: Job) -> None:
    for rank, other in ((0, 1), (1, 0)):
        stderr = unused_job.stderr[rank]
        assert UNFINISHED in stderr, unused_job.explain()
        explained = stderr.index(f"graphwatch: on rank {rank}, `heads.{other}.weight` and `heads.{other}.bias`")
        assert stderr.index(UNFINISHED) < explained
        paragraph = stderr[explained:]
        assert f"this rank's loss did not use `heads.{other}`; the forward chooses from `self.heads` at" in paragraph
        assert _line(UNUSED, "# HERE") in paragraph
        assert f"build the model with `find_unused_parameters=True` at {UNUSED}" in paragraph
        assert _line(UNUSED, "    model = DistributedDataParallel(") in paragraph


@needs_gloo
def test_unused_parameters_is_a_finding_of_each_rank_and_in_the_rank_0_summary(unused_job: Job) -> None:
    for rank, other in ((0, 1), (1, 0)):
        finding = _finding(unused_job, rank, "ddp-unused-parameters")
        assert finding["parameters"] == [f"heads.{other}.weight", f"heads.{other}.bias"]
        assert finding["rank"] == rank and finding["find_unused_parameters"] is False
        assert any(_line(UNUSED, "# HERE") in site for site in finding["sites"])
    assert "ddp-unused-parameters" in _printed(unused_job, 0) and "no graph leaks" not in _printed(unused_job, 0)


# ------------------------------------------------------------------ in this process: messages and wording
def test_both_kinds_are_finding_kinds_and_other_errors_are_not_ddp_errors() -> None:
    assert {"ddp-ready-twice", "ddp-unused-parameters"} <= set(FINDING_KINDS)
    assert ddp_error(RuntimeError(f"{UNFINISHED} before starting a new one.")) == "unused"
    assert ddp_error(RuntimeError("grad can be implicitly created only for scalar outputs")) is None
    assert ddp_error(ValueError(READY_TWICE)) is None


def test_parameters_are_read_by_name_when_torch_names_them_else_by_the_reducers_index() -> None:
    names = ["body.0.weight", "body.0.bias", "heads.0.weight", "heads.0.bias"]
    detail = f"{UNFINISHED}.\nParameters which did not receive grad for rank 1: heads.0.bias, heads.0.weight\n"
    assert _message_parameters("unused", detail, names) == (["heads.0.bias", "heads.0.weight"], 1)
    indices = f"{UNFINISHED}.\nParameter indices which did not receive grad for rank 0: 2 3\n In addition"
    assert _message_parameters("unused", indices, names) == (["heads.0.weight", "heads.0.bias"], 0)
    twice = f"{READY_TWICE}.\nParameter at index 1 has been marked as ready twice. This means"
    assert _message_parameters("ready-twice", twice, names) == (["body.0.bias"], None)
    assert owner_of(["heads.0.weight", "heads.0.bias"]) == "heads.0" and owner_of(["a.w", "b.w"]) is None


def test_unused_parameters_with_find_unused_already_set_asks_for_every_output_in_the_loss() -> None:
    cause = DDPCause("unused", None, rank=1, parameters=["aux.weight"], owner="aux", find_unused=True)
    finding = ddp_finding(Trace(), cause, 3)
    assert finding.kind == "ddp-unused-parameters" and not finding.remedies[0].edits
    assert "make every output of the forward take part in the loss" in finding.fix
    assert "got no gradient in the iteration before step 3" in finding.message


def test_ready_twice_without_checkpoint_offers_static_graph_in_words() -> None:
    finding = ddp_finding(Trace(), DDPCause("ready-twice", None, parameters=["fc.weight"], owner="fc"), 0)
    assert finding.kind == "ddp-ready-twice" and finding.patch is None
    assert "`static_graph=True`" in finding.fix and "use_reentrant" not in finding.fix
