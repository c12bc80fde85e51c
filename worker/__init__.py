"""The worker of one GPU host: GPU inventory, job runner, and the trainer process."""
