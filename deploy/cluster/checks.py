"""The container cluster's checks a-f, judged from what scripts/cluster_smoke.sh collected.

Runs on the host (the Python standard library only). Each check reads the JSON files of one folder:

  job.json            the job's own report (cluster_job.py's JOB line): the client's counters, and
                      Spark's record of every task attempt and executor
  output.json         the committed output read back (cluster_figures.py output)
  node-<name>.json    each node's figures after the job (cluster_figures.py node): its servers' own
                      per-application row counts
  fault.json          what the script did to the cluster during the job, and when
  watch.json          (rollout) when each node's server first served the new version
  prometheus.json     (metrics) Prometheus's targets and the per-node sums of the job's series

and prints the figures, then one ``HELD <claim>`` or ``FAILED <claim>`` line per claim.

A node's rows are the rows its tasks committed (tagged with the task's host in the same Python
worker pass that scored them); its servers' rows are what its servers say they answered for the
job's application (``udfserve_app_rows_total{app_id=...}``, one series per server process).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any


class Verdicts:
    """Figures and claims, printed in the order they were made."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.failed = 0

    def figure(self, text: str) -> None:
        self.lines.append(f"  {text}")

    def claim(self, holds: bool, text: str) -> None:
        self.lines.append(f"{'HELD' if holds else 'FAILED'} {text}")
        self.failed += 0 if holds else 1


def load(folder: Path, name: str) -> Any:
    path = folder / name
    if not path.exists():
        return None
    text = path.read_text().strip()
    return json.loads(text) if text else None


def nodes_of(folder: Path) -> dict[str, dict[str, Any]]:
    return {
        path.stem.removeprefix("node-"): json.loads(path.read_text())
        for path in sorted(folder.glob("node-*.json"))
    }


def server_rows(node: dict[str, Any], app_id: str) -> int:
    """Rows the node's current server processes answered for the application."""
    return sum(int(server.get("app_rows", {}).get(app_id, 0)) for server in node.get("servers", []))


def comma(value: int | float) -> str:
    return f"{value:,}"


def job_ran(verdicts: Verdicts, job: Any, output: Any) -> bool:
    """The job ended with its report, and its output was read back; else one FAILED line."""
    if job is None:
        verdicts.claim(False, "the job ran to its end (no report from the driver: see its log)")
        return False
    if output is None:
        verdicts.claim(False, f"the output of job {job['app_id']} was read back (no figures)")
        return False
    return True


def exactly_once(verdicts: Verdicts, job: dict[str, Any], output: dict[str, Any]) -> None:
    rows = int(job["rows"])
    holds = (
        output["success_marker"]
        and output["rows"] == rows
        and output["distinct_ids"] == rows
        and output["ids_missing"] == 0
        and output["ids_twice_or_more"] == 0
        and output["ids_outside_range"] == 0
        and output["null_predictions"] == 0
    )
    verdicts.claim(
        holds,
        f"the committed output holds every id exactly once: {comma(output['rows'])} rows, "
        f"{comma(output['distinct_ids'])} distinct ids of {comma(rows)}, {output['ids_missing']} missing, "
        f"{output['ids_twice_or_more']} twice or more, {output['null_predictions']} null predictions, "
        f"_SUCCESS {'written' if output['success_marker'] else 'missing'} ({output['files']} files)",
    )


def task_summary(job: dict[str, Any]) -> tuple[int, dict[str, int], list[str]]:
    """Failed task attempts, successful ones per host, and the distinct failure messages."""
    failed = [t for t in job["tasks"] if t["status"] not in ("SUCCESS", "RUNNING")]
    by_host: dict[str, int] = {}
    for task in job["tasks"]:
        if task["status"] == "SUCCESS":
            by_host[task["host"]] = by_host.get(task["host"], 0) + 1
    reasons = sorted({t["error"] for t in failed if t["error"]})
    return len(failed), by_host, reasons


