"""Multi-node mode: a dispatcher (``gateway serve``) scheduling over the executors of several workers (``gateway worker``)."""
