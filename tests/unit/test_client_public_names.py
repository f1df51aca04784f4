"""What users import from the Spark client, pinned: the package's names and the two module paths
the documentation gives (``udfserve.spark_client.tracing``, ``udfserve.spark_client.kserve_messages``).

The modules behind them may move between the client's rooms; these imports may not change.
"""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

import udfserve.spark_client as client

PUBLIC_NAMES = [
    "ClientConfig",
    "arrow_predictor",
    "node_servers",
    "predict_arrow",
    "predict_files",
    "remote_predict",
]

DOCUMENTED_MODULES = {
    "udfserve.spark_client.tracing": ["job_traceparent"],
    "udfserve.spark_client.kserve_messages": [
        "arrow_batch_to_infer_request",
        "infer_response_to_arrow",
        "specs_from_config",
        "specs_from_metadata",
    ],
}


def test_the_package_exports_exactly_its_public_names() -> None:
    assert sorted(client.__all__) == PUBLIC_NAMES


@pytest.mark.parametrize("name", PUBLIC_NAMES)
def test_each_public_name_resolves_to_what_its_module_defines(name: str) -> None:
    """Each name is the object of the module that defines it: one class or function under one
    module name, which is the name cloudpickle ships a UDF's closure with."""
    value = getattr(client, name)

    home = importlib.import_module(value.__module__)

    assert getattr(home, name) is value
    assert value.__module__.startswith("udfserve.spark_client.")


def test_an_unknown_name_is_an_attribute_error_naming_it() -> None:
    with pytest.raises(AttributeError, match="'no_such_name'"):
        _ = client.no_such_name


@pytest.mark.parametrize("module_name", sorted(DOCUMENTED_MODULES))
def test_each_documented_module_path_exports_its_functions_defined_in_a_room(
    module_name: str,
) -> None:
    module = importlib.import_module(module_name)

    assert sorted(module.__all__) == DOCUMENTED_MODULES[module_name]
    for name in module.__all__:
        defined_in = getattr(module, name).__module__
        assert defined_in != module_name, f"{name} should be defined in a room, not at {module_name}"
        assert getattr(importlib.import_module(defined_in), name) is getattr(module, name)


def test_importing_the_package_loads_neither_pyspark_nor_grpc() -> None:
    """The names resolve on first use: a driver that only builds a config imports no Spark."""
    code = (
        "import sys\n"
        "import udfserve.spark_client\n"
        "from udfserve.spark_client import ClientConfig\n"
        "ClientConfig()\n"
        "print(sorted(name for name in ('pyspark', 'grpc', 'pandas') if name in sys.modules))\n"
    )

    completed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)

    assert completed.stdout.strip() == "[]"
