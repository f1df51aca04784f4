"""The XGBoost backend (``model``): ``<model>/<version>/model.ubj`` or ``model.json``, a booster in
XGBoost's own formats, called with ``Booster.inplace_predict``; its one input and its outputs read
from the booster (``specs``), its threads and device chosen once per process (``settings``,
``placement``), its errors the runtime's (``errors``). ``example`` writes ``tabular_xgb``.
Importing this package imports XGBoost."""

from udfserve.runtime.backends.xgboost.model import PLATFORM, XGBoostBackend, XGBoostModel

__all__ = ["PLATFORM", "XGBoostBackend", "XGBoostModel"]
