"""The tables a job and the merge write: each one's schema and writer, defined once."""
