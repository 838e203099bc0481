"""Reproducible benchmarks: schemaless against raw mysqlclient on the same servers.

``python -m bench`` runs the operation benchmark (see docs/benchmarks.md),
``python -m bench.timeline`` the timeline benchmark of "Implementing Timeline in Web
Services" (Kazuho Oku, 2008), ``python -m bench.plot`` turns results into charts.
"""
