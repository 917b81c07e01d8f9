"""Where torch calls into graphwatch: the saved-tensor hooks and their handles (``saved``, ``saved_views``,
``hook_switch``), the wrapper around the autograd engine (``backward``), the optimizer hooks
(``optimizer``), ``model.eval()`` (``eval_mode``), the precise level's TorchFunctionMode (``call_mode``),
stepping aside for torch.compile (``transforms``), graphwatch's own time (``own_time``), and the paragraph
the unpack hook adds to torch's in-place error (``inplace_hints``).

Imports the ``lines`` room only (and names the recorder for type hints).
"""
