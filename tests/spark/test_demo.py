"""`udfserve demo` end to end, as a user runs it: a model other than the default, few rows.

One demo runs for the module, with ``--keep-running``, scoring ``multi_io`` (two inputs of
different dtypes and ranks, two outputs): its report, the node it keeps up after the report,
and Ctrl-C ending both. The tests read the demo's standard output up to the last line it
prints before waiting, and run in the order written: the last one stops the demo.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.short_lived_jvms import short_lived_jvm_environment

pytestmark = pytest.mark.slow

ROWS = 300


@dataclass
class RunningDemo:
    process: subprocess.Popen[str]
    stdout: str

    def field(self, label: str) -> str:
        """The value of a report line such as ``metrics   http://...``."""
        match = re.search(rf"^{re.escape(label)} +(.+)$", self.stdout, re.MULTILINE)
        assert match, f"no {label!r} line in the demo's output:\n{self.stdout}"
        return match.group(1)


@pytest.fixture(scope="module")
def demo(example_repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningDemo]:
    stderr = tmp_path_factory.mktemp("demo") / "stderr.log"
    with open(stderr, "w") as errors:
        process = subprocess.Popen(
            [
                sys.executable, "-m", "udfserve", "demo",
                "--model", "multi_io",
                "--rows", str(ROWS),
                "--partitions", "2",
                "--model-repository", str(example_repository),
                "--keep-running",
            ],
            stdout=subprocess.PIPE,
            stderr=errors,
            text=True,
            env=short_lived_jvm_environment(),  # the demo's Spark application lives seconds
        )  # fmt: skip
    assert process.stdout is not None
    lines = []
    for line in process.stdout:  # the report, then where to look at the node it keeps up
        lines.append(line)
        if line.startswith("node log "):
            break
    else:
        process.wait()
        process.stdout.close()
        pytest.fail(f"the demo exited with code {process.returncode}:\n{stderr.read_text()[-4000:]}")
    yield RunningDemo(process, "".join(lines))
    if process.poll() is None:
        process.kill()
        process.wait()
    process.stdout.close()


def test_the_demo_scores_a_model_of_two_inputs_with_columns_generated_from_its_metadata(
    demo: RunningDemo,
) -> None:
    assert demo.field("rows scored").startswith(f"{ROWS} through remote_predict('multi_io')")
    assert demo.field("answered by servers").startswith(f"{ROWS} rows")
    assert demo.field("answered by fallback").startswith("0 rows")
    samples = re.findall(r"^  id \d+ +(.+)$", demo.stdout, re.MULTILINE)
    assert len(samples) == 3
    assert all(re.fullmatch(r"score=[\d.]+, embedding=\[(-?[\d.]+ ?){4}\]", sample) for sample in samples)


def test_the_report_sets_sends_against_batches_and_payloads_against_sends(demo: RunningDemo) -> None:
    batches = re.fullmatch(r"\d+ rows in (\d+) batches .*", demo.field("answered by servers"))
    sends = re.match(
        r"(\d+) \(RESOURCE_EXHAUSTED, or shared memory refused\): (\d+) batches took (\d+) sends",
        demo.field("resends"),
    )
    payloads = re.fullmatch(
        r"(\d+) of (\d+) sends through the node's shared memory "
        r"\(the servers read (\d+) there\), (\d+) inline",
        demo.field("payloads"),
    )
    assert batches and sends and payloads, demo.stdout
    resent, batches_sent, sent = (int(value) for value in sends.groups())
    in_shared_memory, of_sends, read_by_servers, inline = (int(value) for value in payloads.groups())
    assert batches_sent == int(batches[1]) and sent == batches_sent + resent
    assert of_sends == sent and in_shared_memory + inline == sent
    assert read_by_servers == in_shared_memory


def test_a_warm_up_job_runs_first_and_its_rows_are_not_counted_in_the_timed_job(demo: RunningDemo) -> None:
    warm_up = re.match(r"([\d,]+) rows in (\d+) tasks, [\d.]+ s, before the timed job", demo.field("warm-up"))
    assert warm_up, demo.stdout
    assert int(warm_up[1].replace(",", "")) > 0 and int(warm_up[2]) >= 1
    # The timed UDF's counters and the servers' counts over the timed job hold its rows alone.
    answered = re.fullmatch(
        r"(\d+) rows in \d+ batches \(the servers' own metrics count (\d+)\)",
        demo.field("answered by servers"),
    )
    assert answered and answered.groups() == (str(ROWS), str(ROWS)), demo.stdout


def test_the_report_says_the_example_model_is_untrained(demo: RunningDemo) -> None:
    assert demo.field("note").startswith("multi_io is one of udfserve's example models, generated untrained")


def test_with_keep_running_the_printed_metrics_address_answers_after_the_report(demo: RunningDemo) -> None:
    address = demo.field("metrics")
    with urllib.request.urlopen(address, timeout=30) as response:
        metrics = response.read().decode()
    # The job's rows, and those of the report's sample rows, scored again.
    [rows] = re.findall(r'^udfserve_rows_total\{model="multi_io"\} ([\d.]+)$', metrics, re.MULTILINE)
    assert float(rows) >= ROWS


def test_ctrl_c_stops_the_node_kept_running_and_the_demo_exits_0(demo: RunningDemo) -> None:
    runtime_dir = Path(demo.field("node log")).parent
    demo.process.send_signal(signal.SIGINT)
    assert demo.process.wait(timeout=120) == 0
    assert not runtime_dir.exists()
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(demo.field("metrics"), timeout=30)


def test_an_unknown_model_is_refused_in_one_line(example_repository: Path) -> None:
    completed = subprocess.run(
        [sys.executable, "-m", "udfserve", "demo", "--model", "no_such_model",
         "--model-repository", str(example_repository)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ},
        check=False,
    )  # fmt: skip
    assert completed.returncode == 1
    lines = completed.stderr.strip().splitlines()
    assert len(lines) == 1, completed.stderr
    assert "unknown model 'no_such_model'" in lines[0]
    assert "expected one of them" in lines[0] and "multi_io" in lines[0]
