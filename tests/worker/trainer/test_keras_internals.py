"""The lockstep runner uses private Keras pieces; this fails, saying which, when a Keras
release changes them (instead of jobs quietly losing synchronised batch norm)."""

from __future__ import annotations

import keras

from worker.trainer.lockstep import KERAS_TESTED, keras_internals_missing


def test_the_private_keras_pieces_the_lockstep_runner_uses_are_there() -> None:
    missing = keras_internals_missing()
    assert not missing, (
        f"Keras {keras.__version__} lacks what worker/trainer/lockstep.py uses: {', '.join(missing)}. "
        f"It was written for Keras {KERAS_TESTED}: adapt LockstepRunner before changing the pin in pyproject.toml."
    )


def test_the_installed_keras_is_the_pinned_one() -> None:
    assert keras.__version__.startswith(KERAS_TESTED + "."), (
        f"Keras {keras.__version__} is installed but lockstep.py was checked against {KERAS_TESTED}"
    )
