"""Builds the repository's benchmark document from the results the comparisons wrote.

    python -m benchmarks.docs            # docs/benchmarks.md from benchmarks/results/
    python -m benchmarks.docs --quick    # a preview from the quick run's results

The numbers come only from ``benchmarks/results/<comparison>.json``; the reading of them (what
the profiles say, what to change) comes from ``benchmarks/findings/<comparison>.md``, kept next
to the scripts and written by people.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks import cluster_model
from benchmarks.cli import QUICK_RESULTS_DIR
from benchmarks.report import RESULTS_DIR, ComparisonResult, Table, TargetCheck, machine_markdown

REPO_ROOT = Path(__file__).resolve().parent.parent
DOC_PATH = REPO_ROOT / "docs" / "benchmarks.md"
FINDINGS_DIR = Path(__file__).resolve().parent / "findings"
KSERVE_RESULTS_DIR = Path(__file__).resolve().parent / "kserve" / "results"
KSERVE_HEADING = "6. KServe v2 against a real Triton"
KSERVE_TARGET = (
    "udfserve at least 1.0x Triton's rows/s at every point of the perf_analyzer grid, over gRPC, HTTP and "
    "gRPC with system shared memory (its native KServe "
    "front end)"
)

SECTIONS = (
    ("spark_e2e", "1. End-to-end Spark"),
    ("transport", "2. Transport"),
    ("batching", "3. Dynamic batching"),
    ("footprint", "4. Executor footprint"),
    ("cold_start", "5. Cold start"),
)
LATE_SECTIONS = (
    ("backends", "7. Backends side by side: TensorFlow, ONNX Runtime, PyTorch"),
    ("scaling", "8. Scaling with the rows"),
    ("soak", "9. An hour of load"),
)
"""Comparisons of ``run_all`` rendered after the KServe section (6), which runs outside it."""
FINAL_SECTIONS = (
    ("fairness", "11. Fair shares: many applications on one server"),
    ("text_backpressure", "12. Back-pressure: the demo's text job"),
    ("tracing_cost", "13. Tracing: what spans cost"),
    ("xgboost_scoring", "14. Gradient-boosted trees: XGBoost in Spark"),
    ("null_model", "15. The serving path's own cost: a null model"),
)
"""Comparisons rendered after the cluster on paper (section 10). ``text_backpressure`` runs outside
``run_all``: it compares this tree with another checkout (``--baseline``). ``tracing_cost`` runs
outside it too (``python -m benchmarks.tracing_cost``): a Spark session of its own at the end."""

INTRO = """\
# Benchmarks

udfserve side by side with what data teams use today. Every comparison runs all of its contenders
in one run, on the same model and data, and is regenerated with one command:

```
python -m benchmarks.run_all            # everything, about 2 h 40 min (the soak 60 min,
                                        # end-to-end with Ray Data 34, scaling 19,
                                        # the null model 17, backends 14); rewrites this page
python -m benchmarks.run_all --quick    # small and short, to check that the scripts work;
                                        # writes to benchmarks/results/tmp/quick/ only
python -m benchmarks.transport          # one comparison (also: batching, cold_start,
                                        # spark_e2e, footprint, backends, scaling, fairness,
                                        # xgboost_scoring, null_model, soak --minutes N); then
                                        # python -m benchmarks.docs
```

The scripts live in `benchmarks/`; each comparison writes a Markdown table, a JSON file and a PNG
plot to `benchmarks/results/`, with a description of the machine. They need the `bench` dependency group
(`source scripts/venv.sh bench`: the development environment, matplotlib, py-spy for the sampled
profiles). Ray Data, a contender of the end-to-end comparison, needs the `bench-ray` group as well
(`pip install --group bench-ray` in the checkout); without it that comparison runs without Ray and
says so.

