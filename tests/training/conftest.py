"""Lets the trainer tests (and the worker scripts they start) import ``training_helpers`` beside them."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
