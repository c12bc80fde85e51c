"""The rungs' decisions of an adaptive sweep (service.jobs.asha), against hand-worked
examples: no database, no training."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from service.core.exceptions import SpecError
from service.jobs.asha import EarlyStopping, check_setting, judge
from towerq.contract.spec import JobSpec


def test_rungs_are_min_steps_times_powers_of_the_factor_below_the_steps() -> None:
    early = EarlyStopping(min_steps=50, reduction_factor=3)
    assert early.rungs(1000) == [50, 150, 450]
    assert early.rungs(450) == [50, 150]
    assert early.rungs(50) == []
    assert EarlyStopping(min_steps=10, reduction_factor=2, max_steps=100).rungs(10_000) == [10, 20, 40, 80]


def test_a_setting_goes_on_when_it_is_in_the_top_third_of_the_rung_so_far() -> None:
    """Hand-worked, reduction factor 3, higher is better; each line: what reached the rung
    before, the newcomer, and max(1, n // 3) kept of the n there."""
    arrivals = [0.5, 0.7, 0.2, 0.9, 0.6, 0.1, 0.95]
    expected = [
        (True, 0.5),  # 1 there, keep 1: the first always goes on
        (True, 0.7),  # 2 there, keep 1: 0.7 is the best
        (False, 0.7),  # 3 there, keep 1: 0.2 is behind 0.7 and 0.5
        (True, 0.9),  # 4, keep 1: the best so far
        (False, 0.9),  # 5, keep 1: two ahead of 0.6
        (False, 0.7),  # 6, keep 2 (0.9 and 0.7): the cut is 0.7
        (True, 0.9),  # 7, keep 2: 0.95 is first
    ]
    for n, (value, want) in enumerate(zip(arrivals, expected, strict=True)):
        assert judge(arrivals[:n], value, "max", 3) == want, (n, value)


def test_lower_is_better_for_a_loss_and_an_ended_setting_is_the_worst() -> None:
    assert judge([0.3, 0.9], 0.2, "min", 2) == (True, 0.2)  # 3 there, keep 1: 0.2 is the lowest
    assert judge([0.3, 0.2], 0.25, "min", 2) == (False, 0.2)
    # a setting that failed before the rung (None) is behind everyone: it does not hold a place
    assert judge([None, None, None], 0.01, "max", 2) == (True, None)  # keep 2: no bar yet
    assert judge([0.5, None, None, None], 0.4, "max", 2) == (True, 0.4)  # 5 there, keep 2: second


def test_early_stopping_is_checked_where_it_could_never_compare() -> None:
    with pytest.raises(ValidationError):
        EarlyStopping(min_steps=50, reduction_factor=1)
    with pytest.raises(ValidationError):
        EarlyStopping(min_steps=100, max_steps=100)
    model = JobSpec.model_validate({"model": "mlp", "dataset": "digits", "hyperparameters": {"steps": 900}})
    assert model.hyperparameters.eval_every == 90
    with pytest.raises(SpecError) as missed:
        check_setting(EarlyStopping(min_steps=50), model, "eval_accuracy")
    assert missed.value.field == "early_stopping.min_steps"
    assert "the rung at step 50 has no eval_accuracy to compare: eval_every 90" in missed.value.message
    check_setting(EarlyStopping(min_steps=90), model, "eval_accuracy")  # rungs 90, 270, 810
    check_setting(EarlyStopping(min_steps=50), model, "loss")  # a row every 10 steps
    with pytest.raises(SpecError, match="is not below the 900 steps"):
        check_setting(EarlyStopping(min_steps=900), model, "loss")
    command = JobSpec.model_validate({"command": ["python", "train.py"], "code": "c" * 64})
    with pytest.raises(SpecError) as unsaid:
        check_setting(EarlyStopping(min_steps=7), command, "eval_accuracy")
    assert unsaid.value.field == "early_stopping.max_steps"
    check_setting(EarlyStopping(min_steps=7, max_steps=100), command, "eval_accuracy")  # it reports when it does
