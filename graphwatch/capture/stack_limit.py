"""Room on the main thread's stack for freeing long graphs.

torch frees a chain of autograd nodes iteratively, but once Python has
touched the nodes (any graph walk does: ``next_functions``, as torchviz's
does too) freeing a chain of ~40,000 nodes recurses in C++ and overflows the
default 8 MiB stack: the process dies with SIGSEGV.  graphwatch walks every
graph, so while a session watches, the main thread's soft stack limit is
raised (Linux grows the main stack on demand up to it); it is put back when
no node graphwatch touched is alive any more.

Example::

    >>> from graphwatch.capture.stack_limit import raise_stack_limit
    >>> restore = raise_stack_limit()
    >>> restore()
"""

from __future__ import annotations

import threading
from typing import Callable

try:
    import resource
except ImportError:  # not on Windows
    resource = None  # type: ignore[assignment]

WANTED = 512 << 20  # enough for chains of millions of nodes


def raise_stack_limit() -> Callable[[], None]:
    """Raise the soft RLIMIT_STACK to WANTED (as the hard limit allows); return what restores it."""
    if resource is None or threading.current_thread() is not threading.main_thread():
        return lambda: None
    soft, hard = resource.getrlimit(resource.RLIMIT_STACK)
    target = WANTED if hard == resource.RLIM_INFINITY else min(hard, WANTED)
    if soft == resource.RLIM_INFINITY or soft >= target:
        return lambda: None
    try:
        resource.setrlimit(resource.RLIMIT_STACK, (target, hard))
    except (ValueError, OSError):
        return lambda: None
    return lambda: resource.setrlimit(resource.RLIMIT_STACK, (soft, hard))
