"""Generic helpers. veRL's ``omega_conf_to_dataclass`` at this path (``verl.utils``) is served by
``hybridflow.compat``."""
