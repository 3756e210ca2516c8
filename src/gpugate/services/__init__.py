"""Services: the loops and request paths that combine the core with the adapters."""
