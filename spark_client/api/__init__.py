"""The public UDFs, and what the driver checks while it builds one: ``remote_predict``,
``predict_arrow`` and ``arrow_predictor`` (``udf``), ``predict_files`` (``file_reads``, the files it
reads: ``file_listing``), the Spark types of the answers (``return_types``), the names of appended
columns (``output_names``), and whether Spark's Python workers can run the UDF (``worker_check``).

Users import these from ``udfserve.spark_client``. Imports every other room; none imports it.
"""
