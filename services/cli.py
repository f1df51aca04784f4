"""The ``udfserve`` command: ``serve`` one model server, ``node`` to supervise a node's servers,
``models generate`` to write the example model repository, ``demo`` to run the end-to-end job,
``doctor`` to check a node and an executor's environment, ``completion`` for the shell.
"""

from __future__ import annotations

import argparse
import logging
import threading
from collections.abc import Sequence

import udfserve
from udfserve.services.model_server import event_loop
from udfserve.services.model_server.config import ServerConfig
from udfserve.services.model_server.exit_deadline import exit_now
from udfserve.services.node.config import NodeConfig
from udfserve.services.process_setup import configure_logging
from udfserve.services.settings_cli import SettingsError, add_settings_arguments, settings_from_args

logger = logging.getLogger("udfserve")


def run_serve(args: argparse.Namespace) -> int:
    config = settings_from_args(ServerConfig, args)
    configure_logging(config.log_level, config.log_format)
    # The device is fixed before anything can import TensorFlow: the backends import it lazily.
    from udfserve.runtime.device import pin_device

    pin_device(config.device)
    from udfserve.services.model_server.app import serve

    if not config.model_repository.is_dir():
        logger.error("model repository %s is not a folder", config.model_repository)
        return 2
    from udfserve.services.model_server.security import check_credentials

    try:
        check_credentials(config)
    except ValueError as exc:
        logger.error("refusing to start: %s", exc)
        return 2
    try:
        loop = event_loop.resolve(config.event_loop)
    except event_loop.EventLoopUnavailable as exc:
        logger.error("%s", exc)
        return 2
    code = event_loop.run(serve(config), loop)
    if _only_daemon_threads_left():
        exit_now(code)  # drained and stopped: nothing is left for the teardown to do
    return code  # a model call still runs: Python's exit waits for it, and the exit deadline ends it


def _only_daemon_threads_left() -> bool:
    main = threading.main_thread()
    return not any(t is not main and not t.daemon and t.is_alive() for t in threading.enumerate())


def run_node(args: argparse.Namespace) -> int:
    from udfserve.services.node.command import run_node as run

    return run(args)


def run_generate_models(args: argparse.Namespace) -> int:
    from udfserve.services.examples.backend_examples import backend_examples_missing
    from udfserve.services.examples.generate_models import onnx_missing

    if args.onnx and onnx_missing():
        raise SettingsError(onnx_missing())
    if args.triton_examples and onnx_missing():
        raise SettingsError(onnx_missing("--triton-examples"))
    if backend_examples_missing(args.backend_examples):
        raise SettingsError(backend_examples_missing(args.backend_examples))
    configure_logging("INFO")
    from udfserve.runtime.device import pin_device

    pin_device("cpu")  # generating small models needs no GPU; never take a GPU's memory for it
    from udfserve.services.examples.backend_examples import generate_backend_examples
    from udfserve.services.examples.generate_models import (
        generate_example_repository,
        publish_example_version,
    )

    if args.publish_version is not None:
        publish_example_version(args.output, args.publish_version, args.only)
        return 0
    names = generate_example_repository(
        args.output,
        overwrite=args.overwrite,
        include_savedmodel=args.savedmodel,
        include_onnx=args.onnx,
        include_text_classifier=args.text_classifier,
    )
    if args.torch:
        from udfserve.services.examples.torch_models import generate_torch_examples

        names += generate_torch_examples(args.output, overwrite=args.overwrite)
    if args.triton_examples:
        from udfserve.services.examples.triton_examples import generate_triton_examples

        names += generate_triton_examples(args.output, overwrite=args.overwrite)
    names += generate_backend_examples(args.output, args.backend_examples, overwrite=args.overwrite)
    logger.info("example model repository at %s: %s", args.output, ", ".join(names))
    return 0


def run_import_hf(args: argparse.Namespace) -> int:
    """``models import-hf``: a fine-tuned Hugging Face classifier into the repository."""
    configure_logging("INFO")
    from udfserve.runtime.device import pin_device

    pin_device("cpu")  # exporting needs no GPU; never take a GPU's memory for it
    from udfserve.services.hf_import import HfImportError, import_hugging_face

    try:
        imported = import_hugging_face(
            args.folder,
            args.repository,
            args.name,
            model_format=args.format,
            max_length=args.max_length,
            version=args.version,
            max_batch_size=args.max_batch_size,
        )
    except (HfImportError, ValueError, FileExistsError) as exc:
        logger.error("cannot import %s: %s", args.folder, exc)
        return 1
    logger.info("model %s version %s is ready to serve", args.name, imported.version_dir.name)
    return 0


