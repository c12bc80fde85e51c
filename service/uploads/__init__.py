"""What members upload and download: code bundles, datasets, a job's artifacts, archives,
and the quotas that bound them."""
