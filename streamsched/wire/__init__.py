"""Wire formats: the bytes streamsched writes to Kafka, each writer beside its reader.

Lives here: ``avro`` (the two-byte-envelope Avro codec), ``transition`` (events), ``claim``
(state-topic snapshots), ``dead_letter`` (DLQ records and their safe headers), ``delay``
(parked records: their due time and the transition record they came from), ``schedule`` (catalog
records and the ``origin`` of fired occurrences).

May import: ``streamsched.model``, ``streamsched.errors``, fastavro. Never a Kafka client.
"""
