"""Experiment tracking (spec.tracking): trainer rank 0's step log and validation results, sent to MLflow,
Weights & Biases and TensorBoard through the libraries' own clients.

One room: ``Sink`` (sinks.py) is the abstract backend with ``MlflowSink``, ``WandbSink`` and
``TensorBoardSink``; ``Tracker`` (tracker.py) feeds them from what ``trainer/steplog.py`` writes per step
and ``trainer/validation.py`` receives per validation run. Nothing else in the trainer knows a tracker.
"""
