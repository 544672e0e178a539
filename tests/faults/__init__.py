"""The fault matrix (``make test-faults``): scenarios on a fresh three-node cluster each."""
