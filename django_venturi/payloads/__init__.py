"""Payloads: how task data becomes JSON a database can store, and back.

Owns the codec (dataclasses to JSON and back, typed) and the rules for text
PostgreSQL can store. Imports nothing else from django_venturi: every other
layer may use it.
"""
