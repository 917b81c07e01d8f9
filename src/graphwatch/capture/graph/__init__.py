"""The autograd graph as graphwatch sees it: the tag on each node (``node_tags``), what a node's class says
(``node_types``), walks without recursion (``graph_walk``), the records of a light step's graph read
after the fact (``post_hoc``), and stack room for freeing long graphs (``stack_limit``).

Imports the ``hooks`` and ``lines`` rooms.
"""
