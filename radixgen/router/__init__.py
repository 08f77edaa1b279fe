"""The cache-aware router: data-parallel replicas (``radixgen serve --dp N``) and, standalone
(``radixgen router --worker-urls ...``), several ``radixgen serve`` hosts behind one address."""

from .policy import POLICIES, Policy, Worker
from .proxy import Router, create_router_app, routing_text
from .tree import PrefixTree

__all__ = [
    "POLICIES",
    "Policy",
    "PrefixTree",
    "Router",
    "Worker",
    "create_router_app",
    "routing_text",
]
