"""SLA-aware inference gateway: HTTP front end, queues and wiring."""

__version__ = "0.1.0"