def spark_agrees_on_hosts(verdicts: Verdicts, job: dict[str, Any], output: dict[str, Any]) -> None:
    """Each committed partition's rows name the host Spark recorded for its successful attempt."""
    spark_host = {str(t["partition"]): t["host"] for t in job["tasks"] if t["status"] == "SUCCESS"}
    disagree = [p for p, hosts in output["partition_hosts"].items() if hosts != [spark_host.get(p, "?")]]
    verdicts.claim(
        not disagree,
        "the host each row names is the host Spark ran its task on, for all "
        f"{len(output['partition_hosts'])} "
        f"partitions ({len(disagree)} disagree{': ' + ', '.join(sorted(disagree)[:5]) if disagree else ''})",
    )


def node_table(
    verdicts: Verdicts, nodes: dict[str, dict[str, Any]], output: dict[str, Any], app_id: str
) -> dict[str, tuple[int, int]]:
    """Per node: (rows of its tasks, rows its servers answered), printed as a table."""
    table = {}
    verdicts.figure(f"{'node':<8} {'rows of its tasks':>18} {'its servers answered':>21}  server pids")
    for name in sorted(set(nodes) | set(output["rows_by_host"])):
        tasks = int(output["rows_by_host"].get(name, 0))
        node = nodes.get(name, {})
        served = server_rows(node, app_id) if node else 0
        pids = ",".join(str(s.get("pid")) for s in node.get("servers", [])) or "-"
        verdicts.figure(f"{name:<8} {comma(tasks):>18} {comma(served):>21}  {pids}")
        table[name] = (tasks, served)
    return table


def no_fallback(verdicts: Verdicts, job: dict[str, Any]) -> None:
    stats = job["stats"]
    verdicts.claim(
        stats["rows_by_fallback"] == 0,
        f"0 rows fell back: {comma(stats['rows_by_server'])} rows by the servers, "
        f"{comma(stats['rows_by_fallback'])} by the CPU fallback (the client's counters)"
        + (f", reasons {stats['fallback_reasons']}" if stats["fallback_reasons"] else ""),
    )


# -- a ---------------------------------------------------------------------------------------------
def check_routing(folder: Path, verdicts: Verdicts) -> None:
    """a. Every node's servers answered exactly the rows of the tasks that ran on that node."""
    job, output, nodes = load(folder, "job.json"), load(folder, "output.json"), nodes_of(folder)
    if not job_ran(verdicts, job, output):
        return
    app = job["app_id"]
    failed, tasks_by_host, _ = task_summary(job)
    verdicts.figure(
        f"job {app}: {comma(job['rows'])} rows in {job['partitions']} partitions, "
        f"written in {job['seconds']} s "
        f"({comma(round(job['rows'] / job['seconds']))} rows/s); tasks per host {tasks_by_host}, "
        f"{failed} failed"
    )
    exactly_once(verdicts, job, output)
    table = node_table(verdicts, nodes, output, app)
    missing = sorted(n for n in nodes if table.get(n, (0, 0))[0] == 0)
    verdicts.claim(
        not missing and set(output["rows_by_host"]) <= set(nodes),
        f"the rows were spread over every node: {len(nodes)} nodes, rows on "
        f"{sorted(output['rows_by_host'])}" + (f"; no rows on {missing}" if missing else ""),
    )
    mismatched = {n: v for n, v in table.items() if v[0] != v[1]}
    verdicts.claim(
        not mismatched,
        "each node's servers answered exactly the rows of the tasks that ran on it"
        + (f"; differ: {mismatched}" if mismatched else ""),
    )
    crossed = sum(max(0, served - tasks) for tasks, served in table.values())
    total_served = sum(served for _, served in table.values())
    verdicts.claim(
        crossed == 0 and total_served == job["rows"],
        f"0 rows crossed nodes: {comma(crossed)} rows answered by a node's servers beyond its own "
        "tasks' rows; "
        f"the servers answered {comma(total_served)} rows in all",
    )
    no_fallback(verdicts, job)
    spark_agrees_on_hosts(verdicts, job, output)


