"""The shared core every towerq process uses, the worker too: settings, the database and its
models, a job's lifecycle, Redis keys and publishing, the launch message. It imports none of
the other rooms."""
