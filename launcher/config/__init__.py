"""The typed configuration and its pure checks: schema, loading, compatibility, rendezvous settings."""
