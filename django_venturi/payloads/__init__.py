"""Payloads: how task data becomes JSON a database can store, and back.

Owns the codec (dataclasses to JSON and back, typed) and the rules for text
PostgreSQL can store. Imports nothing else from django_venturi: every other
layer may use it.

- `codec`: the entry points and errors callers import, and the hand-written
  (slow) path that handles every type and explains every refusal.
- `fast`: the msgspec fast path `codec` asks first; it vouches or declines.
- `fields`: what a payload class declares (field hints, secret fields), shared by
  both paths and the admin; the lowest of the three.
- `masking`: stored JSON as screens may show it, `secret()` fields masked by the
  declared type (and their values hidden in untyped JSON and text).
- `text`: the text PostgreSQL can store.
- `size`: how large an encoded value is; `PayloadTooLarge` for one over its limit.
- `stored`: stored JSON read back; a value Python cannot read is `Unreadable`.
"""
