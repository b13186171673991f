"""Callbacks for the training loops people use: ``integrations.transformers.FlopsCallback``
(a transformers ``TrainerCallback``) and ``integrations.lightning.FlopsCallback`` (a Lightning
``Callback``). Each imports its library only when imported itself."""
