"""Structured Streaming on PySpark's Python Data Source API: the ``aws-kinesis`` format."""