def run_model_call(args: argparse.Namespace) -> int:
    """``models load|unload|index``: the call on every server of the node."""
    configure_logging("WARNING")
    import sys

    from udfserve.services.node.model_calls import index_call, load_call, run_node_call, unload_call

    if args.models_command == "load":
        call = load_call(args.model, args.config_json, args.reload)
    elif args.models_command == "unload":
        call = unload_call(args.model)
    else:
        call = index_call(args.ready_only)
    return run_node_call(args, call, sys.stdout)


def run_demo(args: argparse.Namespace) -> int:
    configure_logging("INFO")
    from udfserve.services.demo import main as demo_main

    return demo_main(args)


def build_parser() -> argparse.ArgumentParser:
    from pathlib import Path

    parser = argparse.ArgumentParser(
        prog="udfserve",
        description="GPU-resident model servers for Spark UDFs. Every flag of `serve`, `node` and `doctor` "
        "can also be set with the UDFSERVE_<FLAG> environment variable; a flag wins over the variable. "
        "`serve` and `node` also read settings from a YAML file (--config FILE), which both win over.",
    )
    parser.add_argument("--version", action="version", version=f"udfserve {udfserve.__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = commands.add_parser(
        "serve",
        help="run one model server pinned to one device",
        description="Run one model server process pinned to one device: loads every model of the "
        "repository once and serves dynamically batched predictions over gRPC (unix socket and/or "
        "TCP), with an HTTP admin app (health, models, /metrics). SIGTERM drains and exits 0.",
    )
    add_settings_arguments(serve, ServerConfig, grouped=True, config_file=True)
    serve.set_defaults(handler=run_serve)

    node = commands.add_parser(
        "node",
        help="supervise one model server per device of this node",
        description="Run the node supervisor: one model server per NVIDIA device (found through NVML), "
        "or per --devices entry (cpu, GPU indices, or simulated sim:N devices), restarted with back-off "
        "if it dies; writes the discovery file the Spark client reads and a Prometheus targets file. "
        "SIGTERM stops every server gracefully, removes both files and exits 0.",
    )
    add_settings_arguments(node, NodeConfig, grouped=True, config_file=True)
    node.set_defaults(handler=run_node)

    from udfserve.services.doctor.command import add_doctor_parser

    add_doctor_parser(commands)
    from udfserve.services.completion import add_completion_parser

    add_completion_parser(commands, parser)

    demo = commands.add_parser(
        "demo",
        help="run the end-to-end demo job",
        description="Generate the example models if absent, start `udfserve node` on this machine's "
        "devices, score a DataFrame generated to fit the model's declared inputs through remote_predict "
        "on local Spark, print a report (rows/s, rows answered by the servers and by the CPU fallback, "
        "model loads, sample predictions) and stop everything it started; with --keep-running the node "
        "stays up after the report, its /metrics addresses printed, until Ctrl-C.",
    )
    from udfserve.services.demo import add_arguments as add_demo_arguments

    add_demo_arguments(demo)
    demo.set_defaults(handler=run_demo)

    models = commands.add_parser("models", help="model repository tools")
    models_commands = models.add_subparsers(dest="models_command", required=True, metavar="ACTION")
    from udfserve.services.examples.backend_examples import add_backend_examples_argument
    from udfserve.services.examples.generate_models import (
        GENERATE_DESCRIPTION,
        ONNX_HELP,
        add_publish_arguments,
    )
    from udfserve.services.examples.torch_models import TORCH_HELP
    from udfserve.services.examples.triton_examples import TRITON_EXAMPLES_HELP

    generate = models_commands.add_parser(
        "generate", help="write the example model repository", description=GENERATE_DESCRIPTION
    )
    generate.add_argument("--output", type=Path, required=True, help="repository folder to write")
    generate.add_argument("--overwrite", action="store_true", help="rewrite models already present")
    generate.add_argument(
        "--savedmodel", action="store_true", help="also export tabular_mlp as a TensorFlow SavedModel"
    )
    generate.add_argument("--onnx", action="store_true", help=ONNX_HELP)
    generate.add_argument("--torch", action="store_true", help=TORCH_HELP)
    generate.add_argument("--triton-examples", action="store_true", help=TRITON_EXAMPLES_HELP)
    generate.add_argument(
        "--text-classifier",
        action="store_true",
        help="also write text_classifier: a small BERT-like Hugging Face classifier built with random "
        "weights, imported with `models import-hf` to ONNX (needs torch and transformers here; served by "
        "ONNX Runtime, which tokenizes its string input)",
    )
    add_backend_examples_argument(generate)
    add_publish_arguments(generate)
    generate.set_defaults(handler=run_generate_models)
    _add_import_hf(models_commands)
    _add_model_calls(models_commands)
    return parser


