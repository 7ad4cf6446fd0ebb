"""Library operators, one concept a module."""
