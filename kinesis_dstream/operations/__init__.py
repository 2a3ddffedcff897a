"""``kinesis-dstream leases`` and ``kinesis-dstream checkpoint``: an operator's command line.

It sits on the AWS layer (the lease table's item format and guarded writes, the Kinesis
client) and the shared modules, never on pyspark, so it runs wherever the package is
installed. One module per sub-command family; ``connection`` holds what they share.
"""
