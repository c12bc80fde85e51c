"""Telling the world outside: webhooks (and where they may go) when jobs end, Prometheus metrics."""
