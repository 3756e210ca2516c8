"""gpugate: the front door for a team's GPU work.

Importing this package does nothing but define ``__version__``: no environment is read,
no socket is opened, no app is built. The composition root is :mod:`gpugate.wiring`.
"""

__version__ = "0.1.0"
