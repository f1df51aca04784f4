"""The ``udfserve`` command: ``serve`` one model server, ``node`` to supervise a node's servers,
``models generate`` to write the example model repository, ``demo`` to run the end-to-end job.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Sequence

import udfserve
from services.model_server import event_loop
from services.model_server.config import ServerConfig
from services.node.config import NodeConfig
from services.process_setup import configure_logging
from services.settings_cli import SettingsError, add_settings_arguments, settings_from_args

logger = logging.getLogger("udfserve")


def run_serve(args: argparse.Namespace) -> int:
    config = settings_from_args(ServerConfig, args)
    configure_logging(config.log_level)
    # The device is fixed before anything can import TensorFlow: the backends import it lazily.
    from udfserve.runtime.device import pin_device

    pin_device(config.device)
    from services.model_server.app import serve

    if not config.model_repository.is_dir():
        logger.error("model repository %s is not a folder", config.model_repository)
        return 2
    from services.model_server.security import check_credentials

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
    return event_loop.run(serve(config), loop)


def run_node(args: argparse.Namespace) -> int:
    from services.node.command import run_node as run

    return run(args)


def run_generate_models(args: argparse.Namespace) -> int:
    configure_logging("INFO")
    from udfserve.runtime.device import pin_device

    pin_device("cpu")  # generating small models needs no GPU; never take a GPU's memory for it
    from services.examples.generate_models import generate_example_repository, publish_example_version

    if args.publish_version is not None:
        publish_example_version(args.output, args.publish_version, args.only)
        return 0
    names = generate_example_repository(
        args.output, overwrite=args.overwrite, include_savedmodel=args.savedmodel
    )
    logger.info("example model repository at %s: %s", args.output, ", ".join(names))
    return 0


def run_demo(args: argparse.Namespace) -> int:
    configure_logging("INFO")
    from services.demo import main as demo_main

    return demo_main(args)


def build_parser() -> argparse.ArgumentParser:
    from pathlib import Path

    parser = argparse.ArgumentParser(
        prog="udfserve",
        description="GPU-resident model servers for Spark UDFs. Every flag of `serve` and `node` can also "
        "be set with the UDFSERVE_<FLAG> environment variable; a flag wins over the variable.",
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
    add_settings_arguments(serve, ServerConfig)
    serve.set_defaults(handler=run_serve)

    node = commands.add_parser(
        "node",
        help="supervise one model server per device of this node",
        description="Run the node supervisor: one model server per NVIDIA device (found through NVML), "
        "or per --devices entry (cpu, GPU indices, or simulated sim:N devices), restarted with back-off "
        "if it dies; writes the discovery file the Spark client reads and a Prometheus targets file. "
        "SIGTERM stops every server gracefully, removes both files and exits 0.",
    )
    add_settings_arguments(node, NodeConfig)
    node.set_defaults(handler=run_node)

    demo = commands.add_parser(
        "demo",
        help="run the end-to-end demo job",
        description="Generate the example models if absent, start `udfserve node` on this machine's "
        "devices, score a DataFrame generated to fit the model's declared inputs through remote_predict "
        "on local Spark, print a report (rows/s, rows answered by the servers and by the CPU fallback, "
        "model loads, sample predictions) and stop everything it started; with --keep-running the node "
        "stays up after the report, its /metrics addresses printed, until Ctrl-C.",
    )
    from services.demo import add_arguments as add_demo_arguments

    add_demo_arguments(demo)
    demo.set_defaults(handler=run_demo)

    models = commands.add_parser("models", help="model repository tools")
    models_commands = models.add_subparsers(dest="models_command", required=True, metavar="ACTION")
    from services.examples.generate_models import GENERATE_DESCRIPTION, add_publish_arguments

    generate = models_commands.add_parser(
        "generate", help="write the example model repository", description=GENERATE_DESCRIPTION
    )
    generate.add_argument("--output", type=Path, required=True, help="repository folder to write")
    generate.add_argument("--overwrite", action="store_true", help="rewrite models already present")
    generate.add_argument(
        "--savedmodel", action="store_true", help="also export tabular_mlp as a TensorFlow SavedModel"
    )
    add_publish_arguments(generate)
    generate.set_defaults(handler=run_generate_models)
    return parser


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
