"""Scheduling: the pure policy (`policy.schedule`), the live pass against the database
(`live`), and the trace simulator (`simulate`), which calls the same policy."""
