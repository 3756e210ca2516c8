"""The HTTP delivery layer: parse, call a service, present. No decisions live here."""
