"""Subscription billing: the newcomer's ten-minute path (see README.md)."""
