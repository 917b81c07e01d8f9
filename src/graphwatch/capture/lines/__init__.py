"""The user's lines: which line runs now (``callsite``), the user's source read as syntax (``source``), their
frames and the values their names hold (``frames``), which step and line made a node, from its sequence
number (``step_clock``), and a full step's lines lent to a light step (``line_templates``).

The lowest room: it imports nothing else of ``capture``.
"""
