"""Transform tests run on Beam's in-process FnApiRunner (the DirectRunner's batch engine): each
pipeline then starts in well under a second instead of launching a Prism job server."""

import pytest
from apache_beam.testing.test_pipeline import TestPipeline


@pytest.fixture
def pipeline():
    return TestPipeline(runner="FnApiRunner")
