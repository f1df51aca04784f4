"""What runs in a Spark task: the functions of the pandas and the Arrow UDF (``pandas_udf``,
``arrow_udf``) and the partition every UDF answers (``task``, ``partition``), Spark's data to
requests and back (``convert``, ``pandas_convert``, ``rechunk``), the circuit breaker per server
(``circuit``) and the CPU fallback (``fallback``).

Imports ``nodes``, ``observability``, ``wire`` and ``common``; never ``api``: what a task runs
does not depend on what builds a UDF. The ``mapInArrow`` functions of ``predict_arrow`` and
``predict_files`` (``ArrowPredictor``, ``FileScorer``) are defined in ``api``, beside the calls
that build them, and answer their partitions here.
"""