# -- b ---------------------------------------------------------------------------------------------
def check_server_killed(folder: Path, verdicts: Verdicts) -> None:
    """b. One node's server SIGKILLed mid-job: every id once; that node's rows split between what
    the killed server answered, the CPU fallback and the restarted server; the others' exact."""
    job, output, nodes, fault = (
        load(folder, "job.json"),
        load(folder, "output.json"),
        nodes_of(folder),
        load(folder, "fault.json"),
    )
    if not job_ran(verdicts, job, output):
        return
    app, victim = job["app_id"], fault["victim"]
    failed, _, reasons = task_summary(job)
    verdicts.figure(
        f"job {app}: {comma(job['rows'])} rows, written in {job['seconds']} s; {failed} task attempts failed"
        + (f" ({reasons})" if reasons else "")
    )
    verdicts.figure(
        f"killed server pid {fault['killed_pid']} on {victim} (SIGKILL) once it had answered "
        f"{comma(fault['rows_at_kill'])} rows of the job"
    )
    exactly_once(verdicts, job, output)
    table = node_table(verdicts, nodes, output, app)
    stats = job["stats"]
    tasks, restarted = table.get(victim, (0, 0))
    fallback = int(stats["rows_by_fallback"])
    kept = tasks - restarted - fallback
    new_pids = [s.get("pid") for s in nodes.get(victim, {}).get("servers", [])]
    verdicts.figure(
        f"{victim}: {comma(tasks)} rows of its tasks = {comma(kept)} answered by the killed server "
        "(kept by the "
        f"client) + {comma(fallback)} by the CPU fallback + {comma(restarted)} by the restarted server "
        f"(pid {new_pids}, restarts {nodes.get(victim, {}).get('server_restarts')}); fallback reasons "
        f"{stats['fallback_reasons']}"
    )
    others = {n: v for n, v in table.items() if n != victim}
    verdicts.claim(
        fallback > 0 and restarted > 0 and kept > 0 and fault["killed_pid"] not in new_pids,
        f"{victim}'s rows were split between the killed server ({comma(kept)}), its fallback "
        f"({comma(fallback)}) and its restarted server ({comma(restarted)})",
    )
    verdicts.claim(
        all(t == s for t, s in others.values()),
        "the other nodes' servers answered all of their rows: "
        + ", ".join(f"{n} {comma(s)} of {comma(t)}" for n, (t, s) in sorted(others.items())),
    )


# -- c ---------------------------------------------------------------------------------------------
def check_node_lost(folder: Path, verdicts: Verdicts) -> None:
    """c. One whole node stopped mid-job: Spark runs its tasks again on the others, and the committed
    output holds every id once."""
    job, output, nodes, fault = (
        load(folder, "job.json"),
        load(folder, "output.json"),
        nodes_of(folder),
        load(folder, "fault.json"),
    )
    if not job_ran(verdicts, job, output):
        return
    app, victim = job["app_id"], fault["victim"]
    _, tasks_by_host, reasons = task_summary(job)
    lost = [t for t in job["tasks"] if t["host"] == victim and t["status"] not in ("SUCCESS", "RUNNING")]
    rerun = {
        t["partition"]: t["host"]
        for t in job["tasks"]
        if t["status"] == "SUCCESS" and t["partition"] in {x["partition"] for x in lost}
    }
    verdicts.figure(
        f"job {app}: {comma(job['rows'])} rows, written in {job['seconds']} s; stopped {victim} (its worker, "
        f"its udfserve node and its network namespace, SIGKILL) once its server had answered "
        f"{comma(fault['rows_at_stop'])} rows of the job"
    )
    verdicts.figure(
        f"task attempts lost with {victim}: {len(lost)} ({reasons}); "
        f"successful tasks per host {tasks_by_host}"
    )
    exactly_once(verdicts, job, output)
    verdicts.claim(
        bool(lost) and len(rerun) == len({t["partition"] for t in lost}) and victim not in rerun.values(),
        f"Spark ran the {len({t['partition'] for t in lost})} tasks lost with {victim} again on the others: "
        f"partition -> host {dict(sorted(rerun.items()))}",
    )
    survivors = {n: v for n, v in node_table(verdicts, nodes, output, app).items() if n != victim}
    verdicts.figure(
        f"{victim} committed {comma(int(output['rows_by_host'].get(victim, 0)))} rows, of tasks it finished "
        "before it was stopped"
    )
    verdicts.claim(
        all(t == s for t, s in survivors.values()),
        "the surviving nodes' servers answered exactly the rows of the tasks that ran on them: "
        + ", ".join(f"{n} {comma(s)} of {comma(t)}" for n, (t, s) in sorted(survivors.items())),
    )
    no_fallback(verdicts, job)


