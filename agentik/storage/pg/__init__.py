"""The PostgreSQL engine (several nodes on one database): its writer, plan, statement, schema,
reads, feed, leases and online relay."""
