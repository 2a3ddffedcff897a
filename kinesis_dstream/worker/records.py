"""Moved to ``kinesis_dstream.records`` (shared by the worker and the AWS layer)."""
from ..records import *  # noqa: F401,F403
from ..records import GetRecordsResult, Record, ExtendedSequenceNumber, SENTINELS  # noqa: F401
