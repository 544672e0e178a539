"""The shared checks of the example-producer tests report their failures with pytest's diffs."""

import pytest

pytest.register_assert_rewrite("example_producers")