# -- d ---------------------------------------------------------------------------------------------
def check_node_added(folder: Path, verdicts: Verdicts) -> None:
    """d. A node started while the job runs: its executor's tasks, the first included, are answered
    by its own server."""
    job, output, nodes, fault = (
        load(folder, "job.json"),
        load(folder, "output.json"),
        nodes_of(folder),
        load(folder, "fault.json"),
    )
    if not job_ran(verdicts, job, output):
        return
    app, new = job["app_id"], fault["new_node"]
    _, tasks_by_host, _ = task_summary(job)
    new_tasks = sorted((t for t in job["tasks"] if t["host"] == new), key=lambda t: t["launched"])
    verdicts.figure(
        f"job {app}: {comma(job['rows'])} rows, written in {job['seconds']} s; {new} started "
        f"{fault['started_after_s']} s into the job, ready (its node's servers) after {fault['ready_s']} s, "
        f"its executor in the job after {fault['joined_s']} s; successful tasks per host {tasks_by_host}"
    )
    if new_tasks:
        verdicts.figure(
            f"{new}'s first task: partition {new_tasks[0]['partition']}, launched {new_tasks[0]['launched']}"
        )
    exactly_once(verdicts, job, output)
    table = node_table(verdicts, nodes, output, app)
    tasks, served = table.get(new, (0, 0))
    fallback = int(job["stats"]["rows_by_fallback"])
    others = {n: v for n, v in table.items() if n != new}
    if fault.get("layout") == "job":
        # The job's start stage ran before the node joined: its executor's first task starts the
        # host's node without waiting, and its rows run on the CPU fallback until that node serves.
        verdicts.claim(
            tasks > 0 and served + fallback == tasks and all(t == s for t, s in others.values()),
            f"{new}'s rows were answered by the node its first task started or by the fallback: "
            f"{len(new_tasks)} tasks, {comma(tasks)} rows = {comma(served)} by {new}'s server + "
            f"{comma(fallback)} by the fallback (the other nodes' servers answered all of theirs)",
        )
        return
    verdicts.claim(
        tasks > 0 and served == tasks and fallback == 0,
        f"the executor on {new} routed to its own server from its first task: {len(new_tasks)} tasks, "
        f"{comma(tasks)} rows, {comma(served)} answered by {new}'s server, "
        f"{comma(fallback)} by the fallback in the whole job",
    )
    verdicts.claim(
        all(t == s for t, s in table.values()),
        "every node's servers answered exactly the rows of its tasks",
    )


