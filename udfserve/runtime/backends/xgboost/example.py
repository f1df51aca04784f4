"""The XGBoost backend's example model: ``tabular_xgb``, a binary classifier of 32 features.

Trained here, in a few seconds, on synthetic rows drawn with a fixed seed, in one thread, so
that every machine writes the same trees. Its features are of the range the tests' and
benchmarks' Spark columns give (``[-0.5, 0.5)``), and its label a non-linear function of a few of
them, so the trees are as deep and many as a real scoring job's (100 trees of depth 6).

Written as the other examples are: into a hidden folder of the repository, then renamed, so
a server watching the repository never sees half a model. Registered in ``backend_registry``
(``examples``): ``udfserve models generate --backend-examples xgboost`` calls ``write_examples``.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from pathlib import Path

import numpy as np
import xgboost
import yaml

logger = logging.getLogger(__name__)

NAME = "tabular_xgb"
FEATURES = 32
TRAINING_ROWS = 20_000
TREES = 100
SEED = 7
CONFIG = {
    "name": NAME,
    # one call serves a whole 4,096-row request of the Spark client, as the Keras examples do
    "max_batch_size": 4096,
    "dynamic_batching": {"max_queue_delay_s": 0.002},
}
PARAMETERS = {
    "objective": "binary:logistic",
    "max_depth": 6,
    "eta": 0.1,
    "tree_method": "hist",
    "seed": SEED,
    "nthread": 1,
}


def training_data(rows: int = TRAINING_ROWS) -> tuple[np.ndarray, np.ndarray]:
    """Features uniform in ``[-0.5, 0.5)`` and a label from a few of them, with noise."""
    rng = np.random.default_rng(SEED)
    features = rng.uniform(-0.5, 0.5, size=(rows, FEATURES)).astype(np.float32)
    score = (
        4 * features[:, 0] * features[:, 1]
        + np.sin(6 * features[:, 2])
        + features[:, 3]
        - 3 * features[:, 4] ** 2
        + 0.25 * rng.standard_normal(rows)
    )
    return features, (score > 0).astype(np.float32)


def train_binary_classifier() -> xgboost.Booster:
    """The example's booster: the same trees on every machine."""
    features, labels = training_data()
    return xgboost.train(PARAMETERS, xgboost.DMatrix(features, label=labels), num_boost_round=TREES)


def write_examples(root: Path, *, overwrite: bool = False) -> list[str]:
    """Write ``tabular_xgb/1/model.ubj`` and its config.yaml under ``root`` (kept when present
    unless ``overwrite``); returns the names of the example models there."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    target = root / NAME
    if target.exists() and not overwrite:
        logger.info("keeping %s: already present (pass --overwrite to regenerate it)", target)
        return [NAME]
    staging = Path(tempfile.mkdtemp(prefix=f".{NAME}.", dir=root))
    try:
        (staging / "1").mkdir()
        train_binary_classifier().save_model(str(staging / "1" / "model.ubj"))
        (staging / "config.yaml").write_text(yaml.safe_dump(CONFIG, sort_keys=False), encoding="utf-8")
        staging.chmod(0o755)  # as readable as the other examples: the server may run as another user
        if target.exists():
            shutil.rmtree(target)
        staging.rename(target)
    finally:
        if staging.exists():
            shutil.rmtree(staging)
    logger.info("wrote %s", target)
    return [NAME]
