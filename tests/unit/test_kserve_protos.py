"""The KServe v2 protocol the server compiles from ``protos/`` lives beside tritonclient's.

The server speaks KServe through ``udfserve.protocol.kserve``, generated from NVIDIA's
``grpc_service.proto`` and ``model_config.proto``; the client's ``protocol="kserve"`` and the tests
use ``tritonclient.grpc``'s modules, compiled from the same files. One process often imports both
(a test's client beside a server started in it, a notebook that starts a node and then scores
through KServe). protobuf registers every generated file in one default descriptor pool, by file
name, and takes a file a second time only when its serialized descriptor is the same bytes; a
message's full name (``inference.ModelInferRequest``) can be defined once. So the generated files
must be named as NVIDIA names them and compile to byte-identical descriptors: another release's
protocol, or a path under ``protos/`` in the file's name, makes the second import fail with a
duplicate symbol, whichever came first. Each check runs in a fresh interpreter, since the pool
lives as long as the process.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

OURS = "from udfserve.protocol.kserve import grpc_service_pb2 as service, model_config_pb2 as config"
THEIRS = "from tritonclient.grpc import service_pb2 as triton_service, model_config_pb2 as triton_config"
COMPARE = """
import hashlib, json
def digest(module):
    serialized = module.DESCRIPTOR.serialized_pb
    return {"name": module.DESCRIPTOR.name, "sha256": hashlib.sha256(serialized).hexdigest()}
print(json.dumps({
    "udfserve": [digest(service), digest(config)],
    "tritonclient": [digest(triton_service), digest(triton_config)],
    "same_message_class": service.ModelInferRequest is triton_service.ModelInferRequest,
}))
"""

SERVER_MODULES = (
    "udfserve.services.cli",
    "udfserve.services.model_server.app",
    "udfserve.services.model_server.frontends.kserve.servicer",
    "udfserve.services.model_server.frontends.kserve.native_bridge",
    "udfserve.services.model_server.frontends.kserve.native.build",
    "udfserve.services.model_server.frontends.kserve_http.routes",
    "udfserve.services.model_server.frontends.kserve_http.listener",
    "udfserve.services.model_server.observability.statistics",
)


def run_python(code: str) -> str:
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, f"expected the interpreter to exit 0:\n{result.stderr[-4000:]}"
    return result.stdout


@pytest.mark.parametrize("first, second", [(OURS, THEIRS), (THEIRS, OURS)], ids=["udfserve", "tritonclient"])
def test_both_kserve_modules_import_in_one_process_with_byte_identical_descriptors(
    first: str, second: str
) -> None:
    found = json.loads(run_python(f"{first}\n{second}\n{textwrap.dedent(COMPARE)}"))

    assert found["udfserve"] == found["tritonclient"], (
        "expected udfserve.protocol.kserve's descriptors to be tritonclient's byte for byte; "
        "copy the .proto files of the installed tritonclient's release into protos/udfserve/protocol/kserve/ "
        f"and run scripts/generate_protos.py: {found}"
    )
    assert [entry["name"] for entry in found["udfserve"]] == ["grpc_service.proto", "model_config.proto"]
    assert found["same_message_class"], "expected one message class per KServe message in the process"


def test_the_server_and_its_kserve_front_ends_import_without_tritonclient() -> None:
    # None in sys.modules makes every `import tritonclient...` raise ImportError, as where the
    # server extra is installed alone.
    imports = "\n".join(f"import {module}" for module in SERVER_MODULES)
    code = f"""
import sys
sys.modules["tritonclient"] = None
{imports}
print(sorted(name for name, module in sys.modules.items() if name.startswith("tritonclient") and module))
"""

    assert run_python(code).strip() == "[]"
