"""Node servers started by the Spark job itself (``node_servers``), on a real standalone cluster.

A master and two workers are started with ``spark-class`` from the pip-installed PySpark, as in
``test_cluster.py``. Each worker stands for a host: its environment gives it a runtime folder of
its own (``UDFSERVE_RUNTIME_DIR``, which its executors inherit) and a node name
(``UDFSERVE_NODE_NAME``), so the nodes its executors start are told apart on this one machine
exactly as on separate hosts. No node runs before a job starts one. Each application is a
driver process of its own (``node_servers_driver.py``), driven step by step, so that a test can
leave a context while the driver lives, or kill the driver with SIGKILL.

Every wait is for an event: a process gone (or a zombie: this machine's init reaps no orphan), a
node's readiness probe (its supervisor's ``/health/ready``), the driver's answer.
"""

from __future__ import annotations

import json
import select
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest
from test_cluster import master_addresses, start_daemon, wait_for_workers

from tests.short_lived_jvms import short_lived_jvm_environment
from udfserve.discovery import DISCOVERY_FILE_ENV, read_discovery

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

DRIVER = Path(__file__).with_name("node_servers_driver.py")
ANSWER = "@@answer "
HOSTS = ("host-a", "host-b")
LATE_HOST = "host-c"
LEASE_POLL_S = 0.5
LEASE_TIMEOUT_S = 4.0
COMMAND_TIMEOUT_S = 300.0


@dataclass
class Host:
    name: str
    runtime_dir: Path
    worker: subprocess.Popen[bytes]


@dataclass
class Cluster:
    root: Path
    master_url: str
    web_url: str
    environment: dict[str, str]
    daemons: list[subprocess.Popen[bytes]] = field(default_factory=list)
    hosts: dict[str, Host] = field(default_factory=dict)

    def add_worker(self, name: str, cores: int = 2, wait: bool = True) -> Host:
        """A worker standing for host ``name``: its own runtime folder and node name; ``wait``: until
        the master lists it (else the caller waits, for several workers started together)."""
        folder = self.root / name
        folder.mkdir()
        environment = {
            **self.environment,
            "UDFSERVE_RUNTIME_DIR": str(folder / "runtime"),
            "UDFSERVE_NODE_NAME": name,
        }
        worker = start_daemon(
            ["org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1", "--cores", str(cores),
             "--memory", "1200m", "--webui-port", "0", "--work-dir", str(folder / "work"), self.master_url],
            environment, folder / "worker.log",
        )  # fmt: skip
        self.daemons.append(worker)
        host = self.hosts[name] = Host(name, folder / "runtime", worker)
        if wait:
            wait_for_workers(self.web_url, len(self.hosts), self.daemons, timeout_s=120)
        return host


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("node-servers-cluster")
    environment = {k: v for k, v in short_lived_jvm_environment().items() if not k.startswith("UDFSERVE_")}
    environment |= {"SPARK_LOCAL_IP": "127.0.0.1", "SPARK_NO_DAEMONIZE": "1"}
    master = start_daemon(
        ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", "0", "--webui-port", "0"],
        environment,
        root / "master.log",
    )
    cluster = Cluster(root, "", "", environment, daemons=[master])
    try:
        cluster.master_url, cluster.web_url = master_addresses(root / "master.log", master, timeout_s=120)
        for name in HOSTS:  # their JVMs start side by side
            cluster.add_worker(name, wait=False)
        wait_for_workers(cluster.web_url, len(HOSTS), cluster.daemons, timeout_s=120)
        yield cluster
    finally:
        for daemon in reversed(cluster.daemons):
            daemon.terminate()
        for daemon in cluster.daemons:
            try:
                daemon.wait(timeout=30)
            except subprocess.TimeoutExpired:
                daemon.kill()


