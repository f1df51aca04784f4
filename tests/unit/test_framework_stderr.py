"""What of TensorFlow's start-up output on stderr is passed on: ``framework_stderr.ChatterFilter``.

The lines are those TensorFlow 2.21 printed on a CPU-only machine, on import and on the first
look at its devices.
"""

from __future__ import annotations

import logging

from udfserve.runtime.framework_stderr import ChatterFilter, min_log_level
from udfserve.services.json_lines import JsonLines

PREAMBLE = "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR"
ONEDNN = (
    "I0000 00:00:1795588057.576123   17463 port.cc:153] oneDNN custom operations are on. You may see "
    "slightly different numerical results due to floating-point round-off errors."
)
NO_DRIVER = (
    "I0000 00:00:1795588057.576856   17463 cudart_stub.cc:31] Could not find cuda drivers on your "
    "machine, GPU will not be used."
)
CPU_FEATURES = (
    "I0000 00:00:1795588089.442902   18340 cpu_feature_guard.cc:227] This TensorFlow binary is optimized "
    "to use available CPU instructions in performance-critical operations."
)
CPU_FEATURES_CONTINUED = "To enable the following instructions: AVX2 FMA, in other operations, rebuild."
CUINIT = (
    "E0000 00:00:1795588060.808836   17463 cuda_platform.cc:52] failed call to cuInit: INTERNAL: CUDA "
    "error: Failed call to cuInit: UNKNOWN ERROR (303)"
)
OTHER_ERROR = (
    "E0000 00:00:1795588060.808836   17463 some_op.cc:12] could not open /models/x: Permission denied"
)
OWN_LOG = "2026-11-25 06:27:40,935 INFO [17463 udfserve] listening on /tmp/a.sock"
START_UP = [PREAMBLE, ONEDNN, NO_DRIVER, CPU_FEATURES, CPU_FEATURES_CONTINUED, CUINIT]


def kept(lines: list[str], min_log_level: int = 2, gpus_hidden: bool = True) -> list[str]:
    chatter = ChatterFilter(min_log_level, gpus_hidden)
    return [line for line in lines if chatter.keep(line)]


def test_on_a_cpu_device_every_start_up_line_is_left_out() -> None:
    assert kept(START_UP) == []


def test_a_failed_cuinit_is_kept_when_the_gpus_are_not_hidden_on_purpose() -> None:
    assert kept(START_UP, gpus_hidden=False) == [CUINIT]


def test_an_error_of_the_framework_that_is_not_about_cuda_is_kept() -> None:
    assert kept([ONEDNN, OTHER_ERROR]) == [OTHER_ERROR]


def test_log_level_zero_keeps_everything() -> None:
    assert kept(START_UP, min_log_level=0) == START_UP


def test_log_level_one_keeps_errors_and_leaves_out_information() -> None:
    assert kept([PREAMBLE, NO_DRIVER, OTHER_ERROR], min_log_level=1) == [OTHER_ERROR]


def test_a_line_of_this_process_after_a_dropped_message_is_kept() -> None:
    assert kept([CPU_FEATURES, OWN_LOG, CPU_FEATURES_CONTINUED]) == [OWN_LOG, CPU_FEATURES_CONTINUED]


def test_a_json_line_of_this_process_after_a_dropped_message_is_kept() -> None:
    record = logging.LogRecord(
        "udfserve", logging.INFO, __file__, 1, "listening on %s", ("/tmp/a.sock",), None
    )
    own = JsonLines().format(record)

    assert kept([CPU_FEATURES, own, CPU_FEATURES_CONTINUED]) == [own, CPU_FEATURES_CONTINUED]


def test_lines_that_are_not_the_frameworks_pass_unchanged() -> None:
    lines = ["Traceback (most recent call last):", '  File "x.py", line 1, in <module>', "ValueError: x"]
    assert kept(lines) == lines


def test_the_log_level_is_read_as_tensorflow_reads_it() -> None:
    assert [
        min_log_level(env) for env in ({}, {"TF_CPP_MIN_LOG_LEVEL": "3"}, {"TF_CPP_MIN_LOG_LEVEL": "x"})
    ] == [
        0,
        3,
        0,
    ]
