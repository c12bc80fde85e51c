"""The lab: its users and tokens, its hosts and GPUs, and who used them (usage, fair share)."""
