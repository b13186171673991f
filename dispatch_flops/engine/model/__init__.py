"""Facts read from the model, beside the op counts.

``module_facts``: names, types, parameters, calls and spans of the modules, for a result;
``expert_load``: the tokens each MoE expert is given; ``saved``: the bytes autograd saves for
backward, per module; ``activations``: module outputs kept for the user.
"""
