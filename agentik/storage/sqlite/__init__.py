"""The SQLite engine (the embedded default, one node): its writer, ops, rows, schema, reads."""
