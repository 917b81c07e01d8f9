"""graphwatch's version, in a module of its own: the report's footer and ``graphwatch --version`` read it from
here, below everything else (the package's ``__init__`` imports the session, which imports the rendering).

    >>> from graphwatch.version import __version__
    >>> import graphwatch
    >>> graphwatch.__version__ == __version__
    True
"""

__version__ = "0.1.0"
