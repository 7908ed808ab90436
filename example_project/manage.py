#!/usr/bin/env python3
"""Django's command-line utility for the django-venturi example project.

Run it from anywhere: `python3 example_project/manage.py venturi_demo`.
"""

import os
import sys
from pathlib import Path


def main() -> None:
    # The project is the package `example_project`: put the directory above it on the path.
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "example_project.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
