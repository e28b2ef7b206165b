"""The one definition of every SMQP event, table, topic rule and time format.

Both the gateway and the streaming job import from here; nothing else is
shared between them.  Spark types live in :mod:`schemas.spark` so that the
gateway never has to import pyspark.
"""
