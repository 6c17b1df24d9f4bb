"""Database plumbing: the named-query loader, connection pools and migrations."""
