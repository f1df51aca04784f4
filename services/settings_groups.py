"""Which part of ``--help`` each setting of ``udfserve serve`` and ``udfserve node`` is listed in.

One mapping, beside the settings classes rather than inside them, keyed by the setting's name: a
setting both commands have (``--models``, ``--allow-insecure-remote``, the shared model-lifecycle
settings) sits in the same group in both. ``tests/unit/test_settings_groups.py`` checks that every
setting of both classes has a group, so a new setting cannot reach ``--help`` unlisted.
"""

from __future__ import annotations

from collections.abc import Mapping

GROUPS: Mapping[str, str] = {
    "listening": "where the gRPC, KServe and HTTP listeners bind, and the shared-memory transport",
    "security": "TLS, the token, who may connect, and what may be loaded",
    "limits": "bounds on messages, calls, held bytes and admin requests",
    "models": "the model repository, which models load, and how versions change while serving",
    "batching": "how queued requests are scheduled and run on the backend",
    "observability": "logs, tracing, metrics labels and the admin app's documents",
    "process": "the device, the event loop, and how the process stops",
    "supervision": "the node's devices, runtime folder, discovery file, restarts and leases",
}
"""Each group's title, in the order ``--help`` lists them, and the line printed under its title."""

SETTING_GROUPS: Mapping[str, str] = {
    # settings every server and the node have (SharedServerSettings)
    "model_control": "models",
    "repository_poll_s": "models",
    "repository_settle_s": "models",
    "version_swap": "models",
    "version_drain_s": "models",
    "grace_period_s": "process",
    "log_level": "observability",
    "log_format": "observability",
    "tracing_otlp_endpoint": "observability",
    "tracing_otlp_insecure": "observability",
    "tracing_spans_file": "observability",
    "tracing_sample_ratio": "observability",
    "tracing_service_name": "observability",
    # udfserve serve (ServerConfig)
    "model_repository": "models",
    "models": "models",
    "version_lease_s": "models",
    "max_leased_versions": "models",
    "max_leased_version_bytes": "models",
    "trust_savedmodels": "security",
    "device": "process",
    "device_uuid": "observability",
    "socket": "listening",
    "socket_mode": "security",
    "host": "listening",
    "port": "listening",
    "kserve_frontend": "listening",
    "kserve_port": "listening",
    "kserve_socket": "listening",
    "kserve_http_port": "listening",
    "kserve_http_loop": "listening",
    "http_host": "listening",
    "http_port": "listening",
    "ready_file": "listening",
    "shared_memory_dir": "listening",
    "shared_memory_uids": "security",
    "max_message_bytes": "limits",
    "max_stream_held_requests": "limits",
    "max_stream_held_bytes": "limits",
    "max_unary_held_bytes": "limits",
    "trim_after_call_bytes": "limits",
    "max_concurrent_calls": "limits",
    "shared_memory_max_request_bytes": "limits",
    "kserve_shared_memory_max_regions": "limits",
    "kserve_shared_memory_max_bytes": "limits",
    "kserve_shared_memory_max_regions_per_client": "limits",
    "kserve_shared_memory_max_bytes_per_client": "limits",
    "model_call_timeout_s": "limits",
    "admin_requests_per_s": "limits",
    "admin_total_requests_per_s": "limits",
    "exit_timeout_s": "process",
    "event_loop": "process",
    "lifeline_fd": "process",
    "inference_threads": "batching",
    "cpu_parallel_min_rows": "batching",
    "application_scheduling": "batching",
    "priority_classes": "batching",
    "default_priority_class": "batching",
    "room_wait_s": "batching",
    "room_wait_calls": "batching",
    "tls_cert_file": "security",
    "tls_key_file": "security",
    "tls_client_ca_file": "security",
    "allow_insecure_remote": "security",
    "allow_unauthenticated_remote": "security",
    "auth_token": "security",
    "auth_token_file": "security",
    "max_tracked_apps": "observability",
    "http_docs": "observability",
    "metrics_min_interval_s": "observability",
    "slow_request_s": "observability",
    # udfserve node (NodeConfig)
    "devices": "supervision",
    "runtime_dir": "supervision",
    "discovery_file": "supervision",
    "discovery_heartbeat_s": "supervision",
    "discovery_stale_after_s": "supervision",
    "node_name": "observability",
    "advertise_host": "observability",
    "server_host": "listening",
    "server_port_base": "listening",
    "server_http_host": "listening",
    "server_http_port_base": "listening",
    "supervisor_http_host": "listening",
    "supervisor_http_port": "listening",
    "start_timeout_s": "supervision",
    "restart_backoff_initial_s": "supervision",
    "restart_backoff_max_s": "supervision",
    "restart_backoff_reset_s": "supervision",
    "server_args": "supervision",
    "leases": "supervision",
    "lease_poll_s": "supervision",
    "lease_timeout_s": "supervision",
    "starter_lock_fd": "supervision",
}
"""The group of each setting of ``udfserve serve`` and ``udfserve node``, by the setting's name."""


def group_of(name: str) -> str:
    """The ``--help`` group of a setting; a setting missing from ``SETTING_GROUPS`` is a
    programming error, named with where to add it."""
    try:
        return SETTING_GROUPS[name]
    except KeyError:
        raise TypeError(
            f"setting {name!r} has no --help group; expected an entry in SETTING_GROUPS "
            f"(udfserve.services.settings_groups), one of {', '.join(GROUPS)}"
        ) from None
