"""towerq service: REST API, database models, scheduler policy and CLI."""