def _add_import_hf(models_commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``models import-hf``: a fine-tuned Hugging Face text classifier into the repository."""
    from pathlib import Path

    from udfserve.services.hf_import import MODEL_FILES

    command = models_commands.add_parser(
        "import-hf",
        help="import a fine-tuned Hugging Face text classifier into the repository",
        description="Load a sequence classifier saved with save_pretrained (config.json, model.safetensors, "
        "tokenizer.json; no hub, no remote code, no pickle files) with transformers, export it with a "
        "softmax inside (output `probabilities`) and free batch and sequence dimensions, check the export "
        "against transformers on sample texts, and write it as a new version of the model: model.onnx or "
        "model.pt2 and tokenizer.json, with a config.yaml whose preprocess step makes the server tokenize "
        "a string input `text`. Needs torch and transformers on this machine only.",
    )
    command.add_argument("folder", type=Path, help="the fine-tuned model's folder (save_pretrained)")
    command.add_argument("--repository", type=Path, required=True, help="the model repository to write into")
    command.add_argument("--name", required=True, help="the model's name in the repository")
    command.add_argument(
        "--format",
        choices=tuple(MODEL_FILES),
        default="onnx",
        help="onnx (default: model.onnx, served by ONNX Runtime) or pt2 (model.pt2 from torch.export, "
        "served by PyTorch)",
    )
    command.add_argument(
        "--max-length",
        type=int,
        default=None,
        help="tokens per text, longer texts truncated (default the smallest of the tokenizer's "
        "model_max_length, the model's max_position_embeddings and 512)",
    )
    command.add_argument(
        "--version", type=int, default=None, help="the version to write (default one more than the highest)"
    )
    command.add_argument("--max-batch-size", type=int, default=256, help="the model's max_batch_size (256)")
    command.set_defaults(handler=run_import_hf)


def _add_model_calls(models_commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``models load|unload|index``: model control calls on every server of this node."""
    from udfserve.services.node.model_calls import add_node_call_arguments

    node_wide = (
        "on every ready server of this node (read from its discovery file), one device after the other; "
        "the servers must run with --model-control explicit (udfserve node --model-control explicit)"
    )
    load = models_commands.add_parser(
        "load",
        help="load a model, or its new versions, on every device of this node",
        description="Load a model of the repository, or the versions of it that are new or changed, "
        f"{node_wide}. Each device keeps serving the versions it had until the new ones are loaded "
        "and warmed up.",
    )
    load.add_argument("model", help="the model's folder name in the repository")
    load.add_argument(
        "--config-json",
        default="",
        help="config.yaml fields as one JSON object, used in place of config.yaml",
    )
    load.add_argument("--reload", action="store_true", help="load every version again, changed or not")
    unload = models_commands.add_parser(
        "unload",
        help="unload a model on every device of this node",
        description=f"Unload every version of a model {node_wide}; each answers what it holds first.",
    )
    unload.add_argument("model", help="the model's name")
    index = models_commands.add_parser(
        "index",
        help="list the models and versions of every device of this node",
        description="List every model of the repository and of each server, with each version's state, "
        f"{node_wide} (the index is answered in every model control mode).",
    )
    index.add_argument("--ready-only", action="store_true", help="only the versions that serve")
    for command in (load, unload, index):
        add_node_call_arguments(command)
        command.set_defaults(handler=run_model_call)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.handler(args))
    except SettingsError as exc:
        parser.exit(2, f"udfserve {args.command}: {exc}\n")
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