# -- e ---------------------------------------------------------------------------------------------
def check_rollout(folder: Path, verdicts: Verdicts) -> None:
    """e. A version published while a job runs: every node serves it within the poll and settle
    times (and its load); every row names the version that computed it, and no row fails. Which
    version a row gets is the client's to say (docs/model_lifecycle.md): with version_consistency
    "job" every row of the job is computed by the version serving when its UDF was built, on every
    node, also after the nodes serve the new one; with "request" a request gets the version serving
    when it arrives. A job built after the publish (folder ``after``) gets the new version."""
    job, output, nodes, fault, watch = (
        load(folder, "job.json"),
        load(folder, "output.json"),
        nodes_of(folder),
        load(folder, "fault.json"),
        load(folder, "watch.json"),
    )
    if not job_ran(verdicts, job, output):
        return
    app = job["app_id"]
    poll, settle = float(fault["poll_s"]), float(fault["settle_s"])
    scans = poll * (1 + -(-settle // poll))  # seen at the first scan, applied at the first scan after settle
    failed, _, reasons = task_summary(job)
    consistency = job.get("version_consistency", "request")
    verdicts.figure(
        f"job {app}: {comma(job['rows'])} rows with their version, written in {job['seconds']} s, "
        "its UDF built "
        f"when version {job.get('version_at_build')} served (version_consistency={consistency!r}); version 2 "
        f"published (renamed into place) {fault['published_after_s']} s into the job, once the servers had "
        f"answered {comma(fault['rows_at_publish'])} rows of it; --repository-poll-s {poll:g} "
        f"--repository-settle-s {settle:g}"
    )
    converged = True
    for node in sorted(str(fault["nodes"]).split(",")):
        ready_at = watch["ready_at"].get(node)
        if ready_at is None:
            converged = False
            verdicts.figure(f"{node}: never served version 2 within the watch")
            continue
        took = float(ready_at) - float(fault["published_at"])
        load_s = float(watch["load_s"].get(node, -1))
        bound = scans + max(load_s, 0.0) + 1.0
        converged &= took <= bound
        verdicts.figure(
            f"{node}: serves version 2 {took:.1f} s after the rename (its load and warm-up {load_s:.1f} s; "
            f"bound: a scan to see it, scans until it settled, the load, 1 s of watching = {bound:.1f} s)"
        )
    verdicts.claim(
        converged and not watch["missing"],
        f"every node served version 2 within poll + settle (scans of {poll:g} s: {scans:g} s) and its load",
    )
    exactly_once(verdicts, job, output)
    by_version = output.get("rows_by_version", {})
    stats_versions = {str(k): v for k, v in job["stats"]["rows_by_version"].items()}
    verdicts.figure(f"rows per node and version: {output.get('rows_by_host_version')}")
    reference = output.get("reference", {})
    worst = max((v["max_abs_difference"] for v in reference.values()), default=float("inf"))
    verdicts.claim(
        bool(reference)
        and set(reference) == set(by_version)
        and worst < 1e-4
        and by_version == stats_versions,
        f"every row names the version that computed it: {by_version} "
        f"(the client's counters: {stats_versions}); "
        "sampled rows equal what the version they name computes in-process: "
        + ", ".join(
            f"version {v}: {r['rows']} rows, largest difference {r['max_abs_difference']:.2g}"
            for v, r in sorted(reference.items())
        ),
    )
    held_from = int(fault["hold_from_partition"])
    expected = str(job.get("version_at_build")) if consistency == "job" else "2"
    late = {
        p: c
        for p, c in output["rows_by_partition_version"].items()
        if int(p) >= held_from and set(c) != {expected}
    }
    held_rows = sum(
        sum(c.values()) for p, c in output["rows_by_partition_version"].items() if int(p) >= held_from
    )
    if consistency == "job":
        verdicts.claim(
            set(by_version) == {expected} and not late,
            "the job kept the version serving when it was built, on every node: "
            f"all {comma(job['rows'])} rows "
            f"version {expected}, the {comma(held_rows)} rows of the partitions held until every node served "
            f"version 2 (from partition {held_from}) too" + (f"; not so: {late}" if late else ""),
        )
    else:
        verdicts.claim(
            set(by_version) == {"1", "2"} and not late,
            f"requests got the version serving when they arrived: rows of both versions, and the "
            f"{comma(held_rows)} rows of the partitions held until every node served version 2 "
            "(from partition "
            f"{held_from}) all version 2" + (f"; not so: {late}" if late else ""),
        )
    verdicts.claim(
        failed == 0 and job["stats"]["rows_by_fallback"] == 0,
        f"no row failed: {failed} failed task attempts{' ' + str(reasons) if reasons else ''}, "
        f"{comma(job['stats']['rows_by_fallback'])} rows by the fallback",
    )
    table = node_table(verdicts, nodes, output, app)
    verdicts.claim(
        all(t == s for t, s in table.values()),
        "each node's servers answered exactly the rows of its tasks during the rollout",
    )
    after_job, after_output = load(folder / "after", "job.json"), load(folder / "after", "output.json")
    if job_ran(verdicts, after_job, after_output):
        exactly_once(verdicts, after_job, after_output)
        after_versions = after_output.get("rows_by_version", {})
        after_reference = after_output.get("reference", {})
        verdicts.claim(
            set(after_versions) == {"2"}
            and set(output["rows_by_host"]) <= {h.split(":")[0] for h in after_output["rows_by_host_version"]}
            and max((v["max_abs_difference"] for v in after_reference.values()), default=1.0) < 1e-4,
            f"a job built after the publish ({after_job['app_id']}, {comma(after_job['rows'])} rows) "
            "got version 2 "
            f"on every node: {after_output.get('rows_by_host_version')}",
        )


# -- f ---------------------------------------------------------------------------------------------
def check_metrics(folder: Path, verdicts: Verdicts) -> None:
    """f. Prometheus scrapes every server and supervisor of every node, and the job's per-application
    series add up to its rows."""
    prometheus, nodes, job = load(folder, "prometheus.json"), nodes_of(folder), load(folder, "job.json")
    if prometheus is None:
        verdicts.claim(False, "Prometheus answered (no figures)")
        return
    targets = [t for t in prometheus["targets"] if t["job"] == "udfserve"]
    expected = {(name, "supervisor", None) for name in nodes} | {
        (name, "model_server", server["device"]) for name, node in nodes.items() for server in node["servers"]
    }
    found = {(t["node"], t["role"], t["device"] if t["role"] == "model_server" else None) for t in targets}
    down = [f"{t['url']} ({t['error']})" for t in prometheus["targets"] if t["health"] != "up"]
    verdicts.figure(
        "targets: "
        + ", ".join(
            f"{t['node']}/{t['role']}{'/' + t['device'] if t['device'] else ''}={t['health']}"
            for t in sorted(targets, key=lambda t: (t["node"] or "", t["role"] or ""))
        )
    )
    verdicts.claim(
        found == expected and not down,
        f"Prometheus scrapes every server and supervisor of every node: {len(targets)} udfserve targets "
        f"for {len(nodes)} nodes, {len(down)} down"
        + (f" ({down})" if down else "")
        + (f"; expected {sorted(expected - found, key=str)} too" if expected - found else "")
        + (f"; unexpected {sorted(found - expected, key=str)}" if found - expected else ""),
    )
    if job is not None:
        by_node = prometheus["app_rows_by_node"]
        total = sum(by_node.values())
        verdicts.claim(
            total == job["rows"],
            f"the per-application series of job {job['app_id']} add up to its rows: "
            + ", ".join(f"{n} {comma(v)}" for n, v in sorted(by_node.items()))
            + f" = {comma(total)} of {comma(job['rows'])}",
        )


CHECKS: dict[str, Callable[[Path, Verdicts], None]] = {
    "routing": check_routing,
    "server-killed": check_server_killed,
    "node-lost": check_node_lost,
    "node-added": check_node_added,
    "rollout": check_rollout,
    "metrics": check_metrics,
}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("check", choices=sorted(CHECKS))
    parser.add_argument("folder", type=Path)
    args = parser.parse_args(argv)
    verdicts = Verdicts()
    try:
        CHECKS[args.check](args.folder, verdicts)
    except (KeyError, TypeError, ValueError) as exc:
        verdicts.claim(False, f"check {args.check} could read what it needs from {args.folder} ({exc!r})")
    sys.stdout.write("\n".join(verdicts.lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
