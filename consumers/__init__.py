"""Reference schedulers: ``due_runs`` (external command) and ``pipelines`` (Kafka-native)."""
