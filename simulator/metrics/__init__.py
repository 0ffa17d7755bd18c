"""The event log and what is computed from it: step metrics, the summary, collective tables, link load."""
