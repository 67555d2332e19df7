"""Imported once by the math pool's fork server: math-verify loaded and sympy warmed before any fork.

Workers are forked from that server, so a worker that replaces a killed one is ready in milliseconds
instead of paying sympy's import and cold first simplification (seconds) again.
"""

from rlax_core.rewards.math_symbolic import verdict

verdict("3\\sqrt{3}", "\\sqrt{27}", None)
