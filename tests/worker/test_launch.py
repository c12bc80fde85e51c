"""The trainer's spec file is built by the spec contract from the job's stored spec."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError, ValidationInfo, field_validator

from service.core.models import JobState
from service.core.settings import Settings
from towerq.contract import versions
from towerq.contract.runtime import TrainerInput
from towerq.contract.spec import JobSpec, describe
from towerq.contract.versions import NewerSpecError, applies
from worker.launch import Launch, write_trainer_spec
from worker.outcome import Outcome, Stop


def launch_of(stored: dict[str, object], fraction: float = 1.0) -> Launch:
    return Launch(
        job_id=7,
        attempt=2,
        host="lab-a",
        indices=[1, 3],
        fraction=fraction,
        spec=stored,
        time_limit_s=None,
        memory_total_mb=[16_384, 16_384],
        simulated=True,
    )


def test_the_spec_file_is_the_stored_spec_through_the_contract(tmp_path: Path) -> None:
    stored = JobSpec.model_validate(
        {"model": "mlp", "dataset": "digits", "gpus": [1, 3], "tower_weights": [2, 1], "memory_growth": True}
    ).model_dump(mode="json")
    settings = Settings(artifacts_dir=tmp_path / "artifacts", data_dir=tmp_path / "data")
    path = write_trainer_spec(launch_of(stored), settings, tmp_path / "job-7")
    written = TrainerInput.model_validate(json.loads(path.read_text()))
    assert path.name == "spec-attempt-2.json"
    assert written.train.model_dump() == JobSpec.model_validate(stored).train_spec().model_dump()
    assert written.train.tower_weights == [2, 1]
    assert (written.runtime.job_id, written.runtime.attempt, written.runtime.num_devices) == (7, 2, 2)
    assert written.runtime.memory_growth is True
    assert written.runtime.gpu_memory_fraction == 1.0
    assert written.runtime.batch_gpus == 2, "a step's batch is the job's size's (gpu_count), whatever it runs on"


def test_the_trainer_input_rules_apply_to_the_stored_spec_and_its_placement(tmp_path: Path) -> None:
    stored = JobSpec.model_validate(
        {"model": "mlp", "dataset": "digits", "gpu_count": 2, "memory_growth": True}
    ).model_dump()
    with pytest.raises(ValidationError, match="memory_growth cannot be combined with gpu_memory_fraction < 1"):
        write_trainer_spec(launch_of(stored, fraction=0.5), Settings(), tmp_path / "job-7")


def test_a_stored_spec_that_no_longer_passes_fails_the_job_naming_the_field(tmp_path: Path) -> None:
    stored = {"model": "mlp", "dataset": "digits", "dataset_options": {"classes": 5}, "gpus": [1, 3]}
    with pytest.raises(ValidationError) as refused:
        write_trainer_spec(launch_of(stored), Settings(), tmp_path / "job-7")
    assert not (tmp_path / "job-7").exists()
    message = describe(refused.value)
    assert message.startswith("dataset_options: classes does not apply to dataset 'digits'")
    outcome = Outcome(stop=Stop.BAD_SPEC, stop_message=message)
    assert outcome.verdict() == (JobState.FAILED, message)


def test_a_trainer_killed_by_a_signal_towerq_did_not_send_is_a_crash_tried_again() -> None:
    killed = Outcome(returncode=-9)
    assert killed.killed_from_outside
    assert killed.verdict() == (JobState.QUEUED, "trainer killed by SIGKILL (out of memory?)")
    stopped_by_someone = Outcome(returncode=143)
    assert stopped_by_someone.verdict()[0] == JobState.QUEUED
    killed_while_exiting = Outcome(returncode=-9, done={"event": "done", "step": 60})
    assert killed_while_exiting.verdict()[0] == JobState.QUEUED
    cancelled = Outcome(returncode=-9, stop=Stop.CANCEL, stop_message="cancelled by alice")
    assert not cancelled.killed_from_outside
    assert cancelled.verdict() == (JobState.CANCELLED, "cancelled by alice")


def test_a_rank_that_ends_without_a_word_sends_its_whole_job_back_and_one_with_an_error_fails_it() -> None:
    """In the sandbox a trainer killed by SIGKILL exits 137 (bwrap's 128 + 9). A rank of a
    job over several hosts that ends so is lost, not failed: its peers stop and the gang
    queues again. A one-host job's 137 stays what it was, and a rank's own error fails the job."""
    killed_rank = Outcome(returncode=137, ranks=2)
    assert killed_rank.crashed and killed_rank.verdict()[0] == JobState.QUEUED
    assert Outcome(returncode=137).verdict()[0] == JobState.FAILED
    raised = Outcome(returncode=1, ranks=2, error={"kind": "error", "message": "ValueError: bad shape"})
    assert not raised.crashed and raised.verdict() == (JobState.FAILED, "ValueError: bad shape")
    done = Outcome(returncode=0, ranks=2, done={"event": "done", "step": 60})
    assert not done.crashed and done.verdict() == (JobState.SUCCEEDED, None)
    assert Outcome(returncode=1, error={"kind": "nan_loss", "message": "loss became nan"}).verdict() == (
        JobState.FAILED,
        "loss became nan",
    )


class Stricter(JobSpec):
    """JobSpec with a rule of a version 2 of the rules: at most 100 steps."""

    @field_validator("hyperparameters")
    @classmethod
    def _at_most_100_steps(cls, hyperparameters: Any, info: ValidationInfo) -> Any:
        if applies(info, since=2) and hyperparameters.steps > 100:
            raise ValueError("at most 100 steps")
        return hyperparameters


def test_a_rule_made_stricter_spares_the_specs_admitted_before_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """A job queued under version 1 of the rules is read by version 1's rules when it starts
    under version 2, in its version 2 form; one submitted under version 2 meets its rules."""
    monkeypatch.setattr(versions, "SPEC_VERSION", 2)
    monkeypatch.setitem(versions.UPGRADES, 2, lambda old: {**old, "name": old.get("name") or "renamed by 2"})
    stored = JobSpec.model_validate({"model": "mlp", "dataset": "digits", "hyperparameters": {"steps": 500}}).stored()
    stored.pop("name", None)
    old = Stricter.model_validate(versions.upgraded(stored, 1), context={versions.ADMITTED_UNDER: 1})
    assert old.hyperparameters.steps == 500 and old.name == "renamed by 2"
    for context in ({versions.ADMITTED_UNDER: 2}, None):  # stored under 2; submitted now
        with pytest.raises(ValidationError, match="at most 100 steps"):
            Stricter.model_validate(stored, context=context)


def test_a_job_admitted_by_a_newer_towerq_is_refused_saying_to_upgrade_the_worker(tmp_path: Path) -> None:
    stored = JobSpec.model_validate({"model": "mlp", "dataset": "digits", "gpus": [1, 3]}).stored()
    launch = launch_of(stored)
    launch.spec_version = versions.SPEC_VERSION + 1
    with pytest.raises(NewerSpecError, match="upgrade this worker"):
        write_trainer_spec(launch, Settings(), tmp_path / "job-7")
    launch.spec_version = versions.SPEC_VERSION
    assert write_trainer_spec(launch, Settings(), tmp_path / "job-7").exists()
