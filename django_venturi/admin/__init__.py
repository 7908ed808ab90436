"""The Django admin as the queue's dashboard: browse jobs, act on them, watch the queue.

Django imports this package (admin autodiscovery); importing it registers the
model admins. Nothing in django_venturi imports it. It may import everything
else: it is the top of the house.
"""

from django_venturi.admin import jobs, pauses, periodic  # noqa: F401 - registers the admins
