"""Sub-commands of ``python -m gating_core``; one module per group."""
