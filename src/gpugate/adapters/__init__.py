"""Adapters: each owns one outside system (model servers over HTTP, exporters, object storage)."""
