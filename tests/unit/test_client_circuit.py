"""Circuit breakers: open on failure, half-open after the reset delay, closed by a success, and
closed for the server that replaced the one that failed."""

from __future__ import annotations

from udfserve.spark_client.executor.circuit import CircuitBreakers


class Clock:
    """Time that moves only when the test says so."""

    def __init__(self) -> None:
        self.now_s = 100.0

    def __call__(self) -> float:
        return self.now_s


def test_a_target_never_failed_is_closed() -> None:
    assert CircuitBreakers(Clock()).state("unix:///a.sock", reset_s=5) == "closed"


def test_a_failure_opens_the_circuit_until_the_reset_delay_passes() -> None:
    clock = Clock()
    breakers = CircuitBreakers(clock)
    breakers.failed("a:1", "deadline_exceeded")
    clock.now_s += 4.9
    assert not breakers.allows("a:1", reset_s=5)
    clock.now_s += 0.1
    assert breakers.state("a:1", reset_s=5) == "half_open" and breakers.allows("a:1", reset_s=5)


def test_a_failed_probe_opens_it_for_another_full_delay() -> None:
    clock = Clock()
    breakers = CircuitBreakers(clock)
    breakers.failed("a:1", "connect_failed")
    clock.now_s += 5
    breakers.failed("a:1", "connect_failed")
    assert breakers.reopens_at("a:1", reset_s=5) == clock.now_s + 5
    assert not breakers.allows("a:1", reset_s=5)


def test_a_success_closes_it_and_forgets_the_reason() -> None:
    breakers = CircuitBreakers(Clock())
    breakers.failed("a:1", "stream_closed")
    assert breakers.reason("a:1") == "stream_closed"
    breakers.succeeded("a:1")
    assert breakers.state("a:1", reset_s=5) == "closed" and breakers.reason("a:1") is None


def test_circuits_are_kept_per_target() -> None:
    breakers = CircuitBreakers(Clock())
    breakers.failed("unix:///gpu0.sock", "stream_closed")
    assert breakers.allows("unix:///gpu1.sock", reset_s=5)


def test_a_zero_delay_lets_every_batch_probe() -> None:
    breakers = CircuitBreakers(Clock())
    breakers.failed("a:1", "connect_failed")
    assert breakers.allows("a:1", reset_s=0)


def test_a_circuit_stays_open_for_the_server_that_failed() -> None:
    breakers = CircuitBreakers(Clock())
    breakers.failed("unix:///server-sim0.sock", "stream_closed", server="pid 10")
    assert not breakers.allows("unix:///server-sim0.sock", reset_s=600, server="pid 10")
    assert breakers.reason("unix:///server-sim0.sock", server="pid 10") == "stream_closed"


def test_a_circuit_opened_by_a_server_is_closed_for_the_one_announced_in_its_place() -> None:
    breakers = CircuitBreakers(Clock())
    breakers.failed("unix:///server-sim0.sock", "stream_closed", server="pid 10")
    assert breakers.state("unix:///server-sim0.sock", reset_s=600, server="pid 11") == "closed"
    assert breakers.reason("unix:///server-sim0.sock", server="pid 11") is None
