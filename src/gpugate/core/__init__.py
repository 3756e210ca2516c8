"""The core: pure decisions over plain data. No HTTP, database or SDK import lives here."""
