"""The REST API and the dashboard's static files."""
