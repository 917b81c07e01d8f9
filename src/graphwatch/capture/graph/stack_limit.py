"""Room on the stack for freeing long graphs, claimed for a session and given back after it.

Why graphwatch needs it (torch 2.13): bare torch frees a chain of autograd
nodes iteratively (``deleteNode`` moves each next node onto a heap stack).
Once Python has made a wrapper object for a node (``t.grad_fn``,
``next_functions``: graphwatch's pack hook and graph walks do both), the node
is destroyed through its wrapper's deallocation instead, and that happens
inside the destructor of the node before it:
``~Node -> intrusive_ptr reset -> PyInterpreter decref -> THPCppFunction_dealloc
-> ~MulBackward0 -> ~Node ...``, five C frames (about 190 bytes) per node.  A
chain of ~45,000 touched nodes overflows an 8 MiB stack: SIGSEGV.

So a session claims :data:`WANTED` bytes of stack: on the main thread it
raises the soft ``RLIMIT_STACK`` (Linux grows the main stack on demand up to
it).  Where that is impossible (another thread, whose stack size is fixed
when it starts, or a hard limit below WANTED) the session touches no node:
it watches at the ``light`` level (no saved-tensor hooks, no graph walks),
and says so.  The limit is put back when the session ends, unless more
touched nodes are still alive than the old limit can free; then it is put
back when enough of them have died.  A limit the user changed meanwhile is
kept.

Example::

    >>> from graphwatch.capture.graph.stack_limit import claim_stack
    >>> level, give_back = claim_stack("light")
    >>> level
    'light'
    >>> give_back()
"""

from __future__ import annotations

import ctypes
import ctypes.util
import threading
from collections.abc import Callable
from typing import ClassVar

from ...errors import notify

try:
    import resource
except ImportError:  # not on Windows
    resource = None  # type: ignore[assignment]

WANTED = 512 << 20  # enough for chains of millions of nodes
BYTES_PER_NODE = 512  # stack one touched node costs when its chain is freed (measured: ~190), with a margin


class TouchedNodes:
    """How many autograd nodes graphwatch tagged (so wrapped) are alive, across sessions.

    Node tags and groups (:mod:`~graphwatch.capture.graph.node_tags`) count their
    nodes here; a pending :func:`claim_stack` give-back waits for the count to
    fall.
    """

    alive = 0
    _waiting: ClassVar[list[tuple[int, Callable[[], None]]]] = []

    @classmethod
    def died(cls, count: int = 1) -> None:
        """``count`` tagged nodes were destroyed; run the give-backs that were waiting for this few."""
        cls.alive -= count
        if cls._waiting and cls.alive <= cls._waiting[0][0]:
            ready = [done for most, done in cls._waiting if cls.alive <= most]
            cls._waiting[:] = [(most, done) for most, done in cls._waiting if cls.alive > most]
            for done in ready:
                done()

    @classmethod
    def when_at_most(cls, most: int, done: Callable[[], None]) -> None:
        """Call ``done`` now if at most ``most`` tagged nodes are alive, else once that is true."""
        if cls.alive <= most:
            done()
        else:
            cls._waiting.append((most, done))
            cls._waiting.sort(key=lambda item: -item[0])


def claim_stack(level: str) -> tuple[str, Callable[[], None]]:
    """Make room to free deep graphs at ``level``; return the level that is safe here and what gives the room back.

    Below the ``light`` level (which touches no node) this raises the main
    thread's soft stack limit to :data:`WANTED`; where the stack cannot have
    that much room it warns and returns ``"light"``.
    """
    if level == "light" or resource is None:
        return level, _nothing
    if threading.current_thread() is not threading.main_thread():
        size = thread_stack_size()
        if size is None or size < WANTED:
            return _too_little("this thread's stack" + (f" ({size >> 20} MiB)" if size else "") + " cannot grow")
        return level, _nothing
    soft, hard = resource.getrlimit(resource.RLIMIT_STACK)
    if soft == resource.RLIM_INFINITY or soft >= WANTED:
        return level, _nothing
    if hard != resource.RLIM_INFINITY and hard < WANTED:
        return _too_little(f"the hard stack limit ({hard >> 20} MiB) is below {WANTED >> 20} MiB")
    try:
        resource.setrlimit(resource.RLIMIT_STACK, (WANTED, hard))
    except (ValueError, OSError) as exc:
        return _too_little(f"the stack limit cannot be raised ({exc})")
    return level, lambda: TouchedNodes.when_at_most(soft // BYTES_PER_NODE, lambda: _put_back(soft))


def _nothing() -> None:
    """Nothing was changed: nothing to give back."""


def _too_little(why: str) -> tuple[str, Callable[[], None]]:
    notify(
        f"graphwatch: {why}, and freeing a deep graph whose nodes graphwatch touched needs {WANTED >> 20} MiB; "
        "watching at level='light' (backwards and steps only) so that it cannot crash the program. "
        "Enter the session in the main thread (and `ulimit -Hs unlimited`) for the full diagnosis.",
        RuntimeWarning,
        stacklevel=4,
    )
    return "light", _nothing


def _put_back(soft: int) -> None:
    """The soft limit as it was before the session, unless the user changed it since."""
    now, hard = resource.getrlimit(resource.RLIMIT_STACK)
    if now == WANTED:
        try:
            resource.setrlimit(resource.RLIMIT_STACK, (soft, hard))
        except (ValueError, OSError):  # a hard limit lowered below the old soft one: what the user wanted
            pass


def thread_stack_size() -> int | None:
    """The size of the calling thread's stack in bytes (glibc's pthread_getattr_np), or None if unknown."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.pthread_self.restype = ctypes.c_ulong
        attr = ctypes.create_string_buffer(128)  # pthread_attr_t is 56 bytes on 64-bit glibc
        if libc.pthread_getattr_np(ctypes.c_ulong(libc.pthread_self()), attr) != 0:
            return None
        try:
            address, size = ctypes.c_void_p(), ctypes.c_size_t()
            if libc.pthread_attr_getstack(attr, ctypes.byref(address), ctypes.byref(size)) != 0:
                return None
            return size.value
        finally:
            libc.pthread_attr_destroy(attr)
    except (OSError, AttributeError):
        return None
