"""The always-on service: one resident process per user, thin clients, and their transport.

Modules here that a thin client imports (paths, protocol, client) use the standard library only:
a `ctx` command forwarded to the service must not pay for lancedb, pyarrow, torch or prefect.
"""
