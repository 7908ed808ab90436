"""A stand-in for a library that enqueues Django Tasks but is not an installed app (as
Wagtail's search enqueues `modelsearch.tasks`): workers import its task module only
because its jobs carry the producer's signature of it."""
