"""How the soak judges a measure flat after its warm-up: memory by the slope of a least-squares
line, counts by whether the line rises by one or a sample passes the warm-up's highest."""

from __future__ import annotations

from benchmarks.soak_sampling import trend

MINUTES = [60.0 * m for m in range(61)]  # a sample a minute for an hour; warm-up: 10 minutes
WARM_UP_S = 600.0


def test_memory_rising_half_a_mib_per_10_minutes_is_flat() -> None:
    values = [800 + 0.05 * m for m in range(61)]
    found = trend("server", "MiB", "memory", MINUTES, values, WARM_UP_S)
    assert found.flat is True and abs(found.slope_per_10_min - 0.5) < 1e-9
    assert found.samples == 51


def test_memory_rising_two_mib_per_10_minutes_is_not_flat() -> None:
    values = [800 + 0.2 * m for m in range(61)]
    assert trend("server", "MiB", "memory", MINUTES, values, WARM_UP_S).flat is False


def test_growth_during_the_warm_up_alone_does_not_count() -> None:
    values = [700 + 10 * min(m, 10) for m in range(61)]
    assert trend("server", "MiB", "memory", MINUTES, values, WARM_UP_S).flat is True


def test_a_count_that_moves_within_what_the_warm_up_saw_is_flat() -> None:
    # connections open at some samples and not at others, the later ones more often
    values = [25 + (8 if m % 7 == 0 or m > 50 else 0) for m in range(61)]
    found = trend("fds", "fds", "count", MINUTES, values, WARM_UP_S)
    assert found.rise >= 1 and found.flat is True


def test_a_count_that_climbs_past_the_warm_up_is_not_flat() -> None:
    values = [25 + m // 5 for m in range(61)]
    assert trend("fds", "fds", "count", MINUTES, values, WARM_UP_S).flat is False


def test_fewer_than_two_samples_after_the_warm_up_judge_nothing() -> None:
    found = trend("fds", "fds", "count", MINUTES[:11], [25.0] * 11, WARM_UP_S)
    assert found.samples == 1 and found.flat is None
