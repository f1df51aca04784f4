"""The benchmark suite: udfserve side by side with what data teams use today.

Each comparison is a script that runs all of its contenders in one run, on the same model and
data, and writes a Markdown table, a JSON file and a PNG plot under ``benchmarks/results/``.
``python -m benchmarks.run_all`` runs them all and regenerates ``docs/benchmarks.md``.
"""