class Driver:
    """One Spark application: ``node_servers_driver.py``, answering one command at a time."""

    def __init__(self, arguments: list[str], environment: dict[str, str], log: Path) -> None:
        self.log = log
        with open(log, "wb") as stderr:
            self.process = subprocess.Popen(
                [sys.executable, str(DRIVER), *arguments],
                env=environment,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=stderr,
            )
        self.app_id = ""

    def send(self, command: dict[str, object], timeout_s: float = COMMAND_TIMEOUT_S) -> dict[str, object]:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write((json.dumps(command) + "\n").encode())
        self.process.stdin.flush()
        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([self.process.stdout], [], [], max(left, 0))
            if not ready:
                raise AssertionError(
                    f"the driver did not answer {command} within {timeout_s:g} s; {self.log}"
                )
            line = self.process.stdout.readline().decode(errors="replace")
            if not line:
                raise AssertionError(
                    f"the driver exited ({self.process.wait()}) on {command}; {self.log_tail()}"
                )
            if line.startswith(ANSWER):
                answer: dict[str, object] = json.loads(line[len(ANSWER) :])
                assert "error" not in answer, f"{command}: {answer['error']}\n{answer.get('traceback', '')}"
                return answer

    def start(self, executors: int, repository: Path, **settings: object) -> list[dict[str, object]]:
        """Wait for ``executors`` to register, enter ``node_servers``; the hosts' nodes it reports."""
        self.send({"do": "executors", "count": executors})
        answer = self.send(
            {
                "do": "start",
                "model_repository": str(repository),
                "devices": "cpu",
                "models": ["tabular_mlp"],
                "lease_poll_s": LEASE_POLL_S,
                "lease_timeout_s": LEASE_TIMEOUT_S,
                **settings,
            }
        )
        self.app_id = str(answer["app_id"])
        return answer["hosts"]  # type: ignore[return-value]

    def job(self, rows: int, partitions: int) -> dict[str, object]:
        answer = self.send({"do": "job", "rows": rows, "partitions": partitions})
        assert answer["rows"] == rows and answer["distinct_ids"] == rows, answer
        return answer

    def kill(self) -> None:
        self.process.kill()
        self.process.wait()
        self.close_pipes()

    def close_pipes(self) -> None:
        for pipe in (self.process.stdin, self.process.stdout):
            if pipe is not None:
                pipe.close()

    def quit(self) -> None:
        if self.process.poll() is None:
            assert self.process.stdin is not None
            self.process.stdin.write(b'{"do": "quit"}\n')
            self.process.stdin.flush()
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.close_pipes()

    def log_tail(self) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-30:])


def cluster_driver(cluster: Cluster, name: str, cores: int, tmp_path: Path) -> Driver:
    """A driver of ``cores`` one-core executors; its own discovery file is host-a's, so that it
    reads the model's inputs and outputs from a server rather than loading the model."""
    environment = {
        **cluster.environment,
        DISCOVERY_FILE_ENV: str(cluster.hosts[HOSTS[0]].runtime_dir / "discovery.json"),
    }
    arguments = ["--master", cluster.master_url, "--cores-max", str(cores), "--app-name", name]
    return Driver(arguments, environment, tmp_path / f"{name}.log")


@pytest.fixture
def drivers() -> Iterator[list[Driver]]:
    started: list[Driver] = []
    yield started
    for driver in started:
        driver.quit()


@dataclass
class Application:
    driver: Driver
    hosts: list[dict[str, object]]
    """The hosts' nodes as the context's start stage reported them."""


@pytest.fixture(scope="module")
def application(
    cluster: Cluster, tabular_onnx_repository: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Application]:
    """One application inside ``node_servers``: four one-core executors on the two hosts (two on
    each) when it starts, and a fifth core for a host that joins later."""
    driver = cluster_driver(cluster, "one-context", cores=5, tmp_path=tmp_path_factory.mktemp("driver"))
    try:
        yield Application(driver, driver.start(4, tabular_onnx_repository))
    finally:
        driver.quit()


# -- what the tests look at on each host ---------------------------------------------------------


def node_processes(runtime_dir: Path) -> list[psutil.Process]:
    """The ``udfserve node`` supervisors running with this runtime folder."""
    found = []
    for process in psutil.process_iter(["cmdline", "status"]):
        command = process.info["cmdline"] or []
        if process.info["status"] == psutil.STATUS_ZOMBIE or command[1:4] != ["-m", "udfserve", "node"]:
            continue
        if str(runtime_dir) in command:
            found.append(process)
    return found


