"""What runs on executors: Spark tasks of both APIs read shards here.

``shard_reader`` reads one shard's range of one batch (the same records every time the
partition is computed); ``task`` groups shards into tasks and reads a group concurrently.
Nothing here imports pyspark: the DStream glue (``spark/planner.py``) and the Structured
Streaming source (``sql/source.py``) call in.
"""
