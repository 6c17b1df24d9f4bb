"""Integrations with frameworks deadman does not depend on (each imports its framework
only when used): :mod:`deadman.contrib.django`."""