def node_pids(runtime_dir: Path) -> set[int]:
    """The supervisor of the host's one node and its servers."""
    supervisors = node_processes(runtime_dir)
    assert len(supervisors) == 1, f"{runtime_dir}: {len(supervisors)} node supervisors"
    return {supervisors[0].pid, *(child.pid for child in supervisors[0].children())}


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def wait_until_gone(pids: set[int], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not all(gone(pid) for pid in pids):
        assert time.monotonic() < deadline, (
            f"still running after {timeout_s:g} s: {sorted(p for p in pids if not gone(p))}"
        )
        time.sleep(0.1)


def supervisor_health(runtime_dir: Path) -> tuple[int, dict[str, object]]:
    """The node's readiness probe: its supervisor's ``/health/ready`` (status, body)."""
    targets = json.loads((runtime_dir / "prometheus-targets.json").read_text())
    address = next(t["targets"][0] for t in targets if t["labels"]["role"] == "supervisor")
    try:
        response = urllib.request.urlopen(f"http://{address}/health/ready", timeout=10)
        return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def rows_served(runtime_dir: Path, app_id: str) -> int:
    """The rows the host's servers counted for the application (``/v1/spark/applications``)."""
    total = 0
    for server in read_discovery(runtime_dir / "discovery.json").ready_servers():
        body = json.loads(
            urllib.request.urlopen(f"http://{server.http_address}/v1/spark/applications", timeout=10).read()
        )
        total += sum(int(app["rows"]) for app in body["applications"] if app["app_id"] == app_id)
    return total


# -- the tests -------------------------------------------------------------------------------------
# The two applications' test comes first: it needs the cores that ``application`` keeps until
# the end of the module.


def test_a_node_shared_by_two_applications_lives_until_the_last_one_is_killed(
    cluster: Cluster, tabular_onnx_repository: Path, drivers: list[Driver], tmp_path: Path
) -> None:
    """Two applications with one executor on each host: the second finds the first one's nodes.
    The first driver killed (SIGKILL), every node drops its lease and keeps serving the second;
    the second killed too, every host's node and servers are gone."""
    first = cluster_driver(cluster, "first", cores=2, tmp_path=tmp_path)
    second = cluster_driver(cluster, "second", cores=2, tmp_path=tmp_path)
    drivers += [first, second]
    first_hosts = first.start(2, tabular_onnx_repository)
    second_hosts = second.start(2, tabular_onnx_repository)

    assert all(h["started"] for h in first_hosts) and not any(h["started"] for h in second_hosts)
    assert {h["node"]: h["supervisor_pid"] for h in second_hosts} == {
        h["node"]: h["supervisor_pid"] for h in first_hosts
    }
    pids = set().union(*(node_pids(cluster.hosts[name].runtime_dir) for name in HOSTS))

    first.kill()
    deadline = time.monotonic() + LEASE_TIMEOUT_S + 30
    for name in HOSTS:
        while any(lease["application"] == first.app_id for lease in leases_of(cluster.hosts[name])):
            assert time.monotonic() < deadline, f"{name} still holds {first.app_id}'s lease"
            time.sleep(0.1)
    assert not any(gone(pid) for pid in pids)
    result = second.job(rows=4_000, partitions=4)
    rows_by_node: dict[str, int] = result["rows_by_node"]  # type: ignore[assignment]
    for name in HOSTS:
        assert rows_served(cluster.hosts[name].runtime_dir, second.app_id) == rows_by_node[name]

    second.kill()
    wait_until_gone(pids, timeout_s=LEASE_TIMEOUT_S + 30)


def test_each_host_runs_one_node_whatever_the_number_of_its_executors(
    cluster: Cluster, application: Application
) -> None:
    """The start stage's four tasks, two on each host's two executors, started two nodes: one
    per host, each the only supervisor of its runtime folder."""
    hosts = application.hosts
    assert sorted(h["node"] for h in hosts) == list(HOSTS)
    assert all(len(h["executors"]) == 2 and h["started"] for h in hosts), hosts  # type: ignore[arg-type]
    supervisors = {name: [p.pid for p in node_processes(cluster.hosts[name].runtime_dir)] for name in HOSTS}
    assert supervisors == {h["node"]: [h["supervisor_pid"]] for h in hosts}


def test_a_job_in_the_context_is_served_by_the_nodes_it_started(
    cluster: Cluster, application: Application
) -> None:
    """Eight tasks, each making sure of its host's node, start none more; each host's servers
    count exactly the rows of the tasks that ran there, and none fell back."""
    driver = application.driver
    before = {name: node_pids(cluster.hosts[name].runtime_dir) for name in HOSTS}
    served_before = {name: rows_served(cluster.hosts[name].runtime_dir, driver.app_id) for name in HOSTS}

    result = driver.job(rows=8_000, partitions=8)

    rows_by_node: dict[str, int] = result["rows_by_node"]  # type: ignore[assignment]
    assert set(rows_by_node) == set(HOSTS), rows_by_node
    for name in HOSTS:
        served = rows_served(cluster.hosts[name].runtime_dir, driver.app_id) - served_before[name]
        assert served == rows_by_node[name]
    assert (result["rows_by_server"], result["rows_by_fallback"]) == (8_000, 0)
    assert {name: node_pids(cluster.hosts[name].runtime_dir) for name in HOSTS} == before


def test_an_executor_added_later_runs_on_the_fallback_until_its_hosts_node_serves(
    cluster: Cluster, application: Application
) -> None:
    """A third host joins and the application gets an executor there. The first job's tasks on
    it start its node and answer their rows on the CPU fallback meanwhile (every id still once);
    once the node is ready, the next job's rows on that host are all counted by its server."""
    driver = application.driver
    late = cluster.add_worker(LATE_HOST, cores=1)
    assert node_processes(late.runtime_dir) == []
    driver.send({"do": "executors", "count": 5})

    first = driver.job(rows=10_000, partitions=10)
    rows_by_node: dict[str, int] = first["rows_by_node"]  # type: ignore[assignment]
    assert rows_by_node.get(LATE_HOST, 0) > 0, rows_by_node
    late_served = (
        rows_served(late.runtime_dir, driver.app_id) if readiness(late.runtime_dir) is not None else 0
    )
    assert 0 < first["rows_by_fallback"] == rows_by_node[LATE_HOST] - late_served  # type: ignore[operator]

    deadline = time.monotonic() + 120
    while readiness(late.runtime_dir) != 200:
        assert time.monotonic() < deadline, f"{LATE_HOST}'s node did not become ready"
        time.sleep(0.2)
    before = rows_served(late.runtime_dir, driver.app_id)
    second = driver.job(rows=10_000, partitions=10)
    late_rows = second["rows_by_node"].get(LATE_HOST, 0)  # type: ignore[union-attr]
    assert second["rows_by_fallback"] == 0
    assert late_rows > 0 and rows_served(late.runtime_dir, driver.app_id) - before == late_rows
    assert all(len(node_processes(host.runtime_dir)) == 1 for host in cluster.hosts.values())


def test_every_node_stops_when_the_context_ends(cluster: Cluster, application: Application) -> None:
    """Leaving the context (the driver still running) stops every host's node and servers."""
    pids = set().union(*(node_pids(host.runtime_dir) for host in cluster.hosts.values()))
    application.driver.send({"do": "exit"})
    wait_until_gone(pids, timeout_s=30)
    assert application.driver.process.poll() is None


def leases_of(host: Host) -> list[dict[str, str]]:
    status, body = supervisor_health(host.runtime_dir)
    assert status == 200, body
    return body["leases"]  # type: ignore[return-value]


def readiness(runtime_dir: Path) -> int | None:
    """The node's readiness status; None while it has no supervisor listening (starting, or none)."""
    try:
        return supervisor_health(runtime_dir)[0]
    except (OSError, ValueError, StopIteration):
        return None


def test_node_servers_from_a_spark_connect_session(
    tabular_onnx_repository: Path,
    drivers: list[Driver],
    tmp_path: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """A Spark Connect session (local, its executor on this machine): the client serves the
    lease, the start stage starts the node, a job is served by it, and leaving the context
    stops it."""
    # a short folder: the test's own (named after it, in a parallel worker's folder) leaves the
    # node's socket paths too long for a unix socket
    runtime_dir = tmp_path_factory.mktemp("connect-host") / "runtime"
    # the session's local Spark Connect server is a JVM of this test alone: a short-lived one
    environment = {k: v for k, v in short_lived_jvm_environment().items() if not k.startswith("UDFSERVE_")}
    environment |= {"UDFSERVE_RUNTIME_DIR": str(runtime_dir), "UDFSERVE_NODE_NAME": "connect-host"}
    driver = Driver(["--connect", "--app-name", "connect"], environment, tmp_path / "connect.log")
    drivers.append(driver)
    answer = driver.send(
        {
            "do": "start",
            "model_repository": str(tabular_onnx_repository),
            "devices": "cpu",
            "models": ["tabular_mlp"],
            "lease_poll_s": LEASE_POLL_S,
            "lease_timeout_s": LEASE_TIMEOUT_S,
        }
    )
    hosts: list[dict[str, object]] = answer["hosts"]  # type: ignore[assignment]
    assert [(h["node"], h["started"]) for h in hosts] == [("connect-host", True)]
    pids = node_pids(runtime_dir)

    result = driver.job(rows=4_000, partitions=2)
    assert rows_served(runtime_dir, str(answer["app_id"])) == result["rows"] == 4_000

    driver.send({"do": "exit"})
    wait_until_gone(pids, timeout_s=30)
