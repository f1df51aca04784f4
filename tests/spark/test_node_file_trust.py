"""A discovery file forged by another local user is refused, and no row or model file of it is used.

The attack, as a hostile local user ran it against the client before it checked: ``nobody``
creates a node folder of its own, listens on a unix socket there, writes a discovery file with a
fresh heartbeat naming that socket as a ready server, and names a model repository of its own
holding a SavedModel called like the job's model, whose serving function writes a file of the
attacker's choosing. A job pointed at that discovery file (by a default path the attacker got to
first, or a setting) sent its batches to the attacker's socket, and its CPU fallback ran the
attacker's model as the job's user.

Here the attacker is a real process of the user ``nobody`` (root runs the suite; elsewhere these
tests are skipped). Its socket counts every connection it accepts; the test's own probe
connection, made after the job, is the last one, so the count is exact without waiting.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from pyspark.sql import SparkSession
from spark_data import feature_column, feature_values, reference_outputs, stacked

from udfserve.spark_client import ClientConfig, remote_predict
from udfserve.spark_client.common.errors import ModelMetadataError

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="running a process as another user needs root")

ROWS = 2_000
NOBODY = 65534
SYSTEM_PYTHON = "/usr/bin/python3"

ATTACKER = textwrap.dedent(
    """
    import json, os, socket, sys, time
    folder, repository = sys.argv[1], sys.argv[2]
    os.mkdir(folder, 0o755)
    path = os.path.join(folder, "server.sock")
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(path)
    os.chmod(path, 0o777)
    listener.listen(64)
    forged = {
        "schema_version": 1, "node": "forged", "supervisor_pid": os.getpid(),
        "model_repository": repository, "updated_at": time.time(),
        "heartbeat_s": 1.0, "stale_after_s": 86400.0,
        "servers": [{"device": "cpu", "unix_socket": path, "pid": os.getpid(),
                     "models": ["tabular_mlp"], "state": "ready"}],
    }
    with open(os.path.join(folder, "discovery.json"), "w") as out:
        json.dump(forged, out)
    print("listening", flush=True)
    accepted = 0
    while True:
        connection, _ = listener.accept()
        accepted += 1
        with open(os.path.join(folder, "accepted"), "w") as out:
            out.write(str(accepted))
        connection.close()
    """
)

HOSTILE_MODEL = textwrap.dedent(
    """
    import sys
    import tensorflow as tf
    version_dir, marker = sys.argv[1], sys.argv[2]

    class Forged(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None, 64], tf.float32, name="features")])
        def serve(self, features):
            tf.io.write_file(marker, tf.strings.as_string(tf.reduce_sum(features)))
            return {"probabilities": tf.fill([tf.shape(features)[0], 8], 0.125)}

    module = Forged()
    tf.saved_model.save(module, version_dir, signatures={"serving_default": module.serve})
    """
)


@dataclass
class ForgedNode:
    folder: Path
    marker: Path
    process: subprocess.Popen[str]

    @property
    def discovery_file(self) -> Path:
        return self.folder / "discovery.json"

    counted: int = 0

    def connections_from_others(self) -> int:
        """Connections the attacker's socket accepted since the last call, less the probe made here,
        which it accepts last."""
        with socket.socket(socket.AF_UNIX) as probe:
            probe.connect(str(self.folder / "server.sock"))
            probe.recv(1)  # the attacker closes it once it counted it
        total = int((self.folder / "accepted").read_text())
        others, self.counted = total - self.counted - 1, total
        return others


@pytest.fixture(scope="module")
def forged_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ForgedNode]:
    shared = Path(tempfile.mkdtemp(prefix="udfs-forged-"))
    shared.chmod(0o1777)  # another /tmp: every user may create entries, none may replace another's
    repository = shared / "repository"
    version_dir = repository / "tabular_mlp" / "1"
    marker = shared / "the-job-ran-the-attackers-model"
    subprocess.run(
        [sys.executable, "-c", HOSTILE_MODEL, str(version_dir), str(marker)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (repository / "tabular_mlp" / "config.yaml").write_text("name: tabular_mlp\nmax_batch_size: 4096\n")
    subprocess.run(["chown", "-R", f"{NOBODY}:{NOBODY}", str(repository)], check=True)
    folder = shared / "node"
    process = subprocess.Popen(
        [SYSTEM_PYTHON, "-c", ATTACKER, str(folder), str(repository)],
        user=NOBODY,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None and process.stdout.readline().strip() == "listening"
        yield ForgedNode(folder, marker, process)
    finally:
        process.kill()
        process.wait(timeout=30)
        if process.stdout is not None:
            process.stdout.close()
        shutil.rmtree(shared, ignore_errors=True)


def genuine(example_repository: Path, ids: np.ndarray) -> np.ndarray:
    inputs = {"features": feature_values(ids, (64,))}
    return reference_outputs(example_repository, "tabular_mlp", inputs)["probabilities"]


def score(spark: SparkSession, config: ClientConfig) -> tuple[np.ndarray, np.ndarray, object]:
    predict = remote_predict("tabular_mlp", config=config)
    frame = spark.range(ROWS, numPartitions=2).withColumn("features", feature_column((64,)))
    result = frame.select("id", predict("features").alias("p")).toPandas().sort_values("id")
    return result["id"].to_numpy(), stacked(result["p"]), predict.stats()


def test_the_forged_file_is_the_other_user_s_as_the_attack_needs(forged_node: ForgedNode) -> None:
    assert forged_node.discovery_file.stat().st_uid == NOBODY
    assert json.loads(forged_node.discovery_file.read_text())["updated_at"] > time.time() - 3600


def test_a_discovery_file_of_another_user_is_refused_and_the_rows_run_on_the_job_s_own_repository(
    spark: SparkSession, forged_node: ForgedNode, example_repository: Path
) -> None:
    config = ClientConfig(
        discovery_file=str(forged_node.discovery_file), model_repository=str(example_repository)
    )

    ids, predictions, stats = score(spark, config)

    assert np.array_equal(ids, np.arange(ROWS))
    np.testing.assert_allclose(predictions, genuine(example_repository, ids), atol=1e-5)
    assert stats.rows_by_fallback == ROWS and stats.rows_by_server == 0  # type: ignore[attr-defined]
    assert set(stats.fallback_reasons) == {"untrusted_node_file"}  # type: ignore[attr-defined]
    assert forged_node.connections_from_others() == 0
    assert not forged_node.marker.exists()


def test_the_fallback_does_not_take_the_forged_repository_even_when_told_to_trust_the_node_s(
    spark: SparkSession, forged_node: ForgedNode
) -> None:
    """``fallback_repository_from_node`` trusts a node's file only once it passed the checks."""
    config = ClientConfig(discovery_file=str(forged_node.discovery_file), fallback_repository_from_node=True)

    with pytest.raises(ModelMetadataError) as refused:
        remote_predict("tabular_mlp", config=config)

    message = str(refused.value)
    assert f"refusing discovery file {forged_node.discovery_file}" in message
    assert "belongs to uid 65534 (nobody)" in message
    assert not forged_node.marker.exists()
    assert forged_node.connections_from_others() == 0


def test_a_node_user_the_job_trusts_is_dialled(
    spark: SparkSession, forged_node: ForgedNode, example_repository: Path
) -> None:
    """``trusted_node_uids`` is how a job believes a node run by a service user; trusted, the
    file is believed and its socket dialled (here it answers nothing, so the rows fall back)."""
    config = ClientConfig(
        discovery_file=str(forged_node.discovery_file),
        model_repository=str(example_repository),
        trusted_node_uids=(NOBODY,),
        fallback="cpu",
    )

    ids, predictions, stats = score(spark, config)

    np.testing.assert_allclose(predictions, genuine(example_repository, ids), atol=1e-5)
    assert "untrusted_node_file" not in stats.fallback_reasons  # type: ignore[attr-defined]
    assert forged_node.connections_from_others() > 0
    assert not forged_node.marker.exists()
