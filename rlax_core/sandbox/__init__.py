"""Untrusted Python in a sandboxed child process (``run``: limits, the zygote, prepared sandboxes;
``launcher``: the standard-library-only script that builds each sandbox), shared by the code
verifier (``rewards.code_verifier``) and the episodes' python tool (``envs.tools``)."""
