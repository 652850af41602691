"""Calibration: fitting the analytic model's parameters to a cluster (docs/costmodel.md).

:mod:`.calibrate` fits; :mod:`.backend` says what it fits against (the simulator, or
:mod:`.torch_backend` inside a torchrun job); :mod:`.accuracy` judges the fitted model
against the simulator on workloads the fit never saw.
"""
