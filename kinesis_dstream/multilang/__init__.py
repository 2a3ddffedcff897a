"""KCL properties files and a pure-Python MultiLangDaemon.

``properties`` reads the Java daemon's properties files into ``ConsumerConfig``;
``messages`` and ``protocol`` speak the multilang JSON-lines protocol to one child;
``processor`` runs a child per shard lease on our engine; ``daemon`` is the command
``kinesis-dstream multilang --properties-file F``.
"""
from .properties import (  # noqa: F401
    MultiLangSettings,
    consumer_config_from_properties,
    load_properties,
)
