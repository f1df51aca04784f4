"""The PyTorch backend computes what torch computes, reads inputs and outputs from an exported
program, and refuses every file that could run code other than the program's operators, naming
the file: pickles (code in ``__reduce__`` never runs), a program of another torch major version,
calls beyond ATen, shape expressions that are Python, TorchScript without declared specs."""

from __future__ import annotations

import io
import json
import logging
import os
import re
import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from torch_programs import CLASSES, IMAGE_SHAPE, conv_net_repository, torch_outputs

from udfserve.runtime.backends.pytorch import PyTorchModel
from udfserve.runtime.backends.pytorch.errors import call_error
from udfserve.runtime.errors import BackendFault, DeviceOutOfMemory, InvalidInput, ModelLoadError
from udfserve.runtime.repository import load_model, scan_repository
from udfserve.runtime.tensor_spec import TensorSpec
from udfserve.services.examples.torch_models import TORCH_EXAMPLE, generate_torch_examples

TOLERANCE = 1e-5


def load_only(repository: Path, name: str = "m") -> PyTorchModel:
    scan = scan_repository(repository)
    assert scan.failures == {}, scan.failures
    source = next(source for source in scan.sources if source.name == name)
    model = load_model(source)
    assert isinstance(model, PyTorchModel)
    return model


def load_failure(repository: Path, name: str = "m") -> str:
    scan = scan_repository(repository)
    source = next(source for source in scan.sources if source.name == name)
    with pytest.raises(ModelLoadError) as raised:
        load_model(source)
    return str(raised.value)


@pytest.fixture(scope="module")
def conv_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return conv_net_repository(tmp_path_factory.mktemp("conv"))


@pytest.fixture(scope="module")
def conv_program(conv_repository: Path) -> Path:
    return conv_repository / "m" / "1" / "model.pt2"


@pytest.fixture
def repository_with(tmp_path: Path) -> Callable[..., Path]:
    """A repository holding one version folder of model ``m`` with the given files."""

    def make(files: dict[str, bytes], config: dict[str, object] | None = None) -> Path:
        version_dir = tmp_path / "repo" / "m" / "1"
        version_dir.mkdir(parents=True, exist_ok=True)
        for name, data in files.items():
            (version_dir / name).write_bytes(data)
        if config is not None:
            (tmp_path / "repo" / "m" / "config.yaml").write_text(yaml.safe_dump(config))
        return tmp_path / "repo"

    return make


def rewritten(program: Path, edit: Callable[[str, bytes], bytes]) -> bytes:
    """A copy of a real .pt2 archive with each entry passed through ``edit(name, data)``."""
    out = io.BytesIO()
    with zipfile.ZipFile(program) as source, zipfile.ZipFile(out, "w") as target:
        for info in source.infolist():
            target.writestr(info, edit(info.filename, source.read(info)))
    return out.getvalue()


def program_edit(change: Callable[[dict[str, object]], None]) -> Callable[[str, bytes], bytes]:
    """An ``edit`` that changes the program's JSON (models/model.json)."""

    def edit(name: str, data: bytes) -> bytes:
        if not name.endswith("models/model.json"):
            return data
        program = json.loads(data)
        change(program)
        return json.dumps(program).encode()

    return edit


def conv_inputs(rows: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "image": rng.standard_normal((rows, *IMAGE_SHAPE)).astype(np.float32),
        "offset": rng.integers(0, 5, size=rows).astype(np.int64),
    }


# -- what a program says about itself ---------------------------------------------------------------
def test_inputs_come_from_forwards_parameters_and_outputs_from_the_returned_dict(
    conv_repository: Path,
) -> None:
    model = load_only(conv_repository)
    assert model.platform == "pytorch_export"
    assert model.inputs == (
        TensorSpec(name="image", dtype="float32", shape=IMAGE_SHAPE),
        TensorSpec(name="offset", dtype="int64", shape=()),
    )
    assert model.outputs == (
        TensorSpec(name="probabilities", dtype="float32", shape=(CLASSES,)),
        TensorSpec(name="energy", dtype="float32", shape=()),
    )


