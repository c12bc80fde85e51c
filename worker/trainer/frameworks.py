"""TensorFlow and Keras, loaded once per trainer process without what a trainer never uses.

Keras imports scikit-learn at its own import, only for its scikit-learn wrappers
(`keras.wrappers.SKLearnClassifier` and the like), when scikit-learn is installed; towerq
installs it for the `digits` dataset. That import was about a fifth of a trainer's start-up
CPU (1.3 of ~6 s here), paid by every job and every warm trainer. `load` hides
scikit-learn while TensorFlow and Keras load and shows it again at once: a member's model
imports scikit-learn as usual; only Keras's scikit-learn wrappers say it is not installed,
which a model built for the towers has no use for. The `digits` dataset reads
scikit-learn's bundled file without importing scikit-learn (`datasets.digits_file`).
"""

from __future__ import annotations

import sys

HIDDEN = "sklearn"


def load() -> None:
    """Import TensorFlow and Keras (the trainer's first import of either) with scikit-learn
    hidden from them; nothing changes where either is already loaded or where scikit-learn
    already is."""
    if "tensorflow" in sys.modules or HIDDEN in sys.modules:
        return
    # None in sys.modules: an import of it fails with ImportError, which Keras takes for "not installed"
    sys.modules[HIDDEN] = None  # type: ignore[assignment]
    try:
        import keras  # noqa: F401
        import tensorflow  # noqa: F401
    finally:
        del sys.modules[HIDDEN]
