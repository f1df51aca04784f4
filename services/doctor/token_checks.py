"""The token the jobs here would send: readable, sendable, and accepted by the servers.

The token is read by the client's own code (``credentials.auth_metadata``), so a file the client
could not use (empty, unreadable, holding characters gRPC metadata cannot carry) is refused here
in the client's words. Whether the servers accept it is learnt from the calls the server checks
made with it: a server that requires a token answers every call but health UNAUTHENTICATED.
"""

from __future__ import annotations

import grpc
from pydantic import SecretStr

from udfserve.services.doctor.config import DoctorConfig
from udfserve.services.doctor.report import Finding
from udfserve.services.doctor.server_checks import ServerAnswers
from udfserve.spark_client.common.config import ClientConfig
from udfserve.spark_client.common.errors import ClientSetupError
from udfserve.spark_client.wire.credentials import CallMetadata, auth_metadata

TOKEN_FIX = (
    "put the servers' token (their --auth-token-file, or --server-args='--auth-token-file ...' of "
    "udfserve node) in a file the executors can read, and name it in the jobs "
    "(spark.udfserve.authTokenFile) and here (--auth-token-file, UDFSERVE_AUTH_TOKEN_FILE)"
)


def read_token(config: DoctorConfig) -> tuple[CallMetadata, Finding | None]:
    """The call metadata the jobs would send, and a finding when the token cannot be used."""
    if config.auth_token is None and config.auth_token_file is None:
        return (), None
    where = f"auth token file {config.auth_token_file}" if config.auth_token_file else "the auth token"
    try:
        client = ClientConfig(
            auth_token=SecretStr(config.auth_token.get_secret_value()) if config.auth_token else None,
            auth_token_file=str(config.auth_token_file) if config.auth_token_file else None,
        )
        return auth_metadata(client.task_config()), None
    except (ClientSetupError, ValueError) as exc:
        return (), Finding(
            group="token",
            name="token",
            status="fail",
            summary=f"{where} cannot be sent: {exc}; jobs configured with it fail on the driver or in every "
            "task",
            fix=TOKEN_FIX,
            facts={"file": str(config.auth_token_file) if config.auth_token_file else None},
        )


def check_token(config: DoctorConfig, metadata: CallMetadata, answers: list[ServerAnswers]) -> Finding:
    """What the servers made of the token (or of its absence)."""
    configured = bool(metadata)
    where = f"the token of {config.auth_token_file}" if config.auth_token_file else "the token"
    asked = [reached for reached in answers if reached.target is not None]
    refused = [reached for reached in asked if reached.index_code == grpc.StatusCode.UNAUTHENTICATED]
    facts = {
        "configured": configured,
        "file": str(config.auth_token_file) if config.auth_token_file else None,
        "refused_by": [reached.entry.device for reached in refused],
    }
    if not asked:
        return Finding(
            group="token",
            name="token",
            status="info",
            summary=f"{'configured' if configured else 'none configured'}; not checked: no server answered",
            facts=facts,
        )
    if refused:
        devices = ", ".join(reached.entry.device for reached in refused)
        detail = refused[0].index_error
        summary = (
            f"the servers ({devices}) refuse {where}: {detail}"
            if configured
            else f"the servers ({devices}) require a token and none is configured here ({detail})"
        )
        summary += (
            "; jobs configured so fail (AuthenticationFailed): the client never hides a refused token "
            "behind the CPU fallback"
        )
        return Finding(
            group="token", name="token", status="fail", summary=summary, fix=TOKEN_FIX, facts=facts
        )
    if not configured:
        summary = "none configured, and the servers ask for none"
    elif all(reached.requires_token for reached in asked):
        summary = f"{where} is accepted by every server, and each of them requires it"
    else:
        open_to_all = ", ".join(reached.entry.device for reached in asked if not reached.requires_token)
        summary = f"{where} is accepted; the servers {open_to_all} require no token (they ignore it)"
    return Finding(group="token", name="token", status="ok", summary=summary, facts=facts)
