"""Where each cause of a finding is recorded, read from the graph still alive and the user's frames:

- a saved tensor changed in place: the line that changed it (``inplace``, ``inplace_source``);
- a backward through a freed graph: what the fix must come from (``second_backward``), the tensor that
  carries a graph into the next step (``carriers``, ``values``);
- a loss without a graph: the ``torch.no_grad()`` around it (``no_grad``) or where its graph was cut
  (``graph_cuts``);
- torch's other autograd errors (``error_frames``), DDP's reducer errors (``ddp_frames``), errors on a light
  step (``light_errors``);
- the Python values that keep earlier steps' graphs alive (``holders``, ``held_values``);
- what trained, per optimizer and parameter (``parameters``, ``ownership``).

Imports the ``graph``, ``hooks`` and ``lines`` rooms.
"""
