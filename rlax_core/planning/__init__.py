"""Planning a run against its hardware before it starts: ``hardware`` (declared chips and their
memory) and ``memory`` (bytes per chip of the rollout engine and the trainer; refusal with the numbers)."""
