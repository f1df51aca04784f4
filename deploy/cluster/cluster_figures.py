"""What the container cluster's checks are judged by, measured where it is: run inside the cluster's
containers by scripts/cluster_smoke.sh, each sub-command prints one JSON object.

  node            in a node's worker container: the node's discovery file, and from each server's own
                  /metrics the rows it answered per Spark application, the versions it serves, and
                  the supervisor's restart count. The servers' own counts, not a scrape: no delay,
                  and a restarted server counts from zero.
  output DIR      in the driver container: the committed output of a job read back with pyarrow
                  (independently of Spark): rows, distinct ids, the ids that are missing or twice,
                  rows per host, per version and per partition, predictions that are null; with
                  --reference, a sample of rows per version recomputed by that version in-process.
  prometheus      in the driver container: Prometheus's targets and their health, and one
                  application's rows summed per node from the servers' series.
  executors       in the driver container, while a job runs: the hosts of its executors.
  watch-versions  in the driver container: polls every server's /metrics until each serves a version,
                  and says when each started to (seconds since the epoch: the containers share the
                  host's clock).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families


def series(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    """The samples named ``name`` (a counter's ``_total`` included) in a Prometheus text exposition,
    with their labels, as prometheus_client's parser reads them (escapes in label values undone)."""
    return [
        (dict(sample.labels), sample.value)
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name
    ]


def get(url: str, timeout: float = 10.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as answer:
        return answer.read().decode()


def local(address: str) -> str:
    """An admin address as the discovery file gives it, dialled from the node itself."""
    host, _, port = address.rpartition(":")
    return f"127.0.0.1:{port}" if host in ("0.0.0.0", "", "::") else address


# -- node ------------------------------------------------------------------------------------------
def supervisor_address(discovery: dict[str, Any]) -> str:
    """The supervisor's /metrics address, from the targets file it writes (its port may be any free
    one: a node started by a job), dialled on the node itself."""
    try:
        targets = json.loads(Path(discovery["metrics_targets_file"]).read_text())
        [address] = next(t["targets"] for t in targets if t["labels"].get("role") == "supervisor")
        return local("0.0.0.0:" + address.rpartition(":")[2])
    except (KeyError, OSError, ValueError, StopIteration):
        return f"127.0.0.1:{os.environ.get('UDFSERVE_SUPERVISOR_HTTP_PORT', '7490')}"


def node_figures(discovery_file: Path) -> dict[str, Any]:
    figures: dict[str, Any] = {"host": socket.gethostname(), "discovery_file": str(discovery_file)}
    try:
        discovery = json.loads(discovery_file.read_text())
    except (OSError, ValueError) as exc:
        return {**figures, "discovery": None, "problem": f"{type(exc).__name__}: {exc}", "servers": []}
    figures.update(
        discovery=True,
        node=discovery.get("node"),
        supervisor_pid=discovery.get("supervisor_pid"),
        age_s=round(time.time() - float(discovery.get("updated_at", 0)), 1),
        servers=[],
    )
    for entry in discovery.get("servers", []):
        server: dict[str, Any] = {
            "device": entry.get("device"),
            "pid": entry.get("pid"),
            "state": entry.get("state"),
            "unix_socket": entry.get("unix_socket"),
            "tcp_address": entry.get("tcp_address"),
            "http_address": entry.get("http_address"),
            "versions": entry.get("versions", {}),
        }
        if entry.get("http_address"):
            try:
                text = get(f"http://{local(entry['http_address'])}/metrics")
            except (OSError, urllib.error.URLError) as exc:
                server["metrics_problem"] = str(exc)
            else:
                rows: Counter[str] = Counter()
                for labels, value in series(text, "udfserve_app_rows_total"):
                    rows[labels.get("app_id", "")] += int(value)
                server["app_rows"] = dict(rows)
                server["ready_versions"] = sorted(
                    int(labels["version"])
                    for labels, value in series(text, "udfserve_model_ready")
                    if value == 1 and labels.get("model") == "tabular_mlp"
                )
        figures["servers"].append(server)
    try:
        text = get(f"http://{supervisor_address(discovery)}/metrics")
        figures["server_restarts"] = int(sum(v for _, v in series(text, "udfserve_server_restarts_total")))
    except (OSError, urllib.error.URLError) as exc:
        figures["supervisor_problem"] = str(exc)
    return figures


# -- output ----------------------------------------------------------------------------------------
def output_figures(folder: Path, rows: int, reference: Path | None, sample: int) -> dict[str, Any]:
    import numpy as np
    import pyarrow.compute as pc
    import pyarrow.dataset as ds

    dataset = ds.dataset(folder, format="parquet")  # names starting with _ or . are skipped
    names = dataset.schema.names
    output = next(n for n in names if n not in ("id", "model_version", "host", "partition", "attempt"))
    columns = ["id", "host", "partition", "attempt", output]
    if "model_version" in names:
        columns.append("model_version")
    table = dataset.to_table(columns=columns)
    ids = table.column("id").to_numpy()
    unique, counts = np.unique(ids, return_counts=True)
    expected = np.arange(rows, dtype=np.int64)
    missing = np.setdiff1d(expected, unique, assume_unique=True)
    figures: dict[str, Any] = {
        "folder": str(folder),
        "success_marker": (folder / "_SUCCESS").exists(),
        "files": len(dataset.files),
        "rows": table.num_rows,
        "distinct_ids": int(unique.size),
        "ids_twice_or_more": int((counts > 1).sum()),
        "ids_missing": int(missing.size),
        "ids_outside_range": int(((unique < 0) | (unique >= rows)).sum()),
        "null_predictions": int(pc.sum(pc.is_null(table.column(output))).as_py() or 0),
        "rows_by_host": dict(Counter(table.column("host").to_pylist())),
    }
    hosts = table.column("host").to_numpy(zero_copy_only=False)
    partitions = table.column("partition").to_numpy()
    attempts = table.column("attempt").to_numpy()
    by_partition: dict[str, set[tuple[str, int]]] = defaultdict(set)
    for partition, host, attempt in set(
        zip(partitions.tolist(), hosts.tolist(), attempts.tolist(), strict=True)
    ):
        by_partition[str(partition)].add((host, attempt))
    figures["partition_hosts"] = {p: sorted(h for h, _ in v) for p, v in by_partition.items()}
    figures["partition_attempts"] = {p: sorted(a for _, a in v) for p, v in by_partition.items()}
    if "model_version" in names:
        versions = table.column("model_version").to_numpy(zero_copy_only=False)
        figures["rows_by_version"] = {str(k): v for k, v in sorted(Counter(versions.tolist()).items())}
        pairs = Counter(zip(hosts.tolist(), versions.tolist(), strict=True))
        figures["rows_by_host_version"] = {f"{h}:{v}": n for (h, v), n in sorted(pairs.items())}
        by_partition_version: dict[str, Counter[int]] = defaultdict(Counter)
        for partition, version in zip(partitions.tolist(), versions.tolist(), strict=True):
            by_partition_version[str(partition)][int(version)] += 1
        figures["rows_by_partition_version"] = {p: dict(c) for p, c in by_partition_version.items()}
        if reference is not None:
            figures["reference"] = reference_check(table, output, versions, reference, sample)
    return figures


def reference_check(table: Any, output: str, versions: Any, repository: Path, sample: int) -> dict[str, Any]:
    """A sample of each version's rows recomputed in this process by Keras from that version's own
    file (the file its servers loaded; whichever versions the policy serves now): a row that names
    the wrong version, or was not computed by the version it names, differs."""
    import keras
    import numpy as np

    rng = np.random.default_rng(37)
    ids = table.column("id").to_numpy()
    answers = table.column(output)
    result: dict[str, Any] = {}
    for version in sorted(set(versions.tolist())):
        rows = np.flatnonzero(versions == version)
        picked = np.sort(rng.choice(rows, size=min(sample, rows.size), replace=False))
        model = keras.saving.load_model(repository / "tabular_mlp" / str(version) / "model.keras")
        width = int(model.inputs[0].shape[-1])
        positions = np.arange(width, dtype=np.int64)
        inputs = (((ids[picked].reshape(-1, 1) * 7919 + positions * 104729) % 1000) / 1000.0 - 0.5).astype(
            np.float32
        )
        computed = np.asarray(model(inputs, training=False), dtype=np.float32)
        answered = np.array(answers.take(picked).to_pylist(), dtype=np.float32)
        result[str(version)] = {
            "rows": int(picked.size),
            "max_abs_difference": float(np.abs(computed - answered).max()),
        }
    return result


# -- Prometheus ------------------------------------------------------------------------------------
def prometheus_figures(url: str, app_id: str) -> dict[str, Any]:
    targets = json.loads(get(f"{url}/api/v1/targets"))["data"]["activeTargets"]
    query = urllib.parse.urlencode({"query": f'sum by (node) (udfserve_app_rows_total{{app_id="{app_id}"}})'})
    result = json.loads(get(f"{url}/api/v1/query?{query}"))["data"]["result"]
    return {
        "targets": [
            {
                "job": t["labels"].get("job"),
                "node": t["labels"].get("node"),
                "role": t["labels"].get("role"),
                "device": t["labels"].get("device"),
                "url": t["scrapeUrl"],
                "health": t["health"],
                "error": t.get("lastError", ""),
            }
            for t in targets
        ],
        "app_rows_by_node": {r["metric"].get("node", ""): int(float(r["value"][1])) for r in result},
    }


# -- executors and versions ------------------------------------------------------------------------
def executor_hosts(ui: str) -> dict[str, Any]:
    apps = json.loads(get(f"{ui}/api/v1/applications"))
    hosts = []
    for app in apps:
        for executor in json.loads(get(f"{ui}/api/v1/applications/{app['id']}/executors")):
            if executor["id"] != "driver":
                hosts.append(executor["hostPort"].rsplit(":", 1)[0])
    return {"hosts": sorted(hosts)}


def watch_versions(servers: dict[str, str], model: str, version: int, timeout_s: float) -> dict[str, Any]:
    """When each server first lists ``version`` of ``model`` ready in its own metrics."""
    seen: dict[str, float] = {}
    load_s: dict[str, float] = {}
    deadline = time.monotonic() + timeout_s
    while len(seen) < len(servers) and time.monotonic() < deadline:
        for node, address in servers.items():
            if node in seen:
                continue
            try:
                text = get(f"http://{address}/metrics", timeout=2)
            except (OSError, urllib.error.URLError):
                continue
            ready = any(
                value == 1 and labels.get("model") == model and labels.get("version") == str(version)
                for labels, value in series(text, "udfserve_model_ready")
            )
            if ready:
                seen[node] = time.time()
                load_s[node] = next(
                    (
                        value
                        for labels, value in series(text, "udfserve_model_load_duration_seconds")
                        if labels.get("model") == model and labels.get("version") == str(version)
                    ),
                    -1.0,
                )
        time.sleep(0.2)
    return {"ready_at": seen, "load_s": load_s, "missing": sorted(set(servers) - set(seen))}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    node = commands.add_parser("node")
    node.add_argument(
        "--discovery-file", default=os.environ.get("UDFSERVE_DISCOVERY_FILE", "/run/udfserve/discovery.json")
    )
    output = commands.add_parser("output")
    output.add_argument("folder", type=Path)
    output.add_argument("--rows", type=int, required=True)
    output.add_argument("--reference", type=Path, default=None, help="repository to recompute a sample with")
    output.add_argument("--sample", type=int, default=2000)
    prometheus = commands.add_parser("prometheus")
    prometheus.add_argument("--url", default="http://prometheus:9090")
    prometheus.add_argument("--app-id", required=True)
    executors = commands.add_parser("executors")
    executors.add_argument("--ui", default="http://127.0.0.1:4040")
    watch = commands.add_parser("watch-versions")
    watch.add_argument("--servers", required=True, help="node=host:port,...")
    watch.add_argument("--model", default="tabular_mlp")
    watch.add_argument("--version", type=int, required=True)
    watch.add_argument("--timeout-s", type=float, default=300.0)
    args = parser.parse_args(argv)
    if args.command == "node":
        figures = node_figures(Path(args.discovery_file))
    elif args.command == "output":
        figures = output_figures(args.folder, args.rows, args.reference, args.sample)
    elif args.command == "prometheus":
        figures = prometheus_figures(args.url, args.app_id)
    elif args.command == "executors":
        figures = executor_hosts(args.ui)
    else:
        servers = dict(pair.split("=", 1) for pair in args.servers.split(","))
        figures = watch_versions(servers, args.model, args.version, args.timeout_s)
    sys.stdout.write(json.dumps(figures) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