**Read ratios, not absolute figures.** The numbers were measured on a shared machine with two cores
and no GPU, while other work was running: the load average at the start of each comparison is
recorded under it. Between runs, throughput moves by 15-20% or more; a ratio measured within one
run (both contenders under the same conditions) is much steadier, and CPU time per unit of work
steadier still, which is why the tables give it next to the rates. Resident memory moves too, by up
to 15% between runs (it counts the shared-library pages the kernel maps, which depends on the page
cache), while the ratios between contenders hold. Targets are stated as ratios for this reason. A
target that is missed stays a target: the section says so and shows where the time goes.
"""


def load_result(path: Path) -> tuple[ComparisonResult, dict[str, Any]]:
    data = json.loads(path.read_text(encoding="utf-8"))
    machine = data.pop("machine")
    data["tables"] = [Table(**table) for table in data["tables"]]
    data["targets"] = [TargetCheck(**target) for target in data["targets"]]
    return ComparisonResult(**data), machine


def render(results_dir: Path, doc_path: Path) -> str:
    image_prefix = os.path.relpath(results_dir, doc_path.parent).replace(os.sep, "/") + "/"
    loaded: dict[str, tuple[ComparisonResult, dict[str, Any]]] = {}
    for name, _ in (*SECTIONS, *LATE_SECTIONS, *FINAL_SECTIONS):
        path = results_dir / f"{name}.json"
        if path.exists():
            loaded[name] = load_result(path)
    parts = [INTRO, "## Targets at a glance", ""]
    parts += ["| comparison | target | measured | verdict |", "|---|---|---|---|"]
    parts += _target_rows(SECTIONS, loaded)
    parts.append(kserve_target_row(KSERVE_RESULTS_DIR))
    parts += _target_rows(LATE_SECTIONS, loaded)
    parts += _target_rows(FINAL_SECTIONS, loaded)
    parts.append("")
    for name, heading in SECTIONS:
        parts += _section(name, heading, loaded, image_prefix)
    parts += kserve_section(KSERVE_RESULTS_DIR)
    for name, heading in LATE_SECTIONS:
        parts += _section(name, heading, loaded, image_prefix)
    parts += cluster_model.section(results_dir)
    for name, heading in FINAL_SECTIONS:
        parts += _section(name, heading, loaded, image_prefix)
    return "\n".join(parts).rstrip() + "\n"


def _target_rows(
    sections: Sequence[tuple[str, str]], loaded: dict[str, tuple[ComparisonResult, dict[str, Any]]]
) -> list[str]:
    rows = []
    for name, heading in sections:
        if name not in loaded:
            rows.append(f"| {heading} | - | not run yet | not measured |")
            continue
        for target in loaded[name][0].targets:
            rows.append(f"| {heading} | {target.target} | {target.measured} | {target.verdict} |")
    return rows


def _section(
    name: str, heading: str, loaded: dict[str, tuple[ComparisonResult, dict[str, Any]]], image_prefix: str
) -> list[str]:
    """One comparison's section: its tables and plot, the machine, and the findings written for it."""
    parts = [f"## {heading}", ""]
    if name not in loaded:
        return [*parts, f"Not run yet: `python -m benchmarks.{name}`.", ""]
    result, machine = loaded[name]
    parts += [f"*{result.title}.* Run time {result.duration_s / 60:.1f} min.", ""]
    parts += [result.to_markdown(plot_prefix=image_prefix), machine_markdown(machine)]
    findings = FINDINGS_DIR / f"{name}.md"
    if findings.exists():
        parts += ["### Reading the numbers", "", findings.read_text(encoding="utf-8").strip(), ""]
    return parts


KSERVE_PROTOCOL_FILES = (
    ("gRPC", "perf_analyzer.json"),
    ("HTTP", "perf_analyzer-http.json"),
    ("gRPC + system shared memory", "perf_analyzer-shm.json"),
)


