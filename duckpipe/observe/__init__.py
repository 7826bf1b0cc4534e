"""Watching a running dataplane without disturbing it: ``stats_reader`` maps the stats
segment read-only; ``top`` (duckpipe-top), ``topview`` (what it shows, as pure functions)
and ``exporter`` (Prometheus text) are built on it."""