@pytest.mark.parametrize("rows", [1, 7, 1024])
def test_predictions_equal_torchs_own_for_any_batch_size(
    conv_repository: Path, conv_program: Path, rows: int
) -> None:
    model = load_only(conv_repository)
    inputs = conv_inputs(rows, seed=rows)
    answer = model.predict(inputs)
    expected = torch_outputs(conv_program, inputs)
    for name in ("probabilities", "energy"):
        np.testing.assert_allclose(answer[name], expected[name], atol=TOLERANCE)


def test_read_only_inputs_are_taken_as_they_are(conv_repository: Path, conv_program: Path) -> None:
    """Arrow hands the server read-only arrays; torch.from_numpy would warn (an error here)."""
    model = load_only(conv_repository)
    inputs = conv_inputs(16)
    for array in inputs.values():
        array.flags.writeable = False
    np.testing.assert_allclose(
        model.predict(inputs)["probabilities"],
        torch_outputs(conv_program, inputs)["probabilities"],
        atol=TOLERANCE,
    )


def test_config_yaml_may_declare_another_numeric_dtype_which_is_cast(
    conv_program: Path, repository_with: Callable[..., Path]
) -> None:
    repository = repository_with(
        {"model.pt2": conv_program.read_bytes()},
        {"inputs": [{"name": "image", "shape": list(IMAGE_SHAPE)}, {"name": "offset", "dtype": "int32"}]},
    )
    model = load_only(repository)
    inputs = conv_inputs(5)
    answer = model.predict({"image": inputs["image"], "offset": inputs["offset"].astype(np.int32)})
    np.testing.assert_allclose(answer["probabilities"], torch_outputs(conv_program, inputs)["probabilities"])


def test_config_yaml_names_the_outputs_of_a_program_returning_a_tensor(
    repository_with: Callable[..., Path], tmp_path: Path
) -> None:
    module = torch.nn.Sequential(torch.nn.Linear(4, 2), torch.nn.Sigmoid())
    program = torch.export.export(
        module, (torch.zeros(3, 4),), dynamic_shapes=({0: torch.export.Dim("batch")},)
    )
    torch.export.save(program, tmp_path / "plain.pt2")
    unnamed = load_only(repository_with({"model.pt2": (tmp_path / "plain.pt2").read_bytes()}))
    assert [spec.name for spec in unnamed.outputs] == ["output_0"]
    named = load_only(
        repository_with({}, {"outputs": [{"name": "score", "shape": [2]}]}),
    )
    assert [spec.name for spec in named.outputs] == ["score"]
    assert named.predict({"input": np.ones((2, 4), np.float32)})["score"].shape == (2, 2)


def test_the_example_equals_its_keras_twin(example_repository: Path, tmp_path: Path) -> None:
    import keras

    generate_torch_examples(tmp_path)
    model = load_only(tmp_path, TORCH_EXAMPLE)
    assert [spec.name for spec in model.inputs] == ["features"]
    assert [spec.name for spec in model.outputs] == ["probabilities"]
    features = np.random.default_rng(3).standard_normal((2048, 64)).astype(np.float32)
    twin = keras.saving.load_model(example_repository / "tabular_mlp" / "1" / "model.keras", compile=False)
    np.testing.assert_allclose(
        model.predict({"features": features})["probabilities"], np.asarray(twin(features)), atol=TOLERANCE
    )


