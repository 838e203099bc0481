"""Fault injection on real servers: crashed writers, killed and frozen servers, lost
updates, a full disk (docs/reliability.md)."""