def kserve_target_row(results_dir: Path) -> str:
    """The KServe target's line of the summary, from ``perf_analyzer{,-http,-shm}.json``: one
    grid per protocol, the target met only where it is met at every point of each."""
    measured, verdicts = [], []
    for protocol, name in KSERVE_PROTOCOL_FILES:
        path = results_dir / name
        if not path.exists():
            continue
        ratios = _kserve_ratios(json.loads(path.read_text(encoding="utf-8"))["points"])
        if not ratios:
            measured.append(f"{protocol}: no point measured on both servers")
            verdicts.append(False)
            continue
        met = sum(ratio >= 1.0 for ratio in ratios.values())
        worst = min(ratios, key=lambda point: ratios[point])
        measured.append(
            f"{protocol}: {min(ratios.values()):.2f}-{max(ratios.values()):.2f}x, {met} of {len(ratios)} "
            f"points at 1.0x or more, lowest at batch {worst[0]}, concurrency {worst[1]}"
        )
        verdicts.append(met == len(ratios))
    if not measured:
        return f"| {KSERVE_HEADING} | {KSERVE_TARGET} | not run yet | not measured |"
    verdict = "met" if all(verdicts) else "**missed**"
    return f"| {KSERVE_HEADING} | {KSERVE_TARGET} | {'; '.join(measured)} | {verdict} |"


def _kserve_ratios(points: list[dict[str, Any]]) -> dict[tuple[int, int], float]:
    """udfserve's rows/s over Triton's at each point, judged on the native front end where it was
    measured (see benchmarks/kserve/run.py)."""
    rates = {(p["server"], p["batch"], p["concurrency"]): p["rows_per_s"] for p in points}
    judged = "udfserve-native" if any(p["server"] == "udfserve-native" for p in points) else "udfserve"
    return {
        (batch, concurrency): rate / rates[("triton", batch, concurrency)]
        for (server, batch, concurrency), rate in rates.items()
        if server == judged and rate and rates.get(("triton", batch, concurrency))
    }


def kserve_section(results_dir: Path) -> list[str]:
    """The perf_analyzer table and the Spark interop check, as ``benchmarks/kserve`` wrote them
    (``python -m benchmarks.kserve.run`` and ``python -m benchmarks.kserve.interop``, after
    ``bash benchmarks/kserve/setup.sh``: a heavy peer, outside ``run_all``)."""
    parts = [
        f"## {KSERVE_HEADING}",
        "",
        "Outside `run_all`, since the peer is heavy: `bash benchmarks/kserve/setup.sh` once, then "
        "`python -m benchmarks.kserve.run` (perf_analyzer) and `python -m benchmarks.kserve.interop` "
        "(the Spark client); `python -m benchmarks.docs` brings their tables here.",
        "",
    ]
    written = False
    for name in ("perf_analyzer.md", "perf_analyzer-http.md", "perf_analyzer-shm.md", "interop.md"):
        path = results_dir / name
        if path.exists():
            text = path.read_text(encoding="utf-8").strip()
            parts += ["##" + line if line.startswith("#") else line for line in text.splitlines()] + [""]
            written = True
    if not written:
        parts += ["Not run yet: `bash benchmarks/kserve/setup.sh && python -m benchmarks.kserve.run`.", ""]
    findings = FINDINGS_DIR / "kserve.md"
    if written and findings.exists():
        parts += ["### Reading the numbers", "", findings.read_text(encoding="utf-8").strip(), ""]
    return parts


def write_doc(quick: bool) -> Path:
    results_dir = QUICK_RESULTS_DIR if quick else RESULTS_DIR
    doc_path = results_dir / "benchmarks.md" if quick else DOC_PATH
    doc_path.parent.mkdir(parents=True, exist_ok=True)
    doc_path.write_text(render(results_dir, doc_path), encoding="utf-8")
    return doc_path


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="render the quick run's results")
    args = parser.parse_args(argv)
    print(f"written {write_doc(args.quick)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