def test_a_program_with_control_flow_runs_its_branches(
    repository_with: Callable[..., Path], tmp_path: Path
) -> None:
    class Branching(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.cond(x.sum() > 0, lambda v: v.sin(), lambda v: v.cos(), (x,))

    program = torch.export.export(
        Branching(), (torch.ones(3, 4),), dynamic_shapes=({0: torch.export.Dim("batch")},)
    )
    torch.export.save(program, tmp_path / "branching.pt2")
    model = load_only(repository_with({"model.pt2": (tmp_path / "branching.pt2").read_bytes()}))
    for sign, expected in ((1.0, np.sin(1.0)), (-1.0, np.cos(-1.0))):
        answer = model.predict({"x": np.full((2, 4), sign, np.float32)})["output_0"]
        np.testing.assert_allclose(answer, np.full((2, 4), expected), atol=TOLERANCE)


def test_a_constrained_free_dimension_warms_up_with_the_example_length_and_guards_requests(
    repository_with: Callable[..., Path], tmp_path: Path
) -> None:
    """Tokens in pairs: an even length of at least 4. Export records guards over input sizes, and
    warm-up calls take their free lengths from the inputs the program was exported with."""

    class Pairs(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embedding = torch.nn.Embedding(50, 8)
            self.head = torch.nn.Linear(16, 3)

        def forward(self, tokens: torch.Tensor) -> torch.Tensor:
            pairs = self.embedding(tokens).reshape(tokens.shape[0], -1, 16)
            return self.head(pairs.sum(1)).softmax(-1)

    batch, half = torch.export.Dim("batch"), torch.export.Dim("half", min=2, max=256)
    program = torch.export.export(
        Pairs(), (torch.zeros(3, 8, dtype=torch.int64),), dynamic_shapes={"tokens": {0: batch, 1: 2 * half}}
    )
    torch.export.save(program, tmp_path / "pairs.pt2")
    model = load_only(repository_with({"model.pt2": (tmp_path / "pairs.pt2").read_bytes()}))
    assert model.inputs == (TensorSpec(name="tokens", dtype="int64", shape=(-1,)),)
    assert model.predict({"tokens": np.ones((2, 6), np.int64)})["output_0"].shape == (2, 3)
    with pytest.raises(InvalidInput, match="Guard failed"):
        model.predict({"tokens": np.ones((2, 5), np.int64)})


# -- errors of a call ------------------------------------------------------------------------------
def test_an_id_beyond_the_embedding_table_is_the_requests_fault(conv_repository: Path) -> None:
    inputs = conv_inputs(3)
    inputs["offset"][1] = 99
    with pytest.raises(InvalidInput, match=r"model 'm': the model refused the request's input values: index"):
        load_only(conv_repository).predict(inputs)


def test_a_shape_the_program_was_not_exported_for_is_the_requests_fault(conv_repository: Path) -> None:
    inputs = conv_inputs(3)
    inputs["image"] = np.zeros((3, 1, 8, 9), np.float32)
    with pytest.raises(InvalidInput, match="model 'm'"):
        load_only(conv_repository).predict(inputs)


def test_out_of_memory_is_device_out_of_memory_and_an_unknown_fault_is_a_backend_fault() -> None:
    assert isinstance(call_error("m", 8, torch.OutOfMemoryError("CUDA out of memory.")), DeviceOutOfMemory)
    assert isinstance(
        call_error("m", 8, RuntimeError("DefaultCPUAllocator: can't allocate memory")), DeviceOutOfMemory
    )
    fault = call_error("m", 8, RuntimeError("the kernel failed"))
    assert isinstance(fault, BackendFault) and not isinstance(fault, DeviceOutOfMemory)
    assert fault.message == "model 'm': torch failed running 8 rows: RuntimeError: the kernel failed"


# -- refused at load -----------------------------------------------------------------------------
def test_a_fixed_batch_dimension_is_refused_naming_the_file_and_the_fix(
    repository_with: Callable[..., Path], tmp_path: Path
) -> None:
    program = torch.export.export(torch.nn.Linear(4, 2), (torch.zeros(3, 4),))
    torch.export.save(program, tmp_path / "fixed.pt2")
    message = load_failure(repository_with({"model.pt2": (tmp_path / "fixed.pt2").read_bytes()}))
    assert "model.pt2" in message
    assert "fixed batch dimension 3" in message and "torch.export.Dim('batch')" in message


class CodeCarrying(torch.nn.Module):
    """A module whose pickle, once loaded, creates the folder ``marker``: code in a model file."""

    def __init__(self, marker: Path) -> None:
        super().__init__()
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.makedirs, (str(self.marker),))


@pytest.mark.parametrize("zip_format", [True, False], ids=["zip", "legacy"])
def test_a_pickled_module_carrying_code_is_refused_unread_and_its_code_never_runs(
    repository_with: Callable[..., Path], tmp_path: Path, zip_format: bool
) -> None:
    marker = tmp_path / "code-ran"
    saved = tmp_path / "pickled.pt"
    torch.save(CodeCarrying(marker), saved, _use_new_zipfile_serialization=zip_format)
    message = load_failure(repository_with({"model.pt": saved.read_bytes()}))
    assert re.search(r"model\.pt is .*pickle.*never unpickled", message), message
    assert "torch.jit.save" in message and "model.pt2" in message
    assert not marker.exists()
    torch.load(saved, weights_only=False)  # the file does carry code: unpickled in full, it runs
    assert marker.exists()


def test_a_program_of_another_torch_major_version_is_refused_naming_both_versions(
    conv_program: Path, repository_with: Callable[..., Path]
) -> None:
    data = rewritten(conv_program, program_edit(lambda program: program.update(torch_version="3.1.0")))
    message = load_failure(repository_with({"model.pt2": data}))
    assert "model.pt2" in message
    assert f"exported with torch 3.1.0, but torch {torch.__version__} is installed" in message


def test_a_truncated_program_is_refused_naming_the_file(
    conv_program: Path, repository_with: Callable[..., Path]
) -> None:
    data = conv_program.read_bytes()
    message = load_failure(repository_with({"model.pt2": data[: len(data) // 2]}))
    assert re.search(r"model\.pt2 is not a torch\.export archive \(truncated", message), message


def test_a_call_beyond_aten_is_refused_before_torch_reads_the_file(
    conv_program: Path, repository_with: Callable[..., Path]
) -> None:
    def call_os_system(program: dict[str, object]) -> None:
        node = program["graph_module"]["graph"]["nodes"][0]  # type: ignore[index]
        node["target"] = "torch.os.system"

    message = load_failure(
        repository_with({"model.pt2": rewritten(conv_program, program_edit(call_os_system))})
    )
    assert "model.pt2 calls 'torch.os.system', which is not an ATen or prims operator" in message


def test_a_shape_expression_that_is_python_is_refused_and_never_evaluated(
    conv_program: Path, repository_with: Callable[..., Path], tmp_path: Path
) -> None:
    marker = tmp_path / "expression-ran"
    payload = f"__import__('os').makedirs('{marker}')"

    def edit(name: str, data: bytes) -> bytes:
        if not name.endswith("models/model.json"):
            return data
        text = data.decode()
        symbol = re.search(r"Symbol\('(s\d+)'", text)
        assert symbol is not None
        return re.sub(
            r"\"expr_str\": \"Symbol\('s\d+'[^\"]*\"", json.dumps({"expr_str": payload})[1:-1], text, count=1
        ).encode()

    message = load_failure(repository_with({"model.pt2": rewritten(conv_program, edit)}))
    assert "model.pt2 holds the shape expression" in message and "evaluated as Python" in message
    assert not marker.exists()


def test_sample_inputs_that_carry_code_are_refused_and_never_unpickled(
    conv_program: Path, repository_with: Callable[..., Path], tmp_path: Path
) -> None:
    marker = tmp_path / "sample-ran"
    carrier = io.BytesIO()
    torch.save(CodeCarrying(marker), carrier)

    def edit(name: str, data: bytes) -> bytes:
        return carrier.getvalue() if name.endswith("data/sample_inputs/model.pt") else data

    message = load_failure(repository_with({"model.pt2": rewritten(conv_program, edit)}))
    assert "model.pt2 holds sample inputs" in message and "weights_only=True" in message
    assert not marker.exists()


def test_a_pickled_weight_is_refused(conv_program: Path, repository_with: Callable[..., Path]) -> None:
    def edit(name: str, data: bytes) -> bytes:
        if not name.endswith("model_weights_config.json"):
            return data
        config = json.loads(data)
        next(iter(config["config"].values()))["use_pickle"] = True
        return json.dumps(config).encode()

    message = load_failure(repository_with({"model.pt2": rewritten(conv_program, edit)}))
    assert re.search(r"model\.pt2 stores weight '[\w.]+' as a pickle, which is never unpickled", message), (
        message
    )


# -- TorchScript -------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def scripted(tmp_path_factory: pytest.TempPathFactory) -> tuple[torch.jit.ScriptModule, bytes]:
    class Scored(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = torch.nn.Linear(6, 2)

        def forward(self, values: torch.Tensor, bias: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            scores = self.linear(values) + bias.unsqueeze(-1)
            return scores, scores.sum(-1)

    torch.manual_seed(1)
    buffer = io.BytesIO()
    with pytest.warns(DeprecationWarning, match="torch.jit.* is deprecated"):  # since torch 2.13
        module = torch.jit.script(Scored().eval())
        torch.jit.save(module, buffer)
    return module, buffer.getvalue()


def test_torchscript_without_declared_specs_is_refused_naming_what_to_write(
    scripted: tuple[torch.jit.ScriptModule, bytes], repository_with: Callable[..., Path]
) -> None:
    message = load_failure(repository_with({"model.pt": scripted[1]}))
    assert "model.pt" in message
    assert (
        "TorchScript records no input or output specs, and config.yaml declares no inputs and outputs"
        in message
    )
    assert "named as forward's parameters" in message


def test_torchscript_with_declared_specs_computes_what_the_script_computes(
    scripted: tuple[torch.jit.ScriptModule, bytes], repository_with: Callable[..., Path]
) -> None:
    config = {
        "inputs": [{"name": "bias", "shape": []}, {"name": "values", "shape": [6]}],
        "outputs": [{"name": "scores", "shape": [2]}, {"name": "total", "shape": []}],
    }
    model = load_only(repository_with({"model.pt": scripted[1]}, config))
    assert model.platform == "pytorch_libtorch"
    values = np.random.default_rng(0).standard_normal((9, 6)).astype(np.float32)
    bias = np.arange(9, dtype=np.float32)
    answer = model.predict({"values": values, "bias": bias})
    scores, total = scripted[0](torch.from_numpy(values), torch.from_numpy(bias))
    np.testing.assert_allclose(answer["scores"], scores.detach().numpy(), atol=TOLERANCE)
    np.testing.assert_allclose(answer["total"], total.detach().numpy(), atol=TOLERANCE)


def test_torchscript_inputs_must_be_named_as_forwards_parameters(
    scripted: tuple[torch.jit.ScriptModule, bytes], repository_with: Callable[..., Path]
) -> None:
    config = {"inputs": [{"name": "x", "shape": [6]}, {"name": "bias"}], "outputs": [{"name": "scores"}]}
    message = load_failure(repository_with({"model.pt": scripted[1]}, config))
    assert (
        "config.yaml declares inputs ['x', 'bias'], but the TorchScript forward takes ['values', 'bias']"
        in message
    )


def test_a_torch_export_archive_named_model_pt_is_refused_naming_the_right_name(
    conv_program: Path, repository_with: Callable[..., Path]
) -> None:
    message = load_failure(repository_with({"model.pt": conv_program.read_bytes()}))
    assert "model.pt is a torch.export archive: name it model.pt2" in message


def test_the_process_says_where_torch_computes(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Logged once per process, when the first model loads (it may have loaded already here)."""
    from udfserve.runtime.backends.pytorch import device as pytorch_device

    monkeypatch.setattr(pytorch_device, "_placement", None)  # a fresh process's state
    with caplog.at_level(logging.INFO, logger="udfserve.runtime.backends.pytorch.device"):
        chosen = pytorch_device.placement()
    assert chosen.device == torch.device("cpu")
    assert any("computes on the CPU" in record.getMessage() for record in caplog.records)


def test_a_guard_that_is_more_than_a_size_comparison_is_refused_and_never_compiled(
    conv_program: Path, repository_with: Callable[..., Path], tmp_path: Path
) -> None:
    marker = tmp_path / "guard-ran"
    guard = f"L['image'].size()[0] == 0 or __import__('os').makedirs('{marker}')"
    data = rewritten(conv_program, program_edit(lambda program: program.update(guards_code=[guard])))
    message = load_failure(repository_with({"model.pt2": data}))
    assert "model.pt2 carries the guard" in message and "not a comparison of input sizes" in message
    assert not marker.exists()


def test_a_program_calling_atens_file_reader_is_refused(
    conv_program: Path, repository_with: Callable[..., Path]
) -> None:
    def read_a_file(program: dict[str, object]) -> None:
        node = program["graph_module"]["graph"]["nodes"][0]  # type: ignore[index]
        node["target"] = "torch.ops.aten.from_file.default"

    message = load_failure(repository_with({"model.pt2": rewritten(conv_program, program_edit(read_a_file))}))
    assert "model.pt2 calls 'torch.ops.aten.from_file.default', which reads or writes files" in message


def test_torchscript_that_writes_a_file_is_refused_before_it_runs(
    repository_with: Callable[..., Path], tmp_path: Path
) -> None:
    target = tmp_path / "written-by-the-model"

    class Writer(torch.nn.Module):
        def __init__(self, path: str) -> None:
            super().__init__()
            self.path = path

        def forward(self, values: torch.Tensor) -> torch.Tensor:
            torch.save(values, self.path)
            return values

    buffer = io.BytesIO()
    with pytest.warns(DeprecationWarning, match="torch.jit.* is deprecated"):
        torch.jit.save(torch.jit.script(Writer(str(target))), buffer)
    config = {"inputs": [{"name": "values", "shape": [2]}], "outputs": [{"name": "same", "shape": [2]}]}
    message = load_failure(repository_with({"model.pt": buffer.getvalue()}, config))
    assert re.search(
        r"model\.pt holds TorchScript code \(code/\S+\.py\) naming \['save'\], ATen's file", message
    )
    assert not target.exists()
    with pytest.warns(DeprecationWarning, match="torch.jit.load` is deprecated"):
        loaded = torch.jit.load(io.BytesIO(buffer.getvalue()))
    loaded(torch.ones(1, 2))  # served as it is, the script would write the file
    assert target.exists()


def test_an_invalid_memory_fraction_fails_the_load_naming_the_variable(
    conv_repository: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from udfserve.runtime.backends.pytorch import device as pytorch_device

    monkeypatch.setattr(pytorch_device, "_placement", None)  # as in a process that loads its first model
    monkeypatch.setenv("UDFSERVE_TORCH_CUDA_MEMORY_FRACTION", "2")
    message = load_failure(conv_repository)
    assert "UDFSERVE_TORCH_CUDA_MEMORY_FRACTION='2': Input should be less than or equal to 1" in message


def test_a_parameter_name_that_is_python_source_is_refused_and_never_run(
    conv_program: Path, repository_with: Callable[..., Path], tmp_path: Path
) -> None:
    """torch writes forward's parameter names into the module's generated source."""
    marker = tmp_path / "name-ran"

    def inject(program: dict[str, object]) -> None:
        signature = program["graph_module"]["module_call_graph"][0]["signature"]  # type: ignore[index]
        signature["forward_arg_names"] = ["image", f"offset=__import__('os').makedirs('{marker}')"]

    message = load_failure(repository_with({"model.pt2": rewritten(conv_program, program_edit(inject))}))
    assert "model.pt2 holds the forward parameter" in message and "not a plain name" in message
    assert not marker.exists()


class WritesWhenLoaded(torch.nn.Module):
    """TorchScript whose ``__setstate__`` (run by ``torch.jit.load``) writes the file ``path``."""

    def __init__(self, path: str) -> None:
        super().__init__()
        self.path = path

    def forward(self, values: torch.Tensor) -> torch.Tensor:
        return values

    @torch.jit.export
    def __getstate__(self) -> tuple[str, bool]:
        return (self.path, self.training)

    @torch.jit.export
    def __setstate__(self, state: tuple[str, bool]) -> None:
        self.path = state[0]
        self.training = state[1]
        torch.save(torch.zeros(1), self.path)


def test_torchscript_that_writes_a_file_when_loaded_is_refused_unloaded(
    repository_with: Callable[..., Path], tmp_path: Path
) -> None:
    target = tmp_path / "written-at-load"
    buffer = io.BytesIO()
    with pytest.warns(DeprecationWarning, match="torch.jit.* is deprecated"):
        torch.jit.save(torch.jit.script(WritesWhenLoaded(str(target))), buffer)
    config = {"inputs": [{"name": "values", "shape": [2]}], "outputs": [{"name": "same", "shape": [2]}]}
    message = load_failure(repository_with({"model.pt": buffer.getvalue()}, config))
    assert re.search(r"model\.pt holds TorchScript code \(code/\S+\.py\) naming \['save'\]", message), message
    assert not target.exists()
    with pytest.warns(DeprecationWarning, match="torch.jit.load` is deprecated"):
        torch.jit.load(io.BytesIO(buffer.getvalue()))  # loading it is enough to run its code
    assert target.exists()
