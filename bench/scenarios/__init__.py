"""The scenarios, one module per capability measured; each returns rows of the table."""
